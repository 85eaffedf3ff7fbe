"""The supervisor's start: its command line, and a supervisor started ahead of its sandbox.

Standard library only: `python -m gatekeeper run` starts the agent's supervisor from here
before it loads the rest of the launcher (launch.py).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

# The supervisor starts before every sandbox, so it starts lean: isolated (-I: no PYTHON*
# variables, no user site) and without site (-S: no .pth files, no editable-install hooks),
# with only this package's folder on its path; it needs the standard library and this package.
# It ends without the interpreter's clean-up (its files are closed by then; the launcher is
# waiting for it).
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
SUPERVISOR = (
    "-I", "-S", "-c",
    f"import os, sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); "
    "from gatekeeper.sandbox.supervise.__main__ import main; code = main(sys.argv[1:]); "
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(code)",
)  # fmt: skip

# The same interpreter, started ahead as a standby (supervise/standby.py) with the end of a
# Unix socket it reads its start order from.
STANDBY = (
    "-I", "-S", "-c",
    f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); "
    "from gatekeeper.sandbox.supervise.standby import serve; serve(int(sys.argv[1]))",
)  # fmt: skip
STANDBY_MAX_FDS = 250  # standby.MAX_FDS: with more, a supervisor is started the usual way


class Standby:
    """A supervisor started ahead, for a run's first sandbox: its interpreter starts and loads
    the supervisor on another core while the launcher prepares the run, which takes its
    start-up (some 50 ms) off the time to the agent's first instruction."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, *STANDBY, str(theirs.fileno())],
                env=launcher_env(), pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        except OSError:
            ours.close()
        else:
            self.sock = ours
        finally:
            theirs.close()
        # prepare()'s thread, and the error it met (None: none)
        self._prepared: tuple[threading.Thread, list[BaseException]] | None = None

    def prepare(self, preexec: Callable[[int], None]) -> None:
        """Do preexec(pid) to it now, on a thread of its own, rather than in start(): moving a
        process into a cgroup waits on the kernel for some milliseconds (the move waits for
        every processor to pass a quiescent state), which the run's preparation then hides.
        start() waits for it, and fails as it would have had it done preexec itself."""
        if self.proc is None or self._prepared is not None:
            return
        pid, errors = self.proc.pid, list[BaseException]()

        def work() -> None:
            try:
                preexec(pid)
            except BaseException as exc:  # noqa: BLE001 - raised by start(): never limits unset
                errors.append(exc)

        thread = threading.Thread(target=work, name="gatekeeper-standby", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no thread to spare: start() does it
            return
        self._prepared = (thread, errors)

    def start(self, argv: list[str], fds: dict[int, int], preexec: Callable[[int], None]
              ) -> subprocess.Popen[bytes] | None:  # fmt: skip
        """Have it supervise: argv as the supervisor's own, each of fds (its number there:
        the launcher's descriptor) in place, preexec(pid) done to it first (unless prepare()
        did it: the same preexec). Its process, or None when it cannot (it ended, preexec
        failed, or the order cannot be sent): then start one anew."""
        sock, proc, prepared = self.sock, self.proc, self._prepared
        self.sock = self.proc = self._prepared = None
        if sock is None or proc is None:
            return None
        payload = json.dumps({"argv": argv, "fds": list(fds)}).encode()
        try:
            if prepared is not None:
                thread, errors = prepared
                thread.join()
                if errors:
                    raise errors[0]
            if proc.poll() is not None or len(fds) > STANDBY_MAX_FDS:
                raise OSError("no standby")
            if prepared is None:
                preexec(proc.pid)
            socket.send_fds(sock, [struct.pack("=Q", len(payload)) + payload], list(fds.values()))
        except BaseException as exc:
            sock.close()
            _end(proc)  # told nothing: it ends on its socket's end
            if isinstance(exc, (OSError, ValueError)):
                return None
            raise
        sock.close()
        return proc

    def close(self) -> None:
        """Not needed after all: it ends, having done nothing (its socket's end tells it)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self._prepared is not None:
            self._prepared[0].join()
            self._prepared = None
        if self.proc is not None:
            _end(self.proc)
            self.proc = None


def _end(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def launcher_env() -> dict[str, str]:
    """The environment the supervisor and bwrap run with: the launcher's own, minus what would
    load code into them from elsewhere."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("LD_", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"))}  # fmt: skip


_held: list[Standby] = []


def start_ahead() -> None:
    """Start the supervisor of the next run's agent now (`python -m gatekeeper run`, before
    the launcher loads): taken by take()."""
    _held.append(Standby())


def take() -> Standby:
    """The supervisor started ahead for this run, else one started now."""
    return _held.pop() if _held else Standby()
