"""Run one command under a MountPlan with bubblewrap, and report how it ended."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gatekeeper.errors import SandboxError
from gatekeeper.proc import signal_name
from gatekeeper.sandbox import ahead, seccomp
from gatekeeper.sandbox.ahead import Standby, launcher_env
from gatekeeper.sandbox.limits import ProcessLimit, apply_rlimits, randomize_addresses
from gatekeeper.sandbox.machine import setup_failure_hint
from gatekeeper.sandbox.mounts import MountPlan, bwrap_path, namespace_args
from gatekeeper.sandbox.output import InputFeed, filters_for, is_file
from gatekeeper.sandbox.supervise.setup import Observed

USERNS_HINT = (
    "unprivileged user namespaces look disabled; enable them with "
    "`sudo sysctl -w kernel.unprivileged_userns_clone=1` (Debian) or "
    "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 24.04+), "
    "or run gatekeeper as root"
)


@dataclass
class Outcome:
    argv: list[str]
    pid: int | None  # as seen from the launcher
    ppid: int  # bwrap, the sandbox's parent
    exit_code: int | None  # None when it did not finish (timeout, interrupted)
    signal: int | None
    timed_out: bool
    interrupted: bool
    started_at: float
    finished_at: float
    supervisor_failed: bool = False
    interrupted_by: int | None = None  # the signal the launcher got, that stopped the run

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.signal)

    def take_signal(self, observed: Observed) -> None:
        """Learn from the supervisor whether the command was ended by a signal, and which.

        bwrap reports 128 + N for a command a signal ended, which an `exit 137` also gives; the
        supervisor saw the difference (an exit_group call, or none).
        """
        top = next((p.pid for p in observed.processes
                    if p.ppid == self.pid and p.decision == "allow"), None)  # fmt: skip
        if self.pid is None or top not in observed.ends:
            return
        code, signum = observed.ends[top]
        if code is not None:
            return
        if signum is None and self.exit_code is not None and 128 < self.exit_code < 128 + 65:
            signum = self.exit_code - 128  # killed (no exit call), its status already reaped
        self.signal = signum


def limit_standby(pid: int, process_limit: ProcessLimit) -> None:
    """What Sandbox._preexec does in a supervisor's own process, done to a standby's (pid):
    no core dumps, and the run's process limit (its cgroup)."""
    resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
    process_limit.enter(pid)


class Sandbox:
    """The boundary for one run; each `run` call is a fresh bwrap with the same plan."""

    def __init__(
        self,
        plan: MountPlan,
        *,
        max_file_size: int,
        process_limit: ProcessLimit,
        supervisor_config: Path | None = None,
        tty_fd: int | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
        standby: Standby | None = None,
    ) -> None:
        self.plan = plan
        self.standby = standby  # a supervisor started ahead, for the first run
        self.tty_fd = tty_fd  # the launcher's terminal, for the supervisor's questions
        self.wrap = wrap  # puts the network bridge in front of each command
        self.supervisor_config = supervisor_config
        self.bwrap = bwrap_path()
        self.max_file_size = max_file_size
        self.process_limit = process_limit
        self._filter = tempfile.TemporaryFile()
        if seccomp.is_supported():
            self._filter.write(seccomp.build_filter())
            self._filter.flush()
        self.current: subprocess.Popen[bytes] | None = None
        # Values of secrets passed in: masked in the agent's output when it is no terminal.
        self.output_secrets: list[bytes] = []
        self.interrupted = False
        self.interrupted_by: int | None = None  # the signal the launcher got, that stopped it

    def close(self) -> None:
        """Release the filter and the plan's bind descriptors; the sandbox cannot run again."""
        if self.standby is not None:
            self.standby.close()
            self.standby = None
        self._filter.close()
        self.plan.close()

    def _argv(self, argv: list[str], status_fd: int) -> list[str]:
        self._filter.seek(0)
        seccomp_args = ["--seccomp", str(self._filter.fileno())] if seccomp.is_supported() else []
        # The agent's environment is given to bwrap as arguments, for the sandbox only: the
        # supervisor runs outside it with the launcher's own environment and bwrap with none,
        # so nothing a policy or profile sets (LD_PRELOAD, PYTHONPATH, HOME) reaches them.
        env_args = ["--clearenv"]
        for name, value in self.plan.env.items():
            env_args += ["--setenv", name, value]
        bwrap = [self.bwrap, *namespace_args(), *seccomp_args, "--json-status-fd", str(status_fd),
                 *env_args, *self.plan.args, "--", *argv]  # fmt: skip
        if self.supervisor_config is None:
            return bwrap
        # The supervisor is bwrap's parent: it installs the notifying filter, then execs bwrap.
        # The file size cap is the sandbox's, set in the supervisor's child just before that
        # exec: the supervisor's own event log may grow past it.
        return [sys.executable, *ahead.SUPERVISOR, f"--max-file-size={self.max_file_size}",
                str(self.supervisor_config), "--", *bwrap]  # fmt: skip

    def _preexec(self) -> None:
        apply_rlimits(None if self.supervisor_config is not None else self.max_file_size)
        if self.supervisor_config is None:
            randomize_addresses()  # (supervised: in the supervisor's child, before bwrap)
        self.process_limit.enter()

    def _prepare_standby(self, pid: int) -> None:
        limit_standby(pid, self.process_limit)

    def _popen(
        self, argv: list[str], stdin: int | None, stdout: IO[bytes] | int | None,
        stderr: int | None, pass_fds: tuple[int, ...],
    ) -> subprocess.Popen[bytes]:  # fmt: skip
        """The supervisor (or bwrap alone, unsupervised) started on argv: the standby when
        there is one, else a new process."""
        standby, self.standby = self.standby, None
        if standby is not None and self.supervisor_config is not None:
            out = stdout if isinstance(stdout, int) or stdout is None else stdout.fileno()
            stdio = {0: 0 if stdin is None else stdin, 1: 1 if out is None else out,
                     2: 2 if stderr is None else stderr}  # fmt: skip
            fds = {**stdio, **{fd: fd for fd in pass_fds}}
            proc = standby.start(argv[len(ahead.SUPERVISOR) + 1 :], fds, self._prepare_standby)
            if proc is not None:
                return proc
        elif standby is not None:
            standby.close()
        return subprocess.Popen(
            argv,
            # Unsupervised, this is bubblewrap, the sandbox's pid 1, whose environ is
            # readable inside: it gets none of the launcher's environment.
            env=launcher_env() if self.supervisor_config is not None else {},
            stdin=stdin, stdout=stdout, stderr=stderr,
            # The plan's bind sources go to bwrap as descriptors; it closes them once bound.
            pass_fds=pass_fds, preexec_fn=self._preexec, start_new_session=True,
        )  # fmt: skip

    def run(
        self, argv: list[str], *, deadline: float, stdout: IO[bytes] | int | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> Outcome:  # fmt: skip
        """Run argv in the sandbox until it exits or deadline (a time.monotonic() value) passes.

        on_start: called once the sandbox's process is under way (the launcher then waits)."""
        read_fd, write_fd = os.pipe()
        started = time.time()
        dest = stdout if isinstance(stdout, int) or stdout is None else stdout.fileno()
        filters = filters_for(self.output_secrets, dest)
        feed = InputFeed(0) if is_file(0) else None
        try:
            proc = self._popen(
                self._argv(self.wrap(argv) if self.wrap else argv, write_fd),
                stdin=feed.read_fd if feed is not None else None,
                stdout=filters[1].write_fd if 1 in filters else stdout,
                stderr=filters[2].write_fd if 2 in filters else None,
                pass_fds=(write_fd, self._filter.fileno(), *self.plan.fds,
                          *([self.tty_fd] if self.tty_fd is not None else [])),
            )  # fmt: skip
        except OSError as exc:
            for f in set(filters.values()):
                f.finish()
            if feed is not None:
                feed.finish()
            raise SandboxError(f"could not start bubblewrap: {exc}") from exc
        finally:
            os.close(write_fd)
            for f in set(filters.values()):
                f.close_writer()
            if feed is not None:
                feed.close_reader()
        self.current = proc
        timed_out = False
        try:
            if self.interrupted:  # a signal came while it was being started: kill() found none
                self.kill()
            if on_start is not None:
                on_start()
            remaining = deadline - time.monotonic()
            wait_for_exit(proc, max(remaining, 0.001))
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
            proc.wait()
        finally:
            self.current = None
        self.process_limit.kill_all()
        for f in set(filters.values()):
            f.finish()
        if feed is not None:
            feed.finish()
        status = _read_status(read_fd)
        # A signal that we did not send (SIGKILL, or one it has no handler for: SIGHUP from a
        # terminal, SIGTERM): the supervisor was killed, and the sandbox with it. It passes
        # on bwrap's own end as an exit status, never as a signal.
        supervisor_failed = (
            self.supervisor_config is not None and proc.returncode < 0
            and not timed_out and not self.interrupted
        )  # fmt: skip
        if supervisor_failed:
            return Outcome(
                argv=list(argv), pid=status.get("child-pid"), ppid=proc.pid, exit_code=None,
                signal=None, timed_out=False, interrupted=False, started_at=started,
                finished_at=time.time(), supervisor_failed=True,
            )  # fmt: skip
        if "child-pid" not in status and not timed_out and not self.interrupted:
            # The kernel's settings often say exactly why (the same diagnosis as selftest's).
            known = setup_failure_hint()
            raise SandboxError(
                f"the sandbox could not be set up for {argv[0]!r} (exit {proc.returncode})",
                hint=known + "; `gatekeeper selftest` checks each need of the sandbox"
                if known
                else f"see the message above; {USERNS_HINT} if it names namespaces; gatekeeper "
                "also needs seccomp user notification (Linux 5.5 or newer); `gatekeeper "
                "selftest` checks each need of the sandbox",
            )
        exit_code: int | None = status.get("exit-code", proc.returncode)
        sig: int | None = None  # the supervisor tells killed from exited; an exit code cannot
        if timed_out or self.interrupted:
            exit_code = None
        return Outcome(
            argv=list(argv), pid=status.get("child-pid"), ppid=proc.pid, exit_code=exit_code,
            signal=sig, timed_out=timed_out, interrupted=self.interrupted,
            started_at=started, finished_at=time.time(),
            interrupted_by=self.interrupted_by if self.interrupted else None,
        )  # fmt: skip

    def kill(self) -> None:
        """Kill the running sandbox: bwrap's process group; --die-with-parent takes the rest."""
        proc = self.current
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def wait_for_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """proc's exit status, as proc.wait(timeout) gives it but without its polling.

    Popen.wait with a timeout sleeps in steps of up to 50 ms, so a command that ends at once
    was noticed tens of milliseconds late; a pidfd is readable the moment it ends. Raises
    subprocess.TimeoutExpired.
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # already reaped, or no pidfd on this kernel
        return proc.wait(timeout=timeout)
    try:
        poller = select.poll()  # not select(): the proxy may hold more than 1024 descriptors
        poller.register(pidfd, select.POLLIN)
        ready = poller.poll(min(max(1, int(timeout * 1000)), 2**31 - 1))
    finally:
        os.close(pidfd)
    if not ready:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return proc.wait()


def _read_status(fd: int) -> dict[str, int]:
    """Parse bwrap's --json-status-fd stream: {"child-pid": N} then {"exit-code": N}."""
    chunks = []
    with os.fdopen(fd, "rb") as fh:
        chunks.append(fh.read())
    status: dict[str, int] = {}
    decoder = json.JSONDecoder()
    text = b"".join(chunks).decode("utf-8", "replace")
    i = 0
    while i < len(text):
        while i < len(text) and text[i] in " \n\r\t":
            i += 1
        if i >= len(text):
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict):
            status.update({k: v for k, v in obj.items() if isinstance(v, int)})
    return status
