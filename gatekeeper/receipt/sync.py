"""Make receipts travel: fetch the remote's receipts, merge them into ours, push, retry.

Notes hold one envelope per line, so `git notes merge -s cat_sort_uniq` is a union: when two
people push receipts at once, the second push is refused as non-fast-forward (the server hook
refuses to lose receipts), and the next round merges and pushes again.
"""

from __future__ import annotations

import time
from pathlib import Path

from gatekeeper.errors import GitError
from gatekeeper.git import exact_ref, git, is_ancestor
from gatekeeper.receipt.notes import NOTES_REF

IDENTITY = ("-c", "user.name=gatekeeper", "-c", "user.email=gatekeeper@localhost")


def tracking_ref(remote: str) -> str:
    return f"refs/notes/remotes/{remote}/gatekeeper"


def _oid(git_dir: Path, ref: str) -> str | None:
    return exact_ref(ref, git_dir)


def fetch_notes(git_dir: Path, remote: str) -> str | None:
    """Fetch the remote's receipts into their tracking ref; None when the remote has none."""
    tracking = tracking_ref(remote)
    out = git("ls-remote", remote, NOTES_REF, git_dir=git_dir).decode()
    # ls-remote matches the tail of ref names (refs/heads/refs/notes/gatekeeper too): exact only.
    if not any(line.split("\t")[-1] == NOTES_REF for line in out.splitlines()):
        return None
    git(
        "fetch",
        "--quiet",
        "--no-write-fetch-head",
        remote,
        f"+{NOTES_REF}:{tracking}",
        git_dir=git_dir,
    )
    return _oid(git_dir, tracking)


def merge_notes(git_dir: Path, other: str) -> None:
    """Union other's receipts into the local receipts ref."""
    local = _oid(git_dir, NOTES_REF)
    if local is None:
        git("update-ref", NOTES_REF, other, git_dir=git_dir)
    elif not is_ancestor(git_dir, other, local):
        git(
            *IDENTITY,
            "notes",
            f"--ref={NOTES_REF}",
            "merge",
            "--quiet",
            "-s",
            "cat_sort_uniq",
            other,
            git_dir=git_dir,
        )


def sync_notes(git_dir: Path, remote: str = "origin", attempts: int = 6) -> str:
    """Fetch, merge and push receipts until the push lands; return the pushed notes commit.

    Raises GitError when the push keeps failing.
    """
    last: GitError | None = None
    for attempt in range(attempts):
        theirs = fetch_notes(git_dir, remote)
        if theirs is not None:
            merge_notes(git_dir, theirs)
        ours = _oid(git_dir, NOTES_REF)
        if ours is None:
            raise GitError(
                "there are no receipts to push", hint="run the agent with `gatekeeper run`"
            )
        if ours == theirs:
            return ours
        try:
            git("push", "--quiet", remote, f"{NOTES_REF}:{NOTES_REF}", git_dir=git_dir)
            return ours
        except GitError as exc:  # someone pushed receipts in between: merge theirs and retry
            last = exc
            time.sleep(0.1 * (attempt + 1))
    raise GitError(f"could not push {NOTES_REF} to {remote} after {attempts} attempts: {last}")
