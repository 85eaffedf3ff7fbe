"""Attacks from outside on the supervisor's fast path, the proxy's hand-over and `run` itself.

Each test is an attack as an agent would make it, through the real command line, bubblewrap
and supervisor; it fails on code that has the hole.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import git, gk, make_repo, needs_bwrap
from helpers import ARGV_FLIPPER, run_json
from unprivileged import AsUser, make_user

pytestmark = [needs_bwrap, pytest.mark.sandbox]


def predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


# A program the agent runs: forks, and in the child execs a copy of `touch` named `git`
# with argv ['git', WORD, *PAD] while a thread flips WORD between `status` and `push` (the
# supervisor reads argv, then the kernel reads it again). `git push` is denied; what runs
# must be checked again before it can do anything (touch creating its file `push`).
FLIP = """
import ctypes, os, shutil, sys, threading
os.makedirs('/tmp/w', exist_ok=True); os.chdir('/tmp/w')
shutil.copy('/usr/bin/touch', '/tmp/git')
libc = ctypes.CDLL(None, use_errno=True)
word = ctypes.create_string_buffer(b'status', 8)
pad = [b'./' * (PADLEN // 2) + b'.'] * PADS  # touch only touches the folder
def flip():
    while True:
        ctypes.memmove(word, b'push\\0\\0\\0', 7); ctypes.memmove(word, b'status\\0', 7)
def spin():
    # A watched call (a write-open in scratch space) over and over, from another thread.
    while True:
        os.close(os.open('/tmp/w/spin', os.O_WRONLY | os.O_CREAT, 0o644))
for i in range(TRIES):
    pid = os.fork()
    if pid == 0:
        threading.Thread(target=flip, daemon=True).start()
        if SPIN:
            threading.Thread(target=spin, daemon=True).start()
        argv = (ctypes.c_char_p * (3 + len(pad)))(
            b'git', ctypes.cast(word, ctypes.c_char_p), *pad, None)
        libc.execv(b'/tmp/git', argv)
        os._exit(3)
    os.waitpid(pid, 0)
    if os.path.exists('/tmp/w/push'):
        break
print('pushed' if os.path.exists('/tmp/w/push') else 'not pushed', i)
"""


def _flip(tries: int, spin: bool, pads: int = 0, padlen: int = 2) -> str:
    return (
        FLIP.replace("TRIES", str(tries))
        .replace("SPIN", str(spin))
        .replace("PADS", str(pads))
        .replace("PADLEN", str(padlen))
    )


@pytest.fixture
def gitrepo(tmp_path: Path, key: Path) -> Path:
    return make_repo(tmp_path / "repo", policy="commands: {deny: ['git push'], default: allow}\n",
                     files={"a.txt": "a\n"})  # fmt: skip


def _assert_not_pushed(repo: Path, proc, data) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not pushed" in proc.stderr, proc.stderr[-3000:]
    pred = predicate(repo, data["commit"])
    ran = [p for p in pred["processes"] if p["argv"][:2] == ["git", "push"]]
    assert all(p["decision"] == "deny" for p in ran), ran


def test_a_watched_call_from_another_thread_during_the_exec_does_not_use_up_its_check(
    gitrepo: Path,
) -> None:
    # A third thread makes watched calls without pause. The supervisor answers the exec, then
    # (before the kernel has replaced the program) that thread's call: the process still
    # runs the old program, which must not be taken for "the exec failed" and the check of
    # what the exec runs dropped.
    proc, data = run_json(gitrepo, "python3", "-c", _flip(150, spin=True), timeout=600)
    _assert_not_pushed(gitrepo, proc, data)


def test_an_argv_too_long_to_recheck_is_not_waved_through(gitrepo: Path) -> None:
    # Over a MiB of arguments (each under a page, fewer than the count the supervisor reads):
    # the argv judged at the exec is readable, but the one the kernel copied is too long for
    # the check at the first watched call, which must not then take it as unchanged.
    proc, data = run_json(gitrepo, "python3", "-c", _flip(30, spin=False, pads=2700,
                                                          padlen=400), timeout=600)  # fmt: skip
    _assert_not_pushed(gitrepo, proc, data)


# The same race on the program's path: the supervisor judges `/tmp/okk` (a copy of true), the
# kernel opens `/tmp/git`, a shell script: the check at the first watched call sees the shell
# running it, and must judge the script it runs, as the exec would have been.
FLIP_SCRIPT = """
import ctypes, os, shutil, threading
os.makedirs('/tmp/w', exist_ok=True); os.chdir('/tmp/w')
shutil.copy('/bin/true', '/tmp/okk')
with open('/tmp/git', 'w') as fh:
    fh.write('#!/bin/sh\\ntouch "/tmp/w/$1"\\n')
os.chmod('/tmp/git', 0o755)
libc = ctypes.CDLL(None, use_errno=True)
path = ctypes.create_string_buffer(b'/tmp/okk', 9)
def flip():
    while True:
        ctypes.memmove(path, b'/tmp/git', 8); ctypes.memmove(path, b'/tmp/okk', 8)
for i in range(300):
    pid = os.fork()
    if pid == 0:
        threading.Thread(target=flip, daemon=True).start()
        argv = (ctypes.c_char_p * 3)(b'x', b'push', None)
        libc.execv(ctypes.cast(path, ctypes.c_char_p), argv)
        os._exit(3)
    os.waitpid(pid, 0)
    if os.path.exists('/tmp/w/push'):
        break
print('pushed' if os.path.exists('/tmp/w/push') else 'not pushed', i)
"""


def test_a_script_swapped_in_for_the_judged_program_is_judged_by_its_name(gitrepo: Path) -> None:
    proc, data = run_json(gitrepo, "python3", "-c", FLIP_SCRIPT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not pushed" in proc.stderr, proc.stderr[-3000:]
    pred = predicate(gitrepo, data["commit"])
    killed = [
        p
        for p in pred["processes"]
        if p["decision"] == "deny" and "differs from what was judged" in (p["rule"] or "")
    ]
    assert all(p["argv"][1:3] == ["/tmp/git", "push"] for p in killed), killed


# A thread other than the leader execs (argv flipping as above) while the leader ends the
# process with exit_group: if the exec is past its point of no return, that ends the leader
# thread only, and the exec goes on as the process. Its check must still come.
FLIP_THREAD = (
    ARGV_FLIPPER
    + """def run():
    argv = (ctypes.c_char_p * 3)(b'git', ctypes.cast(word, ctypes.c_char_p), None)
    libc.execv(b'/tmp/git', argv)
for i in range(400):
    pid = os.fork()
    if pid == 0:
        threading.Thread(target=flip, daemon=True).start()
        threading.Thread(target=run, daemon=True).start()
        time.sleep(0.0001 * (i % 20))
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.01)
    if os.path.exists('/tmp/w/push'):
        break
print('pushed' if os.path.exists('/tmp/w/push') else 'not pushed', i)
"""
)


def test_an_exit_of_the_leader_while_another_thread_execs_does_not_end_the_check(
    gitrepo: Path,
) -> None:
    proc, data = run_json(gitrepo, "python3", "-c", FLIP_THREAD, timeout=600)
    _assert_not_pushed(gitrepo, proc, data)


# --- the proxy's hand-over channel ----------------------------------------------------------

# The agent opens a hand-over channel of its own on the launcher's proxy socket (reachable
# inside the sandbox: the bridge connects to it), hands over a TCP connection of its own, and
# closes the channel seconds before it exits. The real bridge lives on, and the proxy keeps
# answering on 127.0.0.1:3128.
FAKE_CHANNEL = """
import socket, time, urllib.request
listener = socket.socket(); listener.bind(('127.0.0.1', 0)); listener.listen(4)
mine = socket.create_connection(listener.getsockname()); other, _ = listener.accept()
unix = socket.socket(socket.AF_UNIX); unix.connect('/run/gatekeeper/proxy.sock')
socket.send_fds(unix, [b'\\x00'], [mine.fileno()])
time.sleep(0.3); unix.close(); mine.close(); other.close()
time.sleep(3)
proxy = socket.create_connection(('127.0.0.1', 3128), timeout=10)
proxy.sendall(b'GET http://127.0.0.1:9/ HTTP/1.1\\r\\nHost: 127.0.0.1:9\\r\\n\\r\\n')
print('proxy answers', proxy.recv(12))
"""


def test_a_channel_the_agent_opens_and_closes_is_not_taken_for_the_bridge_lost(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo", files={"a.txt": "a\n"})
    proc, data = run_json(repo, "python3", "-c", FAKE_CHANNEL, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "proxy answers b'HTTP/1.1 " in proc.stderr, proc.stderr[-3000:]  # the bridge works
    assert data["launcher_errors"] == [], data["launcher_errors"]
    runs = gk("runs", "--repo", str(repo), "--json")
    states = {r["run_id"]: r["state"] for r in json.loads(runs.stdout)}
    assert states[data["run_id"]] == "finished", runs.stdout


# --- the same attacks by an unprivileged user ------------------------------------------------


@pytest.fixture
def user() -> Iterator[AsUser]:
    yield from make_user("commands: {deny: ['git push'], default: allow}\n")


@pytest.mark.root
@pytest.mark.parametrize("attack", ["spin", "script"])
def test_the_exec_races_hold_for_an_unprivileged_user(user: AsUser, attack: str) -> None:
    program = _flip(150, spin=True) if attack == "spin" else FLIP_SCRIPT
    proc = user.gk("run", "--repo", str(user.repo), "--json", "--", "python3", "-c", program)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "not pushed" in proc.stderr, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    note = user.git("notes", "--ref=refs/notes/gatekeeper", "show", data["commit"])
    envelope = json.loads(note.strip().splitlines()[-1])
    pred = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    if attack == "spin":  # `git push` never ran
        ran = [p for p in pred["processes"]
               if p["decision"] == "allow" and p["argv"][:2] == ["git", "push"]]  # fmt: skip
    else:  # the script never ran as judged
        ran = [p for p in pred["processes"]
               if p["decision"] == "allow" and p["exe"] == "/tmp/git"]  # fmt: skip
    assert ran == [], ran


# --- execs through a descriptor ---------------------------------------------------------------

# `curl` is denied. A copy of echo named curl is run through a descriptor: by /proc/self/fd/N,
# by the process's own pid (/proc/PID/fd/N, PID as the sandbox numbers it), by /dev/fd/N, and
# with execveat(fd, "", AT_EMPTY_PATH) (fexecve); a memfd copy has no file on disk. Each is
# refused at the exec, before the program prints a word (echo makes no watched call before
# exit_group, so a check at its first watched call comes too late).
FD_EXEC = """
import ctypes, os, shutil, sys
os.makedirs('/tmp/x', exist_ok=True)
shutil.copy('/bin/echo', '/tmp/x/curl')
fd = os.open('/tmp/x/curl', os.O_RDONLY)
os.set_inheritable(fd, True)
how = sys.argv[1]
if how == 'memfd':
    mem = os.memfd_create('curl', 0)
    os.write(mem, open('/tmp/x/curl', 'rb').read())
    fd = mem
if how in ('fexecve', 'memfd'):
    libc = ctypes.CDLL(None, use_errno=True)
    argv = (ctypes.c_char_p * 3)(b'ok', b'RAN-' + how.encode(), None)
    envp = (ctypes.c_char_p * 1)(None)
    libc.fexecve(fd, argv, envp)
    print('refused', how, ctypes.get_errno())
    sys.exit(0)
path = {'self': f'/proc/self/fd/{fd}', 'pid': f'/proc/{os.getpid()}/fd/{fd}',
        'thread': f'/proc/thread-self/fd/{fd}', 'devfd': f'/dev/fd/{fd}'}[how]
try:
    os.execv(path, ['ok', 'RAN-' + how])
except OSError as exc:
    print('refused', how, exc.errno)
"""


@pytest.mark.parametrize("how", ["self", "pid", "thread", "devfd", "fexecve", "memfd"])
def test_a_denied_program_run_through_a_descriptor_is_refused_at_the_exec(
    tmp_path: Path, key: Path, how: str
) -> None:
    repo = make_repo(tmp_path / "repo", policy="commands: {deny: [curl], default: allow}\n",
                     files={"a.txt": "a\n"})  # fmt: skip
    proc, data = run_json(repo, "python3", "-c", FD_EXEC, how)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"RAN-{how}" not in proc.stderr, proc.stderr[-3000:]
    assert f"refused {how}" in proc.stderr, proc.stderr[-3000:]
    pred = predicate(repo, data["commit"])
    tried = [p for p in pred["processes"] if p["argv"] == ["ok", f"RAN-{how}"]]
    assert tried and all(p["decision"] == "deny" for p in tried), tried


# --- many threads -----------------------------------------------------------------------------

# Thread after thread makes one watched call (a write-open in scratch space) and ends: the
# supervisor must not keep something per thread it never sees end (it ran out of descriptors,
# and from then on refused every write and exec as unreadable). The launcher gets a limit of
# 1024 descriptors so that a few thousand threads show it.
THREADS = """
import os, subprocess, threading
def one():
    os.close(os.open('/tmp/f', os.O_WRONLY | os.O_CREAT, 0o644))
for i in range(3000):
    t = threading.Thread(target=one); t.start(); t.join()
with open('a.txt', 'w') as fh:
    fh.write('changed\\n')
print('echo:', subprocess.run(['echo', 'still-runs'], capture_output=True, text=True).stdout)
"""


def test_thousands_of_threads_with_a_watched_call_each_do_not_wear_out_the_supervisor(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo", files={"a.txt": "a\n"})
    launcher = [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json", "--",
                "python3", "-c", THREADS]  # fmt: skip
    proc = subprocess.run(["sh", "-c", 'ulimit -n 1024 && exec "$@"', "sh", *launcher],
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "echo: still-runs" in proc.stderr, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["denied_writes"] == [], data["denied_writes"]
    assert [c["path"] for c in data["changes"]] == ["a.txt"], data["changes"]


# --- very long argv in the record --------------------------------------------------------------

# Execs with over a MiB of arguments each: the record keeps what decides and how much was
# left out, not megabytes per exec (events on the host's disk, a receipt in the launcher's
# memory, a note over the size the gate reads).
LONG_ARGV = """
import subprocess
for i in range(20):
    subprocess.run(['/bin/true', 'long'] + ['y' * 400] * 3000, check=True)
try:
    subprocess.run(['rm', '-rf', 'x'] + ['z' * 400] * 3000)
except PermissionError:
    print('done')
"""


def test_execs_with_megabytes_of_arguments_keep_the_record_small(tmp_path: Path,
                                                                key: Path) -> None:  # fmt: skip
    repo = make_repo(tmp_path / "repo", policy="commands: {deny: ['rm -rf'], default: allow}\n",
                     files={"a.txt": "a\n"})  # fmt: skip
    proc, data = run_json(repo, "python3", "-c", LONG_ARGV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done" in proc.stderr
    note = git(repo, "notes", "--ref=refs/notes/gatekeeper", "show", data["commit"])
    assert len(note) < 4 << 20, len(note)
    pred = predicate(repo, data["commit"])
    long = [p for p in pred["processes"] if p["argv"][:2] == ["/bin/true", "long"]]
    assert len(long) == 20 and all(p["decision"] == "allow" for p in long), len(long)
    assert long[0]["argv"][-1].endswith("more arguments not recorded)"), long[0]["argv"][-1]
    refused = [p for p in pred["processes"] if p["argv"][:3] == ["rm", "-rf", "x"]]
    assert refused and all(p["decision"] == "deny" for p in refused), refused
    escalation = [e for e in pred["escalations"] if e["kind"] == "command"]
    assert escalation and all(len(e["value"]) < 70_000 for e in escalation), escalation
