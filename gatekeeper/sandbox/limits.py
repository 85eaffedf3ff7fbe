"""Limits for the sandboxed tree: processes (a pids cgroup, else RLIMIT_NPROC), file size."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import time
from pathlib import Path


class ProcessLimit:
    """A pids cgroup the sandbox joins before bwrap starts; RLIMIT_NPROC when there is none.

    RLIMIT_NPROC does not bind root, so root runs need the cgroup to cap the process count.
    """

    def __init__(self, run_id: str, max_processes: int) -> None:
        self.max = max_processes
        self.path: Path | None = None
        self.procs_file: str | None = None
        self.mechanism = "none"
        # Why there is no cgroup, for the receipt (None when there is one).
        self.cgroup_reason: str | None = None
        why = "no pids cgroup controller found"
        for candidate in self._candidates():
            try:
                group = candidate / f"gatekeeper-{run_id}"
                group.mkdir(exist_ok=True)
                (group / "pids.max").write_text(str(max_processes))
            except OSError as exc:
                with contextlib.suppress(OSError):
                    group.rmdir()  # made, but its limit could not be set: not a half cgroup
                why = (f"cannot create a pids cgroup under {candidate} ({exc.strerror}): "
                       "cgroups are not delegated to this user")  # fmt: skip
                continue
            self.path = group
            self.procs_file = str(group / "cgroup.procs")
            self.mechanism = "cgroup"
            return
        if os.geteuid() != 0:
            self.mechanism = "rlimit"
            self.cgroup_reason = f"{why}; the process limit is RLIMIT_NPROC"
        else:
            self.cgroup_reason = f"{why}; no process limit (RLIMIT_NPROC does not bind root)"

    @staticmethod
    def _candidates() -> list[Path]:
        found: list[Path] = []
        v1 = Path("/sys/fs/cgroup/pids")
        if (v1 / "pids.max").exists() or (v1 / "cgroup.procs").exists():
            own = "/"
            with contextlib.suppress(OSError):
                for line in Path("/proc/self/cgroup").read_text().splitlines():
                    _, controllers, where = line.split(":", 2)
                    if "pids" in controllers.split(","):
                        own = where
            found.append(v1 / own.lstrip("/"))
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                if line.startswith("0::"):
                    base = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
                    control = base / "cgroup.subtree_control"
                    if control.exists() and "pids" in control.read_text().split():
                        found.append(base)
        return found

    def enter(self, pid: int = 0) -> None:
        """Called in the child between fork and exec (pid 0: this process), or on a
        supervisor started ahead (its pid): join the cgroup or set RLIMIT_NPROC."""
        if self.procs_file:
            with open(self.procs_file, "w") as fh:
                fh.write(str(pid))
        elif self.mechanism == "rlimit":
            # Counted per user: leave room for what this user already runs (and only that:
            # counting every process of the machine would leave room for hundreds more).
            current = _processes_of(os.getuid())
            limit = (current + self.max, current + self.max)
            if pid:
                resource.prlimit(pid, resource.RLIMIT_NPROC, limit)
            else:
                resource.setrlimit(resource.RLIMIT_NPROC, limit)

    def kill_all(self) -> None:
        """SIGKILL whatever is left in the cgroup (nothing should be: the pid namespace is gone)."""
        if self.path is None:
            return
        # What is left is mostly a process of the ended namespace still being torn down: it
        # is gone within a millisecond, so the waits start short (a quarter of a millisecond,
        # doubling up to 5 ms) and end after about a quarter of a second in all.
        pause, waited = 0.00025, 0.0
        while waited < 0.25:
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, 9)
            time.sleep(pause)
            waited += pause
            pause = min(pause * 2, 0.005)

    def remove(self) -> None:
        if self.path is None:
            return
        self.kill_all()
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)


def _processes_of(uid: int) -> int:
    """How many processes uid owns now, as RLIMIT_NPROC counts them."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                count += os.stat(f"/proc/{entry}").st_uid == uid
    return count


def remove_leftover(run_id: str) -> bool:
    """Remove the cgroup of a run whose launcher died before it could (kill -9, crash)."""
    removed = False
    for base in ProcessLimit._candidates():
        group = base / f"gatekeeper-{run_id}"
        if group.is_dir():
            limit = ProcessLimit.__new__(ProcessLimit)
            limit.path = group
            limit.remove()
            removed = not group.exists()
    return removed


def kill_strays(run_id: str) -> int:
    """Kill what is left of a run's sandbox whose launcher was killed while bubblewrap was
    starting it; return how many processes that was.

    bubblewrap's first process in the sandbox waits for its parent's word before it arms
    --die-with-parent: with that parent gone (the launcher, then the supervisor, then bwrap
    killed in turn), it waits for good, holding the worktree open. Where there is a cgroup
    its removal ends it; without one (an unprivileged user) it is found here by the run's
    scratch folder on its command line (bubblewrap's own: it has run nothing yet). Only this
    user's processes (any, as root), each through a pidfd taken before its command line is
    read again, so a pid reused meanwhile is never hit.
    """
    marker = f"/gatekeeper-run-{run_id}-".encode()
    killed: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        with contextlib.suppress(OSError):
            if os.getuid() != 0 and entry.stat().st_uid != os.getuid():
                continue
            if not _is_stray(pid, marker):
                continue
            fd = os.pidfd_open(pid)
            try:
                if _is_stray(pid, marker):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed.append(fd)
                    continue
            except OSError:
                pass
            os.close(fd)
    poller = select.poll()
    for fd in killed:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + 2.0
    waiting = set(killed)
    while waiting and time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            waiting.discard(fd)
            poller.unregister(fd)
    for fd in killed:
        os.close(fd)
    return len(killed)


def _is_stray(pid: int, marker: bytes) -> bool:
    """Is pid bubblewrap with the run's scratch folder on its command line?"""
    try:
        # " (deleted)": bubblewrap upgraded (or removed) while the sandbox lived
        program = os.path.basename(os.readlink(f"/proc/{pid}/exe")).removesuffix(" (deleted)")
        if program != "bwrap":
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return marker in fh.read()
    except OSError:
        return False


def apply_rlimits(max_file_size: int | None) -> None:
    """File size cap (None: not here, the supervisor sets it for the sandbox) and no core
    dumps (a core could carry secrets out of memory)."""
    if max_file_size is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_size, max_file_size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# personality(2): the flag that turns address randomization off (setarch -R), and the
# persona that only asks for the current one.
ADDR_NO_RANDOMIZE = 0x0040000
PERSONALITY_QUERY = 0xFFFFFFFF


def randomize_addresses() -> None:
    """Address randomization on for the programs this process runs next: a launcher started
    under `setarch -R` (personality ADDR_NO_RANDOMIZE, inherited) would hand the sandbox a
    setting that makes the same program laid out alike at every exec (the supervisor tells
    a new address space from the old one by its layout), and that the sandbox may not set
    itself (the seccomp filter refuses it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.personality.restype = ctypes.c_int
    libc.personality.argtypes = [ctypes.c_ulong]
    current = libc.personality(PERSONALITY_QUERY)
    if current >= 0 and current & ADDR_NO_RANDOMIZE:
        libc.personality(current & ~ADDR_NO_RANDOMIZE)
        if libc.personality(PERSONALITY_QUERY) & ADDR_NO_RANDOMIZE:
            raise OSError(ctypes.get_errno(), "address randomization could not be turned on")
