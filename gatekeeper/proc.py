"""The one subprocess chokepoint: argument lists only, errors that show everything."""

from __future__ import annotations

import contextlib
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
    large: bool = False,
) -> tuple[int, bytes, bytes]:
    """Run argv and return (returncode, stdout, stderr); raise CalledProcessError if check.

    large: stdout may be megabytes. It then goes to a file in memory, read at once when the
    command is done: read from a pipe, it comes in pieces of 32 KiB, and for each the thread
    reading it waits for the interpreter's lock again (up to its switch interval of 5 ms
    while another thread is busy), which can take longer than the command itself.
    """
    memory = os.memfd_create("gatekeeper-output", os.MFD_CLOEXEC) if large else None
    try:
        proc = subprocess.run(
            list(argv),
            input=input,
            stdout=subprocess.PIPE if memory is None else memory,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        stdout = proc.stdout if memory is None else _read_all(memory)
    finally:
        if memory is not None:
            os.close(memory)
    if check and proc.returncode != 0:
        raise CalledProcessError(argv, proc.returncode, stdout, proc.stderr)
    return proc.returncode, stdout, proc.stderr


class TimedOut(Error):
    """A command (with whatever it started) was ended at its deadline."""

    def __init__(self, argv: Sequence[str], seconds: float) -> None:
        super().__init__(f"{argv[0]} did not finish within {seconds:g} s and was ended")
        self.argv = list(argv)
        self.seconds = seconds


def cmd_output_within(
    *argv: str,
    seconds: float,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
) -> tuple[int, bytes, bytes]:
    """Run argv as cmd_output_b does (check=False), in a session of its own, and end it and
    every process it started (its process group) at seconds; raise TimedOut then."""
    if seconds <= 0:
        raise TimedOut(argv, 0)
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(input, timeout=seconds)
    except BaseException as exc:  # its deadline, or the caller interrupted
        _end_group(proc.pid)
        proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise TimedOut(argv, seconds) from None
        raise
    _end_group(proc.pid)  # whatever it left running in its group (a verifier's helper)
    return proc.returncode, stdout, stderr


def _end_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read_all(fd: int) -> bytes:
    """What a file written from its start holds, in as few reads as it takes (one, mostly)."""
    size = os.fstat(fd).st_size
    parts = []
    offset = 0
    while offset < size:
        part = os.pread(fd, size - offset, offset)
        if not part:
            break
        parts.append(part)
        offset += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


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
