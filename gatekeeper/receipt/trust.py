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
import hashlib
import struct
from collections.abc import Callable
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

    @property
    def raw(self) -> bytes:
        return base64.b64decode(self.data)

    @property
    def fingerprint(self) -> str:
        """What git reports for a signature by this key: `SHA256:...` (SSH, as ssh-keygen
        prints it) or the OpenPGP primary key's fingerprint in upper-case hex."""
        if self.kind == "ssh":
            return ssh_fingerprint(self.raw)
        return openpgp_fingerprint(self.raw, "the key")

    @property
    def label(self) -> str:
        """How reports name the person: `<comment> (<key type> <fingerprint>)`."""
        who = self.comment or "unnamed person key"
        return f"{who} ({self.key_type} {self.fingerprint})"

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
        if kind == "ssh":
            _check_ssh_blob(raw, key_type, where)
        else:
            openpgp_fingerprint(raw, where)  # exactly one public key, nothing secret
        return cls(kind, key_type, data, parts[2] if len(parts) > 2 else "")


def ssh_fingerprint(blob: bytes) -> str:
    """`SHA256:<base64>` of an SSH public key blob, as ssh-keygen and git print it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def ssh_ed25519_blob(raw: bytes) -> bytes:
    """The SSH public key blob of a raw Ed25519 key (to recognise a receipt key in a commit)."""
    name = b"ssh-ed25519"
    return struct.pack(">I", len(name)) + name + struct.pack(">I", len(raw)) + raw


def _check_ssh_blob(raw: bytes, key_type: str, where: str) -> None:
    """Raise KeyFileError unless the blob is an SSH public key of the type the line states.

    ssh-keygen goes by the type inside the blob; a line that says one type and holds another
    would show reviewers a key that is not the one trusted.
    """
    if len(raw) < 4:
        raise KeyFileError(f"{where}: the key is not an SSH public key blob")
    (length,) = struct.unpack(">I", raw[:4])
    embedded = raw[4 : 4 + length]
    if length > 64 or len(embedded) != length or len(raw) <= 4 + length:
        raise KeyFileError(f"{where}: the key is not an SSH public key blob")
    if embedded != key_type.encode():
        raise KeyFileError(
            f"{where}: the line says {key_type} but the key inside is "
            f"{embedded.decode('ascii', 'replace')!r}",
            hint="copy the whole line of the .pub file, type and key together",
        )


def _openpgp_packets(data: bytes, where: str) -> list[tuple[int, bytes]]:
    """(tag, body) of each OpenPGP packet (RFC 4880 section 4.2); raise KeyFileError."""
    packets = []
    at = 0
    while at < len(data):
        head = data[at]
        if not head & 0x80:
            raise KeyFileError(f"{where}: not an OpenPGP public key (gpg --export output)")
        if head & 0x40:  # new format
            tag = head & 0x3F
            first = data[at + 1] if at + 1 < len(data) else 256
            if first < 192:
                length, at = first, at + 2
            elif first < 224 and at + 2 < len(data):
                length, at = ((first - 192) << 8) + data[at + 2] + 192, at + 3
            elif first == 255 and at + 6 <= len(data):
                (length,) = struct.unpack(">I", data[at + 2 : at + 6])
                at += 6
            else:  # partial lengths never occur in key material
                raise KeyFileError(f"{where}: the OpenPGP key is truncated or malformed")
        else:
            tag, kind = (head >> 2) & 0x0F, head & 0x03
            if kind == 3:
                raise KeyFileError(f"{where}: the OpenPGP key is truncated or malformed")
            size = 1 << kind
            if at + 1 + size > len(data):
                raise KeyFileError(f"{where}: the OpenPGP key is truncated or malformed")
            length = int.from_bytes(data[at + 1 : at + 1 + size], "big")
            at += 1 + size
        if at + length > len(data):
            raise KeyFileError(f"{where}: the OpenPGP key is truncated or malformed")
        packets.append((tag, data[at : at + length]))
        at += length
    return packets


def openpgp_fingerprint(data: bytes, where: str) -> str:
    """The fingerprint of the one OpenPGP public key in data (binary `gpg --export`).

    Raises KeyFileError when data holds secret key material, no key, or more than one primary
    key: a person line pins exactly one key.
    """
    packets = _openpgp_packets(data, where)
    tags = [tag for tag, _ in packets]
    if 5 in tags or 7 in tags:
        raise KeyFileError(
            f"{where}: this is a secret key; a trust file holds public keys only",
            hint="use `gpg --export KEYID | base64 -w0`, never --export-secret-keys",
        )
    if not packets or tags[0] != 6 or tags.count(6) != 1:
        raise KeyFileError(
            f"{where}: expected exactly one OpenPGP public key, found {tags.count(6)}",
            hint="export one key per person line: `gpg --export KEYID | base64 -w0`",
        )
    body = packets[0][1]
    if not body:
        raise KeyFileError(f"{where}: the OpenPGP key is truncated or malformed")
    if body[0] == 4:
        if len(body) > 0xFFFF:  # a v4 fingerprint hashes a two-octet length
            raise KeyFileError(f"{where}: the OpenPGP key is truncated or malformed")
        return hashlib.sha1(b"\x99" + struct.pack(">H", len(body)) + body).hexdigest().upper()
    if body[0] in (5, 6):
        prefix = b"\x9a" if body[0] == 5 else b"\x9b"
        return hashlib.sha256(prefix + struct.pack(">I", len(body)) + body).hexdigest().upper()
    raise KeyFileError(f"{where}: OpenPGP key version {body[0]} is not supported")


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


def trust_file_at(
    git_dir: Path, commit: str, read: Callable[[], bytes | None] | None = None
) -> TrustFile:
    """The trust file committed at commit; raise ReceiptError when there is none.

    read: gives the file's bytes (None when absent), read from git already (RulesAhead)."""
    data = read_blob_at(git_dir, commit, TRUST_PATH) if read is None else read()
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
