"""Reading a supervised process: strings and pointer arrays from its memory, paths in its root."""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import fcntl
import os
import re
import signal
import stat
import struct
from collections.abc import Iterator

PAGE = 4096
# As long as the kernel takes one argument of an exec (MAX_ARG_STRLEN, 32 pages), and the
# whole of an argv as far as it can take one (its total, strings and pointers, is bounded by a
# quarter of the stack limit and at most 6 MiB): read whole, a command line is judged and
# recorded as it runs, never as unreadable. The budget bounds what a process can make the
# supervisor read for one exec.
MAX_STRING = 32 * PAGE
MAX_ARGV = 8 << 20  # bytes: each string with its NUL and its pointer


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_process_vm_readv = _libc.process_vm_readv
_process_vm_readv.restype = ctypes.c_ssize_t
_process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                              ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]  # fmt: skip


# string_array reads the strings of an array together where this many or more lie on pages
# not read yet, SPAN bytes of each at most (IOV_MAX, 1024, is more than a page of pointers).
BATCH_FROM = 3
SPAN = 256


class MemoryReader:
    """Reads another process's memory with process_vm_readv (one call, nothing to open or
    close: the same access check as /proc/PID/mem, whose open and close cost more than the
    read), until close(): the supervisor closes it after each notification.

    A read within one page reads that whole page once, until close() or forget(): an exec's
    path, its argv array and the argv's words mostly share a page or two.
    """

    def __init__(self) -> None:
        self._pages: dict[tuple[int, int], bytes] = {}
        self._buffer = ctypes.create_string_buffer(4 * PAGE)
        self._local = _IoVec(ctypes.addressof(self._buffer), 0)
        self._remote = _IoVec(0, 0)

    def take(self, pid: int) -> int:
        """A descriptor of pid's address space as it is now (/proc/PID/mem), the caller's to
        close; -1 when it cannot be opened."""
        self._pages.clear()
        try:
            return os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1

    def forget(self, pid: int) -> None:
        self._pages.clear()

    def close(self) -> None:
        self._pages.clear()

    def read(self, pid: int, addr: int, size: int) -> bytes:
        page = addr - addr % PAGE
        if addr + size > page + PAGE:
            return self._read(pid, addr, size)
        data = self._pages.get((pid, page))
        if data is None:
            # A page is readable whole or not at all.
            data = self._pages[(pid, page)] = self._read(pid, page, PAGE)
        return data[addr - page : addr - page + size]

    def _read(self, pid: int, addr: int, size: int) -> bytes:
        """Up to size bytes at addr (fewer where the mapping ends); raises OSError when none
        can be read (nothing mapped there, the process gone, no access)."""
        if size > len(self._buffer):
            self._buffer = ctypes.create_string_buffer(size)
            self._local.base = ctypes.addressof(self._buffer)
        self._local.len = size
        self._remote.base = addr
        self._remote.len = size
        got = _process_vm_readv(pid, ctypes.byref(self._local), 1, ctypes.byref(self._remote),
                                1, 0)  # fmt: skip
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return ctypes.string_at(self._local.base, got)

    def string(self, pid: int, addr: int) -> bytes:
        """A NUL-terminated string at addr; raises OSError when it cannot be read."""
        if addr == 0:
            raise OSError("null pointer")
        # Most strings end in the page they start in, which is read once: found there
        # without copying the rest of the page.
        page = addr - addr % PAGE
        data = self.read(pid, page, PAGE)  # the cached page itself (a whole slice)
        end = data.find(b"\0", addr - page)
        if end >= 0:
            return data[addr - page : end]
        out = bytearray()
        while len(out) < MAX_STRING:
            chunk = PAGE - (addr % PAGE)
            data = self.read(pid, addr, chunk)
            if not data:
                raise OSError("unreadable memory")
            end = data.find(b"\0")
            if end >= 0:
                out += data[:end]
                return bytes(out)
            out += data
            addr += len(data)
        raise OSError("string too long")

    def string_array(self, pid: int, addr: int, first: int = 0) -> list[bytes]:
        """A NULL-terminated array of string pointers (argv) at addr; with first, only up to
        that many of its strings."""
        items: list[bytes] = []
        if addr == 0:
            return items
        at = addr
        budget = MAX_ARGV
        while True:
            # The pointers up to the end of the page in one read rather than one by one (a
            # short read keeps the whole pointers it got; the next read fails as before),
            # taken one at a time from a view: most arrays end long before the page does.
            chunk = self.read(pid, at, max(8, PAGE - at % PAGE) // 8 * 8)
            if len(chunk) < 8:
                raise OSError("unreadable memory")
            whole = len(chunk) // 8 * 8
            pointers: list[int] = []
            ended = False
            for ptr in memoryview(chunk)[:whole].cast("Q"):
                if ptr == 0:
                    ended = True
                    break
                pointers.append(ptr)
                if len(items) + len(pointers) == first:
                    ended = True  # (the page's last pointer may be the last one asked for)
                    break
            for item in self._strings(pid, pointers):
                items.append(item)
                budget -= len(item) + 9
                if budget < 0:
                    raise OSError("arguments too long")
            if ended:
                return items
            at += whole

    def _strings(self, pid: int, pointers: list[int]) -> Iterator[bytes]:
        """The strings at pointers, in order (as string() reads each). Strings on pages not
        read yet are read together, up to SPAN bytes of each in one call (an environment's
        strings lie on many pages: one read each would cost a call each); one that does not
        end there, or was not read, is read by itself, as is one on a page read already (the
        notification's one view of that page)."""
        fresh = [p for p in pointers if (pid, p - p % PAGE) not in self._pages]
        if len(fresh) < BATCH_FROM:
            for ptr in pointers:
                yield self.string(pid, ptr)
            return
        spans = [min(SPAN, PAGE - p % PAGE) for p in fresh]
        total = sum(spans)
        if total > len(self._buffer):
            self._buffer = ctypes.create_string_buffer(total)
            self._local.base = ctypes.addressof(self._buffer)
        self._local.len = total
        # The remote iovecs (base, length: two 64-bit words each) laid out by an array.
        remote = array.array("Q", bytes(16 * len(fresh)))
        remote[0::2] = array.array("Q", fresh)
        remote[1::2] = array.array("Q", spans)
        got = _process_vm_readv(pid, ctypes.byref(self._local), 1,
                                ctypes.cast(remote.buffer_info()[0], ctypes.POINTER(_IoVec)),
                                len(fresh), 0)  # fmt: skip
        data = ctypes.string_at(self._local.base, got) if got > 0 else b""
        read: dict[int, bytes] = {}
        at = 0
        for ptr, span in zip(fresh, spans, strict=True):
            end = data.find(b"\0", at, at + span) if at + span <= len(data) else -1
            if end >= 0:
                read[ptr] = data[at:end]
            at += span
        for ptr in pointers:
            item = read.get(ptr)
            yield item if item is not None else self.string(pid, ptr)


# openat2 (Linux 5.6+): the same number on every machine the supervisor knows.
_OPENAT2 = 437
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10


def _how(flags: int, plain: bool = True) -> ctypes.Array[ctypes.c_char]:
    """struct open_how (flags, mode, resolve) for a lookup inside a process's root, a link on
    the way taken inside that root (an absolute one means that root, never the supervisor's);
    plain: refusing every link on the way instead (without O_NOFOLLOW a link as the last part
    is refused too, with it that link is opened)."""
    resolve = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS | (_RESOLVE_NO_SYMLINKS if plain else 0)
    return ctypes.create_string_buffer(struct.pack("=QQQ", flags, 0, resolve), 24)


_HOW = _how(os.O_PATH | os.O_CLOEXEC)
_HOW_NOFOLLOW = _how(os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
_HOW_IN_ROOT = _how(os.O_PATH | os.O_CLOEXEC, plain=False)
_HOW_IN_ROOT_NOFOLLOW = _how(os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW, plain=False)
# A program file opened to read its `#!` line: not through a link swapped in as its last part,
# not blocking on a FIFO. Never as a controlling terminal: the supervisor leads a session with
# none, and a terminal's slave it opened without O_NOCTTY would become its own, its master in
# the sandbox's hands (^C or a hangup from there would kill the supervisor).
_PROGRAM_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
_HOW_PROGRAM = _how(_PROGRAM_FLAGS, plain=False)
_HOW_PROGRAM_PLAIN = _how(_PROGRAM_FLAGS)  # lookup_program's: no link anywhere on the way
_openat2_works = True
PLAIN = 1  # lookup(): a file is there, and no part of the path is a link


def _open_in(root: int, path: str, how: ctypes.Array[ctypes.c_char]) -> int | None:
    """openat2 from root: a descriptor, or -errno; None when there is no openat2 to ask (an
    old kernel, or a filter refusing it: asked no more)."""
    global _openat2_works
    if not _openat2_works:
        return None
    fd = _libc.syscall(_OPENAT2, root, os.fsencode(path), how, ctypes.c_size_t(24))
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM):
        _openat2_works = False
        return None
    return -err


def lookup(pid: int, path: str) -> int:
    """What the kernel finds at an absolute path as pid sees it (its root, its mounts), in
    one lookup resolved inside that root, where following the path name by name costs a
    readlink for each part.

    -ENOENT or -ENOTDIR when nothing is there (a folder on the way or the last name is
    missing, or a folder on the way is a file): the error an exec of it gets. PLAIN when a
    file is there and no part of the path is a link (the path is its own resolved form). 0
    when the path goes through a link (a link to nothing is something), and whenever the
    kernel cannot tell: a magic link of /proc on the way, no openat2, the process gone.
    """
    root = root_of(pid)
    return _lookup_in(root, through_root_links(root, path), _HOW) if root >= 0 else 0


def lookup_program(pid: int, path: str) -> int:
    """lookup() for an exec's path: where a file is there with no link on the way (PLAIN),
    it is opened for reading in that same lookup, as open_program opens it, and kept for
    open_program's next call for its path in this notification (forget_roots() gives it
    back to close when that does not come)."""
    root = root_of(pid)
    if root < 0:
        return 0
    path = through_root_links(root, path)
    fd = _open_in(root, path, _HOW_PROGRAM_PLAIN)
    if fd is not None and fd >= 0:
        _opened[normal(path)] = fd
        return PLAIN
    if fd in (-errno.ENOENT, -errno.ENOTDIR):
        return fd
    if fd == -errno.ELOOP:  # a link on the way: the lookup without reading says the same
        return 0
    # Not readable (or no openat2): what is there is told by the lookup that reads nothing.
    return _lookup_in(root, path, _HOW)


def looked_up(pid: int, path: str) -> str:
    """The absolute path lookup() looks up for pid (through the target of a link at the
    sandbox's root, as the kernel goes), with `.`, `..` and repeated slashes taken out:
    where lookup() found nothing, no part of it up to there is a link, so this is where the
    kernel looked (`/bin/../x` is /usr/x where /bin -> usr/bin, not /x)."""
    root = root_of(pid)
    return normal(through_root_links(root, path) if root >= 0 else path)


def _lookup_in(root: int, path: str, how: ctypes.Array[ctypes.c_char]) -> int:
    fd = _open_in(root, path, how)
    if fd is None:
        return 0
    if fd >= 0:
        os.close(fd)
        return PLAIN
    return fd if fd in (-errno.ENOENT, -errno.ENOTDIR) else 0


def stat_in_root(pid: int, path: str, follow_last: bool = True) -> os.stat_result | None:
    """The file at an absolute path as pid sees it, None when nothing is there (or it cannot
    be reached): one lookup from pid's root, where /proc/PID/root{path} would take an
    absolute link on the way from the supervisor's own root."""
    root = root_of(pid)
    fd = None
    if root >= 0:
        fd = _open_in(root, path, _HOW_IN_ROOT if follow_last else _HOW_IN_ROOT_NOFOLLOW)
    if fd is None:
        try:
            return os.stat(f"/proc/{pid}/root{path}", follow_symlinks=follow_last)
        except OSError:
            return None
    if fd < 0:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def exists_plain(pid: int, path: str) -> bool | None:
    """Whether something is at an absolute path in pid's root reached through no link (a
    link as the last part is something); None when the kernel cannot tell (no openat2)."""
    root = root_of(pid)
    if root < 0:
        return False
    found = _lookup_in(root, path, _HOW_NOFOLLOW)
    if found == 0 and not _openat2_works:
        return None
    return found == PLAIN


_opened: dict[str, int] = {}  # resolved path -> descriptor opened by lookup_program


def open_program(pid: int, path: str) -> int:
    """A descriptor of the file at path (resolved already) in pid's root, opened for reading
    without following a link swapped in since, without blocking on a FIFO; -errno when it
    cannot be opened (-ENOENT, -ENOTDIR: nothing is there).

    The one lookup_program opened for path in this notification, if any; else opened from
    the root's descriptor, rather than through /proc/PID/root again."""
    fd = _opened.pop(path, -1)
    if fd >= 0:
        return fd
    root = root_of(pid)
    opened = _open_in(root, path, _HOW_PROGRAM) if root >= 0 else None
    if opened is not None:
        return opened
    try:
        return os.open(f"/proc/{pid}/root{path}", _PROGRAM_FLAGS)
    except OSError as exc:
        return -(exc.errno or errno.EACCES)


def normal(path: str) -> str:
    """An absolute path with `.`, `..` and repeated slashes taken out (what resolving gives
    where no part is a link)."""
    return "/" + os.path.normpath(path).lstrip("/")


def proc_link(pid: int, what: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/{what}")
    except OSError:
        return None


class Answered(OSError):
    """A write-like call the kernel's own lookup fails whatever the policy (a name in a
    removed folder, ENOENT; a path that leaves an openat2's RESOLVE_BENEATH descriptor,
    EXDEV): the supervisor answers it with that errno and records nothing, since nothing
    was written or refused."""


class Removed(str):
    """The kernel's name for a removed file or folder, `PATH (deleted)`, when no file of
    that name is the one removed (the agent can make one: a link into the worktree, say)."""


DELETED = " (deleted)"


def folder_link(pid: int, what: str) -> str | None:
    """proc_link() for a descriptor or working folder that a path starts from (what: cwd or
    fd/N): a Removed when the link reads `PATH (deleted)` and PATH (deleted) is not that very
    file or folder. Only such a name costs more than the readlink. Raises OSError
    (ENAMETOOLONG) for a folder whose path is longer than the kernel names (PATH_MAX): the
    kernel still goes there, and a path from it cannot be named."""
    try:
        text = os.readlink(f"/proc/{pid}/{what}")
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise
        return None
    if not text.endswith(DELETED) or not text.startswith("/"):
        return text
    try:
        fd = os.open(f"/proc/{pid}/{what}", os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        held = os.fstat(fd)
    finally:
        os.close(fd)
    named = stat_in_root(pid, text, follow_last=False)
    if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
        return text  # a file or folder really named so (or a hard link of the removed file)
    if stat.S_ISDIR(held.st_mode):
        # A `..` leaves it for the folder it was removed from: that folder, by its name
        # (not removed too, not replaced since), or nothing to judge by.
        try:
            above = os.stat(f"/proc/{pid}/{what}/..")
        except OSError:
            return None
        folder = stat_in_root(pid, os.path.dirname(text[: -len(DELETED)]))
        if folder is None or (folder.st_dev, folder.st_ino) != (above.st_dev, above.st_ino):
            return None
    return Removed(text)


def out_of_removed(removed: str, path: str) -> str:
    """Where a relative path from a removed folder leads, as the kernel takes it: a name in
    it is no more (Answered, ENOENT: a creation there fails so too), and a `..` leaves it
    for the folder it was removed from, which the kernel still knows."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        return removed  # the folder itself (`.`): the kernel still has it
    if parts[0] != "..":
        raise Answered(errno.ENOENT, "in a removed folder")
    folder = os.path.dirname(removed[: -len(DELETED)]).rstrip("/")
    return "/".join([folder, *parts[1:]]) or "/"


def is_cwd(dirfd: int) -> bool:
    """True when a *at() call's dirfd is AT_FDCWD (as a signed or an unsigned 32-bit word)."""
    return dirfd == -100 or dirfd & 0xFFFFFFFF == 0xFFFFFF9C


def base_dir(pid: int, dirfd: int) -> str | None:
    """The folder a *at() call's relative path starts from, as the process sees it."""
    if is_cwd(dirfd):
        return proc_link(pid, "cwd")
    return proc_link(pid, f"fd/{dirfd & 0xFFFFFFFF}")


def write_base(pid: int, dirfd: int) -> str | None:
    """base_dir() for a write-like call: a Removed for a removed folder (folder_link)."""
    return folder_link(pid, "cwd" if is_cwd(dirfd) else f"fd/{dirfd & 0xFFFFFFFF}")


def join(base: str | None, path: str) -> str | None:
    """A path as given, from base; raises Answered for a name in a Removed base."""
    if path.startswith("/"):
        return path
    if base is None or not base.startswith("/"):
        return None
    if isinstance(base, Removed):
        return out_of_removed(base, path)
    return os.path.join(base, path)


MAGIC = re.compile(r"^/proc/(self|thread-self|\d+)(?:/task/(\d+))?/(cwd|root|exe|fd/\d+)$")
OTHER = "/proc/(other)"  # another process's links, or a way through /proc not followed: refused


def magic_target(pid: int, path: str) -> str | None:
    """Where a /proc/self/{cwd,root,exe,fd/N} path really leads for pid.

    None when path is no such link; "" when it leads to no file (a pipe, a socket); a
    Removed for a removed file or folder itself (not to be followed by its name), and for a
    path below a removed folder where out_of_removed() leads (or it raises Answered);
    "/proc/(other)" for another process's links, and for a `..` inside /proc/self (its links
    are not folders by name), which are refused. What follows the link is kept as it is, `..`
    and all, for the caller to resolve: a `..` after a link leaves the link's target, as the
    kernel takes it. /dev/fd, /dev/stdout and the like are links in the sandbox's own /dev,
    which the agent may replace: they are followed as links, never taken by name.
    """
    match, rest = _magic_prefix(path)
    if match is None or isinstance(match, str):
        return match  # no such link, or OTHER
    who, task, what = match.groups()
    owner = _link_owner(pid, who, task)
    if owner is None:
        return OTHER
    base = "/" if what == "root" else folder_link(owner, what)
    if base is None or not base.startswith("/"):
        return ""
    if isinstance(base, Removed) and rest:
        return out_of_removed(base, "/".join(rest))  # (a name in it: raises Answered)
    return base.rstrip("/") + "/" + "/".join(rest) if rest else base


def _link_owner(tid: int, who: str, task: str | None) -> int | None:
    """Whose links /proc/WHO names for the calling thread tid, as the kernel takes them: self
    is the thread's process (its first thread's fs and descriptors, which a thread that
    unshared them does not share), thread-self the thread; None for anything else: another
    process's links, and /proc/self/task/N, whose N counts in the sandbox's pid namespace,
    not the supervisor's (refused)."""
    if task is not None or who not in ("self", "thread-self"):
        return None
    if who == "thread-self":
        return tid
    tgid, _ = ids(tid)
    return tgid


def _magic_prefix(path: str) -> tuple[re.Match[str] | str | None, list[str]]:
    """(MAGIC's match of the /proc link path starts with, /proc/self/root say, and the parts
    after it, as they are); (None, []) when it starts with none; (OTHER, []) for a `..` below
    /proc/WHO before any such link (self, thread-self, task/N and the folders under them
    are not folders by name, whatever the depth)."""
    parts = path.split("/")
    taken: list[str] = []
    for index, part in enumerate(parts):
        if part in ("", "."):
            continue
        if part == "..":
            if len(taken) > 1:
                return OTHER, []
            taken.clear()  # out of /proc, a mount point: / as the kernel takes it
            continue
        taken.append(part)
        if taken[0] != "proc":
            return None, []
        if len(taken) <= 6 and (match := MAGIC.match("/" + "/".join(taken))):
            return match, [p for p in parts[index + 1 :] if p not in ("", ".")]
    return None, []


def resolve(pid: int, path: str, follow_last: bool = True, found: int | None = None) -> str:
    """Resolve symlinks in an absolute path as the process sees its own root.

    Symlinks are read through /proc/PID/root, so a link's absolute target is taken inside
    the sandbox, not on the host. Components that do not exist are kept as they are.
    found: lookup()'s answer for this very path, when the caller asked it already.
    """
    root = root_of(pid)  # -1 when gone: every readlink fails, the path is only normalised
    if root >= 0 and path.startswith("/"):
        path = through_root_links(root, path)
        # Most paths go through no link: one lookup by the kernel tells, where reading each
        # part costs a readlink. A path to a file not made yet: its folder is looked up.
        if found is None:
            found = _lookup_in(root, path, _HOW if follow_last else _HOW_NOFOLLOW)
        if found == PLAIN:
            return normal(path)
        if found == -errno.ENOENT:
            folder, _, last = path.rpartition("/")
            if last not in ("", ".", "..") and _lookup_in(root, folder or "/", _HOW) == PLAIN:
                return normal(path)
    return _resolve_in(root, [p for p in path.split("/") if p], follow_last)


_roots: dict[int, int] = {}


def root_of(pid: int) -> int:
    """A descriptor of pid's root (/proc/PID/root), -1 when it cannot be opened: opened once
    for all the lookups of one notification (each lookup through the magic link would repeat
    the access check), until forget_roots(); the sandbox's root, held since its set-up
    (share_sandbox_root), for every process but the one outside it."""
    if _shared_root >= 0 and pid != _outside:
        return _shared_root
    fd = _roots.get(pid)
    if fd is None:
        try:
            fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return -1
        _roots[pid] = fd
    return fd


def forget_roots() -> list[int]:
    """The root descriptors opened since the last call, and program files lookup_program
    opened that nobody took, for the caller to close."""
    fds = [*_roots.values(), *_opened.values()]
    _roots.clear()
    _opened.clear()
    return fds


# The sandbox's root, held open from its set-up (share_sandbox_root): every process in the
# sandbox has that root and cannot change it (chroot and pivot_root need capabilities it has
# none of, and it can make no user namespace to get them). Only bubblewrap's first process,
# which stays outside, has another (_outside); it makes no call judged by path once the
# sandbox runs. And the links at that root (`/bin -> usr/bin` where /usr is merged), when the
# root is read-only: nothing in the sandbox can change them either, so a path through one
# resolves as the same path through its target, in one lookup with no link on the way, where
# reading each part would cost a readlink for each.
_shared_root = -1
_outside = 0
_root_links: dict[str, str] = {}


def share_sandbox_root(pid: int, outside: int) -> dict[str, str]:
    """Hold pid's root as the root of every process but outside, and learn the links at it
    if it is read-only: name -> absolute target, for links whose target starts with no other
    link of the root and has no `..` after a name. Returns the links learnt."""
    global _shared_root, _outside
    forget_sandbox()
    try:
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return {}
    _shared_root, _outside = root, outside
    links: dict[str, str] = {}
    try:
        if os.fstatvfs(root).f_flag & os.ST_RDONLY:
            for name in os.listdir(root):
                with contextlib.suppress(OSError):
                    target = os.readlink(name, dir_fd=root)
                    if not target.startswith(("/proc", "/dev")) and not _climbs_after_a_name(
                        target
                    ):
                        links[name] = normal("/" + target)  # a relative target is taken from /
    except OSError:
        links = {}
    for name, target in links.items():
        if target.split("/", 2)[1] not in links:
            _root_links[name] = target
    return dict(_root_links)


def forget_sandbox() -> None:
    """Drop what was learnt of a sandbox (its root held open, the links at it)."""
    global _shared_root
    if _shared_root >= 0:
        os.close(_shared_root)
    _shared_root = -1
    _root_links.clear()


def _climbs_after_a_name(target: str) -> bool:
    """True when a link's target has a `..` after a name: the name may be a link (one the
    sandbox can change, even), and `..` climbs from where that leads, which the target's
    spelling cannot tell. A `..` at its start climbs from the root, which stays the root."""
    parts = [p for p in target.split("/") if p not in ("", ".")]
    while parts and parts[0] == "..":
        parts.pop(0)
    return ".." in parts


def through_root_links(root: int, path: str) -> str:
    """An absolute path with its first part, when that is a link at the sandbox's root (root
    being that root) and another part follows it, replaced by the link's target; path itself
    otherwise (a link as the last part is followed or not as the caller asks)."""
    if root != _shared_root or not _root_links:
        return path
    name, _, rest = path[1:].partition("/")
    target = _root_links.get(name)
    if target is None or not rest.strip("/"):
        return path
    return f"{target}/{rest}"


# What a readlink answers for a name that is no link (EINVAL), or not there (ENOENT,
# ENOTDIR), or past a link kept as a name after 40 (ELOOP: the kernel fails the call so):
# kept as it is. Any other failure (ENAMETOOLONG, where only the expansion of a link made
# the path longer than PATH_MAX, which the kernel, going name by name, takes) leaves the
# name unknown: raised, never taken for a name that is no link.
_NO_LINK = (errno.EINVAL, errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
NAME_MAX = 255


_STRETCH = 2048  # bytes of path opened in one go on the way to a name past PATH_MAX


class _Held:
    """A folder held partway down a path longer than PATH_MAX: its descriptor and the names
    that lead there from the root, so that the next name is read from it, not again from the
    root (each read from the root would cost the whole depth)."""

    def __init__(self) -> None:
        self.fd = -1
        self.names: list[str] = []

    def keep(self, fd: int, names: list[str]) -> None:
        self.close()
        self.fd, self.names = fd, names

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.names = -1, []


def _readlink(root: int, candidate: str, resolved: list[str], part: str, held: _Held) -> str:
    """os.readlink(candidate) from root, candidate being resolved and part joined; where
    candidate is longer than the kernel takes in one call (PATH_MAX), which a path from a deep
    folder can be, read from a descriptor of its folder, reached stretch by stretch from the
    deepest folder held on the way, with no link on the way (resolved holds none: each name
    was read so). ENOENT or ENOTDIR where a folder on the way is not there, as the readlink
    would answer; a link that appeared on the way since (raced): ESTALE, never read past."""
    try:
        return os.readlink(candidate, dir_fd=root)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG or len(os.fsencode(part)) > NAME_MAX:
            raise
    at, depth = root, 0
    if held.fd >= 0 and resolved[: len(held.names)] == held.names:
        at, depth = held.fd, len(held.names)
    while depth < len(resolved):
        stretch: list[str] = []
        size = 0
        for name in resolved[depth:]:
            if stretch and size + len(os.fsencode(name)) >= _STRETCH:
                break
            stretch.append(name)
            size += len(os.fsencode(name)) + 1
        fd = _openat2(at, "/".join(stretch), _HOW_FOLDER)
        if fd < 0:
            if fd in (-errno.ENOENT, -errno.ENOTDIR):
                raise OSError(-fd, os.strerror(-fd))
            raise OSError(errno.ESTALE, "the folder on the way cannot be held")
        depth += len(stretch)
        held.keep(fd, resolved[:depth])
        at = fd
    return os.readlink(part, dir_fd=at)


def resolve_visiting(pid: int, path: str) -> tuple[str, list[str]]:
    """What the absolute path leads to as pid sees it, read name by name, and every name
    looked up on the way (the folders entered, the links followed, each as the absolute
    path where it lies): what anyone who could change one of them could redirect. Raises
    OSError (ESRCH when pid is gone)."""
    root = root_of(pid)
    if root < 0:
        raise OSError(errno.ESRCH, "the process is gone")
    visited: list[str] = []
    parts = [p for p in path.split("/") if p]
    return _resolve_in(root, parts, True, visited=visited), visited


def _resolve_in(root: int, parts: list[str], follow_last: bool, scoped: bool = False,
                visited: list[str] | None = None) -> str:  # fmt: skip
    """The path parts lead to from root, their links read by name from root (an absolute
    target starting again at root, a `..` going no higher); scoped: as an openat2 with
    RESOLVE_IN_ROOT from root takes them (a link into /proc is a name like any other, never
    handed to the caller to map). Raises OSError when a name cannot be read (ENAMETOOLONG:
    Answered when the name itself is longer than the kernel takes, which fails the call)."""
    held = _Held()
    try:
        return _resolve_held(root, parts, follow_last, scoped, held, visited)
    finally:
        held.close()


def _resolve_held(root: int, parts: list[str], follow_last: bool, scoped: bool,
                  held: _Held, visited: list[str] | None = None) -> str:  # fmt: skip
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        if resolved == ["proc"] and not scoped:
            # Into the sandbox's /proc, whatever the spelling or the link that led here: its
            # links (self, cwd, fd/N) are the caller's to map (magic_target), never read by
            # name here, where `self` is not the caller's, nor kept as names (a `..` after
            # one leaves its target, not the link).
            return "/".join(["/proc", part, *parts])
        candidate = "/".join([*resolved, part])  # relative to root, never with `..`
        if visited is not None:
            visited.append("/" + candidate)
        if not parts and not follow_last:
            resolved.append(part)
            break
        try:
            target = _readlink(root, candidate, resolved, part, held)
        except OSError as exc:
            if exc.errno in _NO_LINK:
                if scoped and parts and exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    # A folder on the way is not there: the kernel's lookup stops at it
                    # (where this would go on, through a `..` after it).
                    raise Answered(exc.errno, "a folder on the way is not there") from None
                resolved.append(part)
                continue
            if exc.errno == errno.ENAMETOOLONG and len(os.fsencode(part)) > NAME_MAX:
                raise Answered(errno.ENAMETOOLONG, "a name longer than NAME_MAX") from None
            raise
        hops += 1
        if hops > 40:
            resolved.append(part)
            continue
        if not scoped and target.startswith(("/proc/", "/dev/fd")):
            # A link into the magic links of /proc (as /dev/stdout is): let the caller map it.
            return "/".join([target.rstrip("/"), *parts])
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p] + parts
    return "/" + "/".join(resolved)


_RESOLVE_BENEATH = 0x08
SCOPED = _RESOLVE_BENEATH | _RESOLVE_IN_ROOT  # openat2's resolve flags that scope a lookup
_RESOLVE_LOOKUP = 0x1F  # NO_XDEV, NO_MAGICLINKS, NO_SYMLINKS, BENEATH, IN_ROOT (not CACHED)
_HOW_FOLDER = _how(os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY)  # in root, no link on the way


def _openat2(dirfd: int, path: str, how: bytes | ctypes.Array[ctypes.c_char]) -> int:
    """openat2 itself: a descriptor or -errno."""
    fd = _libc.syscall(_OPENAT2, dirfd, os.fsencode(path), how, ctypes.c_size_t(24))
    return int(fd) if fd >= 0 else -ctypes.get_errno()


def scoped_path(pid: int, dirfd: int, path: str, *, resolve: int, nofollow: bool,
                create: bool) -> str:  # fmt: skip
    """Where an openat2 of path from dirfd with RESOLVE_IN_ROOT or RESOLVE_BENEATH in
    resolve (which take an absolute path, a `..` and a link's target under the descriptor)
    leads, as an absolute path in pid's root.

    The kernel is asked first, from the process's own descriptor (or working folder), with
    the call's own resolve flags: where its lookup fails (EXDEV out of RESOLVE_BENEATH, a
    magic link, a link under RESOLVE_NO_SYMLINKS; ENOENT, save for a creation of the last
    name) it raises Answered with that errno. The path found is then followed link by link
    from the descriptor, as RESOLVE_IN_ROOT goes (the same, for a lookup that stays under
    it), named from the descriptor's own path, and taken only when that name is the file
    (or, for a creation, the folder) the kernel reached; OSError otherwise.
    """
    what = "cwd" if is_cwd(dirfd) else f"fd/{dirfd & 0xFFFFFFFF}"
    try:
        held = os.open(f"/proc/{pid}/{what}", os.O_PATH | os.O_CLOEXEC)
    except OSError:
        raise Answered(errno.EBADF, "no such descriptor") from None
    try:
        flags = os.O_PATH | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
        fd = _openat2(held, path, struct.pack("=QQQ", flags, 0, resolve & _RESOLVE_LOOKUP))
        if fd < 0 and not (fd == -errno.ENOENT and create):
            raise Answered(-fd, os.strerror(-fd))
        if fd < 0 and path.rstrip("/").rsplit("/", 1)[-1] in ("", ".", ".."):
            raise Answered(errno.ENOENT, os.strerror(errno.ENOENT))  # no name to make
        parts = [p for p in path.split("/") if p]
        try:
            found = _resolve_in(held, parts, follow_last=not nofollow, scoped=True)
        except OSError:
            if fd >= 0:
                os.close(fd)
            raise
        # What the kernel reached: the file, or the folder a missing last name is made in
        # (reached by its resolved form, which has no link on the way).
        reached = found
        if fd < 0:
            reached = os.path.dirname(found)
            fd = _openat2(held, reached.lstrip("/") or ".", _HOW_FOLDER)
            if fd < 0:
                if fd in (-errno.ENOENT, -errno.ENOTDIR):
                    raise Answered(-fd, "a folder on the way is not there")
                raise OSError(-fd, os.strerror(-fd))
        try:
            held_file = os.fstat(fd)
        finally:
            os.close(fd)
        base = proc_link(pid, what)
        if base is None or not base.startswith("/"):
            raise OSError(errno.ENOTDIR, "no folder to start from")
        named = stat_in_root(pid, normal(f"{base}/{reached}"), follow_last=False)
        if named is None or (named.st_dev, named.st_ino) != (held_file.st_dev, held_file.st_ino):
            if base.endswith(DELETED) and not os.fstat(held).st_nlink:
                raise Answered(errno.ENOENT, "in a removed folder")
            raise OSError(errno.ESTALE, "the path the kernel reaches has no name")
        return normal(f"{base}/{found}")
    finally:
        os.close(held)


def read_proc(path: str, limit: int) -> bytes | None:
    """Up to limit + 1 bytes of a /proc file (so that an overlong one shows), None when it
    cannot be read.

    Plain descriptor reads, page by page: the supervisor reads these files at every exec, and
    a buffered file object (or one buffer of the whole limit) costs more than the read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return read_open(fd, limit)
    finally:
        os.close(fd)


def read_open(fd: int, limit: int) -> bytes | None:
    """read_proc() of a /proc file opened already, from its start: what it shows now (a
    process's cmdline, read through a descriptor taken before its exec, shows the argv of
    the program it runs at the time of the read)."""
    try:
        data = os.pread(fd, PAGE, 0)
        if len(data) < PAGE:
            return data
        parts = [data]
        size = len(data)
        while size <= limit:
            chunk = os.pread(fd, min(limit + 1 - size, 16 * PAGE), size)
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts)
    except OSError:
        return None


def thread_group(pid: int) -> int | None:
    """The thread group (process) id of a thread, None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


MAX_CMDLINE = 1 << 20


def cmdline(pid: int) -> list[str] | None:
    """The argv a process runs with, as the kernel copied it; None when unreadable or huge."""
    data = read_proc(f"/proc/{pid}/cmdline", MAX_CMDLINE)
    if not data or len(data) > MAX_CMDLINE:
        return None
    return (
        [a.decode("utf-8", "surrogateescape") for a in data[:-1].split(b"\0")]
        if data.endswith(b"\0")
        else [a.decode("utf-8", "surrogateescape") for a in data.split(b"\0")]
    )


def ids(pid: int) -> tuple[int | None, int]:
    """(thread group id, parent pid) of a thread from one read of its status: (None, 0) when
    it is gone."""
    tgid: int | None = None
    data = read_proc(f"/proc/{pid}/status", PAGE)
    if data is None:
        return None, 0
    ppid = 0
    for line in data.split(b"\n", 9):
        if line.startswith(b"Tgid:"):
            tgid = int(line.split()[1])
        elif line.startswith(b"PPid:"):
            ppid = int(line.split()[1])
            break
    return tgid, ppid


def parent_pid(pid: int) -> int:
    """The parent of a process (of a thread's process), 0 when it is gone.

    From /proc/PID/stat (field 4, after the name in parentheses, which may hold anything):
    the kernel builds it faster than the status file.
    """
    data = read_proc(f"/proc/{pid}/stat", PAGE)
    if not data:
        return 0
    fields = data[data.rfind(b")") + 2 :].split(b" ", 2)
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return 0


def _stat_fields(data: bytes) -> list[bytes]:
    """The fields of a stat file from the third (its state) on: after the name in
    parentheses, which may hold anything; fields[k - 3] is field k of proc(5)."""
    return data[data.rfind(b")") + 2 :].split()


def current_call(tid: int) -> int | None:
    """The system call a thread is in (/proc/TID/syscall), -1 while it runs its own code;
    None when that cannot be told (it is on a processor at the moment, or gone)."""
    data = read_proc(f"/proc/{tid}/syscall", 64)
    try:
        return int(data.split(None, 1)[0]) if data else None
    except ValueError:  # "running"
        return None


def zombie_exit(pid: int) -> int | None:
    """The wait status of a zombie (field 52 of /proc/PID/stat), None if it is already reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = _stat_fields(data)
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    return int(fields[49])


# What a stat file shows of a layout the reader may not see (the kernel's ptrace read check
# refused: a process not dumpable, its address space owned outside the reader's reach): the
# same for every program (is_hidden).
LAYOUT_HIDDEN = (b"1", b"1", *(b"0",) * 8)


def layout(task: str) -> tuple[bytes, ...] | None:
    """Where the address space of a process (task: /proc/PID or /proc/PID/task/TID) has its
    code, stack, data, heap, arguments and environment (fields 26-28 and 45-51 of its stat
    file): an exec makes a new one, laid out anew. None when it is gone, and when the task
    has no address space (the stat file then shows every field 0: a process's first thread
    that has ended while another of its threads goes on, or one ending). A layout the
    kernel hides from this reader is LAYOUT_HIDDEN: another than any it showed, but no
    reference to tell a later one by."""
    data = read_proc(f"{task}/stat", PAGE)
    if not data:
        return None
    fields = _stat_fields(data)
    if len(fields) < 49:
        return None
    found = (*fields[23:26], *fields[42:49])
    return None if all(field == b"0" for field in found) else found


def pidfd_alive(pidfd: int) -> bool:
    """Whether the task a pidfd refers to (a process, or a thread's with PIDFD_THREAD) is
    still there, as a zombie too: False once it has no task left. A pidfd that may not be
    signalled counts as there."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def has_ended(pidfd: int, pid: int) -> bool:
    """Whether the process a pidfd (of process pid) refers to has ended: reaped (its pid has
    no task left), or a zombie with no thread left.

    A pidfd reads as ready then, and also, for a moment, while a thread other than the
    first makes an exec: the first thread is a zombie, and the exec's thread is about to
    take over its id and go on as the process, running the new program. While the pidfd's
    process is there its id is its own, so /proc/PID is that process."""
    if not pidfd_alive(pidfd):
        return True
    data = read_proc(f"/proc/{pid}/stat", PAGE)
    if not data:
        return True
    fields = _stat_fields(data)
    try:
        return fields[0] in (b"Z", b"X") and int(fields[17]) <= 1
    except (IndexError, ValueError):
        return True


# PIDFD_GET_INFO (Linux 6.15+): _IOWR(0xFF, 11, struct pidfd_info), its first version of 64
# bytes; PIDFD_INFO_EXIT asks for the wait status, which stays readable through the pidfd
# after the parent has reaped the process.
PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11
PIDFD_INFO_PID = 1 << 0
PIDFD_INFO_EXIT = 1 << 3
_PIDFD_INFO = struct.Struct("=QQ11Ii")  # mask, cgroupid, pid..fsgid, exit_code


def reaped_exit(pidfd: int) -> int | None:
    """The wait status of a process already reaped by its parent, read through its pidfd.

    None on kernels without PIDFD_GET_INFO, or while the status is not known yet.
    """
    buf = bytearray(_PIDFD_INFO.pack(PIDFD_INFO_EXIT, *([0] * 13)))
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, buf)
    except OSError:
        return None
    mask, *_, exit_code = _PIDFD_INFO.unpack(bytes(buf))
    return exit_code if mask & PIDFD_INFO_EXIT else None


def pidfd_parent(pidfd: int) -> int:
    """The parent of the process a pidfd refers to (PIDFD_GET_INFO, Linux 6.13+: one call,
    where /proc/PID/stat is an open, a read of a file the kernel builds, and a close); 0 when
    the kernel cannot tell (older kernels, a process already reaped)."""
    buf = bytearray(_PIDFD_INFO.size)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, buf)
    except OSError:
        return 0
    mask, _cgroup, _pid, _tgid, ppid, *_ = _PIDFD_INFO.unpack(buf)
    return ppid if mask & PIDFD_INFO_PID else 0


def arguments_placed(task: str) -> bool | None:
    """Whether the address space of a process (task: /proc/PID or /proc/PID/task/TID) has its
    arguments in place: an exec sets where they end (field 51 of the stat file, env_end) when
    it writes them, after it has replaced the address space and before the new program runs.
    False in between; None when the process is gone. True when the kernel hides the layout
    from this reader (LAYOUT_HIDDEN: code at 1 to 1, which no address space in the window
    shows): nothing will tell, and the arguments are then judged as unreadable."""
    data = read_proc(f"{task}/stat", PAGE)
    if not data:
        return None
    fields = _stat_fields(data)
    try:
        return int(fields[48]) != 0 or fields[23:25] == list(LAYOUT_HIDDEN[:2])
    except (IndexError, ValueError):
        return None


# kcmp(2) (KCMP_VM: do two processes use one address space?); Linux 3.5+, built in where
# checkpoint/restore is (every distribution kernel).
_KCMP = {"x86_64": 312, "aarch64": 272}.get(os.uname().machine)
_KCMP_VM = 1


def same_address_space(pid: int, other: int) -> bool | None:
    """True when pid and other use one address space (a vfork child before its exec, and its
    parent); None when the kernel cannot tell (either gone, no kcmp)."""
    if _KCMP is None:
        return None
    got = _libc.syscall(_KCMP, pid, other, _KCMP_VM, ctypes.c_ulong(0), ctypes.c_ulong(0))
    return None if got < 0 else got == 0


def pid_namespace(pid: int) -> int | None:
    """The pid namespace of a process (the inode of /proc/PID/ns/pid), None when it is gone
    or cannot be read."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """The children of pid's process, started by any of its threads."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        data = read_proc(f"/proc/{pid}/task/{tid}/children", 64 * PAGE)
        found.extend(int(word) for word in (data or b"").split())
    return found
