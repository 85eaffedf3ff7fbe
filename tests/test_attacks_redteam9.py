"""Attacks through another process's memory and through the dynamic loader.

/proc/PID/mem opened for writing lets one process of the sandbox write over another's
memory with no ptrace at all: stopped right after an allowed exec, a program's argv could be
pointed elsewhere after the supervisor's check, so a refused command ran under an allowed
command line. The sandbox's /proc is read-only (the kernel opens nothing there for writing)
and the attempt is recorded as a refused write no approval can lift.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_repo, needs_bwrap
from helpers import run_json
from test_supervise import predicate

pytestmark = [needs_bwrap, pytest.mark.sandbox]

MEMORY = r"""
import errno, json, os, subprocess, sys
child = subprocess.Popen(["sleep", "30"])
out = {}
def attempt(name, path, mode="r+b"):
    try:
        with open(path, mode) as fh:
            if "+" in mode or "w" in mode:
                fh.seek(0)
        out[name] = "OPENED"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
attempt("child", f"/proc/{child.pid}/mem")
attempt("child-task", f"/proc/{child.pid}/task/{child.pid}/mem")
attempt("self", "/proc/self/mem")
attempt("thread-self", "/proc/thread-self/mem")
attempt("via-link", f"/proc/{child.pid}/root/proc/{child.pid}/mem")
with open(f"/proc/{child.pid}/mem", "rb") as ro:
    attempt("reopened", f"/proc/self/fd/{ro.fileno()}")
attempt("oom", "/proc/self/oom_score_adj", "w")
attempt("read", f"/proc/{child.pid}/cmdline", "rb")
# The boundary is the kernel's, whatever the supervisor judges: /proc is mounted read-only.
with open("/proc/self/mountinfo") as fh:
    mounts = [line.split() for line in fh]
out["mount"] = "ro" if any(m[4] == "/proc" and "ro" in m[5].split(",") for m in mounts) else "rw"
child.kill()
child.wait()
with open("proc.json", "w") as fh:
    json.dump({"results": out, "child": child.pid}, fh)
"""


def test_no_process_writes_into_another_processes_memory(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "repo", policy="paths: {write: ['**']}\n")
    proc, data = run_json(repo, "python3", "-c", MEMORY)
    assert proc.returncode == 0, proc.stderr
    pred = predicate(repo, data["commit"])
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:proc.json"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    results, child = json.loads(shown)["results"], json.loads(shown)["child"]
    assert results.pop("read") == "OPENED", results  # reading stays as it was
    assert results.pop("mount") == "ro", results
    assert all(r in ("EROFS", "EACCES") for r in results.values()), results
    refused = {w["path"]: w.get("reason") for w in pred["writes"] if w["decision"] == "deny"}
    assert {f"/proc/{child}/mem", f"/proc/{child}/task/{child}/mem", "/proc/self/mem"} <= set(
        refused
    ), refused
    assert all("memory" in (r or "") for p, r in refused.items() if p.endswith("/mem")), refused
    # A refusal no approval could lift: no decision point.
    assert not [e for e in pred["escalations"] if str(e["value"]).endswith("/mem")], pred


LOADER_POLICY = "paths: {write: ['**']}\ncommands: {deny: ['uname'], default: allow}\n"


def _loader() -> str:
    from gatekeeper.sandbox.supervise.loader import interpreter_of

    found = interpreter_of(shutil.which("uname") or "/bin/uname")
    if found is None:
        pytest.skip("uname is no dynamically linked program here")
    return found


@pytest.mark.parametrize(
    "how",
    [
        "{ld} {uname} -a",
        "{ld} --argv0 other --library-path /nowhere -- {uname} -a",
        "{ld} --glibc-hwcaps-prepend /usr/bin/true {uname} -a",
        "{ld} --argv0=other --preload= {uname} -a",
        "{ld} --an-option-to-come /usr/bin/true {uname} -a",
        "cd $(dirname {uname}) && {ld} ./uname -a",
        "sh -c '{ld} {uname}'",
        'python3 -c \'import os; os.execv("{ld}", ["x", "{uname}"])\'',
        # by a path the agent can change after the check (a link swapped, another
        # process's /proc links, a relative path): refused as such
        "sleep 30 & {ld} --argv0 x /proc/$!/root{uname} -a; kill $!",
        "ln -s {uname} prog && {ld} --argv0 x $PWD/prog -a",
        "ln -s {uname} prog && {ld} --argv0 x ./prog -a",
        # a link at a place the agent cannot write that leads into one it can
        "ln -s {uname} /var/run/gatekeeper-git/L && {ld} --argv0 x /var/run/gatekeeper-git/L -a",
        # a `#!` line naming the loader, and one a level down
        "printf '#!{ld} {uname}\\n' > s && chmod +x s && ./s",
        "printf '#!{ld} {uname}\\n' > /tmp/i && chmod +x /tmp/i && printf '#!/tmp/i\\n' > s"
        " && chmod +x s && ./s",
    ],
)
def test_a_refused_program_run_by_the_dynamic_loader_is_refused(
    tmp_path: Path, key: Path, how: str
) -> None:
    """`ld.so /usr/bin/PROGRAM`: the kernel runs the loader, which maps the program with no
    exec of its own; a rule naming the program holds all the same."""
    repo = make_repo(tmp_path / "repo", policy=LOADER_POLICY)
    uname = os.path.realpath(shutil.which("uname") or "/bin/uname")
    command = how.format(ld=_loader(), uname=uname)
    proc, data = run_json(repo, "sh", "-c", f"({command}) > ran.txt; true")
    assert proc.returncode == 0, proc.stderr
    pred = predicate(repo, data["commit"])
    ran = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:ran.txt"],
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    assert "Linux" not in ran, ran
    refused = [p for p in pred["processes"] if p["decision"] == "deny"
               and (p["rule"] == "uname" or "dynamic loader" in (p["rule"] or ""))]  # fmt: skip
    assert refused, pred["processes"]


def test_the_dynamic_loader_still_runs_what_is_allowed(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "repo", policy=LOADER_POLICY)
    ls = os.path.realpath(shutil.which("ls") or "/bin/ls")
    proc, data = run_json(repo, "sh", "-c", f"{_loader()} {ls} -d / > ran.txt")
    assert proc.returncode == 0, proc.stderr
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:ran.txt"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert shown == "/\n", shown


REOPEN = r"""
import json, os, sys
out = {"stdin": sys.stdin.read()}
for fd in (0, 1, 2):
    try:
        with open(f"/proc/self/fd/{fd}", "r+b") as fh:
            out[f"read{fd}"] = fh.read(100).decode(errors="replace")
            fh.seek(0)
            fh.truncate(0)
            fh.write(b"OVERWRITTEN")
        out[f"fd{fd}"] = "rewritten"
    except OSError as exc:
        out[f"fd{fd}"] = exc.strerror
print("agent output", flush=True)
print(json.dumps(out), file=sys.stderr, flush=True)
with open("reopen.json", "w") as fh:
    json.dump(out, fh)
"""


def test_the_launchers_files_are_never_the_sandboxs_descriptors(
    tmp_path: Path, key: Path, isolated_home: Path
) -> None:
    """stdin, stdout and stderr redirected to files: reopened through /proc/self/fd/N, a file
    descriptor opens the host's file again (read what was in it, truncate, rewrite), here in
    the launcher's HOME, whose name is scratch space in the sandbox. The sandbox gets pipes
    instead: the files keep what they had, and get what the agent wrote."""
    repo = make_repo(tmp_path / "repo", policy="paths: {write: ['**']}\n")
    files = isolated_home / "logs"
    files.mkdir()
    given, log, errors = files / "in.txt", files / "out.log", files / "err.log"
    given.write_text("the prompt\n")
    log.write_text("EARLIER HOST LOG\n")
    errors.write_text("EARLIER ERRORS\n")
    with given.open("rb") as stdin, log.open("ab") as stdout, errors.open("ab") as stderr:
        proc = subprocess.run(
            [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--",
             "python3", "-c", REOPEN],
            stdin=stdin, stdout=stdout, stderr=stderr, timeout=300, check=False,
        )  # fmt: skip
    assert proc.returncode == 0, errors.read_text()
    assert given.read_text() == "the prompt\n"
    assert log.read_text().startswith("EARLIER HOST LOG\n"), log.read_text()
    assert "agent output" in log.read_text(), log.read_text()
    assert errors.read_text().startswith("EARLIER ERRORS\n"), errors.read_text()
    tip = subprocess.run(["git", "-C", str(repo), "for-each-ref", "--format=%(objectname)",
                          "--sort=-committerdate", "refs/heads/"],
                         capture_output=True, text=True, check=True).stdout.split()[0]  # fmt: skip
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{tip}:reopen.json"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    out = json.loads(shown)
    assert out["stdin"] == "the prompt\n", out
    assert "EARLIER" not in json.dumps(out), out


ULP = r"""
import json, socket
out = {}
for name in ("tls", "mptcp", "espintcp"):
    s = socket.socket()
    try:
        s.setsockopt(socket.IPPROTO_TCP, 31, name.encode())  # TCP_ULP
        out[name] = "set"
    except OSError as exc:
        out[name] = exc.errno
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
out["nodelay"] = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
with open("ulp.json", "w") as fh:
    json.dump(out, fh)
"""


def test_no_tcp_upper_layer_protocol_is_set_inside(tmp_path: Path, key: Path) -> None:
    """Kernel TLS on a socket the agent shares with the proxy would change what its reads and
    polls mean there: TCP_ULP is refused (EPERM) by the sandbox's filter; other options work."""
    repo = make_repo(tmp_path / "repo", policy="paths: {write: ['**']}\n")
    proc, data = run_json(repo, "python3", "-c", ULP)
    assert proc.returncode == 0, proc.stderr
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:ulp.json"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    out = json.loads(shown)
    assert out.pop("nodelay") != 0, out
    assert out == dict.fromkeys(("tls", "mptcp", "espintcp"), errno.EPERM), out


MEMFD_LOADER = r"""
import os, shutil, subprocess, sys
fd = os.memfd_create("copy", 0)
with open(shutil.which("ls"), "rb") as fh:
    os.write(fd, fh.read())
try:
    ran = subprocess.run([sys.argv[1], f"/proc/self/fd/{fd}", "-d", "/"], pass_fds=(fd,),
                         capture_output=True, text=True).stdout
except PermissionError:
    ran = "refused"
with open("memfd.txt", "w") as out:
    out.write(ran)
"""


def test_a_program_with_no_file_on_disk_is_refused_through_the_loader_too(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo", policy="paths: {write: ['**']}\n")
    proc, data = run_json(repo, "python3", "-c", MEMFD_LOADER, _loader())
    assert proc.returncode == 0, proc.stderr
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:memfd.txt"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert shown == "refused", shown
    pred = predicate(repo, data["commit"])
    assert any(p["decision"] == "deny" and "no file on disk" in (p["rule"] or "")
               for p in pred["processes"]), pred["processes"]  # fmt: skip


PIDFD_GETFD = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(1)
fd = libc.syscall(438, pidfd, 0, 0)  # pidfd_getfd: a copy of pid 1's descriptor 0
with open("getfd.json", "w") as fh:
    json.dump({"fd": fd, "errno": ctypes.get_errno()}, fh)
"""


def test_no_process_takes_a_copy_of_another_processes_descriptor(tmp_path: Path, key: Path) -> None:
    """pidfd_getfd: bubblewrap's pid 1 holds the eventfd its parent ends the run by, and
    its exit status pipe; the network bridge its channel to the launcher. Refused."""
    repo = make_repo(tmp_path / "repo", policy="paths: {write: ['**']}\n")
    proc, data = run_json(repo, "python3", "-c", PIDFD_GETFD)
    assert proc.returncode == 0, proc.stderr
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:getfd.json"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert json.loads(shown) == {"fd": -1, "errno": errno.EPERM}, shown


def test_a_copy_of_the_loader_under_its_own_name_is_a_loader(tmp_path: Path, key: Path) -> None:
    """A loader elsewhere (a toolchain's, a store's own glibc): known by its name too."""
    repo = make_repo(tmp_path / "repo", policy=LOADER_POLICY)
    uname = os.path.realpath(shutil.which("uname") or "/bin/uname")
    name = os.path.basename(_loader())
    command = f"mkdir -p /tmp/lib && cp {_loader()} /tmp/lib/{name} && /tmp/lib/{name} {uname} -a"
    proc, data = run_json(repo, "sh", "-c", f"({command}) > ran.txt; true")
    assert proc.returncode == 0, proc.stderr
    ran = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:ran.txt"],
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    assert "Linux" not in ran, ran


def test_a_loader_path_through_a_link_into_a_writable_place_is_refused(
    tmp_path: Path, key: Path
) -> None:
    """`/var/run` is a link to `../run`, where the agent's git dir lies: a program named
    through it could be swapped after the check (the link it ends in), whatever it leads to
    when judged (here an allowed one)."""
    repo = make_repo(tmp_path / "repo", policy=LOADER_POLICY)
    true = os.path.realpath(shutil.which("true") or "/bin/true")
    command = (f"ln -s {true} /var/run/gatekeeper-git/L && {_loader()} /var/run/gatekeeper-git/L;"
               " echo $? > rc.txt")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", command)
    assert proc.returncode == 0, proc.stderr
    pred = predicate(repo, data["commit"])
    refused = [p for p in pred["processes"]
               if p["decision"] == "deny" and "dynamic loader" in (p["rule"] or "")]  # fmt: skip
    assert refused, pred["processes"]


def test_a_shebang_split_by_a_tab_is_read_as_the_kernel_reads_it(tmp_path: Path, key: Path) -> None:
    """The kernel splits a `#!` line at a space or a tab: an allowed interpreter so named
    runs, a refused one is refused by its rule."""
    repo = make_repo(tmp_path / "repo", policy=LOADER_POLICY)
    echo = os.path.realpath(shutil.which("echo") or "/bin/echo")
    uname = os.path.realpath(shutil.which("uname") or "/bin/uname")
    command = (f"printf '#!{echo}\\tHELLO\\n' > ok && chmod +x ok && ./ok > ran.txt; "
               f"printf '#!{uname}\\t-a\\n' > no && chmod +x no && ./no >> ran.txt; true")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", command)
    assert proc.returncode == 0, proc.stderr
    ran = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:ran.txt"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert ran == "HELLO ./ok\n", ran
    pred = predicate(repo, data["commit"])
    assert any(p["decision"] == "deny" and p["rule"] == "uname" for p in pred["processes"]), pred
