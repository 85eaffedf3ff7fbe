"""The agent's output on its way to the person: passed-in secret values are masked.

When the launcher's stdout or stderr is not a terminal (CI logs, `--json`, a file), each goes
through a pipe that a launcher thread copies on with every passed-in secret value replaced. A
terminal is handed to the agent as it is (interactive agents need one), and is not filtered.

A file is never handed to the sandbox as one of its standard descriptors: reopened through
`/proc/self/fd/N`, a descriptor of a file opens that file again, as the launcher's, on the
host (to read what was in it, truncate or rewrite it), whatever the sandbox shows. Such an
stdout or stderr goes through a pipe (copied on unchanged when there is nothing to mask),
and such an stdin through a pipe a launcher thread fills (InputFeed).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading

MASK = b"[REDACTED]"
CHUNK = 1 << 16


class OutputFilter:
    """A pipe whose reader masks secrets and writes everything else on to dest."""

    def __init__(self, dest: int, secrets: list[bytes]) -> None:
        self.dest = dest
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.keep = max((len(s) for s in self.secrets), default=1) - 1
        self.read_fd, self.write_fd = os.pipe()
        os.set_inheritable(self.write_fd, True)
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()

    def _mask(self, data: bytes) -> bytes:
        for secret in self.secrets:
            data = data.replace(secret, MASK)
        return data

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.dest, view) :]
            except InterruptedError:
                continue
            except OSError:
                return  # the reader went away; the agent's output is dropped, never blocked on

    def _copy(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self.read_fd, CHUNK)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                break
            pending = self._mask(pending + chunk)
            # Hold back what could be the start of a secret cut by the chunk boundary.
            cut = max(len(pending) - self.keep, 0)
            self._write(pending[:cut])
            pending = pending[cut:]
        self._write(self._mask(pending))
        os.close(self.read_fd)

    def close_writer(self) -> None:
        """The launcher's copy of the write end: closed once the sandbox has it (once only:
        its number may be another's since, on another thread)."""
        fd, self.write_fd = self.write_fd, -1
        _close(fd)

    def finish(self, timeout: float = 10) -> None:
        self.close_writer()
        self._thread.join(timeout)


class InputFeed:
    """A pipe for the sandbox's stdin that a launcher thread fills from source (a file)."""

    def __init__(self, source: int) -> None:
        self.source = source
        self.read_fd, self.write_fd = os.pipe()  # (Popen puts the read end at fd 0)
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        # Only this thread closes the write end: a write blocked on a full pipe ends (EPIPE)
        # once no process holds the read end.
        try:
            while chunk := os.read(self.source, CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self.write_fd, view) :]
        except OSError:
            pass  # the sandbox is gone, or the file could not be read on
        finally:
            os.close(self.write_fd)

    def close_reader(self) -> None:
        """The launcher's copy of the read end: closed once the sandbox has it (once only:
        its number may be another's since, on another thread)."""
        fd, self.read_fd = self.read_fd, -1
        _close(fd)

    def finish(self, timeout: float = 10) -> None:
        self.close_reader()
        self._thread.join(timeout)


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def is_file(fd: int) -> bool:
    """Is fd a descriptor of a file (or folder, or block device): one that reopens it?"""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISBLK(mode)


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return a == b or (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def filters_for(secrets: list[bytes], stdout: int | None) -> dict[int, OutputFilter]:
    """Filters for the agent's stdout (or the fd given for it) and stderr that are no terminals,
    when there are secrets to mask, and for those that are files whatever there is.

    When both go to the same place (`--json` sends the agent's stdout to stderr), one filter
    serves both, so the agent's own order of writes is kept.
    """
    found: dict[int, OutputFilter] = {}
    out = 1 if stdout is None else stdout
    for target, dest in ((1, out), (2, 2)):
        try:
            if os.isatty(dest):
                continue
        except OSError:
            continue
        if not secrets and not is_file(dest):
            continue  # a pipe or a socket: reopened, it is the same pipe
        if target == 2 and 1 in found and _same_file(out, 2):
            found[2] = found[1]
            continue
        found[target] = OutputFilter(dest, secrets)
    return found
