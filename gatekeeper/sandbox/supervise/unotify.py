"""A small ctypes layer over seccomp user notification (SECCOMP_RET_USER_NOTIF)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

libc = ctypes.CDLL(None, use_errno=True)

PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5
SECCOMP_RET_USER_NOTIF = 0x7FC00000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1

# ioctl numbers: _IOWR('!', 0, seccomp_notif), _IOWR('!', 1, seccomp_notif_resp), _IOW('!', 2, u64)
NOTIF_RECV = 0xC0502100
NOTIF_SEND = 0xC0182101
NOTIF_ID_VALID = 0x40082102

AT_FDCWD = -100

SYSCALLS = {
    "x86_64": {
        "audit": 0xC000003E, "seccomp": 317, "x32": 0x40000000,
        "execve": 59, "execveat": 322, "open": 2, "openat": 257, "openat2": 437, "creat": 85,
        "truncate": 76, "ftruncate": 77, "rename": 82, "renameat": 264, "renameat2": 316,
        "link": 86, "linkat": 265, "symlink": 88, "symlinkat": 266, "unlink": 87,
        "unlinkat": 263, "rmdir": 84, "chmod": 90, "fchmod": 91, "fchmodat": 268,
        "fchmodat2": 452, "mkdir": 83, "mkdirat": 258, "mknod": 133, "mknodat": 259,
        "connect": 42, "exit_group": 231, "sendto": 44, "sendmsg": 46, "sendmmsg": 307,
        "bind": 49, "set_tid_address": 218,
    },
    "aarch64": {
        "audit": 0xC00000B7, "seccomp": 277, "x32": None,
        "execve": 221, "execveat": 281, "openat": 56, "openat2": 437, "truncate": 45,
        "ftruncate": 46, "renameat": 38, "renameat2": 276, "linkat": 37, "symlinkat": 36,
        "unlinkat": 35, "fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "mkdirat": 34,
        "mknodat": 33, "connect": 203, "exit_group": 94, "sendto": 206, "sendmsg": 211,
        "sendmmsg": 269, "bind": 200, "set_tid_address": 96,
    },
}  # fmt: skip
META = ("audit", "seccomp", "x32")
# Calls the filter judges by an argument rather than by number alone (see build_notify_filter).
BY_ARGUMENT = ("open", "openat", "sendto", "sendmsg", "sendmmsg")

# Open flags that make an open a write: O_WRONLY | O_RDWR | O_CREAT | O_TRUNC
WRITE_OPEN_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000
# sendto/sendmsg flag: connect and send in one call (TCP Fast Open), to the address given.
MSG_FASTOPEN = 0x20000000


class SeccompData(ctypes.Structure):
    _fields_ = [("nr", ctypes.c_int), ("arch", ctypes.c_uint32),
                ("instruction_pointer", ctypes.c_uint64),
                ("args", ctypes.c_uint64 * 6)]  # fmt: skip


class Notif(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("data", SeccompData)]  # fmt: skip


class NotifResp(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32),
                ("flags", ctypes.c_uint32)]  # fmt: skip


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]  # fmt: skip


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def table() -> dict[str, int]:
    try:
        return SYSCALLS[platform.machine()]  # type: ignore[return-value]
    except KeyError:
        raise OSError(errno.ENOSYS, f"no syscall table for {platform.machine()}") from None


def names_by_number() -> dict[int, str]:
    return {v: k for k, v in table().items() if k not in META and v is not None}


def _insn(code: int, jt: int, jf: int, k: int) -> tuple[int, int, int, int]:
    return (code, jt, jf, k & 0xFFFFFFFF)


LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06


def build_notify_filter(watch_reads: bool) -> list[tuple[int, int, int, int]]:
    """Notify on exec, write-like file calls, bind (a Unix socket's name is a file), connect,
    sends that name a destination, exit_group and set_tid_address; allow everything else.

    set_tid_address is the first call of a new program built with glibc (2.34 and later) or
    musl, made as they set up its first thread, before any of the program's own code, its
    libraries' constructors and LD_PRELOAD's among them (musl makes it in each forked child
    too): there the program is checked against what its exec judged, on the arguments as
    the kernel copied them, before it can rename itself (npm, node's process.title,
    setproctitle) or write into them (mkdir -p parts its path there while it makes each
    folder).

    With watch_reads, every open is notified (to see reads of secret paths); otherwise only
    opens whose flags ask for writing. `sendto` is notified only with an address (a send on
    a connected socket passes NULL and costs nothing); `sendmsg` and `sendmmsg` only with
    MSG_FASTOPEN, since their address lies in memory the filter cannot read.
    """
    t = table()
    prog = [_insn(LD_W_ABS, 0, 0, 4), _insn(JEQ, 1, 0, t["audit"]),
            _insn(RET, 0, 0, SECCOMP_RET_KILL_PROCESS), _insn(LD_W_ABS, 0, 0, 0)]  # fmt: skip
    if t.get("x32"):
        prog += [_insn(JGE, 0, 1, t["x32"]), _insn(RET, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)]
    plain = [n for n, v in t.items() if n not in META and v is not None and
             (n not in BY_ARGUMENT or (watch_reads and n in ("open", "openat")))]  # fmt: skip
    for name in plain:
        prog += [_insn(JEQ, 0, 1, t[name]), _insn(RET, 0, 0, SECCOMP_RET_USER_NOTIF)]
    flag_tests = [("sendmsg", 2, MSG_FASTOPEN), ("sendmmsg", 3, MSG_FASTOPEN)]
    if not watch_reads:
        flag_tests += [("open", 1, WRITE_OPEN_FLAGS), ("openat", 2, WRITE_OPEN_FLAGS)]
    for name, arg, bits in flag_tests:
        if name not in t:
            continue
        # if nr == name: load the flags' low half; notify when any of bits is set; else allow
        prog += [_insn(JEQ, 0, 4, t[name]), _insn(LD_W_ABS, 0, 0, _arg_low(arg)),
                 _insn(JSET, 0, 1, bits), _insn(RET, 0, 0, SECCOMP_RET_USER_NOTIF),
                 _insn(RET, 0, 0, SECCOMP_RET_ALLOW)]  # fmt: skip
    # if nr == sendto: notify unless both halves of the address pointer (args[4]) are zero
    prog += [_insn(JEQ, 0, 6, t["sendto"]), _insn(LD_W_ABS, 0, 0, _arg_low(4)),
             _insn(JEQ, 0, 2, 0), _insn(LD_W_ABS, 0, 0, _arg_low(4) + 4),
             _insn(JEQ, 1, 0, 0), _insn(RET, 0, 0, SECCOMP_RET_USER_NOTIF),
             _insn(RET, 0, 0, SECCOMP_RET_ALLOW)]  # fmt: skip
    prog.append(_insn(RET, 0, 0, SECCOMP_RET_ALLOW))
    return prog


def _arg_low(index: int) -> int:
    """Offset of the low 32 bits of args[index] in seccomp_data (both tabled machines are
    little-endian, so the high half follows at +4)."""
    return 16 + 8 * index


def install_listener(prog: list[tuple[int, int, int, int]]) -> int:
    """Set no_new_privs and install prog in this process; return the listener fd.

    Raises OSError when the kernel refuses (no seccomp, no user notification support).
    """
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    filters = (SockFilter * len(prog))(*[SockFilter(*i) for i in prog])
    fprog = SockFprog(len(prog), filters)
    nr = table()["seccomp"]
    for flags in (SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
                  SECCOMP_FILTER_FLAG_NEW_LISTENER):  # fmt: skip
        fd = libc.syscall(nr, SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(fprog))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EINVAL:
            break
    raise OSError(err, f"seccomp(SET_MODE_FILTER, NEW_LISTENER): {os.strerror(err)}")


class Channel:
    """The listener's ioctls with their buffers made once: the loop answers thousands of
    notifications a second, and each ctypes structure it would build costs more than the call.

    One notification is handled at a time, so the one receive buffer is never shared.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._notif = Notif()
        self._notif_ref = ctypes.byref(self._notif)
        self._notif_addr = ctypes.addressof(self._notif)
        self._resp = NotifResp()
        self._resp_ref = ctypes.byref(self._resp)
        self._id = ctypes.c_uint64()
        self._id_ref = ctypes.byref(self._id)

    def recv(self) -> Notif | None:
        """Receive one notification into the shared buffer (valid until the next recv); None
        when the target died before it could be read."""
        ctypes.memset(self._notif_addr, 0, NOTIF_SIZE)  # the kernel refuses a dirty buffer
        if libc.ioctl(self.fd, NOTIF_RECV, self._notif_ref) != 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.EINTR, errno.EAGAIN):
                return None
            raise OSError(err, f"SECCOMP_IOCTL_NOTIF_RECV: {os.strerror(err)}")
        return self._notif

    def is_valid(self, notif_id: int) -> bool:
        """True while the notifying syscall is still waiting (its memory and pid are its own)."""
        self._id.value = notif_id
        return libc.ioctl(self.fd, NOTIF_ID_VALID, self._id_ref) == 0

    def respond(self, notif_id: int, error: int = 0) -> bool:
        """Let the syscall continue (error 0) or fail it with -error. False when it was no
        longer waiting (its caller killed, or the call interrupted, meanwhile): an answer
        given (True) shows the caller waited in the call until then."""
        resp = self._resp
        resp.id = notif_id
        resp.val = 0
        resp.error = -error if error else 0
        resp.flags = 0 if error else SECCOMP_USER_NOTIF_FLAG_CONTINUE
        if libc.ioctl(self.fd, NOTIF_SEND, self._resp_ref) != 0:
            err = ctypes.get_errno()
            if err == errno.ENOENT:  # the target was killed meanwhile: nothing to answer
                return False
            raise OSError(err, f"SECCOMP_IOCTL_NOTIF_SEND: {os.strerror(err)}")
        return True


NOTIF_SIZE = ctypes.sizeof(Notif)


def pack_filter(prog: list[tuple[int, int, int, int]]) -> bytes:
    return b"".join(struct.pack("=HBBI", *i) for i in prog)
