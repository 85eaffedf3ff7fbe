"""The notification loop: decide each exec, write and connect, and log what happened."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import ipaddress
import json
import os
import resource
import select
import shlex
import signal
import stat
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _quote

from gatekeeper.sandbox.supervise import loader, policing, procmem, unotify
from gatekeeper.sandbox.supervise.display import escape, show_argv
from gatekeeper.sandbox.supervise.lookups import LookupWatch
from gatekeeper.sandbox.supervise.policing import WritePolicy
from gatekeeper.sandbox.supervise.rules import (
    ALLOW,
    ASK,
    DENY,
    EXTERNAL,
    GIT_ELSEWHERE,
    NOTHING_THERE,
    STRICTNESS,
    CommandRules,
    git_command,
)

O_CREAT, O_EXCL, O_TRUNC, O_ACCMODE = 0o100, 0o200, 0o1000, 0o3
PIDFD_THREAD = O_EXCL  # pidfd_open(2): a pidfd of the thread itself
AT_REMOVEDIR = 0x200
AT_EMPTY_PATH = 0x1000
AT_SYMLINK_FOLLOW = 0x400
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
MSG_FASTOPEN = unotify.MSG_FASTOPEN
# How an address the supervisor cannot read is recorded: (host, port, is it the sandbox's own).
UNREADABLE_ADDRESS = ("(unreadable address)", 0, False)
SOCKADDR_UN_MAX = 110  # sizeof(struct sockaddr_un): a longer one the kernel refuses (EINVAL)
SOCKADDR_MAX = 128  # sizeof(struct sockaddr_storage): the kernel refuses longer addresses
MMSGHDR_SIZE = 64  # struct mmsghdr on 64-bit: a 56-byte msghdr, a u32 length, padding
UIO_MAXIOV = 1024  # the most messages one sendmmsg sends
MAX_ANCESTORS = 1024  # how far up a caller's parents an unchecked exec is looked for
# More than the kernel lets an exec's arguments and environment take together (3/4 of the
# 8 MiB stack limit at most), so that the argv an exec runs with is always read whole.
MAX_ARGV_BYTES = 8 << 20
MAX_RECORDED = 64 * 1024  # characters of one argv (or command line) put in the record
MAX_UNVERIFIED = 256  # checks waiting before those of ended processes are swept
MAX_SEARCHES = 64  # PATH searches under way kept, a pidfd each (see Supervisor._absent)
MAX_SEARCH_PATHS = 32  # paths one is known to have tried, past which it is judged afresh
# The rule of an exec refused because the supervisor has no descriptor left to judge or
# watch it (the run fails: an error is recorded too).
STARVED = "(the supervisor has no descriptor left to watch it)"
# The rule of an exec refused while another thread of its process has one let through that
# is not yet known through or failed: a process has one check after an exec at a time.
UNDER_WAY = "(another thread of this process has an exec under way)"
GONE = "(gone before it could be judged)"
MAX_SCRIPT_DEPTH = 5  # `#!` lines the kernel follows (BINPRM_MAX_RECURSION 4, and the first)
MAX_DEFERRED_CLOSES = 32  # descriptors kept open, no longer used, before they are closed
# The record of a write refused because its path could not be followed by name: only the
# expansion of a link made it longer than PATH_MAX (answered ENAMETOOLONG).
TOO_LONG = policing.TOO_LONG


# How long the loop keeps looking for the next notification before it sleeps, while they
# come close together (see Waiting).
SPIN_SECONDS = 0.001


class Waiting:
    """How the loop waits for its next event: asleep in poll(), or, while notifications come less
    than SPIN_SECONDS apart, looking for one (up to SPIN_SECONDS) before it sleeps.

    A process whose call is notified waits for the answer, and the answer waits for the
    supervisor to run: woken from sleep, on a virtual machine, that is a wake-up of an idle CPU,
    some 100 to 200 us a call here, three times an exec (the exec, the new program's first call,
    its exit). Looking first answers a call that comes within the window as soon as it comes, at
    the price of that CPU time; an average of the recent gaps (each counted up to twice the
    window) decides whether to look, so a run whose calls come seldom (a build, a test suite)
    sees the supervisor asleep, as before. It looks only while the machine has no more processes
    ready to run than this one has CPUs to use (the kernel's count in /proc/loadavg, this
    process included): otherwise the time spent looking would be taken from them (other runs, a
    parallel build), and with fewer than two CPUs (cpus) from the process whose call comes next,
    so then it never looks. Between looks the CPU is offered to anything else ready to run there
    (sched_yield).
    """

    def __init__(self, cpus: float, loadavg: str = "/proc/loadavg") -> None:
        self.cpus = cpus
        self.gap = 2 * SPIN_SECONDS  # no looking until the calls are seen to come close
        self.loadavg = -1
        if cpus >= 2:
            with contextlib.suppress(OSError):
                self.loadavg = os.open(loadavg, os.O_RDONLY | os.O_CLOEXEC)

    def _cpu_free(self) -> bool:
        """No more processes ready to run on the machine than this one may use CPUs."""
        try:
            running = int(os.pread(self.loadavg, 128, 0).split()[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return False
        return running <= self.cpus

    def wait(self, poll: select.poll, timeout_ms: int = 1000) -> list[tuple[int, int]]:
        start = time.monotonic()
        ready: list[tuple[int, int]] = []
        if self.gap < SPIN_SECONDS and self.loadavg >= 0:
            ready = poll.poll(0)  # (what is there already needs no look at the machine's load)
            if not ready and self._cpu_free():
                deadline = start + SPIN_SECONDS
                while not ready and time.monotonic() < deadline:
                    os.sched_yield()
                    ready = poll.poll(0)
        if not ready:
            ready = poll.poll(timeout_ms)
        waited = min(time.monotonic() - start, 2 * SPIN_SECONDS)
        self.gap += (waited - self.gap) / 4
        return ready

    def close(self) -> None:
        if self.loadavg >= 0:
            os.close(self.loadavg)
            self.loadavg = -1


def usable_cpus(own: str = "/proc/self/cgroup", groups: str = "/sys/fs/cgroup") -> float:
    """The CPUs this process may use: those it may run on, or fewer where a cgroup's CPU
    bandwidth limit (cpu.max, here or in a group above) allows less time than that."""
    cpus = float(len(os.sched_getaffinity(0)))
    try:  # (a cgroup's name may be any bytes but `/`: kept as they are)
        with open(own, encoding="utf-8", errors="surrogateescape") as fh:
            group = next((line[3:].strip() for line in fh if line.startswith("0::")), None)
    except OSError:
        return cpus
    while group is not None:
        try:
            path = f"{groups}{group.rstrip('/')}/cpu.max"
            with open(path, encoding="ascii") as fh:
                quota, period = fh.read().split()[:2]
            if quota != "max":
                cpus = min(cpus, int(quota) / int(period))
        except (OSError, ValueError, ZeroDivisionError):
            pass
        group = None if group in ("/", "") else os.path.dirname(group.rstrip("/"))
    return cpus


@dataclass
class Config:
    events: str
    commands: CommandRules
    writes: WritePolicy
    ask: str = "never"
    watch_reads: bool = False
    bwrap: str = ""
    tty_fd: int | None = None  # the launcher's terminal, passed in for `--ask tty`
    launcher_argv: list[str] = field(default_factory=list)  # the network bridge's own argv
    watches: dict[str, str] = field(default_factory=dict)  # secret stand-in -> hidden path


def load_config(path: str) -> Config:
    with open(path) as fh:
        data = json.load(fh)
    w = data["writes"]
    return Config(
        events=data["events"], commands=CommandRules.from_config(data["commands"]),
        writes=WritePolicy(w["worktree"], w["write"], w["protected"], w["scratch"],
                           w["secret_names"], w["secret_paths"], w.get("scaffold", []),
                           w.get("readonly", [])),
        ask=data.get("ask", "never"), watch_reads=data.get("watch_reads", False),
        bwrap=data.get("bwrap", ""), tty_fd=data.get("tty_fd"),
        launcher_argv=data.get("launcher_argv", []), watches=data.get("watches", {}),
    )  # fmt: skip


def _exists_in_root(pid: int, path: str) -> bool:
    """True when path exists in pid's own filesystem view, reached without following any link.

    Each component is opened O_PATH|O_NOFOLLOW from a descriptor of the process's root, so a
    symlink the agent swaps in on the way is never followed into the supervisor's (the
    host's) filesystem; a link on the way answers False (the write is then judged as usual).
    """
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return False
    plain = procmem.exists_plain(pid, path)  # one lookup by the kernel, where it can
    if plain is not None:
        return plain
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        for index, part in enumerate(parts):
            try:
                following = os.open(part, flags, dir_fd=fd)
            except OSError:
                return False
            os.close(fd)
            fd = following
            if index < len(parts) - 1 and not stat.S_ISDIR(os.fstat(fd).st_mode):
                return False  # a link or a file on the way
        return True
    finally:
        os.close(fd)


def _now() -> str:
    """The time of an event in UTC to the millisecond, as datetime.isoformat writes it (every
    event carries one: the date and time of day are formatted once a second)."""
    seconds, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
    return f"{_second_text(seconds)}.{nanoseconds // 1_000_000:03d}+00:00"


@functools.lru_cache(maxsize=1)
def _second_text(seconds: int) -> str:
    # time.strftime, not datetime: the supervisor starts before every sandbox, importing little.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def event_line(event: dict[str, object]) -> str:
    """One event as a line of JSON, exactly as json.dumps(event, ensure_ascii=True) writes it.

    The values events hold (strings, whole numbers, None, booleans, lists of strings) are
    written here with the json module's own string encoder: json.dumps' layers around it
    cost more than the encoding, once per event. Anything else goes through json.dumps.
    """
    parts = []
    for key, value in event.items():
        if value is None:
            text = "null"
        elif value is True or value is False:
            text = "true" if value else "false"
        elif type(value) is str:
            text = _quote(value)
        elif type(value) is int:
            text = int.__repr__(value)
        elif type(value) is list and all(type(v) is str for v in value):
            text = "[" + ", ".join(map(_quote, value)) + "]"
        else:
            text = json.dumps(value, ensure_ascii=True)
        parts.append(f"{_quote(key)}: {text}")
    return "{" + ", ".join(parts) + "}\n"


def _parent_then_children(pid: int, ppid: int) -> Iterator[int]:
    """ppid, then the children of pid's process (read only when asked for)."""
    yield ppid
    yield from procmem.children(pid)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _texts(raws: list[bytes]) -> list[str]:
    """[_text(r) for r in raws], decoded at once: no word holds a NUL, and a NUL ends any
    UTF-8 sequence, so each word decodes exactly as it would alone."""
    if not raws:
        return []
    return b"\0".join(raws).decode("utf-8", "surrogateescape").split("\0")


@dataclass
class _Expected:
    """An allowed exec, as judged: the file it runs, the argv, and the image before it."""

    image: tuple[int, int] | None  # (st_dev, st_ino) of the program the kernel should run
    before: tuple[int, int] | None  # the image the process ran before (a failed exec keeps it)
    argv: list[str] | None
    decision_rule: str | None  # the ask rule a person approved, if any
    tid: int = 0  # the thread that made the exec call
    # A descriptor of the address space the exec is to replace (/proc/PID/mem, opened before
    # the answer), -1 when there is none.
    memory: int = -1
    # The parent that shared that address space when the exec was judged (a vfork parent,
    # which goes on with it once the exec is through): its pid and a pidfd of it, or -1.
    sharer: int = -1
    sharer_fd: int = -1
    # Where the address space the exec starts from has its parts (procmem.layout): what the
    # process shows until the exec has replaced it.
    before_layout: tuple[bytes, ...] | None = None
    # A pidfd of the thread that made the exec when that is not the process's first (-1
    # otherwise): once the exec is past its point of no return that thread has the process's
    # id, and its own has no task left.
    thread_fd: int = -1
    # A descriptor of the process's cmdline (/proc/TGID/cmdline), taken once the exec was
    # answered, so that the check after it reads the argv the new program runs with without
    # an open while the program waits; -1 when there is none.
    cmdline: int = -1

    def thread_is_its_own(self) -> bool:
        """True while the exec's thread is still the thread it was (in the exec, or back from
        one that failed); False once it has taken over the process's id (or ended)."""
        return procmem.pidfd_alive(self.thread_fd)

    def unused(self) -> bool:
        """True once nobody uses the address space the exec started from (read through the
        descriptor held of it: then a read gives nothing; while it is in use a read gives
        bytes, or EIO where nothing is mapped)."""
        if self.memory < 0:
            return False
        try:
            return os.pread(self.memory, 1, 0) == b""
        except OSError:
            return False

    def is_replaced(self, pid: int) -> bool:
        """True once process pid (the exec's, by any of its threads' ids) no longer uses the
        address space the exec started from: the exec went through (or its process ended).

        Nobody uses it any more; or the process that shared it when the exec was judged (a
        vfork parent, a CLONE_VM child, which go on with it) still uses it, and the process
        no longer shares one with it (kcmp). That the sharer still uses it is told by its
        layout, as the old one's (no exec of its own since, and not ended: an ended one has
        none, and would share nothing with anyone)."""
        if self.unused():
            return True
        if self.sharer_fd < 0 or pid <= 0:
            return False
        shared = procmem.same_address_space(pid, self.sharer)
        if shared is None or shared:
            return False  # (None: the sharer has ended, or cannot be compared: not known)
        if procmem.has_ended(self.sharer_fd, self.sharer):
            return False
        layout = procmem.layout(f"/proc/{self.sharer}")
        return layout is not None and layout == self.before_layout

    def command_line(self, tgid: int, who: int) -> bytes | None:
        """What /proc shows of the argv thread who of process tgid runs with (see
        procmem.read_proc)."""
        if who == tgid and self.cmdline >= 0:
            return procmem.read_open(self.cmdline, MAX_ARGV_BYTES)
        return procmem.read_proc(f"/proc/{who}/cmdline", MAX_ARGV_BYTES)

    def descriptors(self) -> list[int]:
        fds = (self.memory, self.sharer_fd, self.thread_fd, self.cmdline)
        return [fd for fd in fds if fd >= 0]

    def close(self) -> None:
        for fd in self.descriptors():
            os.close(fd)
        self.forget_descriptors()

    def forget_descriptors(self) -> None:
        self.memory = self.sharer_fd = self.thread_fd = self.cmdline = -1


@dataclass
class _Tracked:
    pidfd: int
    exited: bool = False


@dataclass(slots=True)
class _Search:
    """A thread's PATH search whose misses were answered with the error alone (see
    Supervisor._absent): its argv's address, the name looked for, the paths tried (their
    hashes), and a pidfd of the thread itself, so that an id given to another thread since
    is not taken for it."""

    argv_addr: int
    name: str
    tried: set[int]
    thread: int


@dataclass
class Supervisor:
    config: Config
    listener: int
    child: int
    trampoline: int
    armed: bool = False
    # The sandbox's pid namespace (of the process whose exec armed the supervisor).
    sandbox_pids: int | None = None
    bridge_pending: bool = True
    names: dict[int, str] = field(default_factory=unotify.names_by_number)
    mem: procmem.MemoryReader = field(default_factory=procmem.MemoryReader)
    tracked: dict[int, _Tracked] = field(default_factory=dict)
    by_pidfd: dict[int, int] = field(default_factory=dict)
    # Processes killed for running what was not judged, until they are gone: pidfd -> tgid.
    killed: dict[int, int] = field(default_factory=dict)
    exited: set[int] = field(default_factory=set)
    # Allowed execs not yet seen running (by thread group): what the kernel was to run.
    unverified: dict[int, _Expected] = field(default_factory=dict)
    # Checks done during this notification, their descriptors closed after its answer.
    retired: list[_Expected] = field(default_factory=list)
    # Descriptors no longer used, closed together (_close_later).
    closing: list[int] = field(default_factory=list)
    serving: int = 0  # the id of the notification being handled
    # (pid, command line) of the external writes a process was told of
    external_told: set[tuple[int, str]] = field(default_factory=set)
    # A PATH search under way, by thread, of misses answered with the error alone (_absent).
    searches: dict[int, _Search] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A plain descriptor, appended to by one write per event: each event is in the file
        # (the kernel's) before the call it records is answered, and a buffer layer would only
        # add its cost.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self.out = os.open(self.config.events, flags, 0o666)
        self.channel = unotify.Channel(self.listener)
        self.loaders = loader.identities()
        # One handler per syscall number, looked up once rather than by name per notification.
        self.handlers = {nr: getattr(self, f"_on_{name}", None) for nr, name in self.names.items()}
        self.execve = next((nr for nr, name in self.names.items() if name == "execve"), -1)
        self.execs = {nr for nr, name in self.names.items() if name in ("execve", "execveat")}
        # (Not SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP: it hands the CPU straight between the
        # process and the supervisor, so the record made after an answer waits for the
        # process's next call; woken plainly, the two run at once on two CPUs, and an exec
        # costs some 0.3 times a bare exec less on a two-core machine.)
        self.poll = select.poll()
        self.poll.register(self.listener, select.POLLIN)
        self.waiting = Waiting(usable_cpus())
        self.child_fd = os.pidfd_open(self.child)
        self.poll.register(self.child_fd, select.POLLIN)
        self.lookups = LookupWatch(self.config.watches)
        if self.lookups.fd >= 0:
            self.poll.register(self.lookups.fd, select.POLLIN)

    def emit(self, **event: object) -> None:
        # What a process names is bounded in the record (the decision saw all of it): an
        # agent's execs with megabytes of arguments each would otherwise fill the host's disk
        # with events and the launcher's memory with the receipt.
        argv = event.get("argv")
        if isinstance(argv, list):
            event["argv"] = _recorded_argv(argv)
        value = event.get("value")
        if isinstance(value, str) and len(value) > MAX_RECORDED:
            event["value"] = f"{value[:MAX_RECORDED]}... ({len(value) - MAX_RECORDED} more "
            "characters not recorded)"
        self._write(event_line(event))

    def _write(self, line: str) -> None:
        data = line.encode("ascii")
        try:
            while data:
                data = data[os.write(self.out, data) :]
        except OSError:
            self._record_lost()

    def _record_lost(self) -> None:
        """End the sandbox and the supervisor at once (SIGKILL; never returns).

        A record is written after its call was answered (an exec runs, a write is made), so
        one that cannot be written (a full disk) would leave a receipt without it: nothing
        after can be trusted either. Killed, the supervisor is reported as failed and the run
        with it (launch: a supervisor signal the launcher did not send).
        """
        with contextlib.suppress(OSError):
            os.kill(self.child, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def _emit_exit(self, pid: int, code: int) -> None:
        """emit(t="exit", pid=pid, code=code, time=_now()), written out directly: one comes
        at the end of every process, between its exit call and its parent's next step."""
        self._write(
            f'{{"t": "exit", "pid": {int(pid)}, "code": {int(code)}, "time": "{_now()}"}}\n'
        )

    # --- the loop --------------------------------------------------------------------------

    def loop(self) -> int:
        """Serve notifications until bwrap exits; return its wait status."""
        listening = True
        status: int | None = None
        while status is None:
            try:
                ready = self.waiting.wait(self.poll)
            except InterruptedError:
                continue
            if not ready:
                self._close_deferred()
            for fd, mask in ready:
                if fd == self.listener:
                    if mask & select.POLLIN:
                        self._serve_one()
                    elif mask & (select.POLLHUP | select.POLLERR) and listening:
                        # Nobody is left under the filter: stop polling it rather than spin.
                        self.poll.unregister(self.listener)
                        listening = False
                elif fd == self.child_fd:
                    _, status = os.waitpid(self.child, 0)
                    break
                elif fd == self.lookups.fd:
                    self._lookups()
                elif fd in self.killed:
                    if not procmem.has_ended(fd, self.killed[fd]):
                        continue  # a thread's exec under way: the kill is still to come
                    self.poll.unregister(fd)
                    os.close(fd)
                    del self.killed[fd]
                else:
                    self._process_gone(fd)
        for pid in list(self.tracked):
            self._finish(pid)
        self._close_deferred()
        if self.lookups.fd >= 0:
            self._lookups()
            self.lookups.close()
        self.mem.close()
        self.waiting.close()
        os.close(self.out)
        return status

    def _lookups(self) -> None:
        for path in self.lookups.read():
            if self.armed:  # before that, bwrap itself is setting up the mounts
                self.emit(t="secret", pid=None, path=path, time=_now())

    def _serve_one(self) -> None:
        try:
            notif = self.channel.recv()
        except OSError as exc:
            self.emit(t="error", message=f"receiving a notification failed: {exc}")
            return
        if notif is None:
            return
        try:
            self._handle(notif)
        except Exception as exc:  # noqa: BLE001 (fail closed: refuse what we could not judge)
            self.emit(t="error", message=f"{type(exc).__name__}: {exc}", pid=notif.pid)
            self._refuse(notif, int(notif.pid))
        finally:
            # Pages read are kept for one notification only: memory changes between calls,
            # and a page kept for a thread that ended would be taken for whatever process
            # gets that id next.
            self.mem.close()
            for fd in procmem.forget_roots():
                self._close_later(fd)
            for expected in self.retired:
                for fd in expected.descriptors():
                    self._close_later(fd)
                expected.forget_descriptors()
            self.retired.clear()

    def _close_later(self, fd: int) -> None:
        """Close fd with others, after the call that ended its use is answered (a process's
        pidfd, the memory of an address space an exec replaced): each close frees what the
        kernel kept for it, a cost a waiting process need not see."""
        if fd >= 0:
            self.closing.append(fd)
            if len(self.closing) >= MAX_DEFERRED_CLOSES:
                self._close_deferred()

    def _close_deferred(self) -> None:
        for fd in self.closing:
            os.close(fd)
        self.closing.clear()

    def _refuse(self, n: unotify.Notif, pid: int) -> None:
        """Refuse a call (EACCES). A C library does not look at what set_tid_address gives
        back (it would take an error for the thread's id and go on): its process is ended."""
        if self.names.get(n.data.nr) == "set_tid_address":
            self._kill(pid)
        self._respond(n.id, errno.EACCES)

    def _respond(self, notif_id: int, error: int = 0) -> bool:
        """Answer a call; False when it was not answered (no longer waiting, or an error)."""
        try:
            return self.channel.respond(notif_id, error)
        except OSError as exc:
            self.emit(t="error", message=f"answering a notification failed: {exc}")
            return False

    # --- dispatch --------------------------------------------------------------------------

    def _handle(self, n: unotify.Notif) -> None:
        nr = n.data.nr
        pid = int(n.pid)
        args = n.data.args
        if not self.armed:
            # bwrap is still building the sandbox; the agent's exec arms the supervisor.
            name = self.names.get(nr, "")
            if name in ("execve", "execveat") and pid != self.trampoline and self._is_bwrap(pid):
                self.armed = True
                # The sandbox is set up (its root read-only): its root and the links at it
                # are known, and held; bwrap's first process stays outside.
                procmem.share_sandbox_root(pid, outside=self.child)
                self.sandbox_pids = procmem.pid_namespace(pid)
            else:
                self._respond(n.id)
                return
        if self.killed and self._is_killed(pid):
            # A call it made before the kill took effect: answered, it would still run.
            self._respond(n.id, errno.EACCES)
            return
        self.serving = n.id
        if self.searches and pid in self.searches and nr != self.execve:
            self._end_search(pid)  # another call: its search is over
        if self.unverified and not self._runs_what_was_judged(pid):
            self._refuse(n, pid)
            return
        handler = self.handlers.get(nr)
        if handler is None:
            self._respond(n.id)
            return
        try:
            handler(n, pid, args)
        except procmem.Answered as exc:
            # A write-like call the kernel's lookup fails whatever the policy (a name in a
            # removed folder, a path out of a RESOLVE_BENEATH descriptor): its errno, no
            # record (nothing was written, nothing refused).
            if self.channel.is_valid(n.id):
                self._respond(n.id, exc.errno or errno.ENOENT)

    def _runs_what_was_judged(self, pid: int) -> bool:
        """At a watched call of a process or of its descendants after an allowed exec: does
        it run what was judged?

        The kernel reads the path and argv again after the supervisor's answer, so another
        thread can change them in between. What runs is judged again from /proc (its
        program file and the argv the kernel copied); if the policy refuses it, it is killed
        (with the caller, when that is a descendant it started) before this call takes
        effect, and recorded. False when the caller was killed.
        """
        parent: int | None = None
        if pid in self.unverified:
            here: int | None = pid
        else:
            here, parent = procmem.ids(pid)  # a thread's PPid is its process's parent
        for _ in range(MAX_ANCESTORS):
            if here is None or here <= 1 or here in (self.child, self.trampoline):
                return True  # up to bubblewrap: nothing above it runs agent code
            if here in self.unverified and not self._verify(here, pid):
                if here != pid:
                    self._kill(pid)  # started by a program that should never have run
                return False
            if not self.unverified:
                return True
            here = parent if parent is not None else procmem.parent_pid(here)
            parent = None
        # Deeper than any real tree of processes: its top is not known to run what was judged.
        self.emit(t="error", pid=pid, message=f"a call more than {MAX_ANCESTORS} processes "
                  "below the sandbox's first was refused")  # fmt: skip
        return False

    def _kill(self, pid: int, pidfd: int = -1) -> None:
        """Kill pid's process (pidfd: a pidfd of it already taken), and refuse the calls it
        still has waiting until it is gone.

        A kill takes effect when the process next runs: a call of it already waiting here,
        answered "continue" before that, would still be made.
        """
        tgid = pid if pidfd >= 0 or pid in self.unverified else procmem.thread_group(pid)
        if pidfd < 0:
            try:
                pidfd = os.pidfd_open(tgid if tgid is not None else pid)
            except OSError:
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
                return
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        self.killed[pidfd] = tgid if tgid is not None else pid
        self.poll.register(pidfd, select.POLLIN)

    def _kill_tree(self, tgid: int) -> None:
        """Kill a process and every process it started that is still there (each started by
        a program that should never have run). Each is stopped as it is found, so none of
        them starts another one after its parent's children were read; then all are killed.

        The supervisor sees the sandbox's processes from outside its pid namespace: a pid
        read from /proc may be another process's by the time it is used, one of the
        user's own. So each is signalled through a pidfd, taken only once the process it
        refers to is known to be a child of the one it was found under (or, that one having
        ended, one of the sandbox's processes)."""
        found: dict[int, int] = {}  # pid: a pidfd of it, in the order found
        queue = [(tgid, 0)]
        while queue:
            pid, parent = queue.pop()
            if pid in found:
                continue
            if parent:
                pidfd = self._claim(pid, found[parent], parent)
            else:
                pidfd = self._own_pidfd(pid)
            if pidfd < 0:
                continue
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
            found[pid] = pidfd
            children = procmem.children(pid)
            if procmem.pidfd_alive(pidfd):  # then those were its children
                queue.extend((child, pid) for child in children)
        for pid, pidfd in found.items():
            self._kill(pid, pidfd)

    def _own_pidfd(self, tgid: int) -> int:
        """A pidfd of a process whose exec was judged: a copy of the one taken then (its pid
        may be another process's by now), else one opened now; -1 when it is gone."""
        tracked = self.tracked.get(tgid)
        try:
            return os.dup(tracked.pidfd) if tracked is not None else os.pidfd_open(tgid)
        except OSError:
            return -1

    def _claim(self, pid: int, parent_fd: int, parent: int) -> int:
        """A pidfd of process pid, when it is a child of parent or, parent having ended (its
        children handed on), in the sandbox's pid namespace; -1 when it is not, or is gone."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return -1
        ours = procmem.parent_pid(pid) == parent or (
            procmem.has_ended(parent_fd, parent)
            and self.sandbox_pids is not None
            and procmem.pid_namespace(pid) == self.sandbox_pids
        )
        if ours and procmem.pidfd_alive(pidfd):  # what was read is of the pidfd's process
            return pidfd
        os.close(pidfd)
        return -1

    def _is_killed(self, pid: int) -> bool:
        killed = self.killed.values()
        return pid in killed or procmem.thread_group(pid) in killed

    def _drop(self, tgid: int) -> None:
        expected = self.unverified.pop(tgid, None)
        if expected is not None:
            expected.close()

    def _retire(self, tgid: int) -> None:
        """Drop a check that is done, closing its descriptor once the call is answered (the
        close frees what is left of the address space the exec replaced)."""
        expected = self.unverified.pop(tgid, None)
        if expected is not None:
            self.retired.append(expected)

    def _sweep(self) -> None:
        """Drop the checks of processes that ended before any watched call (a thread's exec is
        not watched through a pidfd), with the descriptors they hold."""
        for tgid in list(self.unverified):
            if _reaped(tgid):
                self._drop(tgid)

    def _verify(self, tgid: int, caller: int) -> bool:
        """Check one process against what was judged at its exec; kill it if refused.

        caller is the thread making the watched call: one of tgid's, or of a descendant's.
        The kernel answers other threads and processes while the exec is still under way
        (until it has replaced the address space, the process runs its old program): their
        calls go on, and the check waits for a call that sees the exec's end. A call seen
        late (its thread was ended by the exec meanwhile) changes nothing: the check is
        made, and dropped, only on what the new program is.
        """
        expected = self.unverified[tgid]
        # Read through its first thread; when that one has ended (while another thread's
        # exec takes the process over, until it has the process's id; or for good, that
        # thread's own exit while others run on), through a thread that is there.
        who, image = self._live_thread(tgid)
        if image is None:
            return self._gone(tgid)
        # A failed exec leaves the old program, whose argv was judged when it started; it is
        # judged again below, as is an exec that went through to the same program file (the
        # old address space may live on in another process: a vfork parent).
        # The exec's own thread, back from it: a first thread keeps its id; a thread that was
        # not the first is asked whether it is still itself (the exec failed), since once it
        # has taken over the process's id its own may be given to another task.
        own = caller == expected.tid and (expected.thread_fd < 0 or expected.thread_is_its_own())
        if not own and not self._exec_through(expected, tgid, who, caller, image):
            # The old program still runs, and the exec's own thread is not back: the exec is
            # under way (or failed), and this thread or process runs what was judged before.
            return True
        raw = expected.command_line(tgid, who)
        if not raw:
            placed = procmem.arguments_placed(f"/proc/{who}")
            if placed is None:  # gone since
                return self._gone(tgid)
            if not placed:
                # The exec has replaced the address space and not yet written the arguments:
                # the new program has not run, nor started anything. The next call checks.
                return True
            # Written since (read again), or read as nothing (the program unmapped them):
            # then judged as unreadable.
            raw = expected.command_line(tgid, who)
        self._retire(tgid)
        if (
            image == expected.image
            and expected.argv is not None
            and raw == _argv_bytes(expected.argv)
        ):
            return True
        argv = _argv_list(raw)
        exe = procmem.proc_link(who, "exe")
        decision, rule = self._judge_running(who, argv, exe)
        if decision == ASK and rule == expected.decision_rule:
            # A person said yes to one command line, and another one runs (its argv changed
            # in memory while the question was read, or the program renamed itself): that
            # one is asked about again, as it is; what is refused is ended.
            decision = self._ask_command(argv, exe, rule)
        if decision == ALLOW:
            # What runs is what the receipt lists (read_events), beside what was judged.
            self.emit(t="exec_recheck", pid=tgid, argv=argv, exe=exe, rule=rule, time=_now())
            return True
        self._kill_tree(tgid)
        self.emit(t="exec", pid=tgid, ppid=procmem.parent_pid(who), argv=argv,
                  cwd=procmem.proc_link(who, "cwd") or "", exe=exe, decision=DENY,
                  rule=f"{rule or '(default)'} (what ran differs from what was judged; killed "
                  "at its first watched call)", time=_now(), unreadable=argv is None)  # fmt: skip
        return False

    def _exec_through(self, expected: _Expected, tgid: int, who: int, caller: int,
                      image: tuple[int, int]) -> bool:  # fmt: skip
        """At a call of another thread or process than the exec's own thread: whether the
        exec has replaced what the process ran, so that what runs is to be judged.

        Known through: another program file runs. An exec made by a thread other
        than the process's first is past its point of no return once that thread has taken
        over the process's id (its own has no task left; every other thread has ended):
        then a call made under the process's id, still waiting, is that thread's own, back
        from the exec; and for any other caller the exec is through once the layout of the
        process's address space differs from the old one's (nothing in the sandbox may
        rewrite a layout, prctl(PR_SET_MM), nor turn address randomization off,
        personality(ADDR_NO_RANDOMIZE): both are refused), as it does once the kernel has put
        the new one in place. Until then, however long the kernel takes, the exec is under
        way. An exec of the first thread is judged at that thread's own next call, or once
        its old address space is known replaced (_Expected.is_replaced).
        """
        if image != expected.before:
            return True
        if expected.thread_fd < 0:
            return expected.is_replaced(who)
        if expected.thread_is_its_own():
            return False  # under way, or failed (the exec's own thread's calls are checked)
        if caller == tgid and self.channel.is_valid(self.serving):
            return True
        if expected.unused():
            return True
        layout = procmem.layout(f"/proc/{who}")
        return layout is not None and layout != expected.before_layout

    def _gone(self, tgid: int) -> bool:
        """A process with nothing left to read: its check is dropped once the process is
        gone (reaped). Until then a thread may still be in the exec: a thread's exec takes
        over the process's id from the first thread, which has ended, and for a moment no
        thread of it can be read while the new program has not run yet. True: the call
        goes on."""
        if _reaped(tgid):
            self._drop(tgid)
        return True

    @staticmethod
    def _live_thread(tgid: int) -> tuple[int, tuple[int, int] | None]:
        """A thread of tgid whose program can be read, and that program: (tgid, None) when
        there is none (the process is gone)."""
        image = _identity(f"/proc/{tgid}/exe")
        if image is not None:
            return tgid, image
        try:
            tids = os.listdir(f"/proc/{tgid}/task")
        except OSError:
            return tgid, None
        for tid in tids:
            if tid != str(tgid) and (image := _identity(f"/proc/{tid}/exe")) is not None:
                return int(tid), image
        # A thread's exec may have taken over the process's id meanwhile (the first thread
        # ended, and then left with the exec's thread id): read the process's id again.
        return tgid, _identity(f"/proc/{tgid}/exe")

    def _judge_running(self, tgid: int, argv: list[str] | None,
                       exe: str | None) -> tuple[str, str | None]:  # fmt: skip
        """The policy's decision for what a process runs, by its argv and program, and, when
        the program is a script's interpreter, by the script it was given (the kernel runs
        `INTERPRETER [ARG] SCRIPT ARGS...`, and a rule names the script): the strictest."""
        image = _identity(f"/proc/{tgid}/exe")
        decision, rule = self._decide_file(argv, exe, image)
        if decision == ALLOW and self.config.commands.git_finds_by_path(argv, exe, image):
            raw = procmem.read_proc(f"/proc/{tgid}/environ", MAX_ARGV_BYTES)
            env = None if raw is None else raw.split(b"\0")
            decision, rule = self._git_environment(argv, env) or (decision, rule)
        if argv is None:
            return decision, rule
        if decision not in (DENY, EXTERNAL) and (
            image in self.loaders or loader.is_loader_name(exe)
        ):
            decision, rule = _stricter((decision, rule), self._loader_decision(tgid, argv))
        cwd = procmem.proc_link(tgid, "cwd")
        for index in (1, 2):
            if len(argv) <= index or decision in (DENY, EXTERNAL):
                break
            joined = procmem.join(cwd, argv[index])
            script = _real_path(tgid, joined) if joined else None
            if script is None or not _is_script(tgid, script):
                continue
            via = self._decide_file(argv[index:], script, _identity_in_root(tgid, script))
            decision, rule = _stricter((decision, rule), via)
        if decision == EXTERNAL:
            decision, rule = DENY, f"external: {rule}"
        return decision, rule

    def _is_bwrap(self, pid: int) -> bool:
        exe = procmem.proc_link(pid, "exe")
        return exe is not None and os.path.basename(exe) == os.path.basename(self.config.bwrap)

    # --- exec ------------------------------------------------------------------------------

    def _on_execve(self, n: unotify.Notif, pid: int, args: object) -> None:
        self._exec(n, pid, dirfd=-100, path_addr=n.data.args[0], argv_addr=n.data.args[1],
                   envp_addr=n.data.args[2], flags=0)  # fmt: skip

    def _on_execveat(self, n: unotify.Notif, pid: int, args: object) -> None:
        self._exec(n, pid, dirfd=_signed(n.data.args[0]), path_addr=n.data.args[1],
                   argv_addr=n.data.args[2], envp_addr=n.data.args[3],
                   flags=n.data.args[4])  # fmt: skip

    def _exec(self, n: unotify.Notif, pid: int, *, dirfd: int, path_addr: int, argv_addr: int,
              envp_addr: int, flags: int) -> None:  # fmt: skip
        raw_path: str | None
        argv: list[str] | None
        if any(expected.sharer >= 0 for expected in self.unverified.values()):
            self._unshare(pid)
        try:
            raw_path = _text(self.mem.string(pid, path_addr))
        except OSError:
            raw_path = None
        found: int | None = None  # procmem.lookup()'s answer, when the path was looked up
        if (
            raw_path
            and raw_path[0] == "/"
            and not self.bridge_pending
            and not raw_path.startswith(("/proc/", "/dev/"))
        ):
            found = procmem.lookup_program(pid, raw_path)
            if found < 0:
                self._absent(n, pid, raw_path, argv_addr, -found)
                return
        if self.searches:
            self._end_search(pid)  # its search found something (or it is no search)
        cwd_link = procmem.proc_link(pid, "cwd")
        cwd = cwd_link or ""
        try:
            argv = _texts(self.mem.string_array(pid, argv_addr))
        except OSError:
            argv = None
        by_fd = bool(flags & AT_EMPTY_PATH and not raw_path)
        fd_image: tuple[int, int] | None = None  # the file of the descriptor, for by_fd
        if by_fd:
            # The descriptor's file is taken before its name: another thread can put another
            # file in its place at any time, and the one expected after the exec must be the
            # one judged (or one judged by a later name, refused if the policy refuses it).
            fd_image = _identity(f"/proc/{pid}/fd/{dirfd & 0xFFFFFFFF}")
            exe = procmem.proc_link(pid, f"fd/{dirfd & 0xFFFFFFFF}")
        else:
            # The working directory read above is the base of a relative path (read once: one
            # view of it for the record and the decision).
            base = cwd_link if procmem.is_cwd(dirfd) else procmem.base_dir(pid, dirfd)
            joined = procmem.join(base, raw_path) if raw_path else None
            exe = _real_path(pid, joined, found=found) if joined else None
            by_fd = (raw_path or "").startswith(("/proc/", "/dev/fd"))
        if not self.channel.is_valid(n.id):
            # The caller is gone (or its call was interrupted): nothing runs, but it was tried.
            self.emit(t="exec", pid=pid, ppid=0, argv=argv, cwd=cwd, exe=exe or raw_path,
                      decision=DENY, rule=GONE, time=_now(),
                      unreadable=argv is None)  # fmt: skip
            self.mem.forget(pid)
            return
        if self.bridge_pending and argv is not None and _is_launcher_exec(argv, self.config):
            # The first exec is the launcher's network bridge, which then execs the command.
            self.bridge_pending = False
            self._respond(n.id)
            self.mem.forget(pid)
            return
        self.bridge_pending = False
        if raw_path is None and not by_fd:
            # The kernel could not read it either, unless another thread just made it readable.
            self._refuse_unjudged(n, pid, argv, cwd, None, "(the program path is unreadable)",
                                  errno.EFAULT)  # fmt: skip
            return
        if exe is None:
            self._unresolved(n, pid, argv, cwd, raw_path or "")
            return
        script: tuple[str | None, list[str]] | None = None
        image: tuple[int, int] | None = None
        rule: str | None  # None: the default decided
        if exe.startswith("/memfd:") or exe.endswith(" (deleted)"):
            decision, rule = DENY, "(a program with no file on disk)"
        else:
            decision, rule = self.config.commands.decide(argv, exe)
            # The program file, opened (as the process sees it) to read its `#!` line where
            # the command is not refused already; that open also tells whether it is there.
            program = None  # a descriptor, or -errno
            if decision not in (DENY, EXTERNAL) and argv is not None:
                program = procmem.open_program(pid, exe)
            if program in (-errno.EMFILE, -errno.ENFILE):
                # Not a file that is not there: the supervisor has no descriptor left.
                decision, rule = DENY, STARVED
                self.emit(t="error", pid=pid, message="an exec was refused: no descriptor left")
                program = None
            elif (
                not by_fd
                and (program is None or program < 0)
                and (program in (-errno.ENOENT, -errno.ENOTDIR) or not _exists(pid, exe))
            ):
                self._unresolved(n, pid, argv, cwd, exe, (decision, rule))
                return
            if program is not None and argv is not None:
                # A script's interpreter runs without an exec of its own: judge it too.
                via, via_rule, script, image = self._interpreter_decision(
                    pid, exe, raw_path or "", argv, program)  # fmt: skip
                decision, rule = _stricter((decision, rule), (via, via_rule))
                # A hard link of a program a rule names is that program, under any name.
                decision, rule = _stricter(
                    (decision, rule), self.config.commands.by_identity(image, argv, exe)
                )
            if decision == ALLOW and self.config.commands.git_finds_by_path(argv, exe, image):
                try:
                    env: list[bytes] | None = self.mem.string_array(pid, envp_addr)
                except OSError:
                    env = None
                decision, rule = self._git_environment(argv, env) or (decision, rule)
        approved_rule = None
        escalation = False
        if decision == ASK:
            decision = self._ask_command(argv, exe, rule)
            approved_rule = rule
        elif decision == EXTERNAL:
            self._external(pid, argv, rule)
            decision, rule = DENY, f"external: {rule}"
        elif decision == DENY and argv is not None and not (rule or "").startswith("("):
            # A deny rule of the policy (or its default): a decision point the person may
            # override for this exact command line. The built-in refusals (rules in
            # parentheses: no file on disk, unreadable #! line) are not.
            escalation = True
        pidfd: int | None = None
        thread_tgid: int | None = None
        ppid = 0
        memory = sharer = sharer_fd = -1
        before: tuple[int, int] | None = None
        if decision == ALLOW:
            # A pidfd opens only for a process (a thread-group leader): then pid is its tgid,
            # and one call tells what reading its status file would; it tells its parent too.
            try:
                pidfd = os.pidfd_open(pid)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    # No descriptor left to watch it (its end, its check after the exec):
                    # refused, and the run fails, rather than let it run unwatched.
                    decision, rule = DENY, STARVED
                    self.emit(t="error", pid=pid, message=f"an exec was refused: {exc}")
            if pidfd is not None:
                # (kernels before 6.13 cannot tell through a pidfd: its stat file can)
                ppid = procmem.pidfd_parent(pidfd) or procmem.parent_pid(pid)
            else:
                # A thread that is not its process's first: its process and that parent.
                thread_tgid, ppid = procmem.ids(pid)
            # The address space the exec starts from (held to see when it is replaced) and
            # the program the process runs now: taken before the look below that shows the
            # caller still waiting in its call, so both are the caller's own. Taken after it,
            # another thread's exec could have ended the caller in between (and put its own
            # program and address space in their place, or left none to open).
        before_layout: tuple[bytes, ...] | None = None
        thread_fd = -1
        if decision == ALLOW:
            memory = self.mem.take(pid)
            before = _identity(f"/proc/{pid}/exe")
            if pidfd is None:  # a thread's exec: its thread tells when it is through
                with contextlib.suppress(OSError):  # (Linux 6.9+)
                    thread_fd = os.pidfd_open(pid, PIDFD_THREAD)
                if thread_fd >= 0:  # (to tell the new address space by: _exec_through)
                    before_layout = procmem.layout(f"/proc/{pid}")
            if memory < 0 and self._out_of_descriptors():
                # Its address space could not be held for the check after the exec.
                decision, rule = DENY, STARVED
                self.emit(t="error", pid=pid, message="an exec was refused: no descriptor left")
            elif memory < 0 and self.channel.is_valid(n.id):
                # Nor could it be for a caller still there (nothing would tell when the exec
                # is through): refused. A caller gone meanwhile is seen below.
                decision, rule = DENY, "(its address space could not be read)"
            elif (
                thread_fd >= 0
                and before_layout in (None, procmem.LAYOUT_HIDDEN)
                and self.channel.is_valid(n.id)
            ):
                # Nor could its layout (hidden from the supervisor: the same for every
                # program, so no new address space could be told from the old).
                decision, rule = DENY, "(its address space could not be read)"
            if decision != ALLOW:
                if pidfd is not None:
                    os.close(pidfd)
                    pidfd = None
                if thread_fd >= 0:
                    os.close(thread_fd)
                    thread_fd = -1
            elif memory >= 0:
                # Another process that uses the same address space goes on with it once the
                # exec is through (a vfork parent; a child started with CLONE_VM), so that
                # the exec is through is asked of the kernel (kcmp) against that process.
                # (Its layout is read once the call is answered: see _sharer_layout.)
                sharer, sharer_fd = self._sharer(pid, ppid)
        # An exec from a thread other than its process's first is recorded under its
        # process's id: allowed, the exec ends every other thread and goes on as the process
        # (the id its exit, and any check after the exec, are known by); refused, it was
        # that process's attempt.
        if decision != ALLOW:
            thread_tgid, ppid = procmem.ids(pid)
        record = {"t": "exec", "pid": thread_tgid or pid, "ppid": ppid or procmem.parent_pid(pid),
                  "argv": argv, "cwd": cwd, "exe": exe, "decision": decision, "rule": rule,
                  "time": "", "unreadable": argv is None}  # fmt: skip
        # (A caller that ended while it was judged, an ask waiting for a person, say, is told
        # by the answer: its pid may be another process's by now, which must not be tracked
        # as this one. Nothing ran: not recorded as a command let run.)
        if decision != ALLOW:
            self._respond(n.id, errno.EACCES)
        elif (tgid := pid if pidfd is not None else thread_tgid) is None:
            # Its process cannot be told (a thread gone, or no descriptor left to read its
            # status): it would run with no check after the exec; refused.
            _close_all(memory, sharer_fd, thread_fd)
            record.update(decision=DENY, rule=self._refused_after_all(n, pid, STARVED))
            if record["rule"] == STARVED and self._out_of_descriptors():
                self.emit(t="error", pid=pid, message="an exec was refused: no descriptor left")
        elif (
            (earlier := self.unverified.get(tgid)) is not None
            and earlier.tid != pid
            and not self._exec_over(earlier, n)
        ):
            # Another thread's exec let through and not yet seen through or failed (the
            # check at this call found it under way): its check must stay, and one made for
            # this exec, were it let through too, could be used up on the old program once
            # this one failed, while the other went on to run what it was not judged to.
            _close_all(pidfd, memory, sharer_fd, thread_fd)
            record.update(decision=DENY, rule=self._refused_after_all(n, pid, UNDER_WAY))
        else:
            expected = _Expected(image, before, argv, approved_rule, pid, memory, sharer,
                                 sharer_fd, before_layout, thread_fd)  # fmt: skip
            if by_fd and script is None:
                expected.image = fd_image
            self._expect(pid, tgid, exe, by_fd, script, expected)
            if pidfd is None:
                # A thread's exec: its process goes on as the new program, whose end is to be
                # seen (taken while the thread waits here: the process is still this one).
                with contextlib.suppress(OSError):
                    pidfd = os.pidfd_open(tgid)
            # Answered, the caller waited in its call until then: the descriptors taken
            # above are of its process (and address space), not of one given its pid since.
            if self._respond(n.id):
                if self.searches:
                    # A thread's exec gives it its process's id (the first thread's), whose
                    # search, kept under that id, would pass to the new program: ended.
                    self._end_search(tgid)
                if pidfd is not None and self.unverified.get(tgid) is expected:
                    expected.cmdline = _command_line_of(tgid, pidfd)
                self._track(tgid, pidfd)  # (closes pidfd when tgid is tracked already)
                if sharer_fd >= 0 and before_layout is None:
                    expected.before_layout = _sharer_layout(sharer, sharer_fd)
            else:
                self._drop(tgid)
                _close_all(pidfd)
                record.update(decision=DENY, rule=GONE)
            self.mem.forget(pid)  # its address space is about to be replaced (or kept above)
        # Recorded once answered, as a write or an exit is: everything recorded was decided
        # before, and the caller need not wait for the record (the next notification is
        # served after it, so the record keeps its place among the others).
        record["time"] = _now()
        if escalation:
            self.emit(t="escalation", kind="command", value=shlex.join(argv or []),
                      decision="pending", time=record["time"])  # fmt: skip
        self.emit(**record)

    def _refused_after_all(self, n: unotify.Notif, pid: int, rule: str) -> str:
        """Refuse an exec the policy let through, for a reason found at the last (rule); GONE
        when its caller is no longer there to be answered."""
        if self.channel.is_valid(n.id):
            self._respond(n.id, errno.EACCES)
            return rule
        self.mem.forget(pid)
        return GONE

    def _exec_over(self, expected: _Expected, n: unotify.Notif) -> bool:
        """Whether an exec let through, made by another thread of the process of the exec
        call n, is known to be over (failed: the process still runs its old program). Its
        thread ended, or took over the process's id; or it is in another call, or running
        its own code: then the call n still waiting, checked afterwards, tells that it did
        not go through (an exec that goes through ends every other thread of the process
        first, the caller's among them, while its own thread waits in the exec call). False
        when that cannot be told (the thread on a processor at the moment, or in an exec)."""
        if expected.thread_fd < 0 or expected.thread_is_its_own():
            call = procmem.current_call(expected.tid)
            if call is None or call in self.execs:
                return False
        return self.channel.is_valid(n.id)

    def _unshare(self, pid: int) -> None:
        """An exec call of a process that another process's exec counts on as its sharer
        (the one that shows, while it still uses the old address space, whether that exec
        has left it): it no longer tells. Its own exec may run the same program laid out
        the same way (no address randomisation, arguments as long), and its new address
        space would read as the old one, so the other exec would look through while it is
        still under way, and be checked, and its check used up, on the program it replaces.
        Dropped before this call is answered (until then it still uses the old one); that
        exec is then known through once nobody uses the old address space, or at its own
        thread's next call."""
        tgid = procmem.thread_group(pid)
        for expected in self.unverified.values():
            # (its process not told: any might be it)
            if expected.sharer >= 0 and (tgid is None or expected.sharer in (pid, tgid)):
                os.close(expected.sharer_fd)
                expected.sharer = expected.sharer_fd = -1

    def _sharer(self, pid: int, ppid: int) -> tuple[int, int]:
        """(pid, pidfd) of a process other than pid's own that uses pid's address space: its
        parent (a vfork child's), else a child of it; (-1, -1) when there is none. The
        pidfd is taken, then the sharing is asked again: a pid that was reused in between
        is another process's, which shares nothing. Not one whose own exec is still to be
        checked (answered, it may be under way: see _unshare)."""
        for other in _parent_then_children(pid, ppid):
            if other <= 0 or other in self.unverified or not procmem.same_address_space(pid, other):
                continue
            try:
                fd = os.pidfd_open(other)
            except OSError:
                continue
            if procmem.same_address_space(pid, other):
                return other, fd
            os.close(fd)
        return -1, -1

    def _out_of_descriptors(self) -> bool:
        """True when the supervisor cannot open another descriptor (EMFILE, ENFILE)."""
        try:
            os.close(os.dup(self.out))
        except OSError as exc:
            return exc.errno in (errno.EMFILE, errno.ENFILE)
        return False

    def _expect(
        self,
        pid: int,
        tgid: int | None,
        exe: str | None,
        by_fd: bool,
        script: tuple[str | None, list[str]] | None,
        expected: _Expected,
    ) -> None:
        """Note what this allowed exec should run, to check it at its first watched call.

        expected: the exec as judged, its image the identity of the program file as it was
        opened to read its `#!` line; the descriptors it holds are now the check's (closed
        here when there is none to make).
        """
        if tgid is None or exe is None:
            expected.close()
            return
        if script is not None:  # the kernel runs the interpreter, with the script's path
            interpreter, effective = script
            expected.image = _identity_in_root(pid, interpreter) if interpreter else None
            expected.argv = effective
        elif by_fd:
            pass  # the descriptor's file, as judged (None: a /proc/self/fd path, judged again)
        elif expected.image is None:
            expected.image = _identity_in_root(pid, exe)
        self._drop(tgid)
        if len(self.unverified) >= MAX_UNVERIFIED:
            self._sweep()
        self.unverified[tgid] = expected

    def _absent(self, n: unotify.Notif, pid: int, path: str, argv_addr: int,
                error: int) -> None:  # fmt: skip
        """An exec of an absolute path where the kernel finds nothing: most are a PATH search
        trying each folder in turn. Answered with the kernel's own error (ENOENT, ENOTDIR);
        judged by name as _unresolved judges, reading the argv only as far as the rules need:
        its first word, when no rule can name that or the path's last part."""
        # Judged (and recorded) by its last part as the path resolves, not as it is spelled:
        # `/nowhere/git/.` and `/nowhere/git/` name git, as the part-by-part resolution said.
        # Up to where nothing is, no part is a link (a link is something), but for a link at
        # the sandbox's root that the lookup went through: the path is taken through it, as
        # the kernel went (a rule naming /usr/bin/X names a miss at /bin/X).
        path = procmem.looked_up(pid, path)
        commands = self.config.commands
        # The next folder of a PATH search whose misses were answered with the error alone,
        # by the same thread with the same argv (its address) for the same name, where the
        # rules decide by name: the same again, its argv not read again. Nothing runs at a
        # miss whatever the argv says; its answer is the error either way. A path tried
        # before starts another search (a program that retries with the argv changed in
        # place), judged afresh; so does a thread id that another thread was given since (a
        # child forked after the thread ended has its argv at the same address).
        name = os.path.basename(path)
        search = self.searches.get(pid)
        by_name = commands.decides_by_name(path)
        if (
            by_name
            and search is not None
            and search.argv_addr == argv_addr
            and search.name == name
            and hash(path) not in search.tried  # (two paths of one hash: judged afresh)
            and len(search.tried) < MAX_SEARCH_PATHS
            and procmem.pidfd_alive(search.thread)
        ):
            search.tried.add(hash(path))
            self._respond(n.id, error)
            return
        # The thread is held for the search that this miss may begin, and only while it is
        # seen still waiting for its answer afterwards: a caller gone (its notification read
        # before it was killed, by another thread's exec that gave its id to the new
        # program) would leave a pidfd of whoever has its id now.
        thread = -1
        if by_name:
            with contextlib.suppress(OSError):  # (Linux 6.9+; before it, no search is kept)
                thread = os.pidfd_open(pid, PIDFD_THREAD)
            if thread >= 0 and not self.channel.is_valid(n.id):
                self._close_later(thread)
                thread = -1
        try:
            silent = self._judge_miss(n, pid, path, argv_addr, error)
        except BaseException:
            self._close_later(thread)
            raise
        if silent:
            self._searching(pid, _Search(argv_addr, name, {hash(path)}, thread))
        else:
            self._end_search(pid)
            self._close_later(thread)

    def _judge_miss(self, n: unotify.Notif, pid: int, path: str, argv_addr: int,
                    error: int) -> bool:  # fmt: skip
        """Judge and answer a miss (see _absent); True when answered with the error alone."""
        commands = self.config.commands
        # The argv's first word is read alone only where it can settle the answer: the
        # default allows, and no rule names the path or its last part (a PATH search for
        # git goes on to the whole argv, which its rules read).
        if commands.default == ALLOW and commands.may_default(path):
            try:
                head = _texts(self.mem.string_array(pid, argv_addr, first=1))
            except OSError:
                head = None
            if head is not None and (not head or commands.by_default(head[0], path)):
                self._respond(n.id, error)
                return True
        try:
            argv = _texts(self.mem.string_array(pid, argv_addr))
        except OSError:
            argv = None
        return self._unresolved(n, pid, argv, None, path, error=error)

    def _searching(self, pid: int, search: _Search) -> None:
        """A thread's PATH search begins (again) at a miss answered with the error alone."""
        self._end_search(pid)
        if search.thread < 0 or pid in self.unverified:
            # No pidfd; or the first thread's, while an exec of its process by another
            # thread is under way, which would give its id to the new program (see _exec).
            self._close_later(search.thread)
            return
        if len(self.searches) >= MAX_SEARCHES:  # (threads killed mid-search leave theirs)
            for tid in list(self.searches):
                self._end_search(tid)
        self.searches[pid] = search

    def _end_search(self, pid: int) -> None:
        search = self.searches.pop(pid, None)
        if search is not None:
            self._close_later(search.thread)

    def _unresolved(self, n: unotify.Notif, pid: int, argv: list[str] | None, cwd: str | None,
                    path: str, decided: tuple[str, str | None] | None = None,
                    error: int = errno.ENOENT) -> bool:  # fmt: skip
        """An exec of a path the supervisor finds no file at: never let through unjudged.

        Most are a PATH search trying each folder, and the kernel would say ENOENT too; but
        another thread may have changed the working directory (or a folder) in between, so
        the kernel could find a program there. It is judged by name (argv[0] and the path's
        last part) and answered ENOENT either way; a name that a deny or ask rule (or a
        default other than allow) would refuse is recorded as a refused command. decided: the
        policy's decision for (argv, path), when it was made already; cwd: the working
        directory read already (None: read only for a record). True when it was answered
        with the error alone (allowed by name, not recorded).
        """
        decision, rule = decided or self.config.commands.decide(argv, path or None)
        if decision == EXTERNAL:
            rule = f"external: {rule}"
        if decision != ALLOW:
            self._refuse_unjudged(n, pid, argv, cwd, path,
                                  f"{rule or '(default)'} {NOTHING_THERE}", error,
                                  missed=True)  # fmt: skip
            return False
        # Not recorded: a PATH search tries folder after folder, and what it finds is.
        self._respond(n.id, error)
        return True

    def _refuse_unjudged(self, n: unotify.Notif, pid: int, argv: list[str] | None,
                         cwd: str | None, exe: str | None, rule: str, error: int,
                         missed: bool = False) -> None:  # fmt: skip
        """Record a refusal of an exec judged by name only, and answer it with error. missed:
        nothing was at its path (a PATH search's miss: its record says so, for the receipt to
        fold a search's misses into one entry)."""
        if cwd is None:
            cwd = procmem.proc_link(pid, "cwd") or ""
        more = {"missed": True} if missed else {}
        self.emit(t="exec", pid=pid, ppid=procmem.parent_pid(pid), argv=argv, cwd=cwd, exe=exe,
                  decision=DENY, rule=rule, time=_now(), unreadable=argv is None,
                  **more)  # fmt: skip
        self._respond(n.id, error)

    def _interpreter_decision(
        self, pid: int, exe: str, raw_path: str, argv: list[str], fd: int
    ) -> tuple[str, str | None, tuple[str | None, list[str]] | None, tuple[int, int] | None]:
        """The decision for the `#!` interpreter line of a script, as the kernel will run it,
        (interpreter path, the argv it gets) when exe is a script, and the identity of the
        file read (None when unread).

        fd: the program file opened by procmem.open_program (or -errno); closed once the
        call is answered.
        """
        try:
            if fd < 0:
                raise OSError(errno.EACCES, "unreadable")
            st = os.fstat(fd)
            identity = (st.st_dev, st.st_ino)
            # Only a regular file is run (the kernel refuses anything else with EACCES): a
            # device, a FIFO or a socket is never read here (/dev/tty would be the
            # supervisor's own terminal).
            head = os.read(fd, 256) if stat.S_ISREG(st.st_mode) else b""
        except OSError:
            # The kernel reads a `#!` line without read permission; the supervisor cannot.
            # Its interpreter could be anything: refuse when the policy refuses anything.
            if self.config.commands.refuses_anything:
                return DENY, "(the program file could not be read to check its #! line)", None, None
            return ALLOW, None, None, None
        finally:
            self._close_later(fd)
        if not head.startswith(b"#!") and (identity in self.loaders or loader.is_loader_name(exe)):
            return (*self._loader_decision(pid, argv), None, identity)
        verdict: tuple[str, str | None] = (ALLOW, None)
        script: tuple[str | None, list[str]] | None = None
        named, given = raw_path or exe, argv
        cwd: str | None = None
        # An interpreter may be a script in turn: the kernel reads its `#!` line too, up to
        # MAX_SCRIPT_DEPTH deep, and runs the last interpreter with each line's words before
        # the path it was named by. Each level is judged (also as the program file it is: a
        # hard link of one a rule names); a loader as the interpreter is judged by the program
        # it is asked to run. A relative interpreter is found from the working folder, as the
        # kernel finds it.
        for _ in range(MAX_SCRIPT_DEPTH):
            if not head.startswith(b"#!"):
                break
            interpreter, argument = _shebang(head)
            if not interpreter:
                break
            effective = [interpreter, *([] if argument is None else [argument]), named,
                         *given[1:]]  # fmt: skip
            if not interpreter.startswith("/") and cwd is None:
                cwd = procmem.proc_link(pid, "cwd") or ""
            joined = interpreter if interpreter.startswith("/") else (
                procmem.join(cwd, interpreter) if cwd else None)  # fmt: skip
            resolved = _real_path(pid, joined) if joined else None
            found = _identity_in_root(pid, resolved) if resolved is not None else None
            verdict = _stricter(verdict, self._decide_file(effective, resolved, found))
            script = (resolved, effective)
            if resolved is None:
                break
            next_head = _head_of(pid, resolved)
            if next_head is None:  # unreadable: as for the script itself
                if self.config.commands.refuses_anything:
                    verdict = (DENY, "(an interpreter could not be read to check its #! line)")
                break
            head = next_head
            if not head.startswith(b"#!") and (
                found in self.loaders or loader.is_loader_name(resolved)
            ):
                verdict = _stricter(verdict, self._loader_decision(pid, effective))
                break
            named, given = interpreter, effective
        return verdict[0], verdict[1], script, identity

    def _git_environment(
        self, argv: list[str] | None, env: list[bytes] | None
    ) -> tuple[str, str] | None:
        """A refusal of an exec of git whose environment points it at another exec path than
        its own (rules.GIT_ELSEWHERE), or that could not be read; None otherwise."""
        commands = self.config.commands
        word = git_command(["git", *(argv or [])[1:]]) or ""
        how = "its environment could not be read"
        if env is not None:
            paths = [e[len(b"GIT_EXEC_PATH=") :] for e in env if e.startswith(b"GIT_EXEC_PATH=")]
            folder = commands.git_on_path.get(word)
            search = [e[len(b"PATH=") :] for e in env if e.startswith(b"PATH=")][:1]
            if not all(commands.is_git_exec_path(_text(p) or "") for p in paths):
                how = "GIT_EXEC_PATH"
            elif folder is not None and not any(
                folder.rstrip("/") == (_text(f) or "").rstrip("/")
                for f in (search[0].split(b":") if search else [])
            ):
                how = f"a PATH without {folder}"
            else:
                return None
        return DENY, GIT_ELSEWHERE.format(word=word[:40], how=how)

    def _decide_file(
        self, argv: list[str] | None, path: str | None, identity: tuple[int, int] | None
    ) -> tuple[str, str | None]:
        """The policy's decision for running the program file path (identity: its device and
        inode) with argv: as it is called, and as each name a rule finds that file by (a hard
        link of it is that program under any name); the stricter."""
        commands = self.config.commands
        return _stricter(commands.decide(argv, path), commands.by_identity(identity, argv, path))

    def _loader_decision(self, pid: int, argv: list[str]) -> tuple[str, str | None]:
        """The decision for the program the dynamic loader is asked to run (loader.py), as
        the process sees its path; ALLOW when it names none."""
        rules = self.config.commands
        strict = rules.refuses_anything
        try:
            loaded = loader.loaded_program(argv)
        except loader.UnknownOption as exc:
            if strict:  # it may take the next word, and the program be another
                # (the word quoted: the agent's own, it cannot pass for another rule's text)
                return DENY, ("(the dynamic loader given an option gatekeeper does not know: "
                              f"{shlex.quote(str(exc))})")  # fmt: skip
            return ALLOW, None
        if loaded is None:
            return ALLOW, None
        path, effective = loaded
        try:
            joined = procmem.join(procmem.proc_link(pid, "cwd"), path)
        except procmem.Answered:
            joined = None  # a name in a removed folder: nothing there to run
        program = _real_path(pid, joined) if joined else None
        if program is not None and (
            program.startswith("/memfd:") or program.endswith(" (deleted)")
        ):
            return DENY, "(a program with no file on disk)"  # as an exec of it is
        if strict and (
            not path.startswith("/")
            or program is None
            or rules.may_change(path)
            or rules.may_change(program)
            or _may_be_redirected(pid, path, rules)
        ):
            # The loader opens the program after this check, by the path it was given: one
            # the agent can change meanwhile (a link swapped, a folder renamed, a working
            # folder changed by a process sharing it, another process's /proc links) could
            # lead it to another program than the one judged, and nothing checks what it
            # opened. Such a program runs by its own path (an exec is checked) or not at all.
            return (
                DENY,
                "(the dynamic loader asked to run a program by a path the agent can change)",
            )
        identity = _identity_in_root(pid, program) if program is not None else None
        return self._decide_file(effective, program, identity)

    def _ask_command(self, argv: list[str] | None, exe: str | None, rule: str | None) -> str:
        shown = shlex.join(argv) if argv else (exe or "?")
        if self.config.ask == "tty":
            answer = _ask_tty(self.config.tty_fd, ask_question(argv, exe, rule))
            if answer is not None:
                decision = ALLOW if answer else DENY
                # A yes at the prompt is a grant for this run, not a signed approval.
                self.emit(t="escalation", kind="command", value=shown,
                          decision="granted" if answer else "denied", time=_now())  # fmt: skip
                return decision
        self.emit(t="escalation", kind="command", value=shown, decision="pending", time=_now())
        return DENY

    def _external(self, pid: int, argv: list[str] | None, rule: str | None) -> None:
        """Record an external write as a pending decision point and tell the agent why its
        command fails: the person performs it after review."""
        shown = shlex.join(argv) if argv else "?"
        if (pid, shown) in self.external_told:
            return  # a shell trying the next PATH entry: one attempt, one message
        self.external_told.add((pid, shown))
        self.emit(t="escalation", kind="external-write", value=shown, decision="pending",
                  time=_now())  # fmt: skip
        _tell(pid, f"gatekeeper: `{escape(shown)[:200]}` writes outside this repository "
                   f"(policy commands.external: `{escape(rule or '')}`); it never runs inside "
                   "the sandbox. It is recorded as a pending external-write escalation: the "
                   "person performs it after review. Carry on without it.\n")  # fmt: skip

    # --- exits -----------------------------------------------------------------------------

    def _track(self, pid: int, pidfd: int | None) -> None:
        """Watch pid's end through pidfd (None: pid is a thread, or gone; not watched)."""
        if pidfd is None:
            return
        if pid in self.tracked:
            os.close(pidfd)
            return
        self.tracked[pid] = _Tracked(pidfd)
        self.by_pidfd[pidfd] = pid
        self.poll.register(pidfd, select.POLLIN)

    def _on_exit_group(self, n: unotify.Notif, pid: int, args: object) -> None:
        tracked = self.tracked.get(pid)
        if pid in self.unverified:
            # Another thread's exec is under way: if it gets past its point of no return, it
            # goes on as the process, and this call ends only the thread. Its pidfd tells.
            tracked = None
        code = int(n.data.args[0]) & 0xFF
        # Answered first: the process is ending and its parent waits for it, while what is
        # recorded of it is known already (the code it exits with).
        self._respond(n.id)
        if tracked is not None:
            tracked.exited = True
            self._emit_exit(pid, code)
            # exit_group cannot fail: the process is ending, and nothing is left to wait for
            # (a second wake-up, through its pidfd, per process would cost as much again).
            self._finish(pid)

    def _process_gone(self, pidfd: int) -> None:
        """A tracked process's pidfd reads as ready: finished once it has really ended (not
        while a thread's exec takes the process over, which makes it ready for a moment)."""
        pid = self.by_pidfd.get(pidfd)
        if pid is not None and procmem.has_ended(pidfd, pid):
            self._finish(pid)

    def _finish(self, pid: int) -> None:
        if pid in self.unverified:
            # It ended before a watched call showed what its exec ran (by a signal, or its
            # last thread's plain exit): its record cannot say that was what was judged.
            self.emit(t="exec_unverified", pid=pid, time=_now())
        self._drop(pid)
        tracked = self.tracked.pop(pid, None)
        if tracked is None:
            return
        self.by_pidfd.pop(tracked.pidfd, None)
        try:
            self.poll.unregister(tracked.pidfd)
        except KeyError:
            pass
        if not tracked.exited:
            status = procmem.zombie_exit(pid)
            if status is None:  # its parent reaped it first: the pidfd still knows how it ended
                status = procmem.reaped_exit(tracked.pidfd)
            if status is not None and os.WIFSIGNALED(status):
                self.emit(t="killed", pid=pid, signal=os.WTERMSIG(status), time=_now())
            elif status is not None and os.WIFEXITED(status):
                self.emit(t="exit", pid=pid, code=os.WEXITSTATUS(status), time=_now())
            else:
                self.emit(t="killed", pid=pid, signal=None, time=_now())
        self._close_later(tracked.pidfd)
        self.mem.forget(pid)

    # --- files -----------------------------------------------------------------------------

    def _path(self, pid: int, dirfd: int, addr: int, follow_last: bool = True) -> str | None:
        """The path a write-like call reaches; raises OSError where it cannot be named, and
        procmem.Answered where the kernel's lookup fails anyway (a name in a removed
        folder)."""
        return _named(pid, dirfd, _text(self.mem.string(pid, addr)), follow_last)

    def _scoped_path(self, pid: int, dirfd: int, addr: int, flags: int,
                     resolve: int) -> str | None:  # fmt: skip
        """_path() for an openat2 with RESOLVE_IN_ROOT or RESOLVE_BENEATH."""
        raw = _text(self.mem.string(pid, addr))
        if not raw:
            return None
        exclusive = flags & (O_CREAT | O_EXCL) == O_CREAT | O_EXCL
        return procmem.scoped_path(pid, dirfd, raw, resolve=resolve, create=bool(flags & O_CREAT),
                                   nofollow=bool(flags & os.O_NOFOLLOW) or exclusive)  # fmt: skip

    def _fd_path(self, pid: int, fd: int) -> str | None:
        target = procmem.proc_link(pid, f"fd/{fd & 0xFFFFFFFF}")
        if target is not None and not target.startswith("/"):
            return "/dev/null"  # a pipe, a socket or an anonymous inode: not a file
        return target

    def _judge(self, n: unotify.Notif, pid: int, op: str, paths: list[str | None]) -> None:
        """Allow when every path is in the boundary; record worktree writes and denials."""
        if not self.channel.is_valid(n.id):
            return
        verdicts: list[tuple[str, str, str | None]] = []
        for path in paths:
            if path is None:
                verdicts.append(("deny", policing.UNREADABLE, policing.UNREADABLE_REASON))
            elif path is TOO_LONG:
                verdicts.append(("deny", TOO_LONG, policing.TOO_LONG_REASON))
            else:
                verdicts.append(self.config.writes.classify(path))
        denied = any(v == "deny" for v, _, _ in verdicts)
        when = _now()
        error = (errno.ENAMETOOLONG if TOO_LONG in paths else errno.EACCES) if denied else 0
        self._respond(n.id, error)  # decided: recorded after the answer
        for verdict, shown, reason in verdicts:
            if verdict != "scratch":  # (a reason comes only with a refusal: no approval lifts it)
                self.emit(t="write", pid=pid, path=shown, op=op,
                          decision="deny" if denied else "allow", time=when,
                          **({"reason": reason} if reason else {}))  # fmt: skip

    def _open(self, n: unotify.Notif, pid: int, dirfd: int, addr: int, flags: int,
              resolve: int = 0) -> None:  # fmt: skip
        writing = bool(flags & O_ACCMODE) or bool(flags & (O_CREAT | O_TRUNC))
        if not writing:
            self._read_open(n, pid, dirfd, addr)
            return
        try:
            if resolve & procmem.SCOPED:
                path = self._scoped_path(pid, dirfd, addr, flags, resolve)
            else:
                path = self._path(pid, dirfd, addr)
        except procmem.Answered:
            raise
        except OSError as exc:
            path = _unnamed(exc)
        if path is TOO_LONG:
            self._judge(n, pid, "write", [path])
            return
        if not flags & (O_ACCMODE | O_TRUNC) and path is not None and _exists_in_root(pid, path):
            # O_CREAT of a file that is there (lock files, `touch`-style probes opened for
            # reading): the kernel only opens it, or answers EEXIST with O_EXCL, writing
            # nothing. So does the supervisor: a refusal would be a false denial. Decided in
            # the process's own view without following links (the mount layer still refuses
            # a creation, should the file vanish in between).
            if flags & O_EXCL:
                if self.channel.is_valid(n.id):
                    self._respond(n.id, errno.EEXIST)
                return
            self._read_open(n, pid, dirfd, addr)
            return
        exists = path is not None and _exists(pid, path)
        if path is not None and not exists and self._nowhere(pid, path):
            # Under a top folder the sandbox has not got at all (/sys, say), nothing is there
            # to write, or to make a file in: the kernel would answer ENOENT whatever the
            # policy, and so does the supervisor, which writes and refuses nothing, so records
            # nothing (tools probe such paths: a tracer's /sys/kernel/debug/tracing/
            # trace_marker, at every start of some agent CLIs, read as a refused write).
            if self.channel.is_valid(n.id):
                self._respond(n.id, errno.ENOENT)
            return
        if flags & O_CREAT and not exists:
            op = "create"
        else:
            op = "truncate" if flags & O_TRUNC else "write"
        self._judge(n, pid, op, [path])

    def _nowhere(self, pid: int, path: str) -> bool:
        """True for a resolved path under a top folder that is not in pid's root at all (and
        in no place of the user's or the repository's), where the supervisor would refuse it."""
        top = "/" + path.lstrip("/").split("/", 1)[0]
        if top in ("/", "/proc", "/dev") or self.config.writes.is_kept(path):
            return False  # (a creation in the worktree, the commonest, stops at is_kept)
        if self.config.writes.classify(path)[0] != "deny":
            return False
        return procmem.stat_in_root(pid, top, follow_last=False) is None

    def _read_open(self, n: unotify.Notif, pid: int, dirfd: int, addr: int) -> None:
        """A read is let through at once; only a lookup of a secret path is recorded."""
        try:
            raw = _text(self.mem.string(pid, addr))
        except OSError:
            raw = ""
        self._respond(n.id)
        if raw and self.config.writes.may_be_secret(raw):
            joined = procmem.join(procmem.base_dir(pid, dirfd), raw)
            path = (_real_path(pid, joined) if joined else None) or joined or raw
            if self.config.writes.is_secret(path) or self.config.writes.is_secret(joined or raw):
                self.emit(t="secret", pid=pid, path=joined or raw, time=_now())

    def _on_open(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._open(n, pid, -100, n.data.args[0], n.data.args[1])

    def _on_openat(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._open(n, pid, _signed(n.data.args[0]), n.data.args[1], n.data.args[2])

    def _on_openat2(self, n: unotify.Notif, pid: int, a: object) -> None:
        # struct open_how: flags, mode, resolve (RESOLVE_IN_ROOT and RESOLVE_BENEATH take
        # the path under the descriptor: judged so).
        try:
            flags, _, resolve = struct.unpack("=QQQ", self.mem.read(pid, n.data.args[2], 24))
        except (OSError, struct.error):
            flags, resolve = O_CREAT, 0  # unreadable: judge it as a write
        self._open(n, pid, _signed(n.data.args[0]), n.data.args[1], flags, resolve)

    def _on_creat(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._open(n, pid, -100, n.data.args[0], O_CREAT | O_TRUNC | 1)

    def _paths(self, pid: int, pairs: list[tuple[int, int, bool]]) -> list[str | None]:
        out: list[str | None] = []
        for dirfd, addr, follow in pairs:
            try:
                out.append(self._path(pid, dirfd, addr, follow))
            except procmem.Answered:
                raise
            except OSError as exc:
                out.append(_unnamed(exc))
        return out

    def _simple(self, n: unotify.Notif, pid: int, op: str, dirfd: int, addr: int,
                follow: bool = True) -> None:  # fmt: skip
        self._judge(n, pid, op, self._paths(pid, [(dirfd, addr, follow)]))

    def _on_truncate(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._simple(n, pid, "truncate", -100, n.data.args[0])

    def _on_ftruncate(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._judge(n, pid, "truncate", [self._fd_path(pid, int(n.data.args[0]))])

    def _on_rename(self, n: unotify.Notif, pid: int, a: object) -> None:
        args = n.data.args
        self._judge(n, pid, "rename", self._paths(pid, [(-100, args[0], False),
                                                        (-100, args[1], False)]))  # fmt: skip

    def _on_renameat(self, n: unotify.Notif, pid: int, a: object) -> None:
        args = n.data.args
        self._judge(
            n,
            pid,
            "rename",
            self._paths(
                pid, [(_signed(args[0]), args[1], False), (_signed(args[2]), args[3], False)]
            ),
        )

    _on_renameat2 = _on_renameat

    # A hard link is judged by both names: a second name, in the write set, for a file
    # outside it would be a way to write that file (the mounts refuse it across binds, EXDEV,
    # and the attempt is recorded).
    def _on_link(self, n: unotify.Notif, pid: int, a: object) -> None:
        args = n.data.args
        self._judge(n, pid, "link", self._paths(pid, [(-100, args[0], False),
                                                      (-100, args[1], False)]))  # fmt: skip

    def _on_linkat(self, n: unotify.Notif, pid: int, a: object) -> None:
        args = n.data.args
        flags = int(args[4])
        try:
            by_fd = bool(flags & AT_EMPTY_PATH) and not self.mem.string(pid, args[1])
        except OSError:  # NULL with AT_EMPTY_PATH also names the descriptor (Linux 6.11+)
            by_fd = bool(flags & AT_EMPTY_PATH)
        if by_fd:  # the file open on olddirfd itself (an O_TMPFILE put in place, say)
            source = [self._fd_path(pid, int(args[0]))]
        else:
            follow = bool(flags & AT_SYMLINK_FOLLOW)
            source = self._paths(pid, [(_signed(args[0]), args[1], follow)])
        target = self._paths(pid, [(_signed(args[2]), args[3], False)])
        self._judge(n, pid, "link", [*source, *target])

    def _on_symlink(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._simple(n, pid, "symlink", -100, n.data.args[1], False)

    def _on_symlinkat(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._simple(n, pid, "symlink", _signed(n.data.args[1]), n.data.args[2], False)

    def _on_unlink(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._simple(n, pid, "unlink", -100, n.data.args[0], False)

    def _on_unlinkat(self, n: unotify.Notif, pid: int, a: object) -> None:
        op = "rmdir" if n.data.args[2] & AT_REMOVEDIR else "unlink"
        self._simple(n, pid, op, _signed(n.data.args[0]), n.data.args[1], False)

    def _on_rmdir(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._simple(n, pid, "rmdir", -100, n.data.args[0], False)

    def _on_chmod(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._simple(n, pid, "chmod", -100, n.data.args[0])

    def _on_fchmod(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._judge(n, pid, "chmod", [self._fd_path(pid, int(n.data.args[0]))])

    def _on_fchmodat(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._simple(n, pid, "chmod", _signed(n.data.args[0]), n.data.args[1])

    _on_fchmodat2 = _on_fchmodat

    def _mkdir(self, n: unotify.Notif, pid: int, dirfd: int, addr: int) -> None:
        # `mkdir -p` and tools that make sure a folder exists ask for folders that are there:
        # the kernel answers EEXIST without changing anything, and so does the supervisor (a
        # refusal would be a false denial, and EACCES breaks them).
        paths = self._paths(pid, [(dirfd, addr, False)])
        path = paths[0]
        if path is not None and path is not TOO_LONG and _exists_in_root(pid, path):
            if self.channel.is_valid(n.id):
                self._respond(n.id, errno.EEXIST)
            return
        self._judge(n, pid, "mkdir", paths)

    def _on_mkdir(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._mkdir(n, pid, -100, n.data.args[0])

    def _on_mkdirat(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._mkdir(n, pid, _signed(n.data.args[0]), n.data.args[1])

    def _on_mknod(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._simple(n, pid, "mknod", -100, n.data.args[0], False)

    def _on_mknodat(self, n: unotify.Notif, pid: int, a: object) -> None:
        self._simple(n, pid, "mknod", _signed(n.data.args[0]), n.data.args[1], False)

    def _on_bind(self, n: unotify.Notif, pid: int, a: object) -> None:
        # A Unix socket bound to a name makes a file of that name (a socket), as mknod would;
        # judged so, its last part not followed (the kernel fails on anything there). Other
        # families, abstract names and an address the kernel refuses make no file.
        raw = self._sockaddr(pid, n.data.args[1], n.data.args[2])
        if raw is None:  # what the kernel may read and the supervisor cannot: refused
            self._judge(n, pid, "bind", [None])
            return
        if (
            len(raw) <= 2
            or len(raw) > SOCKADDR_UN_MAX
            or raw[2] == 0
            or (int.from_bytes(raw[:2], sys.byteorder) != AF_UNIX)
        ):
            if self.channel.is_valid(n.id):
                self._respond(n.id)
            return
        # The kernel takes the name up to the address's length or its first NUL.
        name = _text(raw[2:].split(b"\0", 1)[0])
        try:
            path = _named(pid, unotify.AT_FDCWD, name, follow_last=False)
        except procmem.Answered:
            raise
        except OSError as exc:
            path = _unnamed(exc)
        self._judge(n, pid, "bind", [path])

    # --- network ---------------------------------------------------------------------------

    def _on_connect(self, n: unotify.Notif, pid: int, a: object) -> None:
        raw = self._sockaddr(pid, n.data.args[1], n.data.args[2])
        if not self.channel.is_valid(n.id):
            return
        self._destination(n, pid, [raw], None)

    def _on_sendto(self, n: unotify.Notif, pid: int, a: object) -> None:
        # The filter notifies only when the address (args[4]) is set: a datagram to a name,
        # or TCP Fast Open (connect and send in one call).
        args = n.data.args
        raw = self._sockaddr(pid, args[4], args[5])
        if not self.channel.is_valid(n.id):
            return
        self._destination(n, pid, [raw], "fastopen" if args[3] & MSG_FASTOPEN else "sendto")

    def _on_sendmsg(self, n: unotify.Notif, pid: int, a: object) -> None:
        args = n.data.args
        raw = self._msg_name(pid, args[1])
        if not self.channel.is_valid(n.id):
            return
        self._destination(n, pid, [raw], "fastopen" if args[2] & MSG_FASTOPEN else "sendmsg")

    def _on_sendmmsg(self, n: unotify.Notif, pid: int, a: object) -> None:
        # Every message may name its own destination; the kernel sends at most UIO_MAXIOV.
        args = n.data.args
        count = min(int(args[2]) & 0xFFFFFFFF, UIO_MAXIOV)
        names = [self._msg_name(pid, args[1] + i * MMSGHDR_SIZE) for i in range(count)]
        if not self.channel.is_valid(n.id):
            return
        self._destination(n, pid, names, "fastopen" if args[3] & MSG_FASTOPEN else "sendmmsg")

    def _sockaddr(self, pid: int, addr: int, length: int) -> bytes | None:
        """The socket address a call names (at most sockaddr_storage): b"" for none (the
        kernel then finds no address, or fails the call itself); None when it cannot be read
        whole, which the kernel may still read (a write-only page, where process_vm_readv
        reads nothing, or an address that runs on into one): judged as unreadable."""
        size = min(int(length) & 0xFFFFFFFF, SOCKADDR_MAX)
        if not addr or not size or addr >= 1 << 63:
            return b""
        try:
            raw = self.mem.read(pid, addr, size)
        except OSError:
            return None
        return raw if len(raw) == size else None

    def _msg_name(self, pid: int, header: int) -> bytes | None:
        """The destination of a struct msghdr at header: msg_name (a pointer at offset 0)
        and msg_namelen (a u32 at offset 8); None when either cannot be read."""
        raw = self._sockaddr(pid, header, 16)
        if not raw:
            return raw  # (b"": no header, which the kernel fails itself)
        name, length = struct.unpack("=QI", raw[:12])
        return self._sockaddr(pid, name, length)

    def _destination(self, n: unotify.Notif, pid: int, names: list[bytes | None],
                     via: str | None) -> None:  # fmt: skip
        """Answer a call that names destinations: record each one outside the sandbox's
        loopback and fail the call (there is no route) when the first one is; let the rest
        continue (loopback, Unix sockets, no address). An address that cannot be read is
        recorded as such, and refused (EACCES) when it is the first."""
        parsed = [UNREADABLE_ADDRESS if raw is None else _parse_sockaddr(raw) for raw in names]
        for host, port, _ in dict.fromkeys(d for d in parsed if d and not d[2]):
            event: dict[str, object] = {"t": "connect", "pid": pid, "host": host, "port": port,
                                        "decision": "deny", "time": _now()}  # fmt: skip
            if via is not None:
                event["via"] = via
            self.emit(**event)
        first = parsed[0] if parsed else None
        if first is UNREADABLE_ADDRESS:
            self._respond(n.id, errno.EACCES)
        elif first is not None and not first[2]:
            self._respond(n.id, errno.ENETUNREACH)
        else:
            self._respond(n.id)


def _named(pid: int, dirfd: int, raw: str, follow_last: bool = True) -> str | None:
    """The path a name given to a write-like call reaches (see Supervisor._path)."""
    if not raw:
        return None
    # (A relative path's base only: a working folder past PATH_MAX cannot be named, and an
    # absolute path does not start from it.)
    base = None if raw.startswith("/") else procmem.write_base(pid, dirfd)
    joined = procmem.join(base, raw)
    if joined is None:
        return None
    return _follow(pid, joined, follow_last)


def _parse_sockaddr(raw: bytes) -> tuple[str, int, bool] | None:
    """(host, port, is_own) of an AF_INET or AF_INET6 address; None for other families
    (Unix sockets reach only what the sandbox can see) or a short one.

    is_own: loopback, or unspecified (0.0.0.0, ::), which as a destination means this
    namespace's own addresses, and the sandbox has loopback only.
    """
    family = struct.unpack("=H", raw[:2])[0] if len(raw) >= 2 else 0
    if family == AF_INET and len(raw) >= 8:
        port = struct.unpack("!H", raw[2:4])[0]
        v4 = ipaddress.IPv4Address(raw[4:8])
        return str(v4), port, v4.is_loopback or v4.is_unspecified
    if family == AF_INET6 and len(raw) >= 24:
        port = struct.unpack("!H", raw[2:4])[0]
        address = ipaddress.IPv6Address(raw[8:24])
        mapped = address.ipv4_mapped
        own = (
            address.is_loopback
            or address.is_unspecified
            or (mapped is not None and (mapped.is_loopback or mapped.is_unspecified))
        )
        return str(address), port, own
    return None


def ask_question(argv: list[str] | None, exe: str | None, rule: str | None) -> str:
    """The terminal question for an exec: program and argv escaped, nothing left unshown."""
    program = escape(exe) if exe else "(unknown)"
    args = show_argv(argv) if argv is not None else "(unreadable)"
    return (f"\ngatekeeper: the agent wants to run a command the policy asks about "
            f"(rule `{escape(rule or '')}`):\n  program  {program}\n  argv     {args}\n"
            "Allow? [y/N] ")  # fmt: skip


SYS_PIDFD_GETFD = 438  # the same number on every architecture (the unified syscall table)
PIPE_BUF = 4096
MSG_DONTWAIT, MSG_NOSIGNAL = 0x40, 0x4000


# The sandbox's file size cap (RLIMIT_FSIZE), which the supervisor's own log is not under,
# but what it writes into the sandbox's files is: set by __main__.
SANDBOX_FILE_SIZE: int | None = None


@contextlib.contextmanager
def _under_sandbox_file_size() -> Iterator[None]:
    """The sandbox's file size cap on this process meanwhile (its soft limit: the one thread
    that writes is this one), so that a write into a file of the sandbox's never takes the
    file past what the sandbox itself could write (EFBIG instead)."""
    cap = SANDBOX_FILE_SIZE
    if cap is None:
        yield
        return
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    hard = before[1]
    soft = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)


def _tell(pid: int, text: str) -> None:
    """Write text to pid's own standard error, as the process itself could: through a copy
    of its descriptor 2 (pidfd_getfd), never by a path, and under the sandbox's file size
    cap. Never blocks: a pipe, socket or terminal that cannot take the message now gets
    nothing. Best effort, never raises."""
    data = text.encode("utf-8", "replace")[: PIPE_BUF - 1]
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        fd = _libc().syscall(SYS_PIDFD_GETFD, pidfd, 2, 0)
        if fd < 0:
            return
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode):
                with _under_sandbox_file_size():
                    os.write(fd, data)
            elif stat.S_ISSOCK(mode):
                _libc().send(fd, data, len(data), MSG_DONTWAIT | MSG_NOSIGNAL)
            else:
                # A pipe, FIFO or terminal: written through a description of its own, opened
                # non-blocking (the process's own is shared with it and stays as it is), never
                # as a controlling terminal. Room looked for first would not do: the agent can
                # stop its terminal's output between the look and the write.
                own = os.open(f"/proc/self/fd/{fd}",
                              os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)  # fmt: skip
                try:
                    os.write(own, data)
                finally:
                    os.close(own)
        except OSError:
            pass
        finally:
            os.close(fd)
    finally:
        os.close(pidfd)


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _recorded_argv(argv: list[str]) -> list[str]:
    """argv as recorded: its first MAX_RECORDED characters, and then one last word saying how
    much was left out."""
    size = sum(len(a) for a in argv)
    if size <= MAX_RECORDED:
        return argv
    kept: list[str] = []
    room = MAX_RECORDED
    for arg in argv:
        if room <= 0:
            break
        kept.append(arg[:room])
        room -= len(arg)
    left = size - sum(len(a) for a in kept)
    return [*kept, f"... ({left} more characters in {len(argv) - len(kept)} more arguments "
            "not recorded)"]  # fmt: skip


def _argv_bytes(argv: list[str]) -> bytes:
    """argv as /proc/PID/cmdline shows it: each argument NUL-terminated."""
    return "".join(a + "\0" for a in argv).encode("utf-8", "surrogateescape")


def _argv_list(raw: bytes | None) -> list[str] | None:
    """The argv in a /proc/PID/cmdline read; None when it is unreadable, empty or too long."""
    if not raw or len(raw) > MAX_ARGV_BYTES:
        return None
    if raw.endswith(b"\0"):
        raw = raw[:-1]
    return _text(raw).split("\0")


def _is_script(pid: int, path: str) -> bool:
    """True when path, in pid's root, is a file that starts with `#!` (opened without
    following a link swapped in, without blocking on a FIFO)."""
    fd = procmem.open_program(pid, path)
    if fd < 0:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 2) == b"#!"
    except OSError:
        return False
    finally:
        os.close(fd)


def _sharer_layout(sharer: int, sharer_fd: int) -> tuple[bytes, ...] | None:
    """The layout of the address space an exec let through starts from, read through the
    process that shares it (_Expected.sharer), once the exec's call is answered: the exec
    leaves it to that process, whose own exec (whose call waits to be served) is all that
    could give it another. (A process whose own exec was let through earlier, and may still
    be under way, is never the sharer: _sharer skips a process with a check waiting, and a
    check stays until its exec is known through.) None when that is not what was read:
    the process has ended meanwhile (its pid may name another), or its first thread has
    (procmem.layout: no address space, while another of its threads may still use the old
    one), or the layout is hidden from the supervisor (no reference): the exec is then known
    through only by its own thread's next call, or once nobody uses the old address space."""
    layout = procmem.layout(f"/proc/{sharer}")
    if layout is None or layout == procmem.LAYOUT_HIDDEN:
        return None
    return layout if procmem.pidfd_alive(sharer_fd) else None


def _command_line_of(tgid: int, pidfd: int) -> int:
    """A descriptor of process tgid's cmdline (pidfd: a pidfd of it), -1 when it cannot be
    had: taken while its exec goes on, the process cannot have ended unseen (its next call,
    an exit too, waits to be served) but for a kill, after which its pid may name another."""
    try:
        fd = os.open(f"/proc/{tgid}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    if procmem.pidfd_alive(pidfd):
        return fd
    os.close(fd)
    return -1


def _reaped(tgid: int) -> bool:
    """True when process tgid is gone from /proc (ended and reaped: nothing of it is left to
    run; a later process with its id is judged by what it runs)."""
    return not os.path.exists(f"/proc/{tgid}")


def _close_all(*fds: int | None) -> None:
    """Close each descriptor given (None or a negative number: none)."""
    for fd in fds:
        if fd is not None and fd >= 0:
            os.close(fd)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _identity_in_root(pid: int, path: str) -> tuple[int, int] | None:
    st = procmem.stat_in_root(pid, path)
    return None if st is None else (st.st_dev, st.st_ino)


def _exists(pid: int, path: str) -> bool:
    return procmem.stat_in_root(pid, path, follow_last=False) is not None


def _unnamed(exc: OSError) -> str | None:
    """What a write-like call's path that could not be named is judged as: TOO_LONG where
    only link expansion made it longer than PATH_MAX, else unreadable (None)."""
    return TOO_LONG if exc.errno == errno.ENAMETOOLONG else None


def _may_be_redirected(pid: int, path: str, rules: CommandRules) -> bool:
    """Could the agent make path lead elsewhere once judged: is any name looked up on the way
    (a folder entered, a link followed: `/var/run` -> `../run` leads into the agent's git
    dir) in a place it writes, or in /proc? True too when the way cannot be read."""
    try:
        _, visited = procmem.resolve_visiting(pid, path)
    except OSError:
        return True
    return any(rules.may_change(name) for name in visited)


def _shebang(head: bytes) -> tuple[str, str | None]:
    """(interpreter, its one argument or None) of a `#!` line in the first 256 bytes of a
    file, split as the kernel splits it (binfmt_script): ("", None) where it runs nothing.

    The line ends at the first newline; with none in the 256 bytes (NULs after a shorter
    file), at the 255th (the kernel keeps a NUL in the last place), if an interpreter's name
    ends before the 256th or at it. Blanks (spaces
    and tabs) at its end are dropped; the interpreter is the first word (ended by a blank or a
    NUL), the argument what follows it after blanks, up to the end or a NUL (blanks before
    that NUL kept)."""
    buf = head[:256].ljust(256, b"\0")  # (the kernel's buffer: a shorter file, NULs after)
    end = buf.find(b"\n")
    if end < 0:
        # (the kernel looks for the name's end up to the last byte, which it then drops)
        start = next((i for i in range(2, 256) if buf[i] not in b" \t"), None)
        if start is None or not any(buf[i] in b" \t\0" for i in range(start, 256)):
            return "", None  # (the kernel: ENOEXEC, an interpreter's name cut short)
        end = 255
    while end > 2 and buf[end - 1] in b" \t":
        end -= 1
    line = buf[2:end]
    start = next((i for i, byte in enumerate(line) if byte not in b" \t"), len(line))
    stop = next((i for i in range(start, len(line)) if line[i] in b" \t\0"), len(line))
    interpreter = line[start:stop]
    if stop >= len(line) or line[stop] == 0:
        return interpreter.decode("utf-8", "surrogateescape"), None
    rest = line[stop:]
    first = next((i for i, byte in enumerate(rest) if byte not in b" \t"), len(rest))
    # (blanks, then a NUL: an empty argument, which the kernel passes as one)
    argument = rest[first:].split(b"\0", 1)[0]
    return interpreter.decode("utf-8", "surrogateescape"), argument.decode(
        "utf-8", "surrogateescape"
    )


def _stricter(one: tuple[str, str | None], other: tuple[str, str | None]) -> tuple[str, str | None]:
    """The stricter of two (decision, rule): external over deny, deny over ask, ask over allow
    (the first where they are as strict)."""
    return other if STRICTNESS.get(other[0], 2) > STRICTNESS.get(one[0], 2) else one


def _head_of(pid: int, path: str) -> bytes | None:
    """The first bytes of the program file at path (resolved) as pid sees it; b"" for no
    regular file, None when it cannot be read."""
    fd = procmem.open_program(pid, path)
    if fd < 0:
        return None
    try:
        return os.read(fd, 256) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)


def _real_path(pid: int, path: str, follow_last: bool = True,
               found: int | None = None) -> str | None:  # fmt: skip
    """_follow(), None where the path cannot be named (an exec's: judged as unresolved)."""
    try:
        return _follow(pid, path, follow_last, found)
    except OSError:
        return None


def _follow(pid: int, path: str, follow_last: bool = True,
            found: int | None = None) -> str | None:  # fmt: skip
    """Resolve path as pid sees it, mapping /proc/self/cwd, /dev/fd/N and the like to files.

    Other /proc and /dev paths stay as they are: the kernel guards them. None when the path
    cannot be followed (too many links). found: procmem.lookup()'s answer for path, if asked.
    Raises OSError where a name on the way cannot be read (ENAMETOOLONG: a path only link
    expansion makes longer than PATH_MAX), procmem.Answered below a removed folder.
    """
    if isinstance(path, procmem.Removed):
        return path  # a removed folder itself (`.` in it): its kernel name, never followed
    for _ in range(16):
        if path.startswith(("/proc/", "/dev/")):
            target = procmem.magic_target(pid, path)
            if target == "":
                return "/dev/null"  # a pipe or socket: not a file anywhere
            if target == "/proc/(other)":
                return target
            if isinstance(target, procmem.Removed):
                return target  # a removed file itself: its kernel name, never followed
            if target is not None:
                path, found = target, None
                continue
            if path.startswith("/proc/") and ".." not in path.split("/"):
                return os.path.normpath(path)  # in /proc: the kernel guards it
            # /dev is the sandbox's own tmpfs, where the agent may make links (/dev/x -> the
            # worktree); and a `..` may leave /proc through a link on the way: resolved as any
            # other path, never by its names alone.
        resolved = procmem.resolve(pid, path, follow_last=follow_last, found=found)
        found = None  # (for path as given only)
        if resolved.startswith(("/proc/", "/dev/fd")) and resolved != path:
            path = resolved
            continue
        if resolved.startswith("/proc/") and ".." in resolved.split("/"):
            return procmem.OTHER  # (a way through /proc not followed: refused)
        return resolved
    return None


def _is_launcher_exec(argv: list[str], config: Config) -> bool:
    """True for the bridge invocation the launcher put in front of the agent's command."""
    prefix = config.launcher_argv
    return bool(prefix) and argv[: len(prefix)] == prefix


def _signed(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _ask_tty(fd: int | None, question: str) -> bool | None:
    """Ask on the launcher's terminal; None when there is none to ask on."""
    if fd is None:
        return None
    try:
        # One question at a time on the terminal (the network proxy asks there too).
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, question.encode())
        answer = b""
        deadline = time.monotonic() + 600
        while not answer.endswith((b"\n", b"\r")) and time.monotonic() < deadline:
            chunk = os.read(fd, 64)
            if not chunk:
                break
            answer += chunk
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
    return answer.strip().lower() in (b"y", b"yes")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(2)
