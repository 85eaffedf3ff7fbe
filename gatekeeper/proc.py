"""The one subprocess chokepoint: argument lists only, errors that show everything."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
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
    """Run argv as cmd_output_b does (check=False), in a session of its own, and end every
    process it started in that session (its process group) when it exits, or at seconds
    (raise TimedOut then). What it wrote is taken when it has exited, whatever it left
    holding its output: a process that left the group (setsid) may keep the pipes open, but
    neither makes this wait past seconds nor counts a quick command as timed out."""
    if seconds <= 0:
        raise TimedOut(argv, 0)
    deadline = time.monotonic() + seconds
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    try:
        with _Exit(proc.pid) as exited:
            try:
                output = _gather(proc, input, exited, deadline)
            except _Late:
                output = None
    finally:  # done, at its deadline, or the caller interrupted
        # The group is ended while its leader is a zombie, not yet reaped: its id (the
        # leader's pid) cannot be given to another process before.
        _end_group(proc.pid)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        proc.wait()  # (the leader was killed, or has exited: at once)
    if output is None:
        raise TimedOut(argv, seconds)
    return proc.returncode, *output


class _Exit:
    """Whether the process pid has exited, without reaping it: a pidfd, readable once it
    has; without pidfds (before Linux 5.3), waitid(2) with WNOWAIT, asked again and again."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None

    def __enter__(self) -> _Exit:
        with contextlib.suppress(OSError, AttributeError):
            self.fd = os.pidfd_open(self.pid)
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def done(self) -> bool:
        if self.fd is not None:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return bool(poller.poll(0))
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self.pid, flags) is not None


def _gather(
    proc: subprocess.Popen[bytes], input: bytes | None, exited: _Exit, deadline: float
) -> tuple[bytes, bytes] | None:
    """(stdout, stderr) of proc once it has exited and what it wrote is read; None at
    deadline. Input is written as it is taken. Once proc has exited, all it wrote is in the
    pipes: they are read until they are empty, not until every holder has closed them."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    parts: dict[int, list[bytes]] = {out: [], err: []}
    pending = memoryview(input or b"")
    stdin = proc.stdin
    if stdin is not None and not pending:
        stdin.close()
        stdin = None
    poller = select.poll()
    for fd in parts:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    if stdin is not None:
        os.set_blocking(stdin.fileno(), False)
        poller.register(stdin.fileno(), select.POLLOUT)
    if exited.fd is not None:
        poller.register(exited.fd, select.POLLIN)
    while True:
        ended = exited.done()
        left = deadline - time.monotonic()
        if left <= 0 and not ended:
            return None
        # (once it has exited, no wait: what it wrote is there; without a pidfd, a short one)
        wait = 0.0 if ended else left if exited.fd is not None else min(left, 0.05)
        for fd, _ in poller.poll(wait * 1000):
            if fd in parts:
                chunk = _read_all_now(fd, parts[fd], deadline)
                if chunk == b"":
                    poller.unregister(fd)
            elif stdin is not None and fd == stdin.fileno():
                try:
                    pending = pending[os.write(fd, pending[:_PIPE_CHUNK]) :]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    pending = pending[:0]
                if not pending:
                    poller.unregister(fd)
                    stdin.close()
                    stdin = None
        if ended:
            # What is left of its group ends first: what the command wrote is in the pipes,
            # and nothing of its group writes more (one that left the group may, but the
            # reading stops at the deadline).
            _end_group(proc.pid)
            for fd, taken in parts.items():
                _read_all_now(fd, taken, deadline)
            return b"".join(parts[out]), b"".join(parts[err])


_PIPE_CHUNK = 65536


def _read_all_now(fd: int, into: list[bytes], deadline: float) -> bytes | None:
    """Read what fd holds now into into; the last read's result: b"" at its end, None when
    it held no more. Raise _Late past deadline (a writer that keeps it full)."""
    while True:
        try:
            chunk = os.read(fd, _PIPE_CHUNK)
        except BlockingIOError:
            return None
        except OSError:  # (closed: nothing more)
            return b""
        if not chunk:
            return b""
        into.append(chunk)
        if time.monotonic() > deadline:
            raise _Late


class _Late(Exception):
    """Output still coming at the deadline."""


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
