"""Trust files: who may sign receipts, approve escalations, or commit as a person.

One key per line, `#` starts a comment line:

    ed25519 <base64> [comment]              signs receipts (a launcher's key)
    approver ed25519 <base64> [comment]     approves or denies a run's escalations
    person <ssh-or-openpgp key> [comment]   a person whose signed commits need no receipt

A key may appear on several lines, one per role; a role is never implied by another. The gate
reads the file from the target branch only, never from the branch under review.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.errors import KeyFileError, ReceiptError
from gatekeeper.git import read_blob_at
from gatekeeper.policy.model import TRUST_PATH
from gatekeeper.receipt.keys import PublicKey

ROLES = ("signer", "approver", "person")

# The SSH key types git's ssh signing accepts (`ssh-keygen -Y verify`), as they begin a key line.
SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)


@dataclass(frozen=True)
class PersonKey:
    """A key a person signs commits with: an SSH public key, or an OpenPGP key.

    kind is "ssh" or "openpgp"; key_type the SSH key type or "openpgp"; data the base64 key
    (SSH public key blob, or the binary OpenPGP public key); comment says whose it is.
    """

    kind: str
    key_type: str
    data: str
    comment: str = ""

    @property
    def line(self) -> str:
        return f"person {self.key_type} {self.data} {self.comment}".rstrip()

    @property
    def ssh_public_key(self) -> str:
        """The key as an OpenSSH public key line (kind "ssh" only)."""
        return f"{self.key_type} {self.data}"

    @classmethod
    def parse(cls, text: str, where: str) -> PersonKey:
        """Parse `<key type> <base64> [comment]`; raise KeyFileError saying what is wrong."""
        parts = text.strip().split(None, 2)
        usage = (
            "expected 'person <ssh key type> <base64> [comment]' (as in a .pub file) or "
            "'person openpgp <base64 of the binary public key> [comment]' "
            "(`gpg --export KEYID | base64 -w0`)"
        )
        if len(parts) < 2:
            raise KeyFileError(f"{where}: {usage}, got {text.strip()!r}")
        key_type, data = parts[0], parts[1]
        if key_type == "openpgp":
            kind = "openpgp"
        elif key_type in SSH_KEY_TYPES:
            kind = "ssh"
        else:
            raise KeyFileError(
                f"{where}: unknown person key type {key_type!r}", hint=usage.capitalize()
            )
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise KeyFileError(f"{where}: the key is not valid base64: {data[:40]!r}") from exc
        if not raw:
            raise KeyFileError(f"{where}: the key is empty")
        return cls(kind, key_type, data, parts[2] if len(parts) > 2 else "")


@dataclass(frozen=True)
class TrustFile:
    """A parsed trust file, by role."""

    signers: list[PublicKey] = field(default_factory=list)
    approvers: list[PublicKey] = field(default_factory=list)
    people: list[PersonKey] = field(default_factory=list)

    def lines(self) -> list[tuple[str, str]]:
        """(role, line) for every key, in the file's role order."""
        return (
            [("signer", k.line) for k in self.signers]
            + [("approver", "approver " + k.line) for k in self.approvers]
            + [("person", k.line) for k in self.people]
        )


def parse_trust_file(text: str, where: str) -> TrustFile:
    """Parse a trust file; raise KeyFileError naming the first malformed line."""
    trust = TrustFile()
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        at = f"{where} line {number}"
        head, _, rest = stripped.partition(" ")
        if head == "approver":
            trust.approvers.append(PublicKey.parse_line(rest, at))
        elif head == "person":
            trust.people.append(PersonKey.parse(rest, at))
        elif head == "ed25519":
            trust.signers.append(PublicKey.parse_line(stripped, at))
        else:
            raise KeyFileError(
                f"{at}: expected 'ed25519 <base64> [comment]', 'approver ed25519 <base64> "
                f"[comment]' or 'person <key> [comment]', got {stripped[:80]!r}"
            )
    return trust


def parse_trust(text: str, where: str) -> list[PublicKey]:
    """The keys a trust file lets sign receipts (its plain `ed25519 ...` lines)."""
    return parse_trust_file(text, where).signers


def trust_file_at(git_dir: Path, commit: str) -> TrustFile:
    """The trust file committed at commit; raise ReceiptError when there is none."""
    data = read_blob_at(git_dir, commit, TRUST_PATH)
    if data is None:
        raise ReceiptError(
            f"no trust file ({TRUST_PATH}) at {commit[:12]}",
            hint="run `gatekeeper init` and commit .gatekeeper/ on the target branch",
        )
    return parse_trust_file(data.decode("utf-8", "replace"), f"{TRUST_PATH} at {commit[:12]}")


def trusted_keys_at(git_dir: Path, commit: str) -> list[PublicKey]:
    """The keys that may sign receipts at commit; raise ReceiptError when there is no file."""
    return trust_file_at(git_dir, commit).signers


def read_trust_file(path: Path) -> TrustFile:
    try:
        return parse_trust_file(path.read_text(), str(path))
    except FileNotFoundError:
        raise ReceiptError(f"no trust file at {path}") from None


def trusted_keys_file(path: Path) -> list[PublicKey]:
    return read_trust_file(path).signers
