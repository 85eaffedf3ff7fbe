"""Writes whose record once named another path than the kernel's, with no race: an `openat2`
scoped to its descriptor (RESOLVE_IN_ROOT, RESOLVE_BENEATH), a path that only link expansion
makes longer than PATH_MAX, and a removed folder whose `... (deleted)` name the agent made
real."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import needs_bwrap
from helpers import run_json
from test_supervise import predicate, repo  # noqa: F401 (repo: the same fixture)

pytestmark = [needs_bwrap, pytest.mark.sandbox]


def syscall_writes(pred: dict) -> set[tuple[str, str, str]]:  # type: ignore[type-arg]
    return {(w["path"], w["op"], w["decision"]) for w in pred["writes"]
            if w["source"] == "syscall"}  # fmt: skip


def outcomes(stdout: str) -> dict[str, str]:
    """The agent's `RESULT name outcome` lines (its stdout is the run's stderr)."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            _, name, outcome = line.split(" ", 2)
            found[name] = outcome
    return found


# The agent's side: each call's outcome printed as `RESULT name ok|ERRNAME`.
PRELUDE = r"""
import ctypes, errno, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
WT = os.getcwd()
RESOLVE_BENEATH, RESOLVE_IN_ROOT = 0x08, 0x10
def openat2(dirfd, path, flags, resolve):
    how = struct.pack("=QQQ", flags, 0o644 if flags & os.O_CREAT else 0, resolve)
    fd = libc.syscall(437, dirfd, path.encode(), how, ctypes.c_size_t(24))
    if fd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return fd
def attempt(name, call, *args, **kwargs):
    try:
        fd = call(*args, **kwargs)
        if isinstance(fd, int) and fd >= 0:
            os.close(fd)
        print("RESULT", name, "ok", flush=True)
    except OSError as exc:
        print("RESULT", name, errno.errorcode.get(exc.errno, exc.errno), flush=True)
W = os.O_WRONLY | os.O_CREAT
"""

SCOPED = (
    PRELUDE
    + r"""
src = os.open("src", os.O_PATH | os.O_DIRECTORY)
os.mkdir("/tmp/t")
tmp = os.open("/tmp/t", os.O_PATH | os.O_DIRECTORY)
os.symlink("/README.md", "src/abs")
# In root: an absolute path, a `..` above the descriptor and an absolute link are taken
# under the descriptor.
attempt("in_root_absolute", openat2, src, "/new.py", W, RESOLVE_IN_ROOT)
attempt("in_root_cwd_absolute", openat2, -100, "/README.md", W, RESOLVE_IN_ROOT)
attempt("in_root_dotdot", openat2, tmp, "../../README.md", W, RESOLVE_IN_ROOT)
attempt("in_root_link", openat2, src, "abs", W, RESOLVE_IN_ROOT)
# Beneath: leaving the descriptor fails (EXDEV); staying under it is a plain write.
attempt("beneath_dotdot", openat2, src, "../README.md", W, RESOLVE_BENEATH)
attempt("beneath_absolute", openat2, src, "/etc/passwd", W, RESOLVE_BENEATH)
attempt("beneath_link", openat2, src, "abs", W, RESOLVE_BENEATH)
attempt("beneath_inside", openat2, src, "d/../b.py", W, RESOLVE_BENEATH)  # (no src/d yet)
os.mkdir("src/d")
attempt("beneath_inside2", openat2, src, "d/../b2.py", W, RESOLVE_BENEATH)
# Without a scoping flag a magic link is followed as before; with one the kernel refuses it.
attempt("plain_magic", openat2, -100, "/proc/self/cwd/src/m.py", W, 0)
attempt("in_root_through_proc", openat2, os.open("/", os.O_PATH), "proc/self/cwd/src/p.py",
        W, RESOLVE_IN_ROOT)
"""
)


def test_openat2_scoped_to_its_descriptor_is_judged_where_the_kernel_resolves_it(
    repo: Path,  # noqa: F811 (the fixture)
) -> None:
    """RESOLVE_IN_ROOT takes an absolute path, a `..` above the descriptor and an absolute
    link's target under the descriptor: the write is judged and recorded there (src/new.py,
    allowed), not at the same names from the sandbox's root (/new.py, refused). With
    RESOLVE_BENEATH the kernel refuses a path that leaves the descriptor (EXDEV): the
    supervisor answers so, and records no write to where it would have led."""
    proc, data = run_json(repo, "python3", "-c", SCOPED)
    assert proc.returncode == 0, proc.stderr
    got = outcomes(proc.stderr)
    # A magic link under a scoped lookup: EXDEV from the kernel; the supervisor, outside the
    # sandbox's pid namespace, finds no /proc/self there and answers ENOENT. Neither writes.
    assert got.pop("in_root_through_proc", None) in ("EXDEV", "ENOENT"), proc.stderr
    assert got == {
        "in_root_absolute": "ok",
        "in_root_cwd_absolute": "EACCES",
        "in_root_dotdot": "ok",
        "in_root_link": "ok",
        "beneath_dotdot": "EXDEV",
        "beneath_absolute": "EXDEV",
        "beneath_link": "EXDEV",
        "plain_magic": "ok",
        "beneath_inside": "ENOENT",
        "beneath_inside2": "ok",
    }, proc.stderr
    worktree = Path(data["worktree"])
    assert (worktree / "src" / "new.py").exists() and (worktree / "src" / "README.md").exists()
    assert (worktree / "README.md").read_text() == "r\n"
    writes = syscall_writes(predicate(repo, data["commit"]))
    assert {("src/new.py", "create", "allow"), ("README.md", "write", "deny"),
            ("src/README.md", "create", "allow"), ("src/b2.py", "create", "allow"),
            ("src/m.py", "create", "allow")} <= writes, writes  # fmt: skip
    names = {w[0] for w in writes}
    assert not names & {"/new.py", "/README.md", "/etc/passwd", "src/p.py", "src/b.py"}, writes
    assert not any("README.md" in w[0] and w[2] == "deny" and w[0] != "README.md"
                   for w in writes), writes  # fmt: skip
    assert [w for w in writes if w[0] == "README.md"] == [("README.md", "write", "deny")], writes


LONG = (
    PRELUDE
    + r"""
name = "d" * 200
# Made where each path is short (a creation at a path over PATH_MAX is refused: the
# supervisor cannot name it), then moved under the long folder.
os.makedirs("/tmp/e/" + "/".join([name] * 7))  # E: 1,407 characters
os.symlink(WT + "/README.md", "/tmp/e/" + "/".join([name] * 7) + "/l")
os.symlink(WT + "/src/in.py", "/tmp/e/" + "/".join([name] * 7) + "/ok")
long = "/tmp/" + "/".join([name] * 14)  # D: 2,819 characters
os.makedirs(long)
os.rename("/tmp/e", long + "/e")
os.symlink(long, "/tmp/a")
short = "/tmp/a/e/" + "/".join([name] * 7)  # under PATH_MAX as given, over it once /tmp/a is read
attempt("through_long", os.open, short + "/l", os.O_WRONLY | os.O_TRUNC)
attempt("through_long_ok", os.open, short + "/ok", W)
# A working folder the kernel cannot name (its path over PATH_MAX), left by /proc/self/cwd.
os.chdir(long)
os.chdir("e/" + "/".join([name] * 7))
attempt("through_long_cwd", os.open, "/proc/self/cwd/" + "../" * 23 + WT + "/src/cwd.py", W)
# From that working folder, by absolute path: no name is needed of it.
attempt("absolute_from_long_cwd", os.open, WT + "/src/abs.py", W)
attempt("dev_null_from_long_cwd", os.open, "/dev/null", os.O_WRONLY)
# A working folder in src/ short enough to name, a relative name that takes the whole path
# past PATH_MAX, with no link anywhere: the kernel takes it, so does the supervisor.
os.chdir(WT + "/src")
while len(os.getcwd()) + 201 < 4000:
    os.mkdir(name); os.chdir(name)
attempt("deep_relative", os.open, "f" * 200, W)
"""
)


def test_a_path_only_link_expansion_makes_too_long_is_never_judged_by_another_name(
    repo: Path,  # noqa: F811 (the fixture)
) -> None:
    """A path under PATH_MAX as given, through a link whose target makes it longer: the
    supervisor cannot read the links past that length by name in one call, and once took
    them for plain names (a write to README.md through a link went through as one to /tmp,
    unrecorded). Now it reads them from a folder held partway, and judges the write where the
    kernel takes it. A working folder whose own path is longer than PATH_MAX, which the
    kernel cannot name but follows (/proc/self/cwd/../..), was once taken for no file at
    all: a write from it by a relative path is refused with ENAMETOOLONG and recorded; one by
    an absolute path does not need its name."""
    proc, data = run_json(repo, "python3", "-c", LONG)
    assert proc.returncode == 0, proc.stderr
    got = outcomes(proc.stderr)
    assert got == {"through_long": "EACCES", "through_long_ok": "ok",
                   "through_long_cwd": "ENAMETOOLONG", "absolute_from_long_cwd": "ok",
                   "dev_null_from_long_cwd": "ok", "deep_relative": "ok"}, proc.stderr  # fmt: skip
    worktree = Path(data["worktree"])
    assert (worktree / "README.md").read_text() == "r\n"
    assert (worktree / "src" / "in.py").exists() and (worktree / "src" / "abs.py").exists()
    assert not (worktree / "src" / "cwd.py").exists()
    pred = predicate(repo, data["commit"])
    writes = syscall_writes(pred)
    assert {w for w in writes if w[2] == "deny"} == {
        ("README.md", "truncate", "deny"), ("(a path too long to follow)", "write", "deny")
    }, writes  # fmt: skip
    assert {("src/in.py", "create", "allow"), ("src/abs.py", "create", "allow")} <= writes
    deep = [w for w in writes if w[0].endswith("f" * 200)]
    assert deep and deep[0][2] == "allow" and len(deep[0][0]) > 4000, writes
    # git cannot take a path past PATH_MAX: that one file is left out, said why, and the
    # rest of the run's work is committed.
    committed = {c["path"] for c in pred["changes"]}
    assert {"src/in.py", "src/abs.py"} <= committed, committed
    assert not pred["launcher_errors"], pred["launcher_errors"]
    left = {n["path"]: n["reason"] for n in pred["not_committed"]}
    assert [p for p in left if p.endswith("f" * 200)], left


DELETED = (
    PRELUDE
    + r"""
os.mkdir("/tmp/d2")
d2 = os.open("/tmp/d2", os.O_PATH | os.O_DIRECTORY)
os.rmdir("/tmp/d2")
os.symlink(WT, "/tmp/d2 (deleted)")
os.mkdir("src/w")
os.chdir("src/w")
os.rmdir(WT + "/src/w")
os.symlink(WT, WT + "/src/w (deleted)")  # the removed folder's name, made real
attempt("cwd_existing", os.open, "README.md", os.O_WRONLY | os.O_TRUNC)
attempt("cwd_create", os.open, "src/new.py", W)
attempt("cwd_mkdir", os.mkdir, "sub")
attempt("cwd_proc", os.open, "/proc/self/cwd/README.md", os.O_WRONLY)
attempt("cwd_up", os.open, "../up.py", W)
attempt("fd_existing", os.open, "README.md", os.O_WRONLY, dir_fd=d2)
attempt("fd_up", os.open, "../d2up.txt", W, dir_fd=d2)
# Its folder removed too, and that name made real: a `..` has no name left to judge by.
os.makedirs("/tmp/p/q")
os.chdir("/tmp/p/q")
os.rmdir("/tmp/p/q"); os.rmdir("/tmp/p")
os.symlink(WT, "/tmp/p")
attempt("cwd_up_removed_too", os.open, "../README.md", os.O_WRONLY)
"""
)


def test_a_removed_folder_is_not_judged_by_a_name_the_agent_made_real(repo: Path) -> None:  # noqa: F811  # noqa: F811
    """The kernel names a removed working folder (or folder descriptor) `PATH (deleted)`: a
    link of that name into the worktree once made the supervisor judge and record writes
    there (README.md refused, src/new.py allowed) that the kernel answers with ENOENT, and
    a `..` out of the removed folder at the link's target. Now a name in a removed folder is
    answered ENOENT, unrecorded, and a `..` leaves it for the folder it was removed from
    (refused as unreadable when that folder is no more either)."""
    proc, data = run_json(repo, "python3", "-c", DELETED)
    assert proc.returncode == 0, proc.stderr
    got = outcomes(proc.stderr)
    assert got == {
        "cwd_existing": "ENOENT",
        "cwd_create": "ENOENT",
        "cwd_mkdir": "ENOENT",
        "cwd_proc": "ENOENT",
        "cwd_up": "ok",
        "fd_existing": "ENOENT",
        "fd_up": "ok",
        "cwd_up_removed_too": "EACCES",  # (the kernel: ENOENT)
    }, proc.stderr
    worktree = Path(data["worktree"])
    assert (worktree / "src" / "up.py").exists()
    writes = syscall_writes(predicate(repo, data["commit"]))
    assert ("src/up.py", "create", "allow") in writes, writes
    assert ("(unreadable path)", "write", "deny") in writes, writes
    names = {w[0] for w in writes}
    assert not names & {"README.md", "src/new.py", "sub", "up.py"}, writes
    assert not any(n.endswith("up.txt") for n in names), writes  # /tmp: scratch


PROC_SPELLED = (
    PRELUDE
    + r"""
open("src/victim.py", "w").write("v\n")
os.mkdir("src/sub")
os.chdir("src/sub")
# /proc/self/cwd reached by another spelling than `/proc/...`, then `..` out of it.
attempt("double_slash", os.open, "//proc/self/cwd/../x1.py", W)
attempt("dot", os.open, "/./proc/self/cwd/../x2.py", W)
attempt("through_tmp", os.open, "/tmp/../proc/self/cwd/../x3.py", W)
os.symlink("../proc/self/cwd", "/dev/p")
attempt("through_link", os.open, "/dev/p/../x4.py", W)
attempt("thread_self", os.open, "//proc/thread-self/cwd/../x5.py", W)
attempt("truncate", os.truncate, "//proc/self/cwd/../victim.py", 0)
attempt("mkdir", os.mkdir, "//proc/self/cwd/../d6")
attempt("readme", os.open, "//proc/self/cwd/../../README.md", os.O_WRONLY)
# Its own pid in the sandbox, its working folder removed and that name made real.
os.makedirs("/tmp/decoy/inner")
os.mkdir(WT + "/src/gone")
os.chdir(WT + "/src/gone")
os.rmdir(WT + "/src/gone")
os.symlink("/tmp/decoy/inner", WT + "/src/gone (deleted)")
attempt("own_pid", os.open, "//proc/%d/cwd/../y.py" % os.getpid(), W)
os.chdir(WT)
# Six names into /proc and out again with `..`, a link after it: not a name in /proc.
deep = "/proc/sys/net/ipv4/conf/all/" + "../" * 6 + WT.lstrip("/")
os.symlink("sub", "src/ln")
attempt("deep_dotdot", os.open, deep + "/src/ln/x7.py", W)
os.symlink("/proc/sys/net/ipv4/conf/all", "src/pl")
attempt("deep_dotdot_link", os.open, WT + "/src/pl/" + "../" * 6 + WT.lstrip("/") + "/src/ln/x8.py", W)
# A thread's own descriptors, six names into /proc: another process's links, refused.
import threading
fd = os.open("src/victim.py", os.O_PATH)
tid = threading.get_native_id()
attempt("task_fd", os.open, "/proc/self/task/%d/fd/%d" % (tid, fd), os.O_WRONLY | os.O_TRUNC)
"""
)


def test_proc_links_are_mapped_whatever_the_spelling_that_reaches_them(repo: Path) -> None:  # noqa: F811  # noqa: F811
    """`//proc/self/cwd/../x`, `/./proc/...`, `/tmp/../proc/...` or a link to
    `../proc/self/cwd` reach the same magic link as `/proc/self/cwd`: a `..` after it leaves
    the working folder. Only the literal `/proc/` spelling was once mapped; the others were
    judged as names in /proc (scratch), and their writes in src/ went unrecorded; so were
    paths more than five names into /proc (`/proc/self/task/N/fd/M`, or a `..` out of
    `/proc/sys/net/ipv4/conf/all` with a link after it). Now every way into the sandbox's
    /proc is mapped, and a `..` below /proc/NAME or another process's links are refused."""
    proc, data = run_json(repo, "python3", "-c", PROC_SPELLED)
    assert proc.returncode == 0, proc.stderr
    got = outcomes(proc.stderr)
    assert got == {"double_slash": "ok", "dot": "ok", "through_tmp": "ok", "through_link": "ok",
                   "thread_self": "ok", "truncate": "ok", "mkdir": "ok", "readme": "EACCES",
                   "own_pid": "EACCES", "deep_dotdot": "EACCES", "deep_dotdot_link": "EACCES",
                   "task_fd": "EACCES"}, proc.stderr  # fmt: skip
    writes = syscall_writes(predicate(repo, data["commit"]))
    assert {("src/x1.py", "create", "allow"), ("src/x2.py", "create", "allow"),
            ("src/x3.py", "create", "allow"), ("src/x4.py", "create", "allow"),
            ("src/x5.py", "create", "allow"), ("src/victim.py", "truncate", "allow"),
            ("src/d6", "mkdir", "allow"), ("README.md", "write", "deny"),
            ("another process's /proc links", "create", "deny")} <= writes, writes  # fmt: skip
    assert not [w for w in writes if w[0].startswith(("/proc", "proc"))], writes
    assert {
        ("another process's /proc links", "create", "deny"),
        ("another process's /proc links", "truncate", "deny"),
    } <= writes, writes
    worktree = Path(data["worktree"])
    assert (worktree / "README.md").read_text() == "r\n"
    assert not (worktree / "src" / "sub" / "x7.py").exists()
    assert not (worktree / "src" / "sub" / "x8.py").exists()
