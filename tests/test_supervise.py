"""The syscall supervisor: every exec, exit and write attempt of the whole tree, policed."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gatekeeper.sandbox.supervise.procmem import parent_pid
from gatekeeper.sandbox.supervise.rules import CommandRules

from conftest import git, gk, make_repo, needs_bwrap
from helpers import ARGV_FLIPPER, pids_with, run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

POLICY = """\
paths: {read: ['**'], write: ['src/**', 'docs/**']}
commands:
  deny: ["rm -rf", "git push"]
  ask: ["pnpm install"]
  default: allow
"""


@pytest.fixture
def repo(tmp_path: Path, key: Path) -> Path:
    return make_repo(tmp_path / "repo", policy=POLICY,
                     files={"src/app.py": "x\n", "README.md": "r\n", "victim": "v\n"})  # fmt: skip


def predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


def processes(pred: dict, argv_prefix: list[str]) -> list[dict]:  # type: ignore[type-arg]
    return [p for p in pred["processes"] if p["argv"][: len(argv_prefix)] == argv_prefix]


@pytest.mark.parametrize(
    "how, argv",
    [
        ("rm -rf victim", ["rm", "-rf", "victim"]),
        ("/bin/rm -rf victim", ["/bin/rm", "-rf", "victim"]),
        ("sh -c 'rm -rf victim'", ["rm", "-rf", "victim"]),
        ("env rm -rf victim", ["rm", "-rf", "victim"]),
        ("echo victim | xargs rm -rf", ["rm", "-rf", "victim"]),
        ("python3 -c \"import os; os.execv('/bin/rm', ['rm', '-rf', 'victim'])\"",
         ["rm", "-rf", "victim"]),
        ("sh -c 'sh -c \"rm -rf victim\"'", ["rm", "-rf", "victim"]),
        ("sh -c '(setsid sh -c \"rm -rf victim\" &) ; sleep 0.5'", ["rm", "-rf", "victim"]),
        ("git push origin main", ["git", "push", "origin", "main"]),
        ("sh -c 'exec git push'", ["git", "push"]),
    ],
)  # fmt: skip
def test_denied_commands_are_refused_however_they_are_started(repo: Path, how: str,
                                                              argv: list[str]) -> None:  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", f"{how}; echo after=$?")
    assert proc.returncode == 0, proc.stderr
    assert "Permission denied" in proc.stderr
    pred = predicate(repo, data["commit"])
    denied = [p for p in pred["processes"] if p["decision"] == "deny"]
    assert denied, pred["processes"]
    assert any(p["argv"] == argv for p in denied), [p["argv"] for p in denied]
    by_pid = {p["pid"]: p for p in pred["processes"] if p["decision"] == "allow"}
    for p in denied:
        # The parent is a process the supervisor saw start (or the same pid, for env/exec).
        assert p["ppid"] in by_pid or p["pid"] in by_pid, p
    assert git(repo, "show", f"{data['commit']}:victim") == "v\n"
    assert (Path(data["worktree"]) / "victim").exists()


def test_allowed_commands_are_recorded_with_exit_codes(repo: Path) -> None:
    proc, data = run_json(
        repo, "sh", "-c", "/bin/true; /bin/false; sh -c 'exit 5'; sh -c 'kill -9 $$'; exit 0"
    )
    assert proc.returncode == 0
    pred = predicate(repo, data["commit"])
    assert processes(pred, ["/bin/true"])[0]["exit_code"] == 0
    assert processes(pred, ["/bin/false"])[0]["exit_code"] == 1
    assert processes(pred, ["sh", "-c", "exit 5"])[0]["exit_code"] == 5
    killed = processes(pred, ["sh", "-c", "kill -9 $$"])[0]
    assert killed["killed"] is True and killed["exit_code"] is None
    top = processes(pred, ["sh", "-c"])[0]
    assert top["exit_code"] == 0 and top["cwd"] == data["worktree"]
    assert pred["counts"]["commands_run"] >= 5
    assert pred["counts"]["failed_commands"] >= 3


def test_long_command_lines_are_judged_and_recorded_as_they_run(repo: Path) -> None:
    """Thousands of arguments (what xargs or a glob passes) and one argument of 100 KiB (a
    script given to `sh -c`): read whole, each is judged by its words (a deny rule naming the
    program refuses only what it names) and recorded, never refused as unreadable."""
    script = f"echo {'y' * 100_000} | wc -c"
    names = "$(seq -f src/f%g 5000)"
    proc, data = run_json(repo, "sh", "-c",
                          f"touch {names} && rm {names} && echo removed; sh -c \"$0\"; "
                          "git push $(seq 5000) 2>/dev/null; echo pushed $?", script)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "removed\n100001\npushed 126\n" in proc.stderr, proc.stderr[-2000:]
    pred = predicate(repo, data["commit"])
    removes = processes(pred, ["rm", "src/f1", "src/f2"])
    assert len(removes) == 1 and removes[0]["decision"] == "allow", removes
    assert removes[0]["exit_code"] == 0
    # Recorded as far as the record takes one command line, with a note of what is left out.
    run = [p for p in processes(pred, ["sh", "-c"]) if p["argv"][2].startswith("echo yyy")]
    assert len(run) == 1 and run[0]["decision"] == "allow" and run[0]["exit_code"] == 0, run
    assert "more characters" in run[0]["argv"][-1] and not run[0].get("unreadable"), run
    pushes = processes(pred, ["git", "push", "1"])  # (each folder of the PATH search)
    assert pushes and all(p["decision"] == "deny" for p in pushes), pushes


@pytest.mark.parametrize(
    "attack, op, path",
    [
        ("echo x > README.md", "truncate", "README.md"),
        ("mv src/app.py moved.py", "rename", "moved.py"),
        ("ln src/app.py hard", "link", "hard"),
        ("ln -s /etc/passwd src/link && echo x > src/link", "truncate", "/etc/passwd"),
        ("ln -s ../README.md src/up && echo x > src/up", "truncate", "README.md"),
        ("mkdir newdir", "mkdir", "newdir"),
        ("python3 -c \"import os; os.truncate('README.md', 0)\"", "truncate", "README.md"),
        ("truncate -s 0 README.md", "write", "README.md"),
        ("rm README.md", "unlink", "README.md"),
        ("chmod 777 README.md", "chmod", "README.md"),
        ("echo x > ../escape", "create", None),
        ("echo x > /etc/new-file", "create", "/etc/new-file"),
        ("echo x > .git", "truncate", ".git"),
        ("sh -c 'sh -c \"echo x > README.md\"'", "truncate", "README.md"),
    ],
)  # fmt: skip
def test_writes_outside_the_write_set_are_denied_and_recorded(repo: Path, attack: str, op: str,
                                                             path: str | None) -> None:  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", f"{attack}; exit 0")
    pred = predicate(repo, data["commit"])
    denied = [w for w in pred["writes"] if w["decision"] == "deny" and w["source"] == "syscall"]
    assert denied, (pred["writes"], proc.stderr)
    if path is not None:
        assert any(w["path"] == path and w["op"] == op for w in denied), denied
    assert pred["counts"]["denied_writes"] >= 1
    assert git(repo, "show", f"{data['commit']}:README.md") == "r\n"
    assert (Path(data["worktree"]) / "README.md").read_text() == "r\n"


def test_a_write_under_a_top_folder_the_sandbox_has_not_is_not_a_refusal(repo: Path) -> None:
    """Under a top folder the sandbox has not got at all (/sys), a write or a creation fails
    with ENOENT whatever the policy: nothing is refused, so nothing is recorded (a tracer's
    probe of /sys/kernel/debug/tracing/trace_marker, at every start of some agent CLIs, read
    as a refused write and a pending escalation). Anywhere else a write outside the write set
    is refused and recorded, there or not, by the agent, a child and a grandchild."""
    probes = (
        "echo x > /sys/kernel/debug/tracing/trace_marker; echo x > /nonexistent-dir/f; "
        "python3 -c \"open('/etc/not-there', 'r+')\"; "
        "sh -c 'sh -c \"echo x > /sys/kernel/tracing/trace_marker; echo y > /etc/new-file\"'; "
        "exit 0"
    )
    proc, data = run_json(repo, "sh", "-c", probes)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(": Directory nonexistent") == 3, proc.stderr
    assert "Permission denied: '/etc/not-there'" in proc.stderr, proc.stderr
    assert "cannot create /etc/new-file: Permission denied" in proc.stderr, proc.stderr
    pred = predicate(repo, data["commit"])
    denied = sorted((w["path"], w["op"]) for w in pred["writes"] if w["decision"] == "deny")
    assert denied == [("/etc/new-file", "create"), ("/etc/not-there", "write")], denied
    pending = sorted(e["value"] for e in pred["escalations"] if e["kind"] == "write")
    assert pending == ["/etc/new-file", "/etc/not-there"], pred["escalations"]


@pytest.mark.parametrize(
    "path",
    [
        "/proc/self/root/tmp/l/../.gitmodules",
        "/proc/../tmp/l/../.gitmodules",
        "/proc/self/cwd/" + "../" * 30 + "tmp/l/../.gitmodules",  # (as far up as / goes)
        "/dev/../tmp/l/../.gitmodules",
    ],
)
def test_a_dotdot_after_a_link_through_proc_is_followed_as_the_kernel_does(
    repo: Path, path: str
) -> None:
    """`..` after a symlink leaves the link's target, not the name before it: a write to
    /proc/self/root/tmp/l/../.gitmodules, with /tmp/l a link into the worktree, is a write to
    the worktree's .gitmodules (protected: refused and recorded), never one to /tmp."""
    script = (
        'ln -s "$PWD/src" /tmp/l && '
        f"python3 -c \"import os; os.open('{path}', os.O_WRONLY | os.O_CREAT, 0o644)\"; exit 0"
    )
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "PermissionError" in proc.stderr, proc.stderr
    assert not (Path(data["worktree"]) / ".gitmodules").exists()
    pred = predicate(repo, data["commit"])
    denied = [(w["path"], w["op"]) for w in pred["writes"] if w["decision"] == "deny"]
    assert (".gitmodules", "create") in denied, pred["writes"]


def test_a_link_the_agent_makes_in_dev_is_followed(repo: Path) -> None:
    """/dev is the sandbox's own tmpfs: a link made there into the worktree (or the user's
    checkout) is followed as the kernel follows it, so a write through it is judged and
    recorded as a write to its target, never let through as one to /dev."""
    script = (
        'ln -s "$PWD" /dev/x && echo y > /dev/x/src/through.py && mkdir /dev/x/src/d; '
        "echo z > /dev/x/README.md; rm /dev/x/src/app.py; exit 0"
    )
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "cannot create /dev/x/README.md: Permission denied" in proc.stderr, proc.stderr
    pred = predicate(repo, data["commit"])
    syscalls = {(w["path"], w["op"], w["decision"]) for w in pred["writes"]
                if w["source"] == "syscall"}  # fmt: skip
    assert {("src/through.py", "create", "allow"), ("src/d", "mkdir", "allow"),
            ("README.md", "truncate", "deny"), ("src/app.py", "unlink", "allow")} <= syscalls, (
        syscalls)  # fmt: skip


@pytest.mark.parametrize(
    "script, record",
    [
        ('rm /dev/fd && ln -s "$PWD/src" /dev/fd && echo y > /dev/fd/4',
         ("src/4", "create", "allow")),
        ('mkdir /tmp/y /tmp/fd && ln -s /tmp/y /dev/x && ln -s "$PWD/README.md" /tmp/fd/9 && '
         "echo y > /dev/x/../fd/9", ("README.md", "truncate", "deny")),
        ('ln -s "$PWD/src/out.py" /tmp/stdout && mkdir /tmp/z && ln -s /tmp/z /dev/z && '
         "echo y > /dev/z/../stdout", ("src/out.py", "create", "allow")),
        ("python3 -c \"open('/proc/thread-self/../../../self/cwd/README.md', 'a')\"",
         ("another process's /proc links", "create", "deny")),
    ],
)  # fmt: skip
def test_dev_fd_and_dev_stdout_are_links_the_agent_may_replace(
    repo: Path, script: str, record: tuple[str, str, str]
) -> None:
    """/dev/fd, /dev/stdout and the rest are links in the sandbox's own /dev: replaced, or
    reached through `..` after another link, they lead where the kernel follows them, and a
    write there is judged and recorded as such; a `..` inside /proc/self is refused."""
    proc, data = run_json(repo, "sh", "-c", f"{script}; exit 0")
    assert proc.returncode == 0, proc.stderr
    pred = predicate(repo, data["commit"])
    syscalls = {(w["path"], w["op"], w["decision"]) for w in pred["writes"]
                if w["source"] == "syscall"}  # fmt: skip
    assert record in syscalls, (syscalls, proc.stderr)


def test_proc_self_is_the_process_for_a_thread_that_unshared_its_cwd(repo: Path) -> None:
    """/proc/self/cwd is the process's working folder (its first thread's), which a thread
    that unshared its fs (CLONE_FS) and moved elsewhere no longer shares: a write through it
    is judged at the process's folder, as the kernel writes it, not at the thread's."""
    script = """
import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
def thread():
    assert libc.unshare(0x200) == 0  # CLONE_FS
    os.chdir("/tmp")
    with open("/proc/self/cwd/src/from_thread.py", "w") as fh:
        fh.write("x")
    try:
        open("/proc/self/cwd/README.md", "w")
    except PermissionError:
        print("refused")
    with open("/proc/thread-self/cwd/in_tmp.txt", "w") as fh:
        fh.write("scratch")
t = threading.Thread(target=thread)
t.start()
t.join()
"""
    proc, data = run_json(repo, "python3", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "refused" in proc.stderr or "refused" in proc.stdout, (proc.stdout, proc.stderr)
    pred = predicate(repo, data["commit"])
    syscalls = {(w["path"], w["op"], w["decision"]) for w in pred["writes"]
                if w["source"] == "syscall"}  # fmt: skip
    assert ("src/from_thread.py", "create", "allow") in syscalls, syscalls
    assert ("README.md", "truncate", "deny") in syscalls, syscalls
    assert not any("in_tmp" in w[0] for w in syscalls), syscalls  # /tmp: scratch


BIND = """\
import socket, sys
for name in sys.argv[1:]:
    family = socket.AF_INET if name == "tcp" else socket.AF_UNIX
    sock = socket.socket(family)
    try:
        sock.bind(("127.0.0.1", 0) if name == "tcp" else name.replace("@", "\\0"))
        print("bound", name, file=sys.stderr)
    except OSError as exc:
        print("refused", name, exc.errno, file=sys.stderr)
"""


def test_a_unix_socket_bound_to_a_name_is_a_write_judged_and_recorded(
    tmp_path: Path, key: Path
) -> None:
    """bind() of a Unix socket makes a file of its name: outside the write set it is refused
    and recorded, for the agent, a child and a grandchild, like any other write; inside it
    is allowed and recorded, in scratch space allowed. Abstract names and other families
    make no file and are left alone."""
    repo = make_repo(tmp_path / "repo", policy=POLICY,
                     files={"src/app.py": "x\n", "README.md": "r\n", "bind.py": BIND})  # fmt: skip
    script = (
        "python3 bind.py top.sock src/ok.sock /tmp/scratch.sock @abstract tcp && "
        "sh -c 'python3 bind.py child.sock && sh -c \"python3 bind.py /etc/gc.sock\"'"
    )
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith(("bound", "refused"))]
    assert said == [f"refused top.sock {errno.EACCES}", "bound src/ok.sock",
                    "bound /tmp/scratch.sock", "bound @abstract", "bound tcp",
                    f"refused child.sock {errno.EACCES}",
                    f"refused /etc/gc.sock {errno.EACCES}"], proc.stderr  # fmt: skip
    pred = predicate(repo, data["commit"])
    binds = [(w["path"], w["decision"], w["pid"]) for w in pred["writes"] if w["op"] == "bind"]
    assert [(path, decision) for path, decision, _ in binds] == [
        ("top.sock", "deny"), ("src/ok.sock", "allow"), ("child.sock", "deny"),
        ("/etc/gc.sock", "deny"),
    ], pred["writes"]  # fmt: skip
    assert len({pid for _, _, pid in binds[1:]}) == 3  # three processes
    assert pred["counts"]["denied_writes"] == 3
    pending = sorted(e["value"] for e in pred["escalations"] if e["kind"] == "write")
    assert pending == ["/etc/gc.sock", "child.sock", "top.sock"], pred["escalations"]
    assert not (Path(data["worktree"]) / "top.sock").exists()


UNREADABLE_ADDRESSES = """\
import ctypes, mmap, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
page = mmap.PAGESIZE
both = mmap.mmap(-1, 2 * page)  # a readable page, then a write-only one
base = ctypes.addressof(ctypes.c_char.from_buffer(both))
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert libc.mprotect(base + page, page, mmap.PROT_WRITE) == 0


def put(offset, data):
    both[offset : offset + len(data)] = data
    return ctypes.c_void_p(base + offset)


def said(what, result):
    print(what, "ok" if result == 0 else ctypes.get_errno(), file=sys.stderr)


unix = struct.pack("=H", socket.AF_UNIX)
for what, offset, name in (("bind", page, b"src/wo.sock"), ("bind split", page - 4, b"src/sp.sock")):
    address = unix + name + b"\\0"
    said(what, libc.bind(socket.socket(socket.AF_UNIX).fileno(), put(offset, address), len(address)))
inet = struct.pack("=H", socket.AF_INET) + struct.pack("!H", 443) + socket.inet_aton("192.0.2.7")
inet += bytes(8)
said("connect", libc.connect(socket.socket().fileno(), put(page + 512, inet), len(inet)))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM).fileno()
said("sendto", libc.sendto(udp, b"x", 1, 0, put(page + 512, inet), len(inet)))
"""


def test_a_socket_address_the_supervisor_cannot_read_is_refused_and_recorded(
    tmp_path: Path, key: Path
) -> None:
    """An address in a write-only page (which the kernel reads and process_vm_readv does
    not), or one that runs on into such a page, is judged as unreadable: a bind is a refused
    write of an unreadable path, a connect or a datagram a refused attempt at an unreadable
    address; none goes through unseen, for a child as for the agent."""
    repo = make_repo(tmp_path / "repo", policy=POLICY,
                     files={"src/app.py": "x\n", "wo.py": UNREADABLE_ADDRESSES})  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", "sh -c 'python3 wo.py'")
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.split()[0] in
            ("bind", "connect", "sendto")]  # fmt: skip
    assert said == [f"bind {errno.EACCES}", f"bind split {errno.EACCES}",
                    f"connect {errno.EACCES}", f"sendto {errno.EACCES}"], proc.stderr  # fmt: skip
    pred = predicate(repo, data["commit"])
    binds = [w for w in pred["writes"] if w["op"] == "bind"]
    assert [(w["path"], w["decision"], w.get("count")) for w in binds] == [
        ("(unreadable path)", "deny", 2)
    ], binds
    attempts = [(r["host"], r["method"], r["decision"]) for r in pred["network"]]
    assert attempts == [("(unreadable address)", None, "deny"),
                        ("(unreadable address)", "sendto", "deny")], pred["network"]  # fmt: skip
    assert not (Path(data["worktree"]) / "src" / "wo.sock").exists()
    assert not (Path(data["worktree"]) / "src" / "sp.sock").exists()


def test_writes_inside_the_write_set_are_recorded_as_allowed(repo: Path) -> None:
    proc, data = run_json(repo, "sh", "-c", "echo y > src/new.py && mkdir docs/sub && "
                          "mv src/new.py docs/new.py && ln -s new.py docs/link")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pred = predicate(repo, data["commit"])
    allowed = {(w["op"], w["path"]) for w in pred["writes"] if w["source"] == "syscall"}
    assert {("create", "src/new.py"), ("mkdir", "docs/sub"), ("rename", "docs/new.py"),
            ("symlink", "docs/link")} <= allowed  # fmt: skip
    assert all(w["decision"] == "allow" for w in pred["writes"])


def test_git_inside_the_sandbox_commits_to_the_agent_branch(repo: Path) -> None:
    hook = f"{repo}/.git/hooks/post-commit"
    script = (
        "echo change > src/app.py && git add src/app.py && git commit -qm 'agent work' && "
        "git log --oneline -2 && git branch feature && git status --short && "
        f"(echo 'touch /tmp/hook-ran-{os.getpid()}' > {hook}; "
        f"git config --file {repo}/.git/config core.hooksPath /tmp; "
        f"echo x > {repo}/.git/refs/heads/main; true) 2>&1; "
        "mkdir -p $(git rev-parse --git-dir)/hooks && printf '#!/bin/sh\\ntouch /tmp/hook' > "
        "$(git rev-parse --git-dir)/hooks/post-commit; chmod +x $(git rev-parse --git-dir)/hooks/*;"
        " echo more > src/more.py"
    )
    before = {p: (repo / ".git" / p).read_bytes() for p in ("config", "HEAD", "refs/heads/main")}
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "agent work" in proc.stderr
    assert not Path(hook).exists()
    assert {p: (repo / ".git" / p).read_bytes() for p in before} == before
    assert len(data["agent_commits"]) == 1
    agent_commit = data["agent_commits"][0]
    assert git(repo, "log", "--format=%s", "-1", agent_commit).strip() == "agent work"
    assert git(repo, "rev-parse", f"{data['commit']}^").strip() == agent_commit
    assert git(repo, "show", f"{data['commit']}:src/app.py") == "change\n"
    assert git(repo, "show", f"{data['commit']}:src/more.py") == "more\n"
    assert not Path(f"/tmp/hook-ran-{os.getpid()}").exists()
    assert git(repo, "config", "--get", "core.hooksPath", check=False).strip() == ""
    assert predicate(repo, data["commit"])["agent_commits"] == [agent_commit]


def test_agent_commits_outside_the_policy_are_not_imported(repo: Path) -> None:
    script = ("blob=$(echo evil | git hash-object -w --stdin) && "
              "git update-index --add --cacheinfo 100644,$blob,README.md && "
              "git commit -qm sneaky && git log --oneline -1")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits"] == []
    assert git(repo, "show", f"{data['commit']}:README.md") == "r\n"
    assert "README.md" in data["denied_writes"]


def test_ask_without_a_terminal_is_a_pending_escalation_and_grant_approves(repo: Path) -> None:
    bin_dir = "mkdir -p /tmp/b && printf '#!/bin/sh\\necho pnpm-ran\\n' > /tmp/b/pnpm && chmod +x /tmp/b/pnpm"
    proc, data = run_json(repo, "sh", "-c", f"{bin_dir}; /tmp/b/pnpm install; echo rc=$?")
    assert "pnpm-ran" not in proc.stderr and "Permission denied" in proc.stderr
    pred = predicate(repo, data["commit"])
    assert {"kind": "command", "value": "/tmp/b/pnpm install", "decision": "pending"}.items() <= \
        pred["escalations"][0].items()  # fmt: skip
    assert pred["counts"]["escalations"] == 1
    # A grant by bare name names the pnpm PATH finds, not a file the agent made in scratch
    # space under that name; the agent's own program is granted by its path.
    proc, data = run_json(repo, "sh", "-c", f"{bin_dir}; /tmp/b/pnpm install",
                          extra=["--grant", "command=pnpm install"])  # fmt: skip
    assert "pnpm-ran" not in proc.stderr and "Permission denied" in proc.stderr
    proc, data = run_json(repo, "sh", "-c", f"{bin_dir}; /tmp/b/pnpm install",
                          extra=["--grant", "command=/tmp/b/pnpm install"])  # fmt: skip
    assert "pnpm-ran" in proc.stderr
    pred = predicate(repo, data["commit"])
    assert [e["decision"] for e in pred["escalations"]] == ["granted"]


def test_killing_the_supervisor_kills_the_run(repo: Path) -> None:
    marker = f"sleep {4000 + os.getpid() % 1000}.5"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json", "--", "sh",
         "-c", f"echo partial > src/p.py; {marker}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 30
    while not pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert pids_with(marker)
    supervisors = [p for p in pids_with(sys.executable)
                   if b"gatekeeper.sandbox.supervise" in Path(f"/proc/{p}/cmdline").read_bytes()
                   and parent_pid(p) == launcher.pid]  # fmt: skip
    assert len(supervisors) == 1
    os.kill(supervisors[0], signal.SIGKILL)
    out, err = launcher.communicate(timeout=60)
    assert pids_with(marker) == []
    assert launcher.returncode == 125, err
    data = json.loads(out)
    assert data["supervisor_failed"] is True
    pred = predicate(repo, data["commit"])
    assert pred["sandbox"]["supervisor_failed"] is True
    assert pred["command"]["exit_code"] is None


def test_secret_lookups_are_recorded(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", files={"a.txt": "a\n", "conf/.env": "S=1\n"})
    proc, data = run_json(repo, "sh", "-c", "cat conf/.env; cat $HOME/.ssh/id_rsa; cat a.txt")
    pred = predicate(repo, data["commit"])
    assert any(p.endswith("conf/.env") for p in pred["secret_lookups"])
    assert any(p.endswith(".ssh/id_rsa") for p in pred["secret_lookups"])
    assert not any(p.endswith("a.txt") for p in pred["secret_lookups"])


@pytest.fixture
def planted_system_secrets() -> Iterator[dict[str, str]]:
    """Host files a root run could read: a root-only file under /etc, a root-only folder
    under /opt, and credentials by name under /opt ({path: content}); removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("planting files under /etc and /opt needs root")
    tag = f"gk-test-{os.getpid()}"
    folders = [Path("/etc") / tag, Path("/opt") / tag]
    planted = {
        f"/etc/{tag}/admin.conf": "ETC-ROOT-ONLY",
        f"/opt/{tag}/private/token": "OPT-PRIVATE-FOLDER",
        f"/opt/{tag}/app/.env": "OPT-DOTENV",
        f"/opt/{tag}/app/deep/er/.ssh/id_rsa": "OPT-SSH-KEY",
        f"/opt/{tag}/app/README": "OPT-PUBLIC",
    }
    try:
        for path, text in planted.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text + "\n")
        os.chmod(f"/etc/{tag}/admin.conf", 0o600)
        os.chmod(f"/opt/{tag}/private", 0o700)
        yield planted
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def test_what_not_every_user_may_read_under_etc_and_opt_is_hidden(
    repo: Path, planted_system_secrets: dict[str, str]
) -> None:
    """/etc and /opt are shown whole. A run as root is the host's root there: a file only
    root may read, and credentials by name, were read by the agent and not recorded. Now
    they are empty stand-ins whose lookups are recorded; what every user may read is shown."""
    paths = list(planted_system_secrets)
    script = "; ".join(f"cat {p} 2>/dev/null; ls {Path(p).parent} >/dev/null" for p in paths)
    proc, data = run_json(repo, "sh", "-c", f"{script}; exit 0")
    assert "OPT-PUBLIC" in proc.stderr  # (--json: the agent's output is on stderr)
    for secret in ("ETC-ROOT-ONLY", "OPT-PRIVATE-FOLDER", "OPT-DOTENV", "OPT-SSH-KEY"):
        assert secret not in proc.stderr, proc.stderr
    lookups = predicate(repo, data["commit"])["secret_lookups"]
    for hidden in (paths[0], str(Path(paths[1]).parent), paths[2], str(Path(paths[3]).parent)):
        assert any(p.startswith(hidden) for p in lookups), (hidden, lookups)


def test_summary_shows_denied_commands_and_writes(repo: Path) -> None:
    proc = gk(
        "run", "--repo", str(repo), "--", "sh", "-c", "rm -rf src; echo x > README.md; exit 0"
    )
    assert "denied    command rm -rf src (rule `rm -rf`)" in proc.stderr
    assert "! README.md" in proc.stderr


def test_unreadable_argv_is_decided_by_policy() -> None:
    rules = CommandRules.from_config({"deny": ["rm -rf"], "ask": ["pnpm install"],
                                      "allow": [], "default": "allow"})  # fmt: skip
    assert rules.decide(None, "/usr/bin/rm")[0] == "deny"
    assert rules.decide(None, "/usr/bin/pnpm")[0] == "ask"
    assert rules.decide(None, "/usr/bin/ls")[0] == "allow"
    assert rules.decide(["rm", "-r", "x"], "/usr/bin/rm")[0] == "allow"
    assert rules.decide(["/usr/bin/rm", "-rf", "x"], "/usr/bin/rm")[0] == "deny"


def _run_on_a_terminal(
    args: list[str], answer: bytes | list[bytes], timeout: float = 60, pause: float = 0.0
) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as its controlling terminal; answer its question
    (or its questions in turn, given a list), pause seconds after each is shown."""
    import pty

    answers = answer if isinstance(answer, list) else [answer]
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.execv(sys.executable, [sys.executable, "-m", "gatekeeper", *args])
    output = b""
    seen = 0
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
        while seen < len(answers) and output.count(b"Allow? [y/N]") > seen:
            time.sleep(pause)
            os.write(fd, answers[seen] + b"\r")
            seen += 1
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


@pytest.mark.parametrize("answer, ran", [(b"y", True), (b"n", False)])
def test_ask_on_the_terminal_waits_for_the_answer(repo: Path, answer: bytes, ran: bool) -> None:
    script = ("mkdir -p /tmp/b && printf '#!/bin/sh\\necho pnpm-ran\\n' > /tmp/b/pnpm && "
              "chmod +x /tmp/b/pnpm && /tmp/b/pnpm install; exit 0")  # fmt: skip
    code, output = _run_on_a_terminal(
        ["run", "--repo", str(repo), "--ask", "tty", "--json", "--", "sh", "-c", script], answer
    )
    assert code == 0, output
    assert "program  /tmp/b/pnpm\r\n  argv     /tmp/b/pnpm install\r\n" in output
    assert ("pnpm-ran" in output) is ran
    # A yes at the run's own prompt is a grant for the run (a signed approval is `approved`).
    expected = "granted" if ran else "denied"
    assert f'"decision": "{expected}"' in output


def test_ask_tty_without_a_terminal_is_a_usage_error(repo: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo),
                           "--ask", "tty", "--", "true"], capture_output=True, text=True,
                          start_new_session=True)  # fmt: skip
    assert proc.returncode == 2 and "--ask tty needs a terminal" in proc.stderr


def test_the_gate_covers_commits_the_agent_made_inside(repo: Path) -> None:
    script = ("echo one > src/one.py && git add src && git commit -qm one && "
              "echo two > src/two.py && git add src && git commit -qm two && echo three > src/three.py")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert len(data["agent_commits"]) == 2
    check = gk("check", "--repo", str(repo), "--base", "main", "--format", "json", data["branch"])
    report = json.loads(check.stdout)
    assert check.returncode == 0, report["findings"]
    assert report["verdict"] == "pass" and report["receipts_verified"] == 1
    # In place of the launcher's commit, a human one with the same content and parent (a
    # message-only amend) is still the run's result; with other content it is not covered.
    git(repo, "branch", "tampered", data["agent_commits"][-1])
    wt = Path(data["worktree"]).parent / "tampered"
    git(repo, "worktree", "add", "-q", str(wt), "tampered")
    (wt / "src" / "three.py").write_text("three\n")
    git(wt, "add", "src")
    git(wt, "commit", "-qm", "human")
    same = gk("check", "--repo", str(repo), "--base", "main", "--format", "json", "tampered")
    assert same.returncode == 0, same.stdout
    (wt / "src" / "three.py").write_text("three, by hand\n")
    git(wt, "commit", "-qam", "human", "--amend")
    check = gk("check", "--repo", str(repo), "--base", "main", "--format", "json", "tampered")
    assert check.returncode == 1
    kinds = {f["kind"] for f in json.loads(check.stdout)["findings"]}
    assert "uncovered-commit" in kinds


def test_the_ask_prompt_shows_control_characters_as_escapes(repo: Path) -> None:
    # An argv that would rewrite the prompt: erase the line, move up, overwrite, reverse the
    # text's direction, back over characters. The person must see it all, escaped.
    fake = "\x1b[1A\x1b[2K\rgatekeeper: the agent wants to run `ls`\x08\x08\u202e\u200bok\x7f"
    long = "A" * 5000
    script = ("mkdir -p /tmp/b && printf '#!/bin/sh\\necho pnpm-ran\\n' > /tmp/b/pnpm && "
              "chmod +x /tmp/b/pnpm && cd /tmp/b && exec python3 -c 'import os, sys; "
              "os.execv(\"./pnpm\", [\"pnpm\", \"install\", sys.argv[1], sys.argv[2]])' "
              "\"$0\" \"$1\"")  # fmt: skip
    code, output = _run_on_a_terminal(
        ["run", "--repo", str(repo), "--ask", "tty", "--json", "--", "sh", "-c", script, fake,
         long], b"n")  # fmt: skip
    question = output[output.index("gatekeeper: the agent wants to run a command") :]
    question = question[: question.index("Allow? [y/N]")].replace("\r\n", "\n")
    for raw in ("\x1b", "\x08", "\r", "\u202e", "\u200b", "\x7f"):
        assert raw not in question, repr(question)
    assert "program  /tmp/b/pnpm" in question
    assert (
        "\\x1b[1A\\x1b[2K\\x0dgatekeeper: the agent wants to run `ls`\\x08\\x08\\u202e" in question
    )
    assert "\\u200bok\\x7f" in question
    assert "4800 more characters" in question and len(question) < 3000
    assert "pnpm-ran" not in output


@pytest.mark.parametrize("how", ["execv", "execvp"])
def test_an_exec_racing_a_working_directory_change_is_judged_and_recorded(
    tmp_path: Path, key: Path, how: str
) -> None:
    # One thread flips the working directory between a folder with a copy of a denied program
    # and one without, while another execs it by a relative path (or a PATH search for its
    # name finds it in "."): whatever the supervisor finds when it looks, it must not let an
    # unjudged exec through, and every attempt is in the receipt.
    repo = make_repo(tmp_path / "repo", policy="commands: {deny: [curl], default: allow}\n",
                     files={"a.txt": "a\n"})  # fmt: skip
    attempts = 150
    call = ("os.execv('./curl', ['./curl', 'RAN'])" if how == "execv"
            else "os.execvpe('curl', ['curl', 'RAN'], {'PATH': '.'})")  # fmt: skip
    program = f"""
import os, shutil, sys, threading, time
os.makedirs('/tmp/with', exist_ok=True); os.makedirs('/tmp/without', exist_ok=True)
shutil.copy('/bin/echo', '/tmp/with/curl')
def flip():
    while True:
        os.chdir('/tmp/with'); os.chdir('/tmp/without')
for i in range({attempts}):
    pid = os.fork()
    if pid == 0:
        threading.Thread(target=flip, daemon=True).start()
        time.sleep(0.001 * (i % 5))
        try:
            {call}
        except OSError:
            os._exit(3)
    os.waitpid(pid, 0)
print('done')
"""
    proc, data = run_json(repo, "python3", "-c", program, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stderr and "RAN" not in proc.stderr
    pred = predicate(repo, data["commit"])
    argv0 = "./curl" if how == "execv" else "curl"
    tried = [p for p in pred["processes"] if p["argv"][:1] == [argv0]]
    assert all(p["decision"] == "deny" for p in tried), tried
    tries = sum(p.get("count") or 1 for p in tried)  # a refusal repeated: one entry, counted
    if how == "execv":
        assert tries == attempts, tried
    else:
        assert tries >= attempts, tried


def test_the_run_summary_shows_the_agents_argv_escaped(repo: Path) -> None:
    proc = gk("run", "--repo", str(repo), "--", "sh", "-c",
              "rm -rf \"$(printf 'x\\033[2J\\033[Hy')\"; exit 0")  # fmt: skip
    assert "denied    command rm -rf 'x\\x1b[2J\\x1b[Hy'" in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stderr


def test_an_argv_changed_by_another_thread_after_the_check_is_caught(
    tmp_path: Path, key: Path
) -> None:
    # The supervisor reads argv from the process's memory; the kernel reads it again after
    # the answer. A second thread flips `status` to `push` in between: what runs is checked
    # again at its first watched call (here touch creating its file), and refused there.
    repo = make_repo(tmp_path / "repo", policy="commands: {deny: ['git push'], default: allow}\n",
                     files={"a.txt": "a\n"})  # fmt: skip
    program = (
        ARGV_FLIPPER
        + """
caught = 0
for i in range(200):
    pid = os.fork()
    if pid == 0:
        threading.Thread(target=flip, daemon=True).start()
        argv = (ctypes.c_char_p * 3)(b'git', ctypes.cast(word, ctypes.c_char_p), None)
        libc.execv(b'/tmp/git', argv)
        os._exit(3)
    os.waitpid(pid, 0)
print('pushed' if os.path.exists('/tmp/w/push') else 'not pushed')
"""
    )
    proc, data = run_json(repo, "python3", "-c", program, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "not pushed" in proc.stderr, proc.stderr[-2000:]
    pred = predicate(repo, data["commit"])
    ran = [p for p in pred["processes"] if p["argv"][:2] == ["git", "push"]]
    assert all(p["decision"] == "deny" for p in ran), ran


def test_an_exec_with_an_unreadable_path_is_refused_and_recorded(repo: Path) -> None:
    program = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
               "argv = (ctypes.c_char_p * 2)(b'curl', None); "
               "print('rc', libc.execv(ctypes.c_char_p(16), argv), ctypes.get_errno())")  # fmt: skip
    proc, data = run_json(repo, "python3", "-c", program)
    assert proc.returncode == 0, proc.stderr
    assert "rc -1 14" in proc.stderr  # EFAULT, as the kernel would say
    pred = predicate(repo, data["commit"])
    refused = [p for p in pred["processes"] if p["argv"] == ["curl"]]
    assert [p["decision"] for p in refused] == ["deny"], pred["processes"]
    assert refused[0]["rule"] == "(the program path is unreadable)"


# Execs each (path, argv) of CALLS and prints the error each gets, in order, on stderr.
TRY_EXECS = (
    "import os, sys\n"
    "def code(path, argv):\n"
    "    try:\n"
    "        os.execv(path, argv)\n"
    "    except OSError as exc:\n"
    "        return exc.errno\n"
    "print(*[code(p, a) for p, a in CALLS], file=sys.stderr)\n"
)


def test_an_exec_of_a_path_with_nothing_there_gets_the_kernels_error_and_is_judged_by_name(
    repo: Path,
) -> None:
    """A PATH search's misses are answered at once with the error the kernel would give
    (ENOENT, or ENOTDIR through a file), not recorded when the name is allowed, and recorded
    as refused by name when the policy refuses it."""
    calls = [("/usr/local/nothing/ls", ["ls"]), ("/etc/hostname/ls", ["ls"]),
             ("/usr/local/nothing/rm", ["rm", "-rf", "victim"]),
             ("/usr/local/nothing/x", ["git", "push"])]  # fmt: skip
    proc, data = run_json(repo, "python3", "-c", f"CALLS = {calls!r}\n{TRY_EXECS}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.split()[-4:] == [str(errno.ENOENT), str(errno.ENOTDIR),
                                        str(errno.ENOENT), str(errno.ENOENT)], proc.stderr  # fmt: skip
    pred = predicate(repo, data["commit"])
    refused = {tuple(p["argv"]): p for p in pred["processes"] if p["decision"] == "deny"}
    assert set(refused) == {("rm", "-rf", "victim"), ("git", "push")}, refused
    assert all("by name: no file at the path" in p["rule"] for p in refused.values()), refused
    assert all(p["cwd"] == data["worktree"] for p in refused.values()), refused
    assert not [p for p in pred["processes"] if p["argv"] == ["ls"]], pred["processes"]


# Searches folder after folder for a program with one argv, as execvp does, and prints the
# error of each miss; a forked child's search ends at the program it finds.
SEARCH = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def search(folders, *words):\n"
    "    argv = (ctypes.c_char_p * (len(words) + 1))(*words, None)\n"
    "    errors = []\n"
    "    for folder in folders:\n"
    "        libc.execv(f'{folder}/{words[0].decode()}'.encode(), argv)\n"
    "        errors.append(ctypes.get_errno())\n"
    "    return errors\n"
    "print('git', *search(['/nothing/a', '/nothing/b', '/etc/hostname'], b'git', b'push'),\n"
    "      file=sys.stderr)\n"
    "print('ls', *search(['/nothing/a', '/nothing/b'], b'ls', b'-l'), file=sys.stderr)\n"
    "if os.fork() == 0:\n"
    "    search(['/nothing/a', '/nothing/b', '/usr/bin'], b'true', b'found')\n"
    "    os._exit(9)\n"
    "print('child', os.wait()[1] >> 8, file=sys.stderr)\n"
)


def test_a_path_search_gets_the_kernels_error_at_each_miss_and_runs_what_it_finds(
    repo: Path,
) -> None:
    """One argv tried in folder after folder (its decision made once, kept): each miss gets
    the kernel's error, the misses of a refused name are recorded as one refused by name, an
    allowed name's misses are not recorded, and the search that finds its program runs it,
    judged on what it finds."""
    proc, data = run_json(repo, "python3", "-c", SEARCH)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert f"git {errno.ENOENT} {errno.ENOENT} {errno.ENOTDIR}" in lines, proc.stderr
    assert f"ls {errno.ENOENT} {errno.ENOENT}" in lines, proc.stderr
    assert "child 0" in lines, proc.stderr
    processes = predicate(repo, data["commit"])["processes"]
    refused = [p for p in processes if p["argv"] == ["git", "push"]]
    # One attempt, three folders tried: one entry, counted three times.
    assert [(p["decision"], p["exe"], p["count"]) for p in refused] == [
        ("deny", "/nothing/a/git", 3)
    ], processes
    assert all("by name: no file at the path" in p["rule"] for p in refused), refused
    assert not [p for p in processes if p["argv"][:1] == ["ls"]], processes
    found = [p for p in processes if p["argv"] == ["true", "found"]]
    assert [(p["decision"], p["exe"]) for p in found] == [("allow", "/usr/bin/true")], processes


# One argv array searched for twice in the same folders, its words changed in place between
# the searches (`git status`, then `git push`); then `ls` through a file (ENOTDIR) after two
# misses; then `git push` by a second array at the same folders.
RESEARCH = (
    "import ctypes, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "argv = (ctypes.c_char_p * 3)(b'git', b'status', None)\n"
    "def search(folders, name, array):\n"
    "    errors = []\n"
    "    for folder in folders:\n"
    "        libc.execv(f'{folder}/{name}'.encode(), array)\n"
    "        errors.append(ctypes.get_errno())\n"
    "    return errors\n"
    "print('status', *search(['/nothing/a', '/nothing/b'], 'git', argv), file=sys.stderr)\n"
    "argv[1] = b'push'\n"
    "print('push', *search(['/nothing/a', '/nothing/b'], 'git', argv), file=sys.stderr)\n"
    "ls = (ctypes.c_char_p * 2)(b'ls', None)\n"
    "print('ls', *search(['/nothing/a', '/nothing/b', '/etc/hostname'], 'ls', ls),\n"
    "      file=sys.stderr)\n"
    "again = (ctypes.c_char_p * 3)(b'git', b'push', None)\n"
    "print('again', *search(['/nothing/a', '/nothing/b'], 'git', again), file=sys.stderr)\n"
)


def test_a_search_judged_once_is_judged_again_when_it_starts_over_or_its_argv_moves(
    repo: Path,
) -> None:
    """The misses after a PATH search's first allowed one are answered as it was (the same
    thread, argv and name; nothing runs at a miss), each with the kernel's own error. A
    search that tries a folder again starts over, judged afresh: an argv changed in place
    between two searches is read again, and its refusal recorded; so is another argv."""
    proc, data = run_json(repo, "python3", "-c", RESEARCH)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    nothing, not_dir = errno.ENOENT, errno.ENOTDIR
    assert f"status {nothing} {nothing}" in lines, proc.stderr
    assert f"push {nothing} {nothing}" in lines, proc.stderr
    assert f"ls {nothing} {nothing} {not_dir}" in lines, proc.stderr
    assert f"again {nothing} {nothing}" in lines, proc.stderr
    processes = predicate(repo, data["commit"])["processes"]
    refused = [(p["argv"], p["exe"], p.get("count")) for p in processes if p["decision"] == "deny"]
    # the argv changed in place, then the other array: both searches are recorded, each one
    # entry with the count of its misses (one parent, one command line: one entry in all)
    assert refused == [(["git", "push"], "/nothing/a/git", 4)], processes
    assert not [p for p in processes if p["argv"][:2] == ["git", "status"]], processes


# A PATH search's first miss by a thread that then ends; a thread given the same id (by the
# host, as the test sets its next pid) with the same argv address, the word changed in place.
REUSED_ID = (
    "import ctypes, sys, threading\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "argv = (ctypes.c_char_p * 3)(b'git', b'status', None)\n"
    "def say(*words):\n"
    "    print(*words, file=sys.stderr, flush=True)\n"
    "def first():\n"
    "    say('first', libc.gettid()); sys.stdin.readline()\n"
    "    libc.execv(b'/nothing/a/git', argv)\n"
    "def second():\n"
    "    libc.execv(b'/nothing/b/git', argv)\n"
    "    say('second', ctypes.get_errno()); sys.stdin.readline()\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    argv[1] = b'status'\n"
    "    t = threading.Thread(target=first); t.start(); t.join()\n"
    "    argv[1] = b'push'\n"
    "    say('ended'); sys.stdin.readline()\n"
    "    t = threading.Thread(target=second); t.start(); t.join()\n"
)


def _agent_thread(token: str, inner: int) -> tuple[int, int]:
    """(process, thread): the host's ids of the thread that is `inner` in the sandbox, of the
    process whose command line holds token."""
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                for tid in os.listdir(f"/proc/{pid}/task"):
                    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
                    ids = next(x for x in status.splitlines() if x.startswith("NSpid:"))
                    if int(ids.split()[-1]) == inner and len(ids.split()) > 2:
                        return int(pid), int(tid)
        except (OSError, StopIteration):
            continue
    raise AssertionError(f"no thread {inner} of a process with {token!r}")


@pytest.mark.skipif(os.geteuid() != 0, reason="sets the host's next pid: needs root")
def test_a_search_is_not_taken_over_by_a_thread_given_the_ended_ones_id(repo: Path) -> None:
    """A thread whose PATH search began with an allowed miss ends; a thread given its id
    afterwards (forked or started later, the argv at the same address, its word changed in
    place to a refused one) is judged afresh: its refused miss is recorded each time."""
    tries = 6
    token = f"reused-id-{os.getpid()}"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json", "--",
         "python3", "-c", f"# {token}\n{REUSED_ID}", str(tries)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert launcher.stdin is not None and launcher.stderr is not None
    reused = 0
    try:
        for _ in range(tries):
            line = launcher.stderr.readline()
            while not line.startswith("first "):
                assert line, "the agent ended early"
                line = launcher.stderr.readline()
            agent, host = _agent_thread(token, int(line.split()[1]))
            launcher.stdin.write("\n")
            launcher.stdin.flush()
            assert launcher.stderr.readline() == "ended\n"
            Path("/proc/sys/kernel/ns_last_pid").write_text(f"{host - 1}\n")
            launcher.stdin.write("\n")
            launcher.stdin.flush()
            assert launcher.stderr.readline() == f"second {errno.ENOENT}\n"
            reused += os.path.exists(f"/proc/{agent}/task/{host}")
            launcher.stdin.write("\n")
            launcher.stdin.flush()
        out, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err
    assert reused, "no thread was given an ended one's id (the host took it first each time)"
    processes = predicate(repo, json.loads(out)["commit"])["processes"]
    refused = [(p["argv"], p["exe"], p.get("count")) for p in processes if p["decision"] == "deny"]
    assert refused == [(["git", "push"], "/nothing/b/git", tries)], processes


# The system calls of a program built without a C library (x86-64), and a string copy.
NO_LIBC = r"""
static long call(long n, long a, long b, long c, long d, long e, long f) {
    register long r10 __asm__("r10") = d, r8 __asm__("r8") = e, r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10),
                     "r"(r8), "r"(r9) : "rcx", "r11", "memory");
    return ret;
}
static void put(char *at, const char *text) {
    while ((*at++ = *text++)) {}
}
"""


# A search's first miss by the first thread; then a second thread execs a program with no C
# library (no set_tid_address: its first watched call is its first miss), which takes the
# first thread's id and builds its argv at the same address, with a refused word.
HANDED_OVER = r"""
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
static int go[2];
static void *second(void *unused) {
    char c, *argv[] = {"stage2", 0}, *envp[] = {0};
    if (read(go[0], &c, 1) == 1)
        syscall(SYS_execve, "./stage2", argv, envp);
    return unused;
}
int main(void) {
    char *m = mmap((void *)0x70000000, 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    char **argv = (char **)m, *envp[] = {0};
    strcpy(m + 64, "git"); strcpy(m + 128, "status");
    argv[0] = m + 64; argv[1] = m + 128; argv[2] = 0;
    pthread_t t;
    if (pipe(go) != 0 || pthread_create(&t, 0, second, 0) != 0)
        return 1;
    syscall(SYS_execve, "/nothing/a/git", argv, envp);
    if (write(go[1], "x", 1) != 1)
        return 1;
    pause();
    return 0;
}
"""
# The second stage: an allowed argv and the first stage's missed path put at its address,
# SPIN turns of a loop (a stale miss of the first stage may be handled meanwhile), then a
# refused word in place and three misses.
STAGE2 = (
    NO_LIBC
    + r"""
void _start(void) {
    char *m = (char *)call(9, 0x70000000, 4096, 3, 0x32, -1, 0);  /* mmap, MAP_FIXED */
    char **argv = (char **)m, *envp[] = {0};
    put(m + 64, "git"); put(m + 128, "status"); put(m + 256, "/nothing/a/git");
    argv[0] = m + 64; argv[1] = m + 128; argv[2] = 0;
    for (volatile long i = 0; i < SPIN; i++) {}
    put(m + 128, "push");
    call(59, (long)"/nothing/b/git", (long)argv, (long)envp, 0, 0, 0);  /* execve: ENOENT */
    call(59, (long)"/nothing/c/git", (long)argv, (long)envp, 0, 0, 0);
    call(59, (long)"/nothing/d/git", (long)argv, (long)envp, 0, 0, 0);
    call(231, 0, 0, 0, 0, 0, 0);  /* exit_group */
}
"""
)


def _two_stages(tmp_path: Path, stage1: str, attempts: int, spin: int) -> Path:
    """A repository refusing `git push`, with stage1 (C, pthreads) built from its source and
    STAGE2 (C, no C library), committed."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    repo = make_repo(tmp_path / "repo", files={"a.txt": "a\n"},
                     policy="commands: {deny: ['git push'], default: allow}\n")  # fmt: skip
    stages = (("stage1", stage1, ["-pthread", f"-DATTEMPTS={attempts}"]),
              ("stage2", STAGE2, ["-nostdlib", "-static", f"-DSPIN={spin}"]))  # fmt: skip
    for name, source, flags in stages:
        (tmp_path / f"{name}.c").write_text(source)
        built = subprocess.run([compiler, "-O1", *flags, "-o", str(repo / name),
                                str(tmp_path / f"{name}.c")], capture_output=True, text=True,
                               check=False)  # fmt: skip
        assert built.returncode == 0, built.stderr
    git(repo, "add", "stage1", "stage2")
    git(repo, "commit", "-qm", "stages")
    return repo


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the second stage's calls are x86-64")
def test_a_search_does_not_pass_to_the_program_a_second_thread_execs(
    tmp_path: Path, key: Path
) -> None:
    """An exec by a thread other than the first gives the new program the first thread's id:
    a search that thread began is not the new program's, whose refused misses (its argv at
    the same address, a refused word) are each judged and recorded."""
    repo = _two_stages(tmp_path, HANDED_OVER, 1, 0)
    proc, data = run_json(repo, "./stage1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    refused = [
        (p["argv"], p["exe"], p.get("count"))
        for p in predicate(repo, data["commit"])["processes"]
        if p["decision"] == "deny"
    ]
    assert refused == [(["git", "push"], "/nothing/b/git", 3)], refused


# The first thread misses in a loop while a second thread execs a program with no C library:
# a miss read just before the exec killed the first thread is handled after it, through an id
# that is the new program's by then, which has put the same path and an allowed argv at the
# same address for a while (then a refused word, and three misses).
STALE_MISS = r"""
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
static volatile long delay;
static void *second(void *unused) {
    char *argv[] = {"stage2", 0}, *envp[] = {0};
    for (volatile long i = 0; i < delay; i++) {}
    syscall(SYS_execve, "./stage2", argv, envp);
    return unused;
}
int main(void) {
    for (int n = 0; n < ATTEMPTS; n++) {
        if (fork() == 0) {
            char *m = mmap((void *)0x70000000, 4096, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            char **argv = (char **)m, *envp[] = {0};
            strcpy(m + 64, "git"); strcpy(m + 128, "status"); strcpy(m + 256, "/nothing/a/git");
            argv[0] = m + 64; argv[1] = m + 128; argv[2] = 0;
            delay = (n % 10) * 20000;
            pthread_t t;
            if (pthread_create(&t, 0, second, 0) != 0)
                _exit(1);
            for (;;)
                syscall(SYS_execve, m + 256, argv, envp);
        }
        wait(0);
    }
    return 0;
}
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the second stage's calls are x86-64")
def test_a_miss_handled_after_its_thread_is_gone_begins_no_search(
    tmp_path: Path, key: Path
) -> None:
    """A first thread's miss read by the supervisor just before another thread's exec killed
    it is handled afterwards, through an id that is the new program's by then: no search is
    kept for it, so the new program's refused misses are each judged and recorded."""
    attempts = 40
    repo = _two_stages(tmp_path, STALE_MISS, attempts, 30_000_000)
    proc, data = run_json(repo, "./stage1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    pushed = [p for p in predicate(repo, data["commit"])["processes"]
              if p["decision"] == "deny" and p["argv"] == ["git", "push"]]  # fmt: skip
    assert sum(p.get("count") or 1 for p in pushed) == 3 * attempts, pushed


@pytest.mark.skipif(os.readlink("/bin") != "usr/bin" if os.path.islink("/bin") else True,
                    reason="needs a merged /usr: /bin -> usr/bin")  # fmt: skip
def test_an_exec_through_a_root_link_with_nothing_there_is_judged_by_where_the_link_leads(
    repo: Path,
) -> None:
    """A miss through a link at the sandbox's root (/bin -> usr/bin) is judged, and recorded,
    by the path the kernel looked up: a deny rule naming the program by its path under /usr
    refuses `/bin/NAME` too, and `..` after the link climbs from the link's target."""
    policy = repo / ".gatekeeper" / "policy.yaml"
    policy.write_text(
        "paths: {read: ['**'], write: ['src/**']}\n"
        "commands:\n"
        "  deny: ['/usr/bin/no-such-tool', 'other-tool']\n"
        "  default: allow\n"
    )
    git(repo, "commit", "-qam", "policy")
    calls = [("/bin/no-such-tool", ["no-such-tool"]),
             ("/bin/../local/other-tool", ["other-tool"])]  # fmt: skip
    proc, data = run_json(repo, "python3", "-c", f"CALLS = {calls!r}\n{TRY_EXECS}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.split()[-2:] == [str(errno.ENOENT)] * 2, proc.stderr
    pred = predicate(repo, data["commit"])
    refused = {p["argv"][0]: p for p in pred["processes"] if p["decision"] == "deny"}
    assert set(refused) == {"no-such-tool", "other-tool"}, pred["processes"]
    assert refused["no-such-tool"]["exe"] == "/usr/bin/no-such-tool", refused
    assert refused["other-tool"]["exe"] == "/usr/local/other-tool", refused


def test_an_exec_of_a_fifo_is_refused_by_the_kernel_and_its_data_is_left_alone(
    repo: Path,
) -> None:
    """A program file is read for its `#!` line only when it is a regular file: an exec of a
    FIFO (the kernel refuses it with EACCES) does not make the supervisor take the bytes
    waiting in it from the process that reads it."""
    script = (
        "import os, errno\n"
        "os.chdir('/tmp')\n"
        "os.mkfifo('f')\n"
        "fd = os.open('f', os.O_RDWR)\n"  # reader and writer at once: never blocks
        "os.write(fd, b'kept')\n"
        "try:\n"
        "    os.execv('./f', ['./f'])\n"
        "except OSError as exc:\n"
        "    print('exec', exc.errno)\n"
        "os.set_blocking(fd, False)\n"
        "try:\n"
        "    print('left', os.read(fd, 64))\n"
        "except BlockingIOError:\n"
        "    print('left', b'')\n"
        "os.unlink('f')\n"
    )
    proc, data = run_json(repo, "python3", "-c", script)
    assert proc.returncode == 0, proc.stderr
    # (the agent's output goes to stderr when the launcher prints JSON)
    assert f"exec {errno.EACCES}\nleft b'kept'\n" in proc.stderr, proc.stderr


# Opens a pseudo-terminal no session has as its terminal, execs its slave by PREFIX + its
# name with ARGV0, then types ^C into it and hangs it up; then runs a denied command.
PTY_AS_PROGRAM = r"""
import os, sys, time
master, slave = os.openpty()
name = os.ttyname(slave)
os.close(slave)
try:
    os.execv(PREFIX + name, [ARGV0])
except OSError as exc:
    print('exec', exc.errno, file=sys.stderr)
time.sleep(0.2)
os.write(master, b'\x03')
time.sleep(0.2)
os.close(master)
time.sleep(0.5)
print('alive', file=sys.stderr, flush=True)
os.system('curl after')
"""


@pytest.mark.parametrize("prefix, argv0", [("", "x"), ("/", "curl")])
def test_a_terminal_execd_as_a_program_never_becomes_the_supervisors_own(
    tmp_path: Path, key: Path, prefix: str, argv0: str
) -> None:
    """The supervisor (a session leader with no terminal) opens a program file to read its
    `#!` line (and an absolute path's lookup opens it, whatever the decision): a terminal's
    slave opened so would become its controlling terminal, and whoever holds the master
    could then interrupt it (^C) or hang it up (closing the master), killing it by a signal
    the launcher does not take for the supervisor's failure."""
    repo = make_repo(tmp_path / "repo", policy="commands: {deny: [curl], default: allow}\n",
                     files={"a.txt": "a\n"})  # fmt: skip
    program = f"PREFIX = {prefix!r}\nARGV0 = {argv0!r}\n{PTY_AS_PROGRAM}"
    proc, data = run_json(repo, "python3", "-c", program)
    assert proc.returncode == 0, proc.stderr
    assert f"exec {errno.EACCES}\nalive\n" in proc.stderr, proc.stderr
    pred = predicate(repo, data["commit"])
    assert pred["sandbox"]["supervisor_failed"] is False
    refused = [p for p in pred["processes"] if p["decision"] == "deny"]
    assert ["curl", "after"] in [p["argv"] for p in refused], pred["processes"]


# The main thread execs the process's own program with an argv another thread flips between
# a word the policy allows and one it refuses; a third thread execs /bin/true just after, so
# that its exec is judged while the first goes through (and ends it). Hundreds of processes
# that ran and made no watched call since keep their checks waiting, so the supervisor has
# work (sweeping them) between its last look at the second exec's caller and its answer.
RACING_EXECS = r"""
import ctypes, os, subprocess, sys, threading, time
os.makedirs('/tmp/w', exist_ok=True); os.chdir('/tmp/w')
open('good', 'w').write('pass\n')
open('evil', 'w').write("import os\nopen('/tmp/w/pwned', 'w').write('x')\n")
sleepers = [subprocess.Popen(['sleep', '300']) for _ in range(300)]
libc = ctypes.CDLL(None, use_errno=True)
program = os.readlink('/proc/self/exe').encode()
word = ctypes.create_string_buffer(b'good', 8)
def flip():
    while True:
        ctypes.memmove(word, b'evil', 4); ctypes.memmove(word, b'good', 4)
for i in range(ATTEMPTS):
    pid = os.fork()
    if pid == 0:
        env = [b'E%d=%s' % (k, b'y' * 40) for k in range(2000 + 1500 * (i % 16))]
        envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
        argv = (ctypes.c_char_p * 3)(b'python3', ctypes.cast(word, ctypes.c_char_p), None)
        true = (ctypes.c_char_p * 2)(b'true', None)
        def other():
            time.sleep(0.0002 * (i % 7))
            libc.execv(b'/bin/true', true)
        threading.Thread(target=flip, daemon=True).start()
        threading.Thread(target=other, daemon=True).start()
        libc.execve(program, argv, envp)
        os._exit(3)
    os.waitpid(pid, 0)
    if os.path.exists('/tmp/w/pwned'):
        break
for s in sleepers:
    s.kill(); s.wait()
print('pwned' if os.path.exists('/tmp/w/pwned') else 'not pwned', i, file=sys.stderr)
"""


def test_an_exec_that_ends_the_thread_of_another_judged_exec_is_still_checked(
    tmp_path: Path, key: Path
) -> None:
    """The address space an allowed exec starts from is held from while its caller is known
    to be alive (before the last look at its call): held later, another thread's exec may
    have ended the caller by then, and a check with nothing held would wait for ever, for
    every thread but the ended one, while a flipped argv runs (here: `python3 evil`)."""
    repo = make_repo(tmp_path / "repo", policy="commands: {deny: ['python3 evil'], default: allow}\n",
                     files={"a.txt": "a\n"})  # fmt: skip
    program = f"ATTEMPTS = 600\n{RACING_EXECS}"
    proc, data = run_json(repo, "python3", "-c", program, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not pwned" in proc.stderr, proc.stderr[-3000:]
    pred = predicate(repo, data["commit"])
    caught = [p for p in pred["processes"] if p["argv"] == ["python3", "evil"]]
    assert caught and all(p["decision"] == "deny" for p in caught), caught


# A vfork child execs its parent's own program file while another thread of the parent flips
# an argument between what the supervisor reads and what the kernel copies; the program
# started as `atk evil` (refused) has a child make its watched call before it makes any;
# with UNMAP, after unmapping its arguments (its command line then reads as nothing); with
# LEADER_EXITS, from another thread after its first thread ended (its files read as nothing).
VFORK_FLIPPER = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static char word[8] __attribute__((aligned(8))) = "good";
static char stack[65536];

static void *flip(void *unused) {
    unsigned k = 1000;
    for (;;) {
        __atomic_store_n((unsigned *)word, *(unsigned *)"evil", __ATOMIC_SEQ_CST);
        for (volatile unsigned j = 0; j < k; j++) {}
        __atomic_store_n((unsigned *)word, *(unsigned *)"good", __ATOMIC_SEQ_CST);
        for (volatile unsigned j = 0; j < k; j++) {}
        k = k * 7 % 40000 + 500;
    }
    return unused;
}

static void *work(void *unused) {
    usleep(20000);
    syscall(SYS_exit_group, open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
    return unused;
}

static int child(void *unused) {
    char *argv[] = {"atk", word, 0};
    execv("/tmp/atk", argv);
    _exit(3);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "evil") == 0) {
#ifdef LEADER_EXITS
        /* Its first thread ends (its process's files read as nothing), another works on. */
        pthread_t t;
        pthread_create(&t, 0, work, 0);
        syscall(SYS_exit, 0);
#endif
#ifdef UNMAP
        /* Its arguments unmapped: its command line reads as nothing. */
        munmap((void *)((unsigned long)argv[1] & ~4095UL), 4096);
#endif
        pid_t p = fork();
        if (p == 0)
            _exit(open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
        waitpid(p, 0, 0);
        _exit(0);
    }
    if (argc > 1)
        _exit(0);
    pthread_t t;
    pthread_create(&t, 0, flip, 0);
    for (int i = 0; i < 1500; i++) {
        pid_t p = clone(child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, 0);
        waitpid(p, 0, 0);
        if (access("/tmp/w/evil-ran", F_OK) == 0) {
            fprintf(stderr, "evil ran\n");
            return 0;
        }
    }
    fprintf(stderr, "evil never ran\n");
    return 0;
}
"""


@pytest.mark.parametrize("define", ["-DKEEP", "-DUNMAP", "-DLEADER_EXITS"])
def test_a_vfork_child_execing_its_parents_program_with_a_flipped_argv_is_caught(
    tmp_path: Path, key: Path, define: str
) -> None:
    """The old address space lives on in the vfork parent after the exec went through to the
    same program file; a command line reads as nothing once the exec is done; a process's
    first thread has ended: none passes for an exec still under way, letting a child (or
    another thread) of the refused program make its calls unchecked."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    repo = make_repo(tmp_path / "repo", policy="commands: {deny: ['atk evil'], default: allow}\n",
                     files={"a.txt": "a\n"})  # fmt: skip
    source = tmp_path / "atk.c"
    source.write_text(VFORK_FLIPPER)
    built = subprocess.run([compiler, define, "-O1", "-pthread", "-o", str(repo / "atk"), str(source)],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr
    git(repo, "add", "atk")
    git(repo, "commit", "-qm", "atk")
    proc, data = run_json(repo, "sh", "-c",
                          "mkdir -p /tmp/w && cp ./atk /tmp/atk && /tmp/atk",
                          extra=["--timeout", "300"], timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    ran = processes(predicate(repo, data["commit"]), ["atk", "evil"])
    assert ran and all(p["decision"] == "deny" for p in ran)


TOLD_THROUGH = r"""
import os, socket, subprocess, termios, time
def push(stderr):  # refused (EACCES): the process is told why on its stderr
    try:
        subprocess.run(["git", "push", "origin", "main"], stderr=stderr, timeout=20)
    except PermissionError:
        pass
def drain(fd):
    os.set_blocking(fd, False)
    time.sleep(0.3)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except (BlockingIOError, OSError):
            return out
        if not chunk:
            return out
        out += chunk
master, slave = os.openpty()
push(slave)
print("pty", b"never runs inside the sandbox" in drain(master))
termios.tcflow(slave, termios.TCOOFF)  # output stopped: nothing can be written to it now
started = time.monotonic()
push(slave)
print("stopped", round(time.monotonic() - started) < 5)
termios.tcflow(slave, termios.TCOON)
print("stopped-told", b"never runs" in drain(master))
ours, theirs = socket.socketpair()
push(theirs)
print("socket", b"never runs inside the sandbox" in drain(ours.fileno()))
print("after", subprocess.run(["/bin/true"], timeout=20).returncode)
"""


def test_an_agent_is_told_of_an_external_write_on_a_terminal_or_socket_without_stalling(
    repo: Path,
) -> None:
    """The message on an external write reaches the process's stderr as a terminal or a
    socket; a terminal whose output is stopped gets nothing, and the supervisor goes on
    (it never waits on the agent's terminal)."""
    policy = repo / ".gatekeeper" / "policy.yaml"
    policy.write_text("paths: {read: ['**'], write: ['src/**']}\n"
                      "commands: {external: ['git push'], default: allow}\n")  # fmt: skip
    git(repo, "commit", "-qam", "policy")
    proc, data = run_json(repo, "python3", "-c", TOLD_THROUGH, extra=["--timeout", "120"])
    assert proc.returncode == 0, proc.stderr
    assert "pty True\nstopped True\nstopped-told False\nsocket True\nafter 0\n" in proc.stderr
    pushes = [
        p for p in predicate(repo, data["commit"])["processes"] if p["argv"][:2] == ["git", "push"]
    ]
    tries = sum(p.get("count") or 1 for p in pushes)  # a refusal repeated: one entry, counted
    assert tries >= 3 and all(p["decision"] == "deny" for p in pushes), pushes


MANY_ALIVE = r"""
import os, sys
pids = []
for i in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        os.execv('/bin/sleep', ['sleep', '3'])
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print('done', file=sys.stderr)
"""


def test_a_supervisor_out_of_descriptors_never_lets_an_exec_run_unwatched(
    tmp_path: Path, key: Path
) -> None:
    """Each process the supervisor watches holds a pidfd of it: more live processes than its
    limit on open files must neither leave execs unwatched (their ends unrecorded, their
    check after the exec never made) nor pass as a clean run."""
    import resource

    repo = make_repo(tmp_path / "repo", policy="limits: {max_processes: 2000}\n",
                     files={"a.txt": "a\n"})  # fmt: skip

    def low_limit() -> None:  # in the launcher only (the supervisor inherits it)
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))

    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json", "--",
         "python3", "-c", MANY_ALIVE, "400"],
        capture_output=True, text=True, timeout=300, preexec_fn=low_limit, check=False,
    )  # fmt: skip
    data = json.loads(proc.stdout) if proc.stdout.strip() else None
    assert data is not None, proc.stderr[-2000:]
    pred = predicate(repo, data["commit"])
    sleeps = processes(pred, ["sleep"])
    # (the refused ones, one entry with their count)
    assert sum(p.get("count") or 1 for p in sleeps) == 400, sleeps[-3:]
    unwatched = [p for p in sleeps if p["decision"] == "allow" and p["exit_code"] is None
                 and p["signal"] is None]  # fmt: skip
    refused = [p for p in sleeps if p["decision"] == "deny"]
    assert not unwatched, (len(unwatched), unwatched[:2])
    assert not refused or data["supervisor_failed"], len(refused)
    # The receipt says what the run's report says.
    assert pred["sandbox"]["supervisor_failed"] == data["supervisor_failed"]
