"""Trust files: which Ed25519 keys may sign receipts for a repository."""

from __future__ import annotations

from pathlib import Path

from gatekeeper.errors import ReceiptError
from gatekeeper.git import read_blob_at
from gatekeeper.policy.model import TRUST_PATH
from gatekeeper.receipt.keys import PublicKey, parse_trust


def trusted_keys_at(git_dir: Path, commit: str) -> list[PublicKey]:
    """The trust file committed at commit; raise ReceiptError when there is none."""

    data = read_blob_at(git_dir, commit, TRUST_PATH)
    if data is None:
        raise ReceiptError(
            f"no trust file ({TRUST_PATH}) at {commit[:12]}",
            hint="run `gatekeeper init` and commit .gatekeeper/ on the target branch",
        )
    return parse_trust(data.decode("utf-8", "replace"), f"{TRUST_PATH} at {commit[:12]}")


def trusted_keys_file(path: Path) -> list[PublicKey]:
    try:
        return parse_trust(path.read_text(), str(path))
    except FileNotFoundError:
        raise ReceiptError(f"no trust file at {path}") from None
