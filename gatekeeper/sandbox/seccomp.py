"""A small classic-BPF seccomp filter handed to bubblewrap with `--seccomp FD`.

It refuses (EPERM) the system calls an agent has no business making and that would let it
reach past the mount and namespace boundary: kernel keyrings, io_uring (which bypasses
syscall filters), BPF and perf, kernel modules, new mount APIs, ptrace (which could stop the
sandbox's init or rewrite a process between the supervisor's check and the kernel's use),
pidfd_getfd (a copy of another process's descriptor: bubblewrap's pid 1's eventfd ends the run
with an exit status of the agent's choosing; the network bridge's holds its channel to the
launcher), TIOCSTI terminal injection, and TCP upper-layer protocols
(`setsockopt(SOL_TCP, TCP_ULP)`: kernel TLS would change what reads and polls of a socket
the agent shares with the launcher's proxy mean, and is kernel attack surface no agent needs;
TLS libraries do without it), and personality() with ADDR_NO_RANDOMIZE (the supervisor tells
a program's new address space from the old one by where its parts lie, which address
randomization makes differ; the launcher starts the sandbox with it on).

socket() and socketpair() are limited to the families a network namespace isolates and tools
need: AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK. Every other family fails with EAFNOSUPPORT.
AF_VSOCK in particular is not isolated by a network namespace at all: a vsock socket binds
and connects in the whole VM's vsock space (the hypervisor, other guests' agents). The rest is
refused because nothing an agent runs needs it and each is kernel attack surface reachable
from a user namespace: AF_BLUETOOTH, AF_CAN, AF_TIPC, AF_RDS (RDS over InfiniBand is not
per-namespace), AF_PACKET (per-namespace, but raw frames), AF_ALG (kernel crypto), AF_XDP,
AF_KEY, AF_NFC and the old protocol families. An allowlist, so that a family added to a later
kernel is refused too. These attempts are refused here, in the kernel, and are not recorded:
the supervisor's notification would lose to this filter's errno (seccomp ranks ERRNO above
USER_NOTIF), so it never hears of them.
"""

from __future__ import annotations

import errno
import platform
import struct
from typing import TypedDict

from gatekeeper.sandbox.limits import ADDR_NO_RANDOMIZE, PERSONALITY_QUERY

# struct seccomp_data offsets
OFF_NR = 0
OFF_ARCH = 4
OFF_ARG1_LO = 24
OFF_ARG2_LO = 32
SOL_TCP = 6
TCP_ULP = 31

BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_JSET_K = 0x45
BPF_RET_K = 0x06

SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000

TIOCSTI = 0x5412
# prctl(PR_SET_MM, ...) rewrites where the kernel says a process's address space has its
# parts (and, with PR_SET_MM_MAP, needs no capability): the supervisor reads those to tell an
# exec's new address space from the old one.
PR_SET_MM = 35
TIOCLINUX = 0x541C

OFF_ARG0_LO = 16
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
ALLOWED_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)


class Arch(TypedDict):
    """One architecture's audit value and system call numbers."""

    audit: int
    x32_bit: int | None  # the bit that marks an x32 call, where there is such an ABI
    ioctl: int
    socket: int
    socketpair: int
    setsockopt: int
    prctl: int
    personality: int
    deny: dict[str, int]


ARCHES: dict[str, Arch] = {
    "x86_64": {
        "audit": 0xC000003E,
        "x32_bit": 0x40000000,
        "ioctl": 16,
        "socket": 41,
        "socketpair": 53,
        "setsockopt": 54,
        "prctl": 157,
        "personality": 135,
        "deny": {
            "add_key": 248, "request_key": 249, "keyctl": 250, "kexec_load": 246,
            "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
            "delete_module": 176, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
            "open_by_handle_at": 304, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
            "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
            "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "quotactl": 179,
            "lookup_dcookie": 212, "syslog": 103, "ptrace": 101, "process_vm_writev": 311,
            "pidfd_getfd": 438,
        },
    },
    "aarch64": {
        "audit": 0xC00000B7,
        "x32_bit": None,
        "ioctl": 29,
        "socket": 198,
        "socketpair": 199,
        "setsockopt": 208,
        "prctl": 167,
        "personality": 92,
        "deny": {
            "add_key": 217, "request_key": 218, "keyctl": 219, "kexec_load": 104,
            "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
            "delete_module": 106, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
            "open_by_handle_at": 265, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
            "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
            "swapon": 224, "swapoff": 225, "reboot": 142, "acct": 89, "quotactl": 60,
            "lookup_dcookie": 18, "syslog": 116, "ptrace": 117, "process_vm_writev": 271,
            "pidfd_getfd": 438,
        },
    },
}  # fmt: skip


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def is_supported() -> bool:
    return platform.machine() in ARCHES


def build_filter(machine: str | None = None) -> bytes:
    """The filter program for this machine's architecture, as bwrap reads it from a file."""
    arch = ARCHES[machine or platform.machine()]
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    prog: list[bytes] = []
    prog.append(_insn(BPF_LD_W_ABS, 0, 0, OFF_ARCH))
    # A foreign architecture (e.g. 32-bit calls on a 64-bit kernel) is killed outright.
    prog.append(_insn(BPF_JEQ_K, 1, 0, arch["audit"]))
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS))
    prog.append(_insn(BPF_LD_W_ABS, 0, 0, OFF_NR))
    if arch["x32_bit"] is not None:
        prog.append(_insn(BPF_JGE_K, 0, 1, arch["x32_bit"]))
        prog.append(_insn(BPF_RET_K, 0, 0, eperm))
    for nr in sorted(arch["deny"].values()):
        prog.append(_insn(BPF_JEQ_K, 0, 1, nr))
        prog.append(_insn(BPF_RET_K, 0, 0, eperm))
    # ioctl(fd, TIOCSTI|TIOCLINUX, ...) pushes keystrokes into a terminal outside the sandbox.
    prog.append(_insn(BPF_JEQ_K, 0, 5, arch["ioctl"]))
    prog.append(_insn(BPF_LD_W_ABS, 0, 0, OFF_ARG1_LO))
    prog.append(_insn(BPF_JEQ_K, 2, 0, TIOCSTI))
    prog.append(_insn(BPF_JEQ_K, 1, 0, TIOCLINUX))
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    prog.append(_insn(BPF_RET_K, 0, 0, eperm))
    # prctl(PR_SET_MM, ...): refused; every other option allowed.
    prog.append(_insn(BPF_JEQ_K, 0, 4, arch["prctl"]))
    prog.append(_insn(BPF_LD_W_ABS, 0, 0, OFF_ARG0_LO))
    prog.append(_insn(BPF_JEQ_K, 0, 1, PR_SET_MM))
    prog.append(_insn(BPF_RET_K, 0, 0, eperm))
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    # personality(persona) with ADDR_NO_RANDOMIZE: refused; the query and the rest allowed.
    prog.append(_insn(BPF_JEQ_K, 0, 5, arch["personality"]))
    prog.append(_insn(BPF_LD_W_ABS, 0, 0, OFF_ARG0_LO))
    prog.append(_insn(BPF_JEQ_K, 2, 0, PERSONALITY_QUERY))
    prog.append(_insn(BPF_JSET_K, 0, 1, ADDR_NO_RANDOMIZE))
    prog.append(_insn(BPF_RET_K, 0, 0, eperm))
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    # setsockopt(fd, SOL_TCP, TCP_ULP, ...): refused; every other option allowed.
    prog.append(_insn(BPF_JEQ_K, 0, 6, arch["setsockopt"]))
    prog.append(_insn(BPF_LD_W_ABS, 0, 0, OFF_ARG1_LO))
    prog.append(_insn(BPF_JEQ_K, 0, 3, SOL_TCP))
    prog.append(_insn(BPF_LD_W_ABS, 0, 0, OFF_ARG2_LO))
    prog.append(_insn(BPF_JEQ_K, 0, 1, TCP_ULP))
    prog.append(_insn(BPF_RET_K, 0, 0, eperm))
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    prog += _socket_families(arch["socket"], arch["socketpair"])
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    return b"".join(prog)


def _socket_families(socket_nr: int, socketpair_nr: int) -> list[bytes]:
    """socket() and socketpair() with a family outside ALLOWED_FAMILIES: EAFNOSUPPORT.

    Expects the syscall number loaded; falls through to the next instruction (allow) for
    every other call and for an allowed family. The kernel reads the family as an int, so
    the low 32 bits of the argument are what counts.
    """
    n = len(ALLOWED_FAMILIES)
    block = [
        _insn(BPF_JEQ_K, 1, 0, socket_nr),
        _insn(BPF_JEQ_K, 0, n + 2, socketpair_nr),
        _insn(BPF_LD_W_ABS, 0, 0, OFF_ARG0_LO),
    ]
    for i, family in enumerate(ALLOWED_FAMILIES):
        block.append(_insn(BPF_JEQ_K, n - i, 0, family))
    block.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT))
    return block
