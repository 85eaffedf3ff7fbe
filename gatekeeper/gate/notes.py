"""Read receipts straight from notes commits, so a server hook can read the notes being pushed.

A notes commit's tree maps annotated object ids (possibly fanned out as `ab/cdef...`) to note
blobs; each note holds one DSSE envelope per line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.git import exact_refs, git
from gatekeeper.receipt.notes import notes_refs

HEX40 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class NoteLine:
    """One envelope line, the commit whose note holds it, and where it was read from."""

    annotated: str
    line: str
    source: str


def local_sources(git_dir: Path) -> list[tuple[str, str]]:
    """(label, notes commit) for the local receipts ref and any remote-tracking copies."""
    refs = notes_refs(git_dir)
    found = exact_refs(refs, git_dir)
    return [(ref, found[ref]) for ref in refs if ref in found]


def _list_notes(git_dir: Path, notes_commit: str) -> list[tuple[str, str]]:
    """(annotated object id, note blob id) for every note in a notes commit's tree."""
    out = git("ls-tree", "-r", "-z", "--full-tree", notes_commit, git_dir=git_dir)
    notes = []
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        _mode, kind, oid = meta.decode().split(" ")
        annotated = path.decode("ascii", "replace").replace("/", "")
        if kind == "blob" and HEX40.fullmatch(annotated):
            notes.append((annotated, oid))
    return notes


def _read_blobs(git_dir: Path, oids: list[str]) -> dict[str, bytes]:
    """Read many blobs with one `git cat-file --batch`."""
    if not oids:
        return {}
    unique = list(dict.fromkeys(oids))
    out = git(
        "cat-file", "--batch", git_dir=git_dir, input="".join(o + "\n" for o in unique).encode()
    )
    blobs: dict[str, bytes] = {}
    pos = 0
    for oid in unique:
        end = out.index(b"\n", pos)
        header = out[pos:end].decode().split(" ")
        pos = end + 1
        if len(header) < 3 or header[1] == "missing":
            continue
        size = int(header[2])
        blobs[oid] = out[pos : pos + size]
        pos += size + 1
    return blobs


def read_notes(git_dir: Path, sources: list[tuple[str, str]]) -> dict[str, list[NoteLine]]:
    """Every envelope line by annotated commit, across sources, without duplicates."""
    listed = [
        (label, annotated, blob)
        for label, commit in sources
        for annotated, blob in _list_notes(git_dir, commit)
    ]
    blobs = _read_blobs(git_dir, [blob for _, _, blob in listed])
    found: dict[str, list[NoteLine]] = {}
    seen: set[tuple[str, str]] = set()
    for label, annotated, blob in listed:
        text = blobs.get(blob, b"").decode("utf-8", "replace")
        for line in text.splitlines():
            line = line.strip()
            if line and (annotated, line) not in seen:
                seen.add((annotated, line))
                found.setdefault(annotated, []).append(NoteLine(annotated, line, label))
    return found
