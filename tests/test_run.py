"""`gatekeeper run` end to end: real repositories, real bubblewrap, the real command line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import git, gk, make_repo, needs_bwrap
from helpers import pids_with, run_json, user_visible_state
from test_supervise import predicate

pytestmark = [needs_bwrap, pytest.mark.sandbox]


def show_receipt(repo: Path, rev: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", rev)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]


def test_write_inside_the_write_set_is_committed_and_in_the_receipt(repo: Path) -> None:
    proc, data = run_json(repo, "sh", "-c", "echo new > src/new.py && printf more >> README.md")
    assert proc.returncode == 0, proc.stderr
    assert data["branch"].startswith("agent/")
    assert git(repo, "show", f"{data['commit']}:src/new.py") == "new\n"
    statement = show_receipt(repo, data["branch"])
    changes = {c["path"]: c for c in statement["predicate"]["changes"]}
    assert changes["src/new.py"]["status"] == "A"
    assert changes["README.md"]["status"] == "M"
    blob = git(repo, "rev-parse", f"{data['commit']}:src/new.py").strip()
    assert changes["src/new.py"]["new_blob"] == blob
    assert statement["subject"][0]["digest"]["gitCommit"] == data["commit"]
    assert statement["predicate"]["counts"]["files_touched"] == 2
    # The raw diff is what git itself reports.
    raw = git(repo, "diff", "--raw", "-M", "--no-abbrev", data["base"], data["commit"])
    assert len(raw.strip().splitlines()) == 2


def test_exit_code_checks_and_json_fields(repo: Path) -> None:
    proc, data = run_json(repo, "sh", "-c", "echo out; exit 7",
                          extra=["--check", "true", "--check", "sh -c 'exit 3'"])  # fmt: skip
    assert proc.returncode == 7
    assert {"run_id", "branch", "commit", "worktree"} <= set(data)
    assert [c["exit_code"] for c in data["checks"]] == [0, 3]
    assert "out" in proc.stderr  # with --json the agent's stdout goes to stderr
    predicate = show_receipt(repo, data["commit"])["predicate"]
    assert predicate["command"] == {"argv": ["sh", "-c", "echo out; exit 7"], "exit_code": 7}
    assert predicate["counts"]["commands_run"] == 3
    assert predicate["counts"]["failed_commands"] == 2


def test_human_summary_names_branch_changes_checks_and_receipt(repo: Path) -> None:
    proc = gk("run", "--repo", str(repo), "--check", "true", "--", "sh", "-c", "echo x > f.txt")
    assert proc.returncode == 0, proc.stderr
    for text in ("branch    agent/", "A f.txt", "check     true  -> ok", "receipt   signed"):
        assert text in proc.stderr


def test_untracked_files_are_committed_ignored_ones_are_not(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", files={".gitignore": "build/\n*.log\n", "a.txt": "a\n"})
    proc, data = run_json(repo, "sh", "-c", "mkdir -p build new && echo 1 > build/out && "
                          "echo 2 > x.log && echo 3 > new/file")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert "new/file" in files and "build/out" not in files and "x.log" not in files


@pytest.mark.parametrize(
    "attack",
    [
        "echo pwned > {checkout}/README.md",
        "echo pwned > {checkout}/new-file",
        "echo pwned > {git}/hooks/pre-commit",
        "echo pwned >> {git}/config",
        "echo deadbeef > {git}/HEAD",
        "echo pwned > {git}/refs/heads/main",
        "rm -f {git}/index",
        "echo pwned > $HOME/../outside",
        "echo pwned > ../../../../../../../tmp/gk-outside-{tag}",
        "ln -s {checkout}/README.md link && echo pwned > link",
        "ln -s {git}/config cfg && echo pwned >> cfg",
        "sh -c 'sh -c \"echo pwned > {checkout}/README.md\"'",
        "(setsid sh -c 'echo pwned > {checkout}/grandchild' &) ; sleep 0.3",
        "python3 -c 'import os; os.system(\"echo pwned > {checkout}/py\")'",
        "git -C {checkout} commit --allow-empty -m pwned",
        "git commit --allow-empty -m pwned",
        "git update-ref refs/heads/main HEAD",
        "echo pwned > .git",
    ],
)
def test_writes_outside_the_boundary_fail_and_change_nothing(repo: Path, attack: str) -> None:
    git_dir = repo / ".git"
    tag = str(os.getpid())
    before = user_visible_state(repo)
    command = attack.format(checkout=repo, git=git_dir, tag=tag) + "; exit 0"
    proc, data = run_json(repo, "sh", "-c", command)
    assert proc.returncode == 0, proc.stderr
    assert user_visible_state(repo) == before
    assert not Path(f"/tmp/gk-outside-{tag}").exists()
    assert not (Path(os.environ["HOME"]).parent / "outside").exists()
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert "README.md" in files
    assert git(repo, "show", f"{data['commit']}:README.md") == "# demo\n"
    assert (
        git(repo, "rev-parse", "refs/heads/main").strip() == git(repo, "rev-parse", "HEAD").strip()
    )


def test_a_symlink_planted_by_the_agent_is_committed_as_a_link_not_followed(repo: Path) -> None:
    proc, data = run_json(repo, "sh", "-c", f"ln -s {repo}/.git/config src/cfg")
    assert proc.returncode == 0
    assert git(repo, "cat-file", "-p", f"{data['commit']}:src/cfg") == f"{repo}/.git/config"
    mode = git(repo, "ls-tree", data["commit"], "src/cfg").split()[0]
    assert mode == "120000"


def test_paths_outside_the_write_set_are_read_only(tmp_path: Path, key: Path) -> None:
    policy = "paths: {read: ['**'], write: ['docs/**']}\n"
    repo = make_repo(tmp_path / "r", policy=policy,
                     files={"src/app.py": "x\n", "docs/a.md": "a\n"})  # fmt: skip
    proc, data = run_json(repo, "sh", "-c",
                          "echo y > src/app.py; echo new > src/b.py; echo z > top.txt; "
                          "echo ok > docs/a.md; mkdir docs/sub && echo ok > docs/sub/c.md")  # fmt: skip
    assert proc.returncode == 0
    assert "Permission denied" in proc.stderr or "Read-only file system" in proc.stderr
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert "src/b.py" not in files and "top.txt" not in files and "docs/sub/c.md" in files
    assert git(repo, "show", f"{data['commit']}:src/app.py") == "x\n"
    assert git(repo, "show", f"{data['commit']}:docs/a.md") == "ok\n"


def test_finer_globs_are_enforced_by_the_mounts_and_recorded_as_denied(
    tmp_path: Path, key: Path
) -> None:
    # A folder that holds both writable and read-only files stays read-only; only the existing
    # files the glob names are bound writable, so a new b.md cannot be created beside them.
    policy = "paths: {read: ['**'], write: ['**/*.md']}\n"
    repo = make_repo(tmp_path / "r", policy=policy, files={"src/app.py": "x\n", "a.md": "a\n"})
    proc, data = run_json(repo, "sh", "-c", "echo y > src/app.py; echo b > b.md; echo b >> a.md")
    assert proc.returncode == 0
    assert "b.md: Read-only file system" in proc.stderr
    assert data["denied_writes"] == ["src/app.py"]
    assert git(repo, "show", f"{data['commit']}:src/app.py") == "x\n"
    predicate = show_receipt(repo, data["commit"])["predicate"]
    assert predicate["counts"]["denied_writes"] == 1
    write = next(w for w in predicate["writes"] if w["path"] == "src/app.py")
    assert write["decision"] == "deny" and write["op"] in ("create", "truncate", "modify")
    assert [c["path"] for c in predicate["changes"]] == ["a.md"]


def test_protected_paths_stay_read_only_under_a_broad_write_set(repo: Path) -> None:
    proc, data = run_json(repo, "sh", "-c",
                          "echo 'paths: {write: [\"**\"]}' > .gatekeeper/policy.yaml; "
                          "mkdir -p .github/workflows && echo x > .github/workflows/ci.yml; exit 0")  # fmt: skip
    assert proc.returncode == 0
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert ".github/workflows/ci.yml" not in files
    assert git(repo, "show", f"{data['commit']}:.gatekeeper/policy.yaml") == git(
        repo, "show", "HEAD:.gatekeeper/policy.yaml"
    )
    denied = set(data["denied_writes"])
    assert ".gatekeeper/policy.yaml" in denied
    assert any(d == ".github" or d.startswith(".github/") for d in denied), denied


def test_only_readable_paths_are_visible(tmp_path: Path, key: Path) -> None:
    policy = "paths: {read: ['src/**'], write: ['src/**']}\n"
    repo = make_repo(
        tmp_path / "r",
        policy=policy,
        files={"src/app.py": "x\n", "private/notes.txt": "p\n", "README.md": "r\n"},
    )
    proc, _ = run_json(
        repo, "sh", "-c", "cat src/app.py; cat README.md; ls private; echo ok > src/z"
    )
    assert proc.returncode != 0 or "No such file" in proc.stderr
    assert "x\n" in proc.stderr
    assert "README.md: No such file" in proc.stderr and "private" in proc.stderr


def test_secrets_are_unreachable(tmp_path: Path, key: Path, isolated_home: Path) -> None:
    repo = make_repo(tmp_path / "r", files={".gitignore": ".env\n", "a.txt": "a\n",
                                             "config/.env.production": "TRACKED_SECRET=1\n"})  # fmt: skip
    (repo / ".env").write_text("CHECKOUT_SECRET=1\n")
    ssh = isolated_home / ".ssh"
    ssh.mkdir()
    (ssh / "id_ed25519").write_text("PRIVATE KEY MATERIAL\n")
    (isolated_home / ".netrc").write_text("machine x login y password z\n")
    key_text = key.read_text()
    probe = (
        "env; cat .env config/.env.production; cat $HOME/.ssh/id_ed25519 "
        f"{isolated_home}/.ssh/id_ed25519 {isolated_home}/.netrc {key} {repo}/.env; "
        "ls -la $HOME; cat /etc/shadow; exit 0"
    )
    proc, data = run_json(repo, "sh", "-c", probe, env={"AWS_SECRET_ACCESS_KEY": "launch-secret",
                                                         "GITHUB_TOKEN": "gh-secret"})  # fmt: skip
    assert proc.returncode == 0
    out = proc.stderr
    for secret in (
        "launch-secret",
        "gh-secret",
        "PRIVATE KEY MATERIAL",
        "password z",
        "TRACKED_SECRET",
        "CHECKOUT_SECRET",
        key_text.splitlines()[1],
        "root:",
    ):
        assert secret not in out, secret
    assert "AWS_SECRET_ACCESS_KEY" not in out and "SSH_AUTH_SOCK" not in out
    # A masked file is not committed as emptied: the result keeps the tracked content.
    assert git(repo, "show", f"{data['commit']}:config/.env.production") == "TRACKED_SECRET=1\n"


def test_toolchains_on_path_under_home_stay_usable(
    tmp_path: Path, key: Path, isolated_home: Path
) -> None:
    repo = make_repo(tmp_path / "r")
    tool_bin = isolated_home / ".mytool" / "bin"
    tool_bin.mkdir(parents=True)
    tool = tool_bin / "mytool"
    tool.write_text("#!/bin/sh\necho tool-works\n")
    tool.chmod(0o755)
    (isolated_home / "diary.txt").write_text("private\n")
    env = {"PATH": f"{tool_bin}:{os.environ['PATH']}"}
    proc, _ = run_json(repo, "sh", "-c", "mytool; cat $HOME/diary.txt; touch $HOME/.mytool/x",
                       env=env)  # fmt: skip
    assert "tool-works" in proc.stderr
    assert "private" not in proc.stderr
    assert not (isolated_home / ".mytool" / "x").exists()


def test_read_only_git_works_inside(repo: Path) -> None:
    proc, _ = run_json(repo, "sh", "-c", "echo z >> README.md; git status --short; git log --oneline; "
                       "git diff --stat")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert " M README.md" in proc.stderr and "initial" in proc.stderr


def test_no_network_inside(repo: Path) -> None:
    proc, _ = run_json(
        repo,
        "sh",
        "-c",
        "cat /proc/net/dev | grep -c : ; ip -o link 2>/dev/null; "
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9), 1)'",
    )
    assert proc.returncode != 0
    assert "Connection refused" in proc.stderr or "unreachable" in proc.stderr.lower()


def test_process_hygiene(repo: Path) -> None:
    proc, _ = run_json(repo, "sh", "-c", "grep -E '^(NoNewPrivs|CapEff|Seccomp):' /proc/self/status;"
                       " echo pid=$$; ps -e 2>/dev/null | wc -l")  # fmt: skip
    assert "NoNewPrivs:\t1" in proc.stderr
    assert "CapEff:\t0000000000000000" in proc.stderr
    assert "Seccomp:\t2" in proc.stderr


def test_background_process_does_not_outlive_the_run(repo: Path) -> None:
    marker = f"sleep {1000 + os.getpid() % 1000}.5"
    proc, _ = run_json(repo, "sh", "-c", f"(setsid nohup {marker} >/dev/null 2>&1 &); "
                       f"nohup {marker} >/dev/null 2>&1 & echo started")  # fmt: skip
    assert proc.returncode == 0
    deadline = time.time() + 5
    while pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert pids_with(marker) == []


def test_timeout_kills_the_run_and_is_recorded(repo: Path) -> None:
    start = time.monotonic()
    proc, data = run_json(repo, "sh", "-c", "echo before > f; sleep 60", extra=["--timeout", "2"])
    assert time.monotonic() - start < 30
    assert proc.returncode == 124
    predicate = show_receipt(repo, data["commit"])["predicate"]
    assert predicate["sandbox"]["timed_out"] is True
    assert predicate["sandbox"]["interrupted"] is False
    assert predicate["command"]["exit_code"] is None
    assert predicate["command"]["signal_name"] == "SIGKILL"
    assert {p["argv"][0]: p["signal_name"] for p in predicate["processes"]} == {
        "sh": "SIGKILL", "sleep": "SIGKILL"}  # fmt: skip
    assert git(repo, "show", f"{data['commit']}:f") == "before\n"
    shown = gk("receipt", "show", "--repo", str(repo), data["commit"])
    assert "-> did not finish (timed out; killed by SIGKILL, signal 9)" in shown.stdout


def test_killing_the_launcher_leaves_nothing_running_and_discard_cleans_up(repo: Path) -> None:
    marker = f"sleep {2000 + os.getpid() % 1000}.25"
    before = user_visible_state(repo)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--", "sh", "-c",
         f"echo partial > p.txt; {marker}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 30
    while not pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert pids_with(marker), "the agent never started"
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    deadline = time.time() + 5
    while pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert pids_with(marker) == []
    assert user_visible_state(repo) == before
    assert "agent/" in git(repo, "branch", "--list", "agent/*")
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "branch", "--list", "agent/*").strip() == ""
    assert "gatekeeper" not in git(repo, "worktree", "list")
    assert user_visible_state(repo) == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_still_commits_and_signs(repo: Path, signum: signal.Signals) -> None:
    """A run the launcher is told to stop is committed and signed, and its receipt says so:
    interrupted, by which signal, and every process still running then killed by SIGKILL.
    The launcher's own exit status is 128 + the signal it got, as a shell's would be."""
    marker = f"sleep {3000 + os.getpid() % 1000}.75"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json", "--", "sh", "-c",
         f"echo partial > p.txt; {marker}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 30
    while not pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    launcher.send_signal(signum)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signum, err
    data = json.loads(out)
    assert data["interrupted"] is True and data["interrupted_by"] == signum.name
    assert git(repo, "show", f"{data['commit']}:p.txt") == "partial\n"
    predicate = show_receipt(repo, data["commit"])["predicate"]
    assert predicate["command"] == {
        "argv": ["sh", "-c", f"echo partial > p.txt; {marker}"],
        "exit_code": None,
        "signal": 9,
        "signal_name": "SIGKILL",
    }
    assert predicate["sandbox"]["interrupted"] is True
    assert predicate["sandbox"]["interrupted_by"] == signum.name
    assert not predicate["sandbox"]["timed_out"]
    ends = {p["argv"][0]: (p["exit_code"], p["signal_name"], p["killed"])
            for p in predicate["processes"]}  # fmt: skip
    assert ends == {"sh": (None, "SIGKILL", True), "sleep": (None, "SIGKILL", True)}
    assert predicate["counts"]["failed_commands"] == 2
    shown = gk("receipt", "show", "--repo", str(repo), data["commit"])
    assert (f"-> did not finish (interrupted by {signum.name}; killed by SIGKILL, signal 9)"
            in shown.stdout), shown.stdout  # fmt: skip


def test_the_user_checkout_is_byte_for_byte_unchanged(repo: Path) -> None:
    (repo / "dirty.txt").write_text("uncommitted work\n")
    git(repo, "add", "dirty.txt")
    (repo / "untracked.txt").write_text("mine\n")
    before = user_visible_state(repo)
    proc, data = run_json(repo, "sh", "-c", "echo a > a; git status; rm -f README.md")
    assert proc.returncode == 0
    assert user_visible_state(repo) == before
    assert git(repo, "rev-parse", "HEAD").strip() == data["base"]


def test_run_from_another_base_and_named_branch(repo: Path) -> None:
    first = git(repo, "rev-parse", "HEAD").strip()
    (repo / "later.txt").write_text("later\n")
    git(repo, "add", "later.txt")
    git(repo, "commit", "-qm", "later")
    proc, data = run_json(repo, "sh", "-c", "test ! -e later.txt && echo ok > b",
                          extra=["--base", first, "--branch", "agent/named"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert data["branch"] == "agent/named" and data["base"] == first
    proc, _ = run_json(repo, "true", extra=["--branch", "agent/named"])
    assert proc.returncode == 2 and "already exists" in proc.stderr


@pytest.mark.parametrize("name", ["HEAD", "-x"])
def test_a_branch_name_git_would_not_check_out_is_refused(repo: Path, name: str) -> None:
    # `git worktree add` takes such a name as a commit (HEAD: the user's) or an option.
    before = user_visible_state(repo)
    proc, _ = run_json(repo, "true", extra=[f"--branch={name}"])
    assert proc.returncode == 2 and "is not a valid branch name" in proc.stderr, proc.stderr
    assert user_visible_state(repo) == before
    assert git(repo, "for-each-ref", "refs/heads/").count("\n") == 1
    assert git(repo, "worktree", "list").count("\n") == 1


def test_missing_base_revision_is_a_clear_error(repo: Path) -> None:
    proc, _ = run_json(repo, "true", extra=["--base", "no-such-branch"])
    assert proc.returncode == 2
    assert "revision 'no-such-branch' does not name a commit" in proc.stderr
    assert git(repo, "branch", "--list", "agent/*").strip() == ""


def test_broken_policy_is_a_clear_error(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy="paths:\n  write: ['../up']\n  wirte: []\n")
    proc, _ = run_json(repo, "true")
    assert proc.returncode == 2
    assert ".gatekeeper/policy.yaml at" in proc.stderr
    assert "paths.write" in proc.stderr and "paths.wirte: unknown key" in proc.stderr
    assert git(repo, "branch", "--list", "agent/*").strip() == ""


def test_policy_path_through_a_symlink_out_of_the_repo_is_rejected(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "r", policy="paths: {write: ['out/**']}\n")
    os.symlink("/etc", repo / "out")
    git(repo, "add", "out")
    git(repo, "commit", "-qm", "link")
    proc, _ = run_json(repo, "true")
    assert proc.returncode == 2
    assert "resolves through a symlink" in proc.stderr
    assert git(repo, "branch", "--list", "agent/*").strip() == ""


def test_missing_bubblewrap_exits_125_with_a_remedy(repo: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "sh", "true"):
        target = subprocess.run(["which", tool], capture_output=True, text=True)
        os.symlink(target.stdout.strip(), bin_dir / tool)
    proc, _ = run_json(repo, "true", env={"PATH": str(bin_dir)})
    assert proc.returncode == 125
    assert "bubblewrap (bwrap) is not installed" in proc.stderr and "apt-get install" in proc.stderr
    assert git(repo, "branch", "--list", "agent/*").strip() == ""


def test_a_git_folder_it_cannot_write_is_a_clear_error(repo: Path) -> None:
    """Where the run's record cannot be written (a repository this user may only read), the
    run stops before anything is made, with what to do: no traceback."""
    (repo / ".git" / "gatekeeper").mkdir(exist_ok=True)
    runs = repo / ".git" / "gatekeeper" / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    runs.write_text("in the way\n")  # as unwritable as a folder of another user's
    proc = gk("run", "--repo", str(repo), "--", "true")
    assert proc.returncode == 2, proc.stderr
    assert "cannot record the run in" in proc.stderr and "Traceback" not in proc.stderr
    assert "run gatekeeper as a user who may write there" in proc.stderr
    assert git(repo, "branch", "--list", "agent/*").strip() == ""


def test_a_repository_of_another_user_is_named_as_such(tmp_path: Path, key: Path) -> None:
    """git's safe.directory refusal is told as what it is, with git's own way out, not as
    `not a git repository`."""
    if os.geteuid() != 0:
        pytest.skip("giving the repository to another user needs root")
    repo = make_repo(tmp_path / "theirs")
    subprocess.run(["chown", "-R", "54321:54321", str(repo)], check=True)
    for args in (["runs", "--repo", str(repo)], ["check", "--repo", str(repo), "HEAD"]):
        proc = gk(*args)
        assert proc.returncode == 2, proc.stderr
        assert "the repository belongs to another user" in proc.stderr, proc.stderr
        assert f"safe.directory {repo}" in proc.stderr and "Traceback" not in proc.stderr


def test_a_sha256_repository_is_named_as_such(tmp_path: Path, key: Path) -> None:
    """Every object id gatekeeper reads, writes into a receipt and checks is 40 hex digits: a
    repository of SHA-256 names is refused up front, saying so (check said `main` did not
    name a commit)."""
    repo = tmp_path / "r256"
    subprocess.run(["git", "init", "-q", "--object-format=sha256", "-b", "main", str(repo)],
                   check=True)  # fmt: skip
    git(repo, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty",
        "-m", "base")  # fmt: skip
    for args in (["run", "--repo", str(repo), "--", "true"],
                 ["check", "--repo", str(repo), "--base", "main", "HEAD"],
                 ["runs", "--repo", str(repo)]):  # fmt: skip
        proc = gk(*args)
        assert proc.returncode == 2, proc.stderr
        assert "names its objects with sha256" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert git(repo, "branch", "--list", "agent/*").strip() == ""


def test_a_line_break_in_the_repositorys_path_cannot_shift_what_is_read(tmp_path: Path) -> None:
    """git answers one line a question: a repository (of SHA-256 names) at `S\ntrue\nsha1`
    was read as a SHA-1 repository at `S`."""
    repo = tmp_path / "nl" / "S\ntrue\nsha1"
    subprocess.run(["git", "init", "-q", "--bare", "--object-format=sha256", str(repo)],
                   check=True)  # fmt: skip
    proc = gk("runs", "--repo", str(repo))
    assert proc.returncode == 2, proc.stderr
    assert "line break in its path" in proc.stderr and "Traceback" not in proc.stderr


def test_a_repository_named_by_its_git_dir_or_one_git_cannot_open(
    tmp_path: Path, key: Path
) -> None:
    """`--repo` naming a checkout's .git folder means that checkout (it ended in git's raw
    `this operation must be run in a work tree`); a git dir with no checkout of its own is
    refused saying so; a repository git cannot open says what git says (an unknown object
    format was `not inside a git repository`)."""
    repo = make_repo(tmp_path / "r")
    for inside in (repo / ".git", repo / ".git" / "objects"):
        proc = gk("runs", "--repo", str(inside))
        assert proc.returncode == 0, proc.stderr
        found = gk("check", "--repo", str(inside), "--base", "main", "main")
        assert "this operation must be run in a work tree" not in found.stderr, found.stderr
        assert "Traceback" not in found.stderr
    separate = tmp_path / "sep.git"
    subprocess.run(["git", "init", "-q", f"--separate-git-dir={separate}", str(tmp_path / "w")],
                   check=True)  # fmt: skip
    proc = gk("runs", "--repo", str(separate))
    assert proc.returncode == 2, proc.stderr
    assert "not in a checkout" in proc.stderr and "Traceback" not in proc.stderr
    odd = tmp_path / "odd"
    subprocess.run(["git", "init", "-q", str(odd)], check=True)
    git(odd, "config", "core.repositoryformatversion", "1")
    git(odd, "config", "extensions.objectformat", "md5")
    proc = gk("runs", "--repo", str(odd))
    assert proc.returncode == 2, proc.stderr
    assert "git cannot open the repository" in proc.stderr and "md5" in proc.stderr, proc.stderr
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = gk("runs", "--repo", str(plain))
    assert proc.returncode == 2 and "not inside a git repository" in proc.stderr, proc.stderr


@needs_bwrap
def test_a_checkout_whose_git_dir_is_a_folder_named_git_elsewhere(
    tmp_path: Path, key: Path
) -> None:
    """A checkout whose git dir is elsewhere in a folder named `.git` (made with
    --separate-git-dir, or a `.git` symlink) is that checkout, not the git dir's parent:
    `init` writes its policy there, a run commits from there, and its writes to the checkout
    are refused (they were writes to a folder the run did not count as the user's)."""
    separate = tmp_path / "store" / ".git"
    checkout = tmp_path / "w"
    separate.parent.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", f"--separate-git-dir={separate}",
                    str(checkout)], check=True)  # fmt: skip
    linked = tmp_path / "co"
    other = make_repo(tmp_path / "src")
    (tmp_path / "s2").mkdir()
    shutil.move(other / ".git", tmp_path / "s2" / ".git")
    shutil.copytree(other, linked)
    (linked / ".git").symlink_to(tmp_path / "s2" / ".git")
    (checkout / "README.md").write_text("# demo\n")
    proc = gk("init", "--repo", str(checkout), "--no-hooks")
    assert proc.returncode == 0, proc.stderr
    assert (checkout / ".gatekeeper" / "policy.yaml").is_file()
    assert not (tmp_path / "store" / ".gatekeeper").exists()
    git(checkout, "add", "-A")
    git(checkout, "commit", "-q", "-m", "initial")
    for repo in (checkout, linked):
        script = f"echo new > made.txt; echo bad >> {repo}/README.md"
        proc, data = run_json(repo, "sh", "-c", script)
        assert data["exit_code"] != 0, data
        assert (repo / "README.md").read_text() == "# demo\n"
        assert "made.txt" in git(repo, "show", "--name-only", "--format=", data["branch"])
        check = gk("check", "--repo", str(repo), "--base", "main", data["branch"])
        assert check.returncode == 0 and "PASS" in check.stdout, check.stdout + check.stderr


def test_file_size_limit(tmp_path: Path, key: Path) -> None:
    repo = make_repo(
        tmp_path / "r", policy="paths: {write: ['**']}\nlimits: {max_file_size: 4096}\n"
    )
    proc, data = run_json(repo, "sh", "-c", "head -c 100000 /dev/zero > big; ls -l big")
    assert "File size limit exceeded" in proc.stderr or "File too large" in proc.stderr
    assert os.path.getsize(Path(data["worktree"]) / "big") <= 4096


def test_file_size_limit_is_the_sandboxs_not_the_supervisors(tmp_path: Path, key: Path) -> None:
    """The cap is the agent's: the supervisor's own log of many commands grows past it, and
    the run goes on; a grandchild's write past it still fails."""
    repo = make_repo(
        tmp_path / "r", policy="paths: {write: ['**']}\nlimits: {max_file_size: 4096}\n"
    )
    script = (
        "for i in $(seq 200); do /bin/true; done; echo small > s.txt; "
        "sh -c 'sh -c \"head -c 100000 /dev/zero > big\"'; exit 0"
    )
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["exit_code"] == 0 and not data["supervisor_failed"], data
    assert "s.txt" in git(repo, "show", "--name-only", "--format=", data["branch"])
    assert os.path.getsize(Path(data["worktree"]) / "big") <= 4096
    processes = predicate(repo, data["branch"])["processes"]
    assert sum(p["argv"] == ["/bin/true"] for p in processes) == 200


def test_what_the_supervisor_tells_the_agent_is_under_the_agents_file_size_cap(
    tmp_path: Path, key: Path
) -> None:
    """The supervisor writes the reason for a refused external command into the agent's own
    standard error: where that is a file at an offset past the cap, the write fails as the
    agent's own would, never growing the file past the cap."""
    repo = make_repo(
        tmp_path / "r",
        policy="paths: {write: ['**']}\ncommands: {external: ['git push']}\n"
        "limits: {max_file_size: 4096}\n",
    )
    script = (
        "import os, subprocess\n"
        "def push(fd):\n"
        "    try:\n"
        "        subprocess.run(['git', 'push', 'origin', 'main'], stderr=fd)\n"
        "    except PermissionError:\n"
        "        pass  # refused: the exec fails\n"
        "far = os.open('far.log', os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "os.lseek(far, 1 << 20, os.SEEK_SET)\n"
        "push(far)\n"
        "push(os.open('near.log', os.O_WRONLY | os.O_CREAT, 0o644))\n"
    )
    proc, data = run_json(repo, "python3", "-c", script)
    assert proc.returncode == 0, proc.stderr
    worktree = Path(data["worktree"])
    assert os.path.getsize(worktree / "far.log") == 0
    assert "writes outside this repository" in (worktree / "near.log").read_text()
    assert any(e["kind"] == "external-write" for e in data["escalations"]), data["escalations"]


def test_process_limit(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy="limits: {max_processes: 16}\n")
    script = "for i in $(seq 40); do sleep 5 & done; echo all-forked"
    proc, data = run_json(repo, "sh", "-c", script)
    assert "Cannot fork" in proc.stderr and "all-forked" not in proc.stderr
    assert data["exit_code"] != 0


def test_runs_lists_the_counts_of_a_run_whose_receipt_is_megabytes(repo: Path) -> None:
    """A run that adds 3,000 files has a receipt over a megabyte: `runs` still shows what it
    says (the listing reads a note as far as the gate does)."""
    proc, data = run_json(repo, "sh", "-c",
                          "mkdir -p out && for i in $(seq 3000); do echo $i > out/file-$i.txt; done")  # fmt: skip
    assert proc.returncode == 0 and data is not None, proc.stderr
    note = git(repo, "notes", "--ref=refs/notes/gatekeeper", "show", data["commit"])
    assert len(note) > 1 << 20
    listed = gk("runs", "--repo", str(repo), "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = [r for r in json.loads(listed.stdout) if r["run_id"] == data["run_id"]]
    assert row["counts"]["files_touched"] == 3000, row


@needs_bwrap
def test_a_plain_runs_reads_ahead_fail_as_the_reads_would(tmp_path: Path, key: Path) -> None:
    """`python -m gatekeeper run` reads the repository, the base and its policy while the
    launcher loads: each failure is still the error it was, nothing is created, and the policy
    read ahead is the one the run enforces (a change to the file after the commit is not)."""
    default = (Path(__file__).parent.parent / "policies" / "default.yaml").read_text()
    narrow = default.replace('write: ["**"]', 'write: ["src/**"]', 1)
    assert narrow != default
    repo = make_repo(tmp_path / "repo", narrow, files={"a.txt": "a\n"})
    plain = tmp_path / "plain"
    plain.mkdir()
    cases = [
        (["--repo", str(tmp_path / "missing")], "does not exist"),
        (["--repo", str(plain)], "not inside a git repository"),
        (["--repo", str(repo), "--base", "no-such-rev"], "no-such-rev"),
    ]
    bare = make_repo(tmp_path / "nopolicy", files={"b.txt": "b\n"})
    git(bare, "rm", "-q", "-r", ".gatekeeper")
    git(bare, "commit", "-q", "-m", "no policy")
    cases.append((["--repo", str(bare)], "no policy at the base revision"))
    for args, said in cases:
        proc = gk("run", *args, "--", "true")
        assert proc.returncode == 2, proc.stderr
        assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    for made in (repo, bare):
        assert git(made, "branch", "--list", "agent/*") == ""
    # The committed policy allows no writes to a.txt; the checkout's copy (uncommitted) would.
    (repo / ".gatekeeper" / "policy.yaml").write_text(default)
    proc = gk("run", "--repo", str(repo), "--json", "--", "sh", "-c", "echo x > a.txt")
    assert "cannot create a.txt: Permission denied" in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)  # (the command's own exit code, sh's 2)
    assert out["exit_code"] == 2 and out["changes"] == [], out
