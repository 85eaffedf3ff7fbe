"""One error base for every seam; each carries a diagnostic text and a hint."""

from __future__ import annotations


class Error(Exception):
    """Base of gatekeeper's errors: a message that says what is wrong, and a remedy."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def diagnostics(self) -> str:
        text = f"error: {self.message}"
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text


class PolicyError(Error):
    """A policy file is missing, unparsable or invalid."""


class GitError(Error):
    """A git operation failed or a revision does not exist."""


class KeyFileError(Error):
    """A signing key or trust file is missing or unusable."""


class SandboxError(Error):
    """The sandbox could not be set up (exit 125 from `run`)."""

    exit_code = 125


class ReceiptError(Error):
    """A receipt is missing or does not parse."""


class VerificationError(ReceiptError):
    """A receipt's signature does not verify or its key is not trusted."""


class UsageError(Error):
    """The command line or configuration is wrong."""


class BadSignatureError(VerificationError):
    """A signature by a trusted key does not match the payload."""


class UntrustedKeyError(VerificationError):
    """No signature is by a key in the trust file."""
