"""Showing what the agent chose (argv, paths) on a person's terminal, with nothing hidden.

Every character that does not print as itself (controls such as ESC, CR and backspace, bidi
overrides and other format characters, separators other than the space, undecodable bytes)
becomes a visible escape, so the text on the screen is the text that will run.
"""

from __future__ import annotations

import shlex
import unicodedata

HIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
MAX_ARG = 200  # characters of one escaped argument
MAX_TOTAL = 2000  # characters of a whole escaped command line


def _shows_as_itself(ch: str) -> bool:
    return ch.isprintable() and unicodedata.category(ch) not in HIDDEN_CATEGORIES


def escape(text: str) -> str:
    """text with every character that does not print as itself written as an escape."""
    out: list[str] = []
    for ch in text:
        cp = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif _shows_as_itself(ch):
            out.append(ch)
        elif 0xDC80 <= cp <= 0xDCFF:  # a byte that was not UTF-8 (surrogate escape)
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif cp < 0x80:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    return "".join(out)


def show_arg(arg: str, limit: int = MAX_ARG) -> str:
    """One argument, escaped and quoted; cut to limit characters with a note of what is left."""
    shown = escape(arg)
    if len(shown) > limit:
        shown = shlex.quote(shown[:limit]) + f"…[{len(shown) - limit} more characters]"
        return shown
    return shlex.quote(shown)


def show_argv(argv: list[str], limit: int = MAX_TOTAL) -> str:
    """The whole argv, each argument escaped and quoted, the total bounded with a note."""
    parts: list[str] = []
    used = 0
    for i, arg in enumerate(argv):
        part = show_arg(arg)
        if used + len(part) > limit:
            parts.append(f"…[{len(argv) - i} more arguments]")
            break
        parts.append(part)
        used += len(part) + 1
    return " ".join(parts)
