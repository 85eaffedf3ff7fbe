"""Small text helpers shared by the human-readable outputs."""

from __future__ import annotations

import shlex


def short_command(argv: list[str], width: int = 100) -> str:
    """argv as a shell line on one line, cut to width with an ellipsis."""
    text = shlex.join(argv).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def times(count: int | None) -> str:
    """` (N times)` for an entry that stands for N > 1 events, else nothing."""
    return f" ({count} times)" if count and count > 1 else ""
