"""`python -m gatekeeper.sandbox.supervise [--max-file-size=N] CONFIG -- BWRAP ARGS...`: bwrap
under supervision.

The supervisor forks; the child installs a seccomp filter that notifies this process of every
exec, write-like file call, connect and exit, hands over the listener, and execs bubblewrap.
The supervisor is bwrap's parent, so if it dies, `--die-with-parent` takes the sandbox with it;
and it dies with the launcher (PR_SET_PDEATHSIG). It exits with bwrap's status. The file
size cap (RLIMIT_FSIZE, soft and hard) is set in the child only, for the sandbox: the
supervisor's own event log is not the agent's to fill, and may grow past it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import sys
from typing import NoReturn

from gatekeeper.sandbox.limits import randomize_addresses
from gatekeeper.sandbox.supervise import supervisor as supervising
from gatekeeper.sandbox.supervise import unotify
from gatekeeper.sandbox.supervise.supervisor import Supervisor, load_config

PR_SET_PDEATHSIG = 1
USAGE = "usage: python -m gatekeeper.sandbox.supervise [--max-file-size=N] CONFIG -- BWRAP ARGS..."


def main(argv: list[str]) -> int:
    max_file_size: int | None = None
    if argv and argv[0].startswith("--max-file-size="):
        value = argv[0].partition("=")[2]
        if not value.isdigit():
            print(USAGE, file=sys.stderr)
            return 2
        max_file_size, argv = int(value), argv[1:]
        supervising.SANDBOX_FILE_SIZE = max_file_size
    if len(argv) < 3 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    config = load_config(argv[0])
    launcher = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != launcher:
        return 1
    command = argv[2:]
    prog = unotify.build_notify_filter(watch_reads=config.watch_reads)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = os.fork()
    if child == 0:
        try:
            ours.close()
            if config.tty_fd is not None:
                os.close(config.tty_fd)  # the terminal stays with the supervisor
            listener = unotify.install_listener(prog)
            socket.send_fds(theirs, [b"L"], [listener])
            os.close(listener)
            if theirs.recv(1) != b"G":
                os._exit(125)
            theirs.close()
            # Python ignores SIGPIPE and SIGXFSZ; the sandbox gets the default dispositions.
            for signum in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signum, signal.SIG_DFL)
            if max_file_size is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_size, max_file_size))
            randomize_addresses()  # (under `setarch -R` too: the filter refuses it inside)
            # bubblewrap is the sandbox's pid 1, and its environ is readable from inside
            # (/proc/1/environ): it gets none of the launcher's. The sandbox's own comes
            # as --setenv arguments.
            os.execve(command[0], command, {})
        except BaseException as exc:  # noqa: BLE001 (anything here means no sandbox)
            try:
                os.write(2, f"gatekeeper supervisor: {exc}\n".encode())
            finally:
                os._exit(125)
    theirs.close()
    _raise_open_file_limit()
    try:
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    except OSError:
        fds = []
    if not fds:
        _, status = os.waitpid(child, 0)
        _report_setup_failure(config.events)
        return 125
    supervisor = Supervisor(config, fds[0], child, trampoline=child)
    ours.send(b"G")
    ours.close()
    try:
        status = supervisor.loop()
    except BaseException as exc:  # noqa: BLE001 (see _fail)
        _fail(config.events, child, exc)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _raise_open_file_limit() -> None:
    """Let the supervisor hold as many descriptors as the hard limit allows (the sandbox,
    forked already, keeps the limit it had): it holds a pidfd for each process it watches and
    an address space for each exec not checked yet, and the sandbox may start up to its
    process limit of them, well past a soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _fail(events: str, child: int, exc: BaseException) -> NoReturn:
    """End the sandbox and the supervisor after an error of its own (SIGKILL; never returns).

    Its exit status is the sandbox's: an exception's exit code 1 would read as the
    command's. Killed, the supervisor is reported as failed, and the run with it (launch: a
    supervisor signal the launcher did not send); what went wrong is in the run's events
    and on its error output.
    """
    with contextlib.suppress(BaseException):
        import traceback  # (only here: the supervisor starts lean)

        traceback.print_exception(exc)
        sys.stderr.flush()
    with contextlib.suppress(BaseException):
        line = json.dumps({"t": "error", "message": f"the supervisor failed: "
                                                   f"{type(exc).__name__}: {exc}"})  # fmt: skip
        fd = os.open(events, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        os.kill(child, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def _report_setup_failure(events: str) -> None:
    with open(events, "a") as fh:
        fh.write(
            json.dumps({"t": "error", "message": "seccomp user notification unavailable"}) + "\n"
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
