"""Receipts stored as git notes: one envelope per line under refs/notes/gatekeeper.

One envelope per line lets `git notes merge -s cat_sort_uniq` union receipts.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import time
from pathlib import Path

from gatekeeper.errors import GitError
from gatekeeper.git import ZERO_OID, git
from gatekeeper.receipt import dsse

NOTES_REF = "refs/notes/gatekeeper"
# Private refs a writer builds its notes commit on before moving NOTES_REF.
PENDING_PREFIX = "refs/notes/gatekeeper-pending/"


def add_receipt_note(git_dir: Path, commit: str, envelope: dsse.Envelope) -> None:
    """Append the envelope to commit's gatekeeper note, keeping every note already there.

    `git notes add` moves the notes ref without a compare-and-swap, so two runs finishing
    together could each overwrite the other's notes commit. The note is written on a private
    ref instead, and the shared ref moves only from the value it was built on (`update-ref NEW
    OLD`); a concurrent writer makes that fail, and the whole step is done again.
    Raises GitError when the note could not be stored.
    """
    line = envelope.to_json()
    pending = f"{PENDING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    last: GitError | None = None
    try:
        for attempt in range(60):
            old = _ref_value(git_dir, NOTES_REF)
            if old:
                git("update-ref", pending, old, git_dir=git_dir)
            else:
                git("update-ref", "-d", pending, git_dir=git_dir)
            existing = read_note(git_dir, commit, pending) or ""
            lines = [x for x in existing.splitlines() if x.strip()]
            if line in lines and old:
                return
            lines.append(line)
            try:
                git(
                    "-c", "user.name=gatekeeper", "-c", "user.email=gatekeeper@localhost",
                    "notes", f"--ref={pending}", "add", "-f", "-F", "-", commit,
                    git_dir=git_dir, input=("\n".join(lines) + "\n").encode(),
                )  # fmt: skip
                new = _ref_value(git_dir, pending)
                git("update-ref", "-m", "gatekeeper: add receipt", NOTES_REF, new,
                    old or ZERO_OID, git_dir=git_dir)  # fmt: skip
                return
            except GitError as exc:
                last = exc
                time.sleep(random.uniform(0.01, 0.05) * min(attempt + 1, 8))
    finally:
        with contextlib.suppress(GitError):
            git("update-ref", "-d", pending, git_dir=git_dir)
    raise GitError(f"could not store the receipt note on {commit[:12]}: {last}")


def _ref_value(git_dir: Path, ref: str) -> str | None:
    try:
        return git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}",
                   git_dir=git_dir).decode().strip() or None  # fmt: skip
    except GitError:
        return None


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
