"""Receipts stored as git notes: one envelope per line under refs/notes/gatekeeper.

One envelope per line lets `git notes merge -s cat_sort_uniq` union receipts.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gatekeeper.errors import GitError
from gatekeeper.git import HEX40, ZERO_OID, exact_ref, git
from gatekeeper.receipt.limits import MAX_ENVELOPE_BYTES

if TYPE_CHECKING:
    from gatekeeper.receipt import dsse

NOTES_REF = "refs/notes/gatekeeper"
# Private refs a writer builds its notes commit on before moving NOTES_REF.
PENDING_PREFIX = "refs/notes/gatekeeper-pending/"
# Notes are pushed by anyone who may push: bound what one note may cost every later reader.
MAX_NOTE_BYTES = 256 << 20  # a receipt of a run that changed 100,000 files is ~60 MiB
MAX_NOTE_LINES = 1000


@dataclass
class NoteText:
    """The envelope lines of one note, and what in it was over the limits (not read)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


# What bytes.strip() takes off both ends of a line.
_SPACE = frozenset(b" \t\n\r\x0b\x0c")
_WINDOW = 1 << 16


def split_note(data: bytes, start: int = 0, end: int | None = None) -> NoteText:
    """A note blob's non-empty lines, at most MAX_NOTE_LINES lines of MAX_ENVELOPE_BYTES each.

    The blob is data[start:end] (default: all of data), read in place: a receipt is megabytes,
    and each copy of it costs as much as reading it. Linear in the blob and never holds more
    than the limits allow; what is over a limit becomes a problem to report, never silently
    dropped.
    """
    end = len(data) if end is None else end
    text = NoteText()
    # The pieces data[start:end].split(b"\n", MAX_NOTE_LINES) would give, as bounds.
    pieces: list[tuple[int, int]] = []
    pos = start
    while len(pieces) < MAX_NOTE_LINES:
        newline = data.find(b"\n", pos, end)
        if newline < 0:
            break
        pieces.append((pos, newline))
        pos = newline + 1
    pieces.append((pos, end))
    if len(pieces) > MAX_NOTE_LINES and _stripped(data, *pieces[-1])[0] < pieces[-1][1]:
        text.problems.append(
            f"the note has more than {MAX_NOTE_LINES} lines (the limit); the rest was not read"
        )
        pieces = pieces[:-1]
    view = memoryview(data)
    for a, b in pieces:
        a, b = _stripped(data, a, b)
        if a == b:
            continue
        if b - a > MAX_ENVELOPE_BYTES:
            text.problems.append(
                f"a line of {b - a} bytes, over the envelope limit of "
                f"{MAX_ENVELOPE_BYTES}; not read"
            )
            continue
        text.lines.append(str(view[a:b], "utf-8", "replace"))
    return text


def _stripped(data: bytes, a: int, b: int) -> tuple[int, int]:
    """The bounds of data[a:b].strip() in data (a == b when nothing is left).

    Stripped in C a window at a time (bounded copies), not a byte at a time: whitespace
    compresses to nothing, so a small push can pad a note with hundreds of megabytes of it.
    """
    while a < b and data[a] in _SPACE:
        high = min(b, a + _WINDOW)
        a = high - len(data[a:high].lstrip())
    while b > a and data[b - 1] in _SPACE:
        low = max(a, b - _WINDOW)
        b = low + len(data[low:b].rstrip())
    return a, b


def oversized_note(size: int) -> str:
    return f"the note is {size} bytes, over the limit of {MAX_NOTE_BYTES}; not read"


def add_receipt_note(
    git_dir: Path, commit: str, envelope: dsse.Envelope, owner: str | None = None
) -> None:
    """Append the envelope to commit's gatekeeper note, keeping every note already there.

    `git notes add` moves the notes ref without a compare-and-swap, so two runs finishing
    together could each overwrite the other's notes commit. The note is written on a private
    ref instead, and the shared ref moves only from the value it was built on (`update-ref NEW
    OLD`); a concurrent writer makes that fail, and the whole step is done again.
    owner (a run id) names the private ref, so that once that run's launcher is gone (killed
    mid-write) `discard` knows the ref is dead. Raises GitError when the note could not be
    stored.
    """
    line = envelope.to_json()
    pending = f"{PENDING_PREFIX}{owner or os.getpid()}-{secrets.token_hex(4)}"
    last: GitError | None = None
    cleaned = False
    try:
        for attempt in range(60):
            old = exact_ref(NOTES_REF, git_dir)
            if old:
                git("update-ref", pending, old, git_dir=git_dir)
            else:
                git("update-ref", "-d", pending, git_dir=git_dir)
            try:
                if not _add_note(git_dir, pending, commit, line):
                    return  # the envelope is there already
                # The new notes commit must build on the value it replaces: if the private ref
                # vanished in between (someone removed it), git made a commit without a parent,
                # and moving NOTES_REF there would drop every earlier receipt.
                new, parent = _tip_and_parent(git_dir, pending)
                if new is None or parent != old:
                    raise GitError("the notes commit does not build on the current receipts")
                # One transaction: the shared ref moves only from old, and the private one goes.
                git("update-ref", "-m", "gatekeeper: add receipt", "--stdin", git_dir=git_dir,
                    input=(f"update {NOTES_REF} {new} {old or ZERO_OID}\n"
                           f"delete {pending} {new}\n").encode())  # fmt: skip
                cleaned = True
                return
            except GitError as exc:
                last = exc
                time.sleep(random.uniform(0.01, 0.05) * min(attempt + 1, 8))
    finally:
        if not cleaned:
            with contextlib.suppress(GitError):
                git("update-ref", "-d", pending, git_dir=git_dir)
    raise GitError(f"could not store the receipt note on {commit[:12]}: {last}")


_NOTES_AS_LAUNCHER = ("-c", "user.name=gatekeeper", "-c", "user.email=gatekeeper@localhost")


def _add_note(git_dir: Path, ref: str, commit: str, line: str) -> bool:
    """Add line to commit's note on ref, keeping the lines there; False when line is there
    already. Raise GitError.

    A new commit has no note: one call adds it (git refuses, without -f, to replace one). Only
    when a note is there is it read and written back with the line appended.
    """
    argv = (*_NOTES_AS_LAUNCHER, "notes", f"--ref={ref}", "add")
    try:
        git(*argv, "-F", "-", commit, git_dir=git_dir, input=f"{line}\n".encode())
        return True
    except GitError:
        existing = read_note(git_dir, commit, ref)
        if existing is None:
            raise
    lines = [x for x in existing.splitlines() if x.strip()]
    if line in lines:
        return False
    lines.append(line)
    git(*argv, "-f", "-F", "-", commit, git_dir=git_dir, input=("\n".join(lines) + "\n").encode())
    return True


def _tip_and_parent(git_dir: Path, ref: str) -> tuple[str | None, str | None]:
    """ref's commit and its first parent (None for either that is not there)."""
    out = git("rev-list", "--parents", "-n", "1", ref, "--", git_dir=git_dir, check=False)
    ids = out.decode().split()
    if not ids or not HEX40.fullmatch(ids[0]):
        return None, None
    return ids[0], ids[1] if len(ids) > 1 else None


def read_note(git_dir: Path, commit: str, ref: str = NOTES_REF) -> str | None:
    try:
        return git("notes", f"--ref={ref}", "show", commit, git_dir=git_dir).decode()
    except GitError:
        return None


def is_receipts_ref(ref: str) -> bool:
    """True for the local receipts ref and the remote-tracking copies fetched beside it."""
    return ref == NOTES_REF or ref.endswith("/gatekeeper")


def notes_refs(git_dir: Path) -> list[str]:
    """The local receipts ref and any remote-tracking copies fetched beside it."""
    out = git("for-each-ref", "--format=%(refname)", "refs/notes/", git_dir=git_dir).decode()
    refs = [r for r in out.splitlines() if is_receipts_ref(r)]
    return sorted(set(refs), key=lambda r: (r != NOTES_REF, r))


def _note_text(git_dir: Path, commit: str, ref: str) -> NoteText | None:
    """commit's note under ref, read within the limits; None when there is none."""
    out = git("notes", f"--ref={ref}", "list", commit, git_dir=git_dir, check=False)
    blob = out.decode().strip()
    if not HEX40.fullmatch(blob):
        return None
    size = int(git("cat-file", "-s", blob, git_dir=git_dir).decode().strip())
    if size > MAX_NOTE_BYTES:
        return NoteText(problems=[oversized_note(size)])
    return split_note(git("cat-file", "blob", blob, git_dir=git_dir))


def note_envelopes(
    git_dir: Path, commit: str
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(notes ref, envelope line) attached to commit across the receipt refs, and
    (notes ref, problem) for what was over the limits."""
    found: list[tuple[str, str]] = []
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for ref in notes_refs(git_dir):
        text = _note_text(git_dir, commit, ref)
        if text is None:
            continue
        problems += [(ref, p) for p in text.problems]
        for line in text.lines:
            if line not in seen:
                seen.add(line)
                found.append((ref, line))
    return found, problems


def envelopes_for(git_dir: Path, commit: str) -> list[tuple[str, str]]:
    """Every (notes ref, envelope line) attached to commit across the receipt refs."""
    return note_envelopes(git_dir, commit)[0]
