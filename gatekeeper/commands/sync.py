"""`gatekeeper receipt sync`: fetch, merge and push refs/notes/gatekeeper until it lands."""

from __future__ import annotations

import sys
from pathlib import Path

from gatekeeper.git import discover
from gatekeeper.receipt.notes import NOTES_REF
from gatekeeper.receipt.sync import sync_notes


def sync(*, repo: Path, remote: str = "origin") -> int:
    """Union the remote's receipts with ours and push them; raise GitError when it cannot."""
    oid = sync_notes(discover(repo).git_dir, remote)
    print(
        f"receipts: {NOTES_REF} on {remote} is {oid[:12]} (merged with the remote's, pushed)",
        file=sys.stderr,
    )
    return 0
