"""Repo-relative path patterns: `*` and `?` within a segment, `**` across segments.

A pattern without glob characters names a path and everything beneath it, so `docs` and
`docs/**` mean the same thing. `[...]` is a class of characters within a segment: `!` or `^`
first negates it, a `]` right after the opening (or the negation) is a member, `a-z` is a
range and a `-` first or last is a member; a `[` without a closing `]` is a literal `[`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache

GLOB_CHARS = set("*?[")


def has_glob(text: str) -> bool:
    return any(c in GLOB_CHARS for c in text)


def check_pattern(pattern: str) -> str | None:
    """Why pattern is not an acceptable repo-relative pattern, or None if it is."""
    if not pattern or not pattern.strip():
        return "an empty path"
    if pattern.startswith("/"):
        return "an absolute path; write paths relative to the repository root"
    if "\\" in pattern:
        return "a backslash; use '/' between path segments"
    if "\0" in pattern or "\n" in pattern:
        return "a NUL or newline character"
    parts = pattern.rstrip("/").split("/")
    if any(p == ".." for p in parts):
        return "a '..' segment; paths may not leave the repository"
    if any(p == ".git" for p in parts):
        return "a '.git' segment; the git directory is never part of a path set"
    for part in parts:
        for members, _ in _classes(part):
            for low, high in members:
                if low > high:
                    return f"a reversed range {low}-{high} in a [...] class"
    return None


def normalize(pattern: str) -> str:
    pattern = pattern.strip()
    while pattern.startswith("./"):
        pattern = pattern[2:]
    pattern = re.sub(r"/+", "/", pattern).rstrip("/")
    return pattern or "**"


def _class_at(part: str, i: int) -> tuple[list[tuple[str, str]], bool, int] | None:
    """The `[...]` class opening at part[i]: (ranges, negated, index of its `]`), or None
    when no `]` closes it (then the `[` is a literal)."""
    j = i + 1
    negated = j < len(part) and part[j] in "!^"
    if negated:
        j += 1
    start = j
    if j < len(part) and part[j] == "]":
        j += 1  # a `]` first is a member, not the end
    close = part.find("]", j)
    if close < 0:
        return None
    body = part[start:close]
    ranges: list[tuple[str, str]] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            ranges.append((body[k], body[k + 2]))
            k += 3
        else:
            ranges.append((body[k], body[k]))
            k += 1
    return ranges, negated, close


def _classes(part: str) -> list[tuple[list[tuple[str, str]], bool]]:
    """Every `[...]` class of one segment, as (ranges, negated)."""
    found = []
    i = 0
    while i < len(part):
        if part[i] == "[":
            cls = _class_at(part, i)
            if cls is not None:
                found.append((cls[0], cls[1]))
                i = cls[2]
        i += 1
    return found


def _class_regex(ranges: list[tuple[str, str]], negated: bool) -> str:
    # Members are escaped one by one, so nothing in a class is read as regex syntax; a
    # reversed range (refused by check_pattern, but reachable through fold_path) matches
    # nothing, and no class, negated or not, matches the `/` between segments.
    body = "".join(
        re.escape(low) if low == high else f"{re.escape(low)}-{re.escape(high)}"
        for low, high in ranges
        if low <= high
    )
    if negated:
        return f"[^/{body}]"
    return f"[{body}]" if body else "(?!)"


def _segment_regex(part: str) -> str:
    seg = ""
    i = 0
    while i < len(part):
        c = part[i]
        if c == "*":
            seg += r"[^/]*"
        elif c == "?":
            seg += r"[^/]"
        elif c == "[" and (cls := _class_at(part, i)) is not None:
            seg += _class_regex(cls[0], cls[1])
            i = cls[2]
        else:
            seg += re.escape(c)
        i += 1
    return seg


def _parts(pattern: str) -> list[str]:
    parts: list[str] = []
    for part in normalize(pattern).split("/"):
        # `**/**` is `**`: collapsing them keeps `a/**/**` meaning `a/**` below.
        if not (part == "**" and parts and parts[-1] == "**"):
            parts.append(part)
    return parts


def _regex(parts: list[str]) -> str:
    """The regex of the paths a list of segments names exactly (without what lies beneath)."""
    if parts in (["**"], ["."]):
        return r".*"
    out: list[str] = []
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            if last and out:
                # `dir/**` names dir itself and everything beneath it.
                out[-1] = out[-1][:-1]
                out.append(r"(?:/.*)?")
            else:
                out.append(r"(?:.*)" if last else r"(?:[^/]*/)*")
            continue
        seg = _segment_regex(part)
        out.append(seg if last else seg + "/")
    return "".join(out)


@lru_cache(maxsize=1024)
def _pattern_regex(pattern: str) -> str:
    # A pattern also covers everything below what it names (`docs` covers `docs/a.md`).
    return rf"{_regex(_parts(pattern))}(?:/.*)?"


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(_pattern_regex(pattern), re.S)


def matches(pattern: str, path: str) -> bool:
    """True when the repo-relative path is named by pattern (or lies beneath what it names)."""
    return compile_pattern(pattern).fullmatch(path) is not None


def matches_any(patterns: list[str] | tuple[str, ...], path: str) -> bool:
    return _any_of(tuple(patterns)).fullmatch(path) is not None


@lru_cache(maxsize=256)
def _any_of(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One expression for a list of patterns: the mount plan asks it of every file of the
    worktree, and one match costs much less than one per pattern."""
    if not patterns:
        return re.compile(r"(?!)")
    # From each pattern's text: compiling each first would cost as much again (re compiles in
    # Python, and the gate compiles the protected patterns twice, as written and folded).
    return re.compile("|".join(f"(?:{_pattern_regex(p)})" for p in patterns), re.S)


def static_prefix(pattern: str) -> str:
    """The leading segments of pattern that carry no glob ('' for the repository root)."""
    pattern = normalize(pattern)
    if pattern in ("**", "."):
        return ""
    fixed: list[str] = []
    for part in pattern.split("/"):
        if has_glob(part):
            break
        fixed.append(part)
    return "/".join(fixed)


def _matches_any_name(segment: str) -> bool:
    """True when one segment matches every (non-empty) name: `*`s and at most one `?`."""
    return "*" in segment and set(segment) <= {"*", "?"} and segment.count("?") <= 1


def covers_subtree(pattern: str, directory: str) -> bool:
    """True when every path beneath directory is named by pattern.

    Decided from the pattern's structure, never by probing names: a pattern covers the
    subtree when it names directory (or what holds it), or when it is a part that names
    directory exactly followed by one segment that matches every name and `**`s only
    (`src/*`, `src/**/*`, `**/*`). So `src/[!x]*` or `src/?*.py` cover no folder whole.
    """
    if matches(pattern, directory):
        return True
    root, heads = _subtree_heads(pattern)
    if not directory:
        return root
    return any(re.fullmatch(head, directory, re.S) for head in heads)


def _subtree_heads(pattern: str) -> tuple[bool, list[str]]:
    """What pattern covers whole by its structure (see covers_subtree): whether that is the
    repository's root, and the expressions of the folders it is."""
    parts = _parts(pattern)
    root = False
    heads: list[str] = []
    for split in range(len(parts) + 1):
        head, tail = parts[:split], parts[split:]
        rest = [p for p in tail if p != "**"]
        if len(rest) != 1 or not _matches_any_name(rest[0]):
            continue
        root = root or all(p == "**" for p in head)
        if head:
            heads.append(_regex(head))
    return root, heads


@lru_cache(maxsize=64)
def subtree_rule(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """`any(covers_subtree(p, directory) for p in patterns)` as a function of the directory
    alone, in two expressions for the whole list: the mount plan asks it of every folder of
    the worktree, and thousands of write patterns asked one by one would be compiled again
    and again."""
    root = False
    heads: dict[str, None] = {}
    for pattern in patterns:
        covers_root, its_heads = _subtree_heads(pattern)
        root = root or covers_root
        heads.update(dict.fromkeys(its_heads))
    named = _any_of(patterns).fullmatch
    in_heads = re.compile("|".join(f"(?:{h})" for h in heads) or "(?!)", re.S).fullmatch

    def covers(directory: str) -> bool:
        if named(directory) is not None:
            return True
        return root if not directory else in_heads(directory) is not None

    return covers


def is_explicit(pattern: str, path: str, protected: list[str] | tuple[str, ...]) -> bool:
    """True when a write pattern names a protected path on purpose.

    That is, when it matches path and either is that very path (`src/.gitattributes`) or
    starts inside the protected area (`.github/workflows/**`). So `**` and `src/**` never
    open `.github/` or `src/.gitattributes`.
    """
    if not matches(pattern, path):
        return False
    prefix = static_prefix(pattern)
    if not prefix:
        return False
    return prefix == normalize(path) or matches_any(protected, prefix)


@lru_cache(maxsize=64)
def explicit_rule(write: tuple[str, ...], protected: tuple[str, ...]) -> Callable[[str], bool]:
    """`any(is_explicit(p, path, protected) for p in write)` as a function of the path alone.

    The write patterns are sorted once: those that start inside the protected area, asked
    together in one expression, and the rest by the path they name exactly. Asked pattern by
    pattern, a list longer than the cache of compiled patterns would be compiled again for
    every path (thousands of approvals make such a list).
    """
    inside: list[str] = []
    by_prefix: dict[str, list[str]] = {}
    for pattern in write:
        prefix = static_prefix(pattern)
        if not prefix:
            continue
        if matches_any(protected, prefix):
            inside.append(pattern)
        else:
            by_prefix.setdefault(prefix, []).append(pattern)
    in_inside = _any_of(tuple(inside)).fullmatch
    named: dict[str, Callable[[str], re.Match[str] | None]] = {}

    def is_named(path: str) -> bool:
        if in_inside(path) is not None:
            return True
        key = normalize(path)
        candidates = by_prefix.get(key)
        if not candidates:
            return False
        match = named.get(key)
        if match is None:
            match = named[key] = re.compile(
                "|".join(f"(?:{_pattern_regex(p)})" for p in candidates), re.S
            ).fullmatch
        return match(path) is not None

    return is_named


# Code points that HFS+ and APFS ignore in names, so `.vs\u200ccode` opens as `.vscode` there.
_IGNORABLE = dict.fromkeys(
    [0x200B, 0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2060, 0x2070),
     0xFEFF, 0x00AD, 0x034F, 0x180E]
)  # fmt: skip


def fold_path(path: str) -> str:
    """path as a case-insensitive, normalising filesystem (macOS, Windows) would open it.

    Lower case (Unicode case folding), NFC, the code points HFS+ ignores removed, and trailing
    dots and spaces cut from each segment (Windows drops them).
    """
    if path.isascii():
        # What follows leaves ASCII as it is but for the case (the gate folds every path of
        # a change, so the common case is worth its own lines): no segment ends in a dot or
        # a space, so there is nothing to cut.
        lower = path.lower()
        if "./" in lower or " /" in lower or lower.endswith((".", " ")):
            return "/".join(p.rstrip(". ") or p for p in lower.split("/"))
        return lower
    parts = []
    for part in path.split("/"):
        part = unicodedata.normalize("NFC", part.translate(_IGNORABLE)).casefold()
        stripped = part.rstrip(". ")
        parts.append(stripped if stripped else part)
    return "/".join(parts)


@lru_cache(maxsize=256)
def _folded(patterns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(fold_path(p) for p in patterns)


def is_protected(protected: list[str] | tuple[str, ...], path: str) -> bool:
    """True when path, or what a case-insensitive checkout would open for it, is protected.

    `.VSCODE/tasks.json` and `.Claude/settings.json` are `.vscode/...` and `.claude/...` on the
    macOS or Windows machine that clones the merged result.
    """
    return _is_protected(protected, path, fold_path(path))


def _is_protected(protected: list[str] | tuple[str, ...], path: str, folded: str) -> bool:
    return matches_any(protected, path) or matches_any(_folded(tuple(protected)), folded)


def has_git_segment(path: str) -> bool:
    """True when a segment of path is `.git` on some filesystem (`.GIT`, `.git.`, `.Git `)."""
    return ".git" in fold_path(path).split("/")


def is_write_allowed(write: list[str] | tuple[str, ...], protected: list[str] | tuple[str, ...],
                     path: str) -> bool:  # fmt: skip
    """True when path is in the write set and, if protected, named there explicitly.

    A path with a `.git` segment in any letter case is never allowed.
    """
    return write_rule(tuple(write), tuple(protected))(path)


@lru_cache(maxsize=64)
def write_rule(write: tuple[str, ...], protected: tuple[str, ...]) -> Callable[[str], bool]:
    """is_write_allowed for one write set and protected list, as a function of the path alone.

    Its expressions are compiled and looked up once, not per path: the supervisor and the gate
    ask it of every path of a change, and the per-call lookups cost several times the match.
    """
    in_write = _any_of(write).fullmatch
    every_path = any(_parts(p) in (["**"], ["."]) for p in write)  # `**`: nothing to match
    folded_protected = _folded(protected)
    # A path that folding leaves as it is (the common case: lower-case ASCII) is asked of both
    # lists at once, with one expression for the two (they differ in a few patterns at most);
    # the expression of each list is compiled only when a path needs it.
    in_either = _any_of(tuple(dict.fromkeys((*protected, *folded_protected)))).fullmatch
    explicit = explicit_rule(write, protected)

    def is_protected_path(path: str, folded: str) -> bool:
        if folded == path:
            return in_either(path) is not None
        return (_any_of(protected).fullmatch(path) is not None
                or _any_of(folded_protected).fullmatch(folded) is not None)  # fmt: skip

    def is_allowed(path: str) -> bool:
        folded = fold_path(path)  # once, for the `.git` segment and the protected paths
        if ".git" in folded and ".git" in folded.split("/"):
            return False
        if not every_path and in_write(path) is None:
            return False
        if is_protected_path(path, folded):
            return explicit(path)
        return True

    return is_allowed
