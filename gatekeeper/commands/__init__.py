"""The CLI's verbs: one module per verb, each a function of keyword arguments that returns an
exit code. The top of the pipeline: may import any package below it, and none imports it
(the hook scripts enter through `gatekeeper.hookrun`)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from gatekeeper.errors import Error
from gatekeeper.gate.shown import visible_lines


def outcome(fn: Callable[..., int | None], /, **kwargs: object) -> int:
    """Call a command function and give its exit code; an error prints its diagnostics, an
    interrupt a message, not a traceback (refs move by compare-and-swap and records are
    replaced whole, so what was interrupted can simply be run again)."""
    try:
        return fn(**kwargs) or 0
    except Error as exc:
        # (messages quote names, values and paths as read: shown as escapes, a line each)
        print(visible_lines(exc.diagnostics()), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\ngatekeeper: interrupted", file=sys.stderr)
        return 130
