"""Work started now and collected when needed: a git command runs in its own process (on
another core) while the gate goes on, and a thread of ours drains its output."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def later(fn: Callable[..., T], /, *args: object) -> Callable[[], T]:
    """fn(*args), started now on a thread of its own (in a copy of this context: what the
    caller's work is bounded by bounds it too); the function returned waits for it and gives
    what it returned, or raises what it raised."""
    outcome: list[tuple[bool, object]] = []
    context = contextvars.copy_context()

    def work() -> None:
        try:
            outcome.append((True, fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            outcome.append((False, exc))

    thread = threading.Thread(
        target=context.run, args=(work,), name=f"gatekeeper-{fn.__name__}", daemon=True
    )
    thread.start()

    def result() -> T:
        thread.join()
        ok, value = outcome[0]
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        return value  # type: ignore[return-value]

    return result
