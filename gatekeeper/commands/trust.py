"""`gatekeeper trust add|list`: the repository's trust file, by role."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

from gatekeeper.commands.checkout_file import read_checkout_file, write_checkout_file
from gatekeeper.errors import ReceiptError, UsageError
from gatekeeper.git import discover, rev_parse
from gatekeeper.policy.model import TRUST_PATH
from gatekeeper.receipt.keys import PublicKey, load_key
from gatekeeper.receipt.trust import (
    PersonKey,
    TrustFile,
    parse_trust_file,
    trust_file_at,
)

HEADER = (
    "# Who this repository trusts; the gate reads this file from the target branch only.\n"
    "#   ed25519 <base64> [comment]            signs receipts (a launcher's key)\n"
    "#   approver ed25519 <base64> [comment]   approves or denies a run's escalations\n"
    "#   person <ssh or openpgp key> [comment] signs commits that need no receipt\n"
)


def _work_tree(repo: Path) -> Path:
    checkout = discover(repo).checkout
    if checkout is None:
        raise UsageError(f"{repo} is a bare repository", hint="pass --at REV to read a commit")
    return checkout


def _line_for(role: str, text: str | None) -> str:
    """The trust-file line for text in role; raise KeyFileError when it is malformed."""
    if text is None:
        if role == "person":
            raise UsageError(
                "a person's key must be given",
                hint="pass the public key line or a .pub file, e.g. ~/.ssh/id_ed25519.pub",
            )
        text = load_key().public.line
    candidate = Path(text).expanduser()
    if "\n" not in text and len(text) < 4096 and candidate.is_file():
        text = _key_file_text(candidate, role)
    text = " ".join(text.split())
    if role == "person":
        text = text.removeprefix("person ")
        return PersonKey.parse(text, "the key given").line
    text = text.removeprefix("approver ")
    key = PublicKey.parse_line(text, "the key given")
    return ("approver " if role == "approver" else "") + key.line


ARMOR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"


def _key_file_text(path: Path, role: str) -> str:
    """A key file's line: an SSH .pub file as it is; a person's OpenPGP key exported by gpg,
    binary or ASCII-armored, as `openpgp <base64>`."""
    data = path.read_bytes()[: 1 << 20]
    if role == "person" and data[:1] and data[0] & 0x80:
        return "openpgp " + base64.b64encode(data).decode()
    text = data.decode("utf-8", "replace").strip()
    if role == "person" and text.startswith(ARMOR_BEGIN):
        # Armor: headers, a blank line, base64 lines, then a `=CRC` line and the END line.
        body = text.split("\n\n", 1)[-1].splitlines()
        lines = [ln.strip() for ln in body if ln.strip() and not ln.startswith(("=", "-----"))]
        return "openpgp " + "".join(lines)
    return text


def add(*, repo: Path, line: str | None, approver: bool = False, person: bool = False) -> int:
    """Append a key in its role to the working tree's trust file, unless it is there already."""
    if approver and person:
        raise UsageError(
            "--approver and --person exclude each other",
            hint="add the key twice, once per role, if it has both",
        )
    role = "approver" if approver else "person" if person else "signer"
    top = _work_tree(repo)
    data = read_checkout_file(top, TRUST_PATH)
    text = HEADER if data is None else data.decode("utf-8", "surrogateescape")
    new = _line_for(role, line)
    current = parse_trust_file(text, str(top / TRUST_PATH))
    wanted = parse_trust_file(new, "the key given")
    if _has(current, wanted):
        print(f"trust: already in {TRUST_PATH} as {role}", file=sys.stderr)
        return 0
    if text and not text.endswith("\n"):
        text += "\n"
    write_checkout_file(top, TRUST_PATH, (text + new + "\n").encode("utf-8", "surrogateescape"))
    print(
        f"trust: added {'an' if role[:1] in 'aeiou' else 'a'} {role} key to {TRUST_PATH}; "
        "commit it on the target branch",
        file=sys.stderr,
    )
    return 0


def _has(current: TrustFile, wanted: TrustFile) -> bool:
    if wanted.signers:
        return any(k.raw == wanted.signers[0].raw for k in current.signers)
    if wanted.approvers:
        return any(k.raw == wanted.approvers[0].raw for k in current.approvers)
    person = wanted.people[0]
    return any((p.key_type, p.data) == (person.key_type, person.data) for p in current.people)


def listing(*, repo: Path, at: str | None = None, json_out: bool = False) -> int:
    """Print every key of the trust file (working tree, or committed at REV) with its role."""
    if at is not None:
        git_dir = discover(repo).git_dir
        trust = trust_file_at(git_dir, rev_parse(git_dir, at))
    else:
        top = _work_tree(repo)
        data = read_checkout_file(top, TRUST_PATH)
        if data is None:
            raise ReceiptError(f"no trust file at {top / TRUST_PATH}")
        trust = parse_trust_file(data.decode("utf-8", "surrogateescape"), str(top / TRUST_PATH))
    rows = []
    for key in trust.signers:
        rows.append({"role": "signer", "type": "ed25519", "id": key.keyid, "comment": key.comment})
    for key in trust.approvers:
        rows.append(
            {"role": "approver", "type": "ed25519", "id": key.keyid, "comment": key.comment}
        )
    for person in trust.people:
        rows.append(
            {
                "role": "person",
                "type": person.key_type,
                "id": person.fingerprint,
                "comment": person.comment,
            }
        )
    if json_out:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("(no keys)", file=sys.stderr)
    for row in rows:
        print(f"{row['role']:<9} {row['type']:<20} {row['id']}  {row['comment']}".rstrip())
    return 0
