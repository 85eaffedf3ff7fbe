"""The CLI's verbs: one module per verb, each a function of keyword arguments that returns an
exit code. The top of the pipeline: may import any package below it, and none imports it
(the hook scripts enter through `gatekeeper.hookrun`)."""

from __future__ import annotations

import errno
import resource
import sys
from collections.abc import Callable

from gatekeeper.errors import Error


def outcome(fn: Callable[..., int | None], /, **kwargs: object) -> int:
    """Call a command function and give its exit code; an error prints its diagnostics, an
    interrupt a message, not a traceback (refs move by compare-and-swap and records are
    replaced whole, so what was interrupted can simply be run again)."""
    try:
        return fn(**kwargs) or 0
    except Error as exc:
        # (messages quote names, values and paths as read: shown as escapes, a line each)
        print(_shown(exc.diagnostics()), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\ngatekeeper: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        error = out_of_descriptors(exc)
        print(_shown(error.diagnostics()), file=sys.stderr)
        return error.exit_code


def _shown(text: str) -> str:
    """visible_lines(text), its module loaded only when there is an error to show."""
    from gatekeeper.gate.shown import visible_lines

    return visible_lines(text)


def out_of_descriptors(exc: OSError) -> Error:
    """What to say when the process, or the system, has no file descriptor left."""
    if exc.errno == errno.ENFILE:
        return Error(f"the system is out of open files ({exc.strerror})",
                     hint="close programs, or raise fs.file-max (sysctl)")  # fmt: skip
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return Error(
        f"out of open files ({exc.strerror}): this process may open {soft}",
        hint="raise the limit, `ulimit -n 4096` (LimitNOFILE= for a service); a run needs "
        "some 300, and more for a write set that names many single files",
    )
