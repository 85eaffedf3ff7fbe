"""Receipts stored as git notes: one envelope per line under refs/notes/gatekeeper.

One envelope per line lets `git notes merge -s cat_sort_uniq` union receipts.
"""

from __future__ import annotations

import time
from pathlib import Path

from gatekeeper.errors import GitError
from gatekeeper.git import git
from gatekeeper.receipt import dsse

NOTES_REF = "refs/notes/gatekeeper"


def add_receipt_note(git_dir: Path, commit: str, envelope: dsse.Envelope) -> None:
    """Append the envelope to commit's gatekeeper note, keeping receipts already there.

    The notes ref is updated compare-and-swap by git; a concurrent writer makes the update
    fail, so it is read and tried again rather than overwritten.
    """
    line = envelope.to_json()
    last: GitError | None = None
    for attempt in range(8):
        existing = read_note(git_dir, commit, NOTES_REF) or ""
        lines = [x for x in existing.splitlines() if x.strip()]
        if line not in lines:
            lines.append(line)
        try:
            git(
                "-c", "user.name=gatekeeper", "-c", "user.email=gatekeeper@localhost",
                "notes", f"--ref={NOTES_REF}", "add", "-f", "-F", "-", commit,
                git_dir=git_dir, input=("\n".join(lines) + "\n").encode(),
            )  # fmt: skip
        except GitError as exc:
            last = exc
            time.sleep(0.05 * (attempt + 1))
            continue
        if line in (read_note(git_dir, commit, NOTES_REF) or "").splitlines():
            return
    raise GitError(f"could not store the receipt note on {commit[:12]}: {last}")


def read_note(git_dir: Path, commit: str, ref: str = NOTES_REF) -> str | None:
    try:
        return git("notes", f"--ref={ref}", "show", commit, git_dir=git_dir).decode()
    except GitError:
        return None


def notes_refs(git_dir: Path) -> list[str]:
    """The local receipts ref and any remote-tracking copies fetched beside it."""
    out = git("for-each-ref", "--format=%(refname)", "refs/notes/", git_dir=git_dir).decode()
    refs = [r for r in out.splitlines() if r == NOTES_REF or r.endswith("/gatekeeper")]
    return sorted(set(refs), key=lambda r: (r != NOTES_REF, r))


def envelopes_for(git_dir: Path, commit: str) -> list[tuple[str, str]]:
    """Every (notes ref, envelope line) attached to commit across the receipt refs."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for ref in notes_refs(git_dir):
        text = read_note(git_dir, commit, ref)
        for line in (text or "").splitlines():
            if line.strip() and line not in seen:
                seen.add(line)
                found.append((ref, line))
    return found
