"""Repo-relative path patterns: `*` and `?` within a segment, `**` across segments.

A pattern without glob characters names a path and everything beneath it, so `docs` and
`docs/**` mean the same thing.
"""

from __future__ import annotations

import re
import unicodedata
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
    return None


def normalize(pattern: str) -> str:
    pattern = pattern.strip()
    while pattern.startswith("./"):
        pattern = pattern[2:]
    pattern = re.sub(r"/+", "/", pattern).rstrip("/")
    return pattern or "**"


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    pattern = normalize(pattern)
    if pattern in ("**", "."):
        return re.compile(r".*", re.S)
    out: list[str] = []
    parts = pattern.split("/")
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
        seg = ""
        i = 0
        while i < len(part):
            c = part[i]
            if c == "*":
                seg += r"[^/]*"
            elif c == "?":
                seg += r"[^/]"
            elif c == "[":
                j = part.find("]", i + 1)
                if j == -1:
                    seg += re.escape(c)
                else:
                    body = part[i + 1 : j]
                    if body.startswith("!"):
                        body = "^" + body[1:]
                    seg += f"[{body}]"
                    i = j
            else:
                seg += re.escape(c)
            i += 1
        out.append(seg if last else seg + "/")
    regex = "".join(out)
    # A pattern also covers everything below what it names (`docs` covers `docs/a.md`).
    return re.compile(rf"{regex}(?:/.*)?", re.S)


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
    return re.compile("|".join(f"(?:{compile_pattern(p).pattern})" for p in patterns), re.S)


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


def covers_subtree(pattern: str, directory: str) -> bool:
    """True when every path beneath directory is named by pattern."""
    probe = f"{directory}/\x01probe/\x01deeper" if directory else "\x01probe/\x01deeper"
    probe2 = f"{directory}/\x01probe" if directory else "\x01probe"
    return matches(pattern, probe) and matches(pattern, probe2) or matches(pattern, directory)


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
        # a change, so the common case is worth its own line).
        return "/".join(p.rstrip(". ") or p for p in path.lower().split("/"))
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
    return matches_any(protected, path) or matches_any(_folded(tuple(protected)), fold_path(path))


def has_git_segment(path: str) -> bool:
    """True when a segment of path is `.git` on some filesystem (`.GIT`, `.git.`, `.Git `)."""
    return any(part == ".git" for part in fold_path(path).split("/"))


def is_write_allowed(write: list[str] | tuple[str, ...], protected: list[str] | tuple[str, ...],
                     path: str) -> bool:  # fmt: skip
    """True when path is in the write set and, if protected, named there explicitly.

    A path with a `.git` segment in any letter case is never allowed.
    """
    if has_git_segment(path) or not matches_any(write, path):
        return False
    if is_protected(protected, path):
        return any(is_explicit(p, path, protected) for p in write)
    return True
