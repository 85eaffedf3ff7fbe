"""Repo-relative path patterns: `*` and `?` within a segment, `**` across segments.

A pattern without glob characters names a path and everything beneath it, so `docs` and
`docs/**` mean the same thing.
"""

from __future__ import annotations

import re
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
    return any(matches(p, path) for p in patterns)


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


def is_write_allowed(write: list[str] | tuple[str, ...], protected: list[str] | tuple[str, ...],
                     path: str) -> bool:  # fmt: skip
    """True when path is in the write set and, if protected, named there explicitly."""
    if not matches_any(write, path):
        return False
    if matches_any(protected, path):
        return any(is_explicit(p, path, protected) for p in write)
    return True
