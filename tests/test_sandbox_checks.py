"""Checks run on the committed result in a fresh worktree; bind sources never follow a link."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gatekeeper.policy.model import parse_policy
from gatekeeper.run.worktree import create_worktree, new_run_id
from gatekeeper.sandbox.launch import Sandbox
from gatekeeper.sandbox.limits import ProcessLimit
from gatekeeper.sandbox.mounts import plan_sandbox

from conftest import git, gk, make_repo, needs_bwrap
from helpers import pids_with, run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

SECRET = "HOST-SSH-PRIVATE-KEY-MATERIAL"


def _plant_when_ready(worktrees: Path, secret_dir: Path, done: threading.Event) -> None:
    """Replace the worktree's docs folder by a relative symlink to secret_dir, as an agent that
    beat the supervisor would (the mounts now stop the rename inside, so it is done outside)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not done.is_set():
        for ready in worktrees.glob("*/*/ready"):
            tree = ready.parent
            os.rename(tree / "docs", tree / "docs-moved")
            os.symlink(os.path.relpath(secret_dir, tree), tree / "docs")
            (tree / "go").write_text("")
            return
        time.sleep(0.05)


def test_a_symlink_planted_by_the_agent_does_not_reach_a_check(
    tmp_path: Path, key: Path, isolated_home: Path
) -> None:
    # docs/.gitattributes is protected, so a plan binds it read-only by its path. The agent's
    # docs folder becomes a relative symlink to the launcher's HOME while the agent runs.
    # Resolved on the host, a bind's source through it is a file of the host; resolved inside,
    # its destination is in the sandbox's HOME, where the check reads it through the same link.
    repo = make_repo(tmp_path / "r", files={"docs/.gitattributes": "* text\n", "a.txt": "a\n"})
    (isolated_home / ".gitattributes").write_text(SECRET + "\n")
    done = threading.Event()
    planter = threading.Thread(
        target=_plant_when_ready,
        args=(isolated_home / ".local" / "share" / "gatekeeper" / "worktrees", isolated_home,
              done),
    )  # fmt: skip
    planter.start()
    agent = "touch ready; while [ ! -e go ]; do sleep 0.05; done; rm -f ready go; ls -la; exit 0"
    check = "sh -c 'cat docs/.gitattributes > leak.txt; cat docs/.gitattributes; exit 0'"
    try:
        proc, data = run_json(repo, "sh", "-c", agent, extra=["--check", check], timeout=120)
    finally:
        done.set()
        planter.join()
    assert proc.returncode == 0, proc.stderr
    assert "docs -> " in proc.stderr  # the link was there while the agent ran
    assert SECRET not in proc.stderr and SECRET not in proc.stdout
    assert data["checks"] == [{"argv": ["sh", "-c", check[7:-1]], "exit_code": 0}]
    for commit in git(repo, "rev-list", "--all").split():
        assert SECRET not in git(repo, "grep", "-I", "-c", SECRET, commit, check=False)
    # What checks write is not committed: they are checks.
    assert "leak.txt" not in git(repo, "ls-tree", "-r", "--name-only", data["commit"])


def test_checks_run_on_the_committed_result_and_their_writes_are_not_committed(
    repo: Path,
) -> None:
    # The agent leaves an ignored file and an untracked one; the check sees only what was
    # committed, and what it writes itself goes nowhere.
    (repo / ".gitignore").write_text("ignored.txt\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore")
    agent = "echo new > src/new.py; echo ign > ignored.txt"
    check = ("sh -c 'test -f src/new.py && test ! -e ignored.txt && echo check > c.txt && "
             "git log --oneline -1'")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", agent, extra=["--check", check, "--check", "true"])
    assert proc.returncode == 0, proc.stderr
    assert [c["exit_code"] for c in data["checks"]] == [0, 0]
    assert "gatekeeper run" in proc.stderr  # the check's git saw the result commit
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert "src/new.py" in files and "c.txt" not in files
    statement = json.loads(gk("receipt", "show", "--repo", str(repo), "--json",
                              data["commit"]).stdout)[0]["statement"]  # fmt: skip
    assert [c["exit_code"] for c in statement["predicate"]["checks"]] == [0, 0]
    argvs = [p["argv"] for p in statement["predicate"]["processes"]]
    assert ["true"] in argvs


def test_bind_sources_are_opened_without_following_links(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", files={"src/a.py": "a\n", "lib/b.py": "b\n"})
    policy = parse_policy(b"paths: {read: ['src/**', 'lib/**'], write: ['src/**']}\n", "p.yaml")
    head = git(repo, "rev-parse", "HEAD").strip()
    run_id = new_run_id()
    wt = create_worktree(repo / ".git", head, f"agent/{run_id}", run_id)
    # The folder the plan makes writable is a symlink to a read-only one by now.
    os.rename(wt.path / "src", wt.path / "src-moved")
    os.symlink("lib", wt.path / "src")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    plan = plan_sandbox(worktree=wt.path, git_common_dir=repo / ".git", policy=policy,
                        run_id=run_id, scratch=scratch, private_dirs=[], user_checkout=repo)  # fmt: skip
    args = plan.args
    for i, arg in enumerate(args):
        if arg in ("--bind", "--ro-bind"):
            assert not args[i + 1].startswith(str(wt.path) + "/"), args[i : i + 3]
        if arg in ("--bind-fd", "--ro-bind-fd"):
            # The object bound is the one at the destination, reached without a link.
            assert os.readlink(f"/proc/self/fd/{args[i + 1]}") == args[i + 2], args[i : i + 3]
    assert "src" not in plan.writable
    limit = ProcessLimit(run_id, 64)
    sandbox = Sandbox(plan, max_file_size=1 << 20, process_limit=limit)
    out = tmp_path / "out.txt"
    try:
        with out.open("wb") as fh:
            sandbox.run(["sh", "-c", "echo x > src/b.py; echo y > lib/b.py; exit 0"],
                        deadline=time.monotonic() + 60, stdout=fh)  # fmt: skip
    finally:
        sandbox.close()
        limit.remove()
    assert (wt.path / "lib" / "b.py").read_text() == "b\n"


def test_an_interrupt_during_a_check_still_signs_the_receipt(repo: Path) -> None:
    marker = f"sleep {4000 + os.getpid() % 1000}.25"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json",
         "--check", marker, "--check", "true", "--", "sh", "-c", "echo done > d.txt"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 30
    while not pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=60)
    data = json.loads(out)
    assert data is not None, err
    assert launcher.returncode == 130, err  # interrupted, even though the agent had exited 0
    assert [c["exit_code"] for c in data["checks"]] == [None]  # the second never started
    assert git(repo, "show", f"{data['commit']}:d.txt") == "done\n"
    statement = json.loads(gk("receipt", "show", "--repo", str(repo), "--json",
                              data["commit"]).stdout)[0]["statement"]  # fmt: skip
    assert statement["predicate"]["checks"] == [
        {"argv": marker.split(), "exit_code": None, "signal": 9, "signal_name": "SIGKILL"}
    ]
    assert statement["predicate"]["command"]["exit_code"] == 0  # the agent had finished
    assert statement["predicate"]["sandbox"]["interrupted_by"] == "SIGINT"
    assert not pids_with(marker)
