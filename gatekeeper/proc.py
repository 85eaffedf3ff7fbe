"""The one subprocess chokepoint: argument lists only, errors that show everything."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

from gatekeeper.errors import Error


class CalledProcessError(Error):
    """A command the launcher ran exited non-zero."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: bytes, stderr: bytes) -> None:
        def show(data: bytes) -> str:
            text = data.decode("utf-8", "replace").strip()
            return text if text else "(none)"

        message = (
            f"command failed: {' '.join(argv)}\n"
            f"return code: {returncode}\nstdout: {show(stdout)}\nstderr: {show(stderr)}"
        )
        super().__init__(message)
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def cmd_output_b(
    *argv: str,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: bytes | None = None,
) -> tuple[int, bytes, bytes]:
    """Run argv and return (returncode, stdout, stderr); raise CalledProcessError if check."""
    proc = subprocess.run(
        list(argv),
        input=input,
        capture_output=True,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise CalledProcessError(argv, proc.returncode, proc.stdout, proc.stderr)
    return proc.returncode, proc.stdout, proc.stderr


def signal_name(number: int | None) -> str | None:
    """The conventional name of a signal number (`SIGKILL`, `SIGRTMIN+3`); None for None."""
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        pass
    low, high = int(signal.SIGRTMIN), int(signal.SIGRTMAX)
    if low <= number <= high:
        if number - low <= high - number:
            return f"SIGRTMIN+{number - low}"
        return f"SIGRTMAX-{high - number}"
    return f"SIG{number}"
