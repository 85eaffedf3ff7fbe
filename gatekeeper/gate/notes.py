"""Read receipts straight from notes commits, so a server hook can read the notes being pushed.

A notes commit's tree maps annotated object ids (possibly fanned out as `ab/cdef...`) to note
blobs; each note holds one DSSE envelope per line. Notes are pushed by anyone who may push, so
reading is bounded: the notes of the commits under review are looked up by id, each note blob
and line is size-checked before it is read, and whatever is over a limit comes back as a
problem line that the gate reports as `malformed-receipt`. Where a whole notes tree is listed
(receipts on commits outside the range; what a push of the notes ref changes), the listing is
read with gate.diffread's bound.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.gate.diffread import read_git
from gatekeeper.git import HEX40, git
from gatekeeper.receipt.notes import (
    MAX_NOTE_BYTES,
    NOTES_REF,
    NoteText,
    is_receipts_ref,
    oversized_note,
    split_note,
)

# How deep a fanned-out notes tree is searched (git fans out one level per 256 notes or so;
# three levels hold billions). A note hidden deeper only hides the pusher's own receipts.
MAX_FANOUT = 3
# What receipts on commits outside the range (a rebase's original commit) may cost in all:
# bytes of note blobs read, and envelope lines kept.
ELSEWHERE_BUDGET = 64 << 20
ELSEWHERE_MAX_LINES = 100_000
# And what the notes on the range itself may cost: past it, a problem (the rest unread). A
# range has a line or three per commit a run made; a push of under a megabyte can put
# thousands of lines, or hundreds of megabytes, on each of thousands of commits.
RANGE_BUDGET = 256 << 20
RANGE_MAX_LINES = 100_000
# What the notes a push of the receipts ref changes may cost to read, before and after, in all
# (a run's receipt is a megabyte or so; one of 100,000 files some 60 MiB).
NOTES_PUSH_BUDGET = 256 << 20
# What to do about a notes tree too large to list (a receipts ref holds one entry of some
# 100 bytes per commit a run made: the bound is some 600,000 of them).
NOTES_TOO_LARGE = (
    "The gate blocks (and the server's hook refuses such a push of the receipts ref): a "
    "receipts ref holds one small note per commit a run made; look at what was pushed to "
    f"it (`git ls-tree -r -l {NOTES_REF} | head`) and push receipts with `gatekeeper "
    "receipt sync`"
)


@dataclass(frozen=True)
class NoteLine:
    """One envelope line, the commit whose note holds it, and where it was read from.

    `problem` is set (and `line` empty) for a part of a note that was over a limit; `cut` when
    that limit is the range's in all (what was not read is other commits' notes too).
    """

    annotated: str
    line: str
    source: str
    problem: str | None = None
    cut: bool = False


@dataclass(frozen=True)
class _Entry:
    annotated: str
    blob: str
    size: int


def local_sources(git_dir: Path) -> list[tuple[str, str]]:
    """(label, notes commit) for the local receipts ref and any remote-tracking copies (the
    refs notes_refs names, in its order), with one `git for-each-ref`."""
    out = git("for-each-ref", "--format=%(objectname) %(refname)", "refs/notes/", git_dir=git_dir)
    found: dict[str, str] = {}
    for line in out.decode("utf-8", "surrogateescape").splitlines():
        oid, _, ref = line.partition(" ")
        if is_receipts_ref(ref):
            found[ref] = oid
    return [(ref, found[ref]) for ref in sorted(found, key=lambda r: (r != NOTES_REF, r))]


def note_paths(oid: str) -> list[str]:
    """Where a note on oid may sit in a notes tree: `oid`, `ab/cdef...`, `ab/cd/ef...`, ..."""
    return [
        "/".join([oid[2 * i : 2 * i + 2] for i in range(depth)] + [oid[2 * depth :]])
        for depth in range(MAX_FANOUT + 1)
    ]


def _lookup(git_dir: Path, notes_commit: str, wanted: Iterable[str]) -> list[_Entry]:
    """The note blobs on the wanted objects, found by path with one `cat-file --batch-check`."""
    queries = [(oid, path) for oid in sorted(set(wanted)) for path in note_paths(oid)]
    if not queries:
        return []
    out = git(
        "cat-file",
        "--batch-check=%(objectname) %(objecttype) %(objectsize)",
        git_dir=git_dir,
        input="".join(f"{notes_commit}:{path}\n" for _, path in queries).encode(),
    ).decode()
    entries = []
    for (oid, _), line in zip(queries, out.splitlines(), strict=True):
        fields = line.split(" ")
        if len(fields) == 3 and fields[1] == "blob" and HEX40.fullmatch(fields[0]):
            entries.append(_Entry(oid, fields[0], int(fields[2])))
    return entries


def _list_notes(git_dir: Path, notes_commit: str) -> list[_Entry]:
    """Every note in a notes commit's tree, with its blob's size."""
    out = read_git(
        git_dir, ["ls-tree", "-r", "-l", "-z", "--full-tree", notes_commit],
        f"the notes tree of {notes_commit[:12]}", limit=None, hint=NOTES_TOO_LARGE,
    )  # fmt: skip
    notes = []
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        fields = meta.decode().split()
        annotated = path.decode("ascii", "replace").replace("/", "")
        if len(fields) == 4 and fields[1] == "blob" and HEX40.fullmatch(annotated):
            notes.append(_Entry(annotated, fields[2], int(fields[3])))
    return notes


def read_blobs(git_dir: Path, oids: list[str]) -> dict[str, bytes]:
    """Read many blobs with one `git cat-file --batch` (the caller checked their sizes)."""
    out, spans = blob_spans(git_dir, oids)
    return {oid: out[a:b] for oid, (a, b) in spans.items()}


def blob_spans(git_dir: Path, oids: list[str]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """Many blobs read with one `git cat-file --batch`: its output and where in it each blob
    is (a receipt is megabytes: read in place, not copied). The caller checked their sizes."""
    if not oids:
        return b"", {}
    unique = list(dict.fromkeys(oids))
    listed = "".join(o + "\n" for o in unique).encode()
    out = git("cat-file", "--batch", git_dir=git_dir, input=listed, large=True)
    spans: dict[str, tuple[int, int]] = {}
    pos = 0
    for oid in unique:
        end = out.index(b"\n", pos)
        header = out[pos:end].decode().split(" ")
        pos = end + 1
        if len(header) < 3 or header[1] == "missing":
            continue
        size = int(header[2])
        spans[oid] = (pos, min(pos + size, len(out)))
        pos += size + 1
    return out, spans


# Note blobs read already: blob id -> (the output of git that holds it, start, end).
ReadAhead = dict[str, tuple[bytes, int, int]]


def read_ahead(git_dir: Path, sources: list[tuple[str, str]], annotated: str) -> ReadAhead:
    """The note blobs on one object across sources (those within MAX_NOTE_BYTES), read before
    read_notes asks for them. Raises GitError."""
    blobs = [
        e.blob
        for _, commit in sources
        for e in _lookup(git_dir, commit, [annotated])
        if e.size <= MAX_NOTE_BYTES
    ]
    out, spans = blob_spans(git_dir, blobs)
    return {blob: (out, a, b) for blob, (a, b) in spans.items()}


def read_notes(
    git_dir: Path,
    sources: list[tuple[str, str]],
    wanted: set[str] | None = None,
    exclude: set[str] | None = None,
    budget: int | None = None,
    ahead: ReadAhead | None = None,
) -> dict[str, list[NoteLine]]:
    """Envelope lines by annotated commit, across sources, without duplicates.

    With wanted, only the notes on those commits are looked up; otherwise the whole tree is
    listed (less exclude), and at most budget bytes of note blobs (smallest first) and
    ELSEWHERE_MAX_LINES lines are read. Notes and lines over the limits become NoteLines with
    a problem. A blob this reads that is in ahead (read_ahead) is taken from there: blobs are
    found by their id, so it is the same bytes.
    """
    listed: list[tuple[str, _Entry]] = []
    for label, commit in sources:
        entries = (
            _lookup(git_dir, commit, wanted)
            if wanted is not None
            else [e for e in _list_notes(git_dir, commit) if e.annotated not in (exclude or ())]
        )
        listed += [(label, e) for e in entries]
    readable = sorted({e.blob: e.size for _, e in listed if e.size <= MAX_NOTE_BYTES}.items(),
                      key=lambda item: item[1])  # fmt: skip
    spent, kept = 0, []
    for blob, size in readable:
        if spent + size > (RANGE_BUDGET if budget is None else budget):
            break
        spent += size
        kept.append((blob, size))
    over = {blob for blob, _ in readable[len(kept) :]}  # not read: past the budget
    readable = kept
    max_lines = RANGE_MAX_LINES if budget is None else ELSEWHERE_MAX_LINES
    ahead = {blob: ahead[blob] for blob, _ in readable if blob in ahead} if ahead else {}
    out, spans = blob_spans(git_dir, [blob for blob, _ in readable if blob not in ahead])

    found: dict[str, list[NoteLine]] = {}
    seen: set[tuple[str, str]] = set()
    texts: dict[str, NoteText] = {}

    def add(note: NoteLine) -> None:
        key = (note.annotated, note.line or f"problem:{note.source}:{note.problem}")
        if key not in seen:
            seen.add(key)
            found.setdefault(note.annotated, []).append(note)

    for label, entry in listed:
        if entry.size > MAX_NOTE_BYTES:
            add(NoteLine(entry.annotated, "", label, oversized_note(entry.size)))
            continue
        if entry.blob in texts:
            text = texts[entry.blob]  # one blob on many commits is split once, not per commit
        elif entry.blob in ahead:
            text = texts[entry.blob] = split_note(*ahead[entry.blob])
        elif entry.blob in spans:
            text = texts[entry.blob] = split_note(out, *spans[entry.blob])
        elif budget is not None or entry.blob not in over:
            continue  # over the budget of notes outside the range: they could only add coverage
        else:
            add(NoteLine(entry.annotated, "", label, f"not read: the notes on the range are "
                         f"over {RANGE_BUDGET >> 20} MiB in all", cut=True))  # fmt: skip
            break
        if len(seen) + len(text.lines) + len(text.problems) > max_lines:
            if budget is None:  # (on the range: a problem, which blocks)
                add(NoteLine(entry.annotated, "", label, f"not read: the notes on the range "
                             f"hold over {RANGE_MAX_LINES:,} lines", cut=True))  # fmt: skip
            break  # notes outside the range could only add coverage: stop, fail closed
        for line in text.lines:
            add(NoteLine(entry.annotated, line, label))
        for problem in text.problems:
            add(NoteLine(entry.annotated, "", label, problem))
    return found


def lost_lines(git_dir: Path, old: str, new: str) -> list[str]:
    """What updating the notes from commit old to commit new would lose, one problem each.

    Notes may only gain lines: every line the gate reads on an object in old must still be
    read on it in new. Lines are read as the gate reads them (split_note, from where the gate
    looks: note_paths), so a line moved where the gate never looks (`ab/cd/ef/01/...`, a
    3-character fan-out) or changed in a way another reading would forgive (a trailing
    U+3000) counts as lost. New or changed note blobs over MAX_NOTE_BYTES are problems too.
    Reads only the notes of objects whose note paths changed between the trees. Raises
    DiffTooLarge when that change is past gate.diffread's bound in bytes.
    """
    out = read_git(
        git_dir, ["diff-tree", "-r", "-t", "-z", "--no-renames", "--no-abbrev", old, new],
        f"the change of the notes from {old[:12]} to {new[:12]}", limit=None,
        hint=NOTES_TOO_LARGE,
    )  # fmt: skip
    fields = out.split(b"\0")
    touched: set[str] = set()  # objects with a note that changed, appeared or went away
    trees = [f"{new}^{{tree}}"]  # the new tree objects: the root, and each folder changed
    for i in range(1, len(fields), 2):
        if not fields[i - 1].startswith(b":"):
            continue
        _old_mode, new_mode, _old_blob, new_blob, _status = fields[i - 1][1:].decode().split(" ")
        if new_mode == "040000":
            trees.append(new_blob)
        annotated = fields[i].decode("ascii", "replace").replace("/", "")
        if HEX40.fullmatch(annotated):
            touched.add(annotated)
    # A tree git itself never writes (two entries of one name, a name with a `/`) is read one
    # way by the lookup of a path and another by diff-tree: refused, whatever it holds.
    problems = _malformed(git_dir, trees)
    if problems or not touched:
        return problems
    before, after = _lookup(git_dir, old, touched), _lookup(git_dir, new, touched)
    kept = {(e.annotated, e.blob) for e in after}  # (a blob left where it was is unchanged)
    old_blobs = {e.blob for e in before}
    problems += [
        f"the note on {e.annotated[:12]} is {e.size} bytes, over the limit of {MAX_NOTE_BYTES}"
        for e in after
        if e.size > MAX_NOTE_BYTES and e.blob not in old_blobs
    ]
    if problems:
        return problems
    sizes = {e.blob: e.size for e in (*before, *after) if e.size <= MAX_NOTE_BYTES}
    if sum(sizes.values()) > NOTES_PUSH_BUDGET:
        return [f"the notes it changes are over {NOTES_PUSH_BUDGET >> 20} MiB in all, more than "
                "the gate reads for one push; push the receipts of fewer runs at once"]  # fmt: skip
    out, spans = blob_spans(git_dir, list(sizes))  # (read in place: no copy of each)
    lines_of: dict[str, set[bytes]] = {}  # blob -> its lines' digests, each blob split once

    def gate_lines(blob: str) -> set[bytes]:
        if blob not in lines_of:
            text = split_note(out, *spans[blob]).lines if blob in spans else []
            lines_of[blob] = {hashlib.sha256(line.encode("utf-8", "surrogateescape")).digest()
                              for line in text}  # fmt: skip
        return lines_of[blob]

    read: dict[str, set[bytes]] = {}
    for e in after:
        read.setdefault(e.annotated, set()).update(gate_lines(e.blob))
    lost: dict[str, int] = {}
    for e in before:
        if (e.annotated, e.blob) in kept:
            continue  # left as it was
        if e.size > MAX_NOTE_BYTES:
            problems.append(f"the note on {e.annotated[:12]} was over the size limit; it "
                            "cannot be changed")  # fmt: skip
            continue
        missing = gate_lines(e.blob) - read.get(e.annotated, set())
        if missing:
            lost[e.annotated] = lost.get(e.annotated, 0) + len(missing)
    problems += [f"the note on {annotated[:12]} would lose {count} receipt or approval line(s)"
                 for annotated, count in lost.items()]  # fmt: skip
    return problems


# The modes git writes in a tree; and the entries of one notes tree level past which git fans
# out (a flat level of thousands would make each path lookup of the check below a long scan).
TREE_MODES = (b"40000", b"100644", b"100755", b"120000", b"160000")
MAX_NOTES_TREE_ENTRIES = 1024


def _malformed(git_dir: Path, trees: list[str]) -> list[str]:
    """What is wrong with tree objects of a notes commit that git would not write: an entry
    name that is empty, `.`, `..` or holds a `/`, a mode git never writes (`040000`), two
    entries of one name, entries out of git's order, more entries than git leaves on one
    level. One `cat-file --batch` for them all."""
    out, spans = blob_spans(git_dir, trees)
    problems: list[str] = []
    for tree in trees:
        if tree not in spans:
            continue
        start, end = spans[tree]
        names: list[bytes] = []
        pos = start
        while pos < end:
            space = out.find(b" ", pos, end)
            nul = out.find(b"\0", space, end)
            if space < 0 or nul < 0 or nul + 21 > end:
                problems.append(f"a tree of the notes ({tree[:12]}) is not one git reads")
                break
            mode, name = out[pos:space], out[space + 1 : nul]
            # git orders a folder's name as if it ended in `/`.
            names.append(name + b"/" if mode == b"40000" else name)
            pos = nul + 21
            if name in (b"", b".", b"..") or b"/" in name or mode not in TREE_MODES:
                problems.append(f"a tree of the notes ({tree[:12]}) has an entry {mode[:8]!r} "
                                f"{name[:60]!r}, which git never writes")  # fmt: skip
        if len(names) > MAX_NOTES_TREE_ENTRIES:
            problems.append(f"a tree of the notes ({tree[:12]}) has {len(names)} entries; git "
                            f"fans notes out long before {MAX_NOTES_TREE_ENTRIES}")  # fmt: skip
        if len({n.rstrip(b"/") for n in names}) != len(names) or names != sorted(names):
            problems.append(f"a tree of the notes ({tree[:12]}) has two entries of one name or "
                            "entries out of order, which git never writes")  # fmt: skip
    return problems
