"""The real diff of a range, as hunks parsed with unidiff, for reports that show it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.gate.diffread import read_git

_ESCAPES = {
    "n": "\n",
    "t": "\t",
    '"': '"',
    "\\": "\\",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "r": "\r",
    "v": "\v",
}


def unquote_path(text: str) -> str:
    """Undo git's C-style quoting of a path (`"a/new\\nline"`) and strip the a/ or b/ prefix."""
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        raw = bytearray()
        body = text[1:-1].encode("utf-8", "surrogateescape")
        i = 0
        while i < len(body):
            c = body[i : i + 1]
            if c == b"\\" and i + 1 < len(body):
                nxt = chr(body[i + 1])
                if nxt in "01234567" and re.fullmatch(rb"[0-7]{3}", body[i + 1 : i + 4]):
                    raw.append(int(body[i + 1 : i + 4], 8))
                    i += 4
                    continue
                raw.extend(_ESCAPES.get(nxt, nxt).encode())
                i += 2
                continue
            raw.extend(c)
            i += 1
        text = raw.decode("utf-8", "surrogateescape")
    if text[:2] in ("a/", "b/"):
        text = text[2:]
    return text


@dataclass(frozen=True)
class Line:
    kind: str  # "+", "-" or " "
    text: str
    old_no: int | None
    new_no: int | None


@dataclass(frozen=True)
class Hunk:
    header: str
    lines: list[Line]


@dataclass
class FileDiff:
    """The diff of one file: its paths, whether it is binary, and its hunks."""

    path: str
    old_path: str | None
    is_binary: bool = False
    hunks: list[Hunk] = field(default_factory=list)
    truncated: bool = False


def file_diffs(git_dir: Path, base: str, head: str, max_lines: int = 4000) -> dict[str, FileDiff]:
    """Hunks of `git diff -M base head` by new path; long diffs are cut after max_lines lines."""
    # Here, not at the top: only the HTML report reads hunks, and `check` imports this module.
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    # Read with the gate's bounds (a branch under review may hold gigabytes of text, or a
    # diff git takes gigabytes to make): past them, DiffTooLarge, and the report has no hunks.
    out = read_git(
        git_dir,
        ["-c", "core.quotePath=false", "diff", "-M", "--no-color", "--no-ext-diff",
         "--no-textconv", "--src-prefix=a/", "--dst-prefix=b/", base, head, "--"],
        f"the diff from {base[:12]} to {head[:12]} (its lines)",
        limit=None,
        hint="The report shows the findings without the diff's lines.",
    ).decode("utf-8", "replace")  # fmt: skip
    try:
        patch = PatchSet(out)
    except UnidiffParseError:
        return {}
    diffs: dict[str, FileDiff] = {}
    budget = max_lines
    for patched in patch:
        source = unquote_path(patched.source_file)
        target = unquote_path(patched.target_file)
        path = source if target == "/dev/null" else target
        old = source if patched.is_rename else None
        entry = FileDiff(path, old, is_binary=patched.is_binary_file)
        for hunk in patched:
            if budget <= 0:
                entry.truncated = True
                break
            header = (
                f"@@ -{hunk.source_start},{hunk.source_length} "
                f"+{hunk.target_start},{hunk.target_length} @@ {hunk.section_header}"
            ).rstrip()
            lines = [
                Line(
                    ln.line_type if ln.line_type in "+- " else " ",
                    ln.value.rstrip("\n"),
                    ln.source_line_no,
                    ln.target_line_no,
                )
                for ln in hunk
                if ln.line_type in "+- "
            ]
            budget -= len(lines)
            entry.hunks.append(Hunk(header, lines))
        diffs[path] = entry
    return diffs
