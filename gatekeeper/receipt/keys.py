"""Ed25519 signing keys kept outside any repository, and the trust file of public keys."""

from __future__ import annotations

import base64
import hashlib
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gatekeeper.errors import KeyFileError

KEY_FILE = "signing_key.pem"


def config_dir() -> Path:
    """Where gatekeeper keeps the user's key: $GATEKEEPER_HOME, else $XDG_CONFIG_HOME/gatekeeper."""
    if os.environ.get("GATEKEEPER_HOME"):
        return Path(os.environ["GATEKEEPER_HOME"]).expanduser().resolve()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser().resolve() / "gatekeeper"


_UNREACHABLE_HINT = (
    "set GATEKEEPER_HOME (or XDG_CONFIG_HOME, or HOME) to a folder of your own; the key lives "
    "in $GATEKEEPER_HOME, else $XDG_CONFIG_HOME/gatekeeper, else ~/.config/gatekeeper"
)


def default_key_path() -> Path:
    return config_dir() / KEY_FILE


@dataclass(frozen=True)
class PublicKey:
    """A public key as the trust file carries it: `ed25519 <base64> <comment>`."""

    raw: bytes
    comment: str = ""

    @property
    def keyid(self) -> str:
        return "SHA256:" + hashlib.sha256(self.raw).hexdigest()

    @property
    def line(self) -> str:
        text = f"ed25519 {base64.b64encode(self.raw).decode()}"
        return f"{text} {self.comment}".rstrip()

    def verify(self, signature: bytes, data: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, data)
        except InvalidSignature:
            return False
        return True

    @classmethod
    def parse_line(cls, line: str, where: str = "trust file") -> PublicKey:
        parts = line.strip().split(None, 2)
        if len(parts) < 2 or parts[0] != "ed25519":
            raise KeyFileError(f"{where}: expected 'ed25519 <base64 key> [comment]', got {line!r}")
        try:
            raw = base64.b64decode(parts[1], validate=True)
        except ValueError as exc:
            raise KeyFileError(f"{where}: the key is not valid base64: {parts[1]!r}") from exc
        if len(raw) != 32:
            raise KeyFileError(f"{where}: an Ed25519 public key has 32 bytes, this has {len(raw)}")
        return cls(raw, parts[2] if len(parts) > 2 else "")


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey
    public: PublicKey
    path: Path

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)


def _comment() -> str:
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = os.environ.get("USER") or str(os.getuid())
    host = os.uname().nodename
    return f"{user}@{host}"


def generate_key(path: Path | None = None, force: bool = False) -> SigningKey:
    """Create a key at path (0600, folder 0700); raise KeyFileError if one exists and not force."""
    path = path or default_key_path()
    try:
        exists = path.lstat() is not None
    except FileNotFoundError:
        exists = False
    except OSError as exc:
        raise KeyFileError(f"cannot create a signing key at {path}: {exc.strerror}",
                           hint=_UNREACHABLE_HINT) from None  # fmt: skip
    if exists and not force:
        raise KeyFileError(
            f"a signing key already exists at {path}",
            hint="`gatekeeper keys show` prints it; pass --force to replace it (old receipts stay "
            "verifiable only while its public key stays in the trust file)",
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise KeyFileError(f"cannot create the key folder {path.parent}: {exc.strerror}",
                           hint=_UNREACHABLE_HINT) from None  # fmt: skip
    from cryptography.hazmat.primitives import serialization  # see load_key

    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    os.replace(tmp, path)
    comment_path = path.with_suffix(".comment")
    comment_path.write_text(_comment() + "\n")
    return load_key(path)


def load_key(path: Path | None = None) -> SigningKey:
    """Load the signing key; raise KeyFileError when it is missing, unreadable or too open."""
    path = path or default_key_path()
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KeyFileError(
            f"no signing key at {path}", hint="create one with `gatekeeper keys generate`"
        ) from None
    except OSError as exc:  # a folder on the way this user may not enter (HOME of another)
        raise KeyFileError(f"cannot reach the signing key at {path}: {exc.strerror}",
                           hint=_UNREACHABLE_HINT) from None  # fmt: skip
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise KeyFileError(
            f"signing key {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o})",
            hint=f"chmod 600 {path}",
        )
    # Imported here: PEM and the other key formats weigh more than the Ed25519 part, and
    # verifying a receipt (the gate) never needs them.
    from cryptography.hazmat.primitives import serialization

    try:
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise KeyFileError(f"cannot read the signing key {path}: {exc.strerror}",
                           hint=f"it must belong to you (chown to your user; chmod 600 {path})",
                           ) from None  # fmt: skip
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"{path} is not an Ed25519 key")
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    try:
        comment = path.with_suffix(".comment").read_text().strip()
    except (OSError, UnicodeDecodeError):
        comment = ""  # no comment, or one this user may not read: the key works without
    return SigningKey(private, PublicKey(raw, comment), path)
