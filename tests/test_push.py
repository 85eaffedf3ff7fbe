"""The server hook over a real transport: `git daemon` on loopback, `git push` from a clone.

Every case pushes real objects: the hook reads them from quarantine, and reads receipts from
the refs/notes/gatekeeper pushed alongside.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fixtures.gate_receipts import (
    attach,
    commit_files,
    git_dir_of,
    make_receipt,
    receipted_commit,
    sign,
)
from fixtures.gitserver import GitDaemon, start_daemon

from gatekeeper.receipt.keys import generate_key
from gatekeeper.receipt.notes import NOTES_REF
from gatekeeper.receipt.sync import sync_notes

from conftest import git, gk, make_repo, needs_bwrap

pytestmark = pytest.mark.slow
ZERO = "0" * 40


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitDaemon]:
    served = start_daemon(tmp_path_factory.mktemp("served"), tmp_path_factory.mktemp("daemon-home"))
    yield served
    served.stop()


class Setup:
    """A bare repository served by the daemon with the pre-receive hook, and a clone of it."""

    def __init__(self, daemon: GitDaemon, tmp_path: Path, name: str) -> None:
        self.daemon = daemon
        seed = make_repo(tmp_path / "seed")
        self.name = f"{name}.git"
        self.bare = daemon.path(self.name)
        if self.bare.exists():
            shutil.rmtree(self.bare)
        git(tmp_path, "clone", "-q", "--bare", str(seed), str(self.bare))
        proc = gk("hooks", "install", "--server", str(self.bare))
        assert proc.returncode == 0, proc.stderr
        self.clone = tmp_path / "clone"
        git(tmp_path, "clone", "-q", daemon.url(self.name), str(self.clone))
        proc = gk("init", "--repo", str(self.clone), "--no-hooks")
        assert proc.returncode == 0, proc.stderr

    def push(self, *refspecs: str) -> subprocess.CompletedProcess[str]:
        """`git push origin REFSPEC...` from the clone over git://."""
        return run_git(self.clone, "push", "origin", *refspecs)

    def server_rev(self, ref: str) -> str | None:
        out = git(self.bare, "rev-parse", "--verify", "--quiet", ref, check=False).strip()
        return out or None


def run_git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"], GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=120
    )


def assert_accepted(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"push was refused:\n{proc.stderr}"


def assert_blocked(proc: subprocess.CompletedProcess[str], *kinds: str) -> None:
    assert proc.returncode != 0, f"push was accepted:\n{proc.stderr}"
    assert "pre-receive hook declined" in proc.stderr, proc.stderr
    for kind in kinds:
        assert f"remote: gatekeeper:   {kind}" in proc.stderr, f"no {kind} in:\n{proc.stderr}"


@pytest.fixture
def setup(daemon: GitDaemon, tmp_path: Path, key: Path, request: pytest.FixtureRequest) -> Setup:
    return Setup(daemon, tmp_path, request.node.name.replace("[", "-").replace("]", ""))


PUSH = ("HEAD:refs/heads/main", f"{NOTES_REF}:{NOTES_REF}")


def test_a_clean_agent_branch_is_accepted_with_its_receipts(setup: Setup) -> None:
    commit = receipted_commit(setup.clone, {"src/feature.py": "def f():\n    return 1\n"})
    assert setup.server_rev(NOTES_REF) is None  # the receipts arrive in this very push
    proc = setup.push(*PUSH)
    assert_accepted(proc)
    assert "refs/heads/main: PASS (1 receipt(s) verified, 0 finding(s))" in proc.stderr
    assert setup.server_rev("refs/heads/main") == commit
    assert setup.server_rev(NOTES_REF) is not None


def test_an_extra_commit_after_the_run_is_blocked(setup: Setup) -> None:
    receipted_commit(setup.clone, {"src/feature.py": "x = 1\n"})
    commit_files(setup.clone, {"src/app.py": "print('edited by hand')\n"}, message="human edit")
    before = setup.server_rev("refs/heads/main")
    assert_blocked(setup.push(*PUSH), "uncovered-commit", "unclaimed-change")
    assert setup.server_rev("refs/heads/main") == before


def test_an_amended_agent_commit_is_blocked(setup: Setup) -> None:
    receipted_commit(setup.clone, {"src/feature.py": "x = 1\n"})
    (setup.clone / "src/feature.py").write_text("x = 2  # amended\n")
    git(setup.clone, "commit", "-q", "-a", "--amend", "--no-edit")
    assert_blocked(setup.push(*PUSH), "uncovered-commit", "unclaimed-change")


def test_an_amended_commit_whose_note_was_carried_over_is_blocked(setup: Setup) -> None:
    receipted_commit(setup.clone, {"src/feature.py": "x = 1\n"})
    (setup.clone / "src/feature.py").write_text("x = 2  # amended\n")
    git(
        setup.clone,
        "-c",
        f"notes.rewriteRef={NOTES_REF}",
        "commit",
        "-q",
        "-a",
        "--amend",
        "--no-edit",
    )
    assert_blocked(setup.push(*PUSH), "result-mismatch", "uncovered-commit")


def test_an_edited_receipt_is_blocked(setup: Setup) -> None:
    commit = receipted_commit(setup.clone, {"src/feature.py": "x = 1\n"})
    line = git(setup.clone, "notes", f"--ref={NOTES_REF}", "show", commit).strip()
    envelope = json.loads(line)
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["predicate"]["command"]["exit_code"] = 0
    payload["predicate"]["command"]["argv"] = ["a", "harmless", "command"]
    envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    git(setup.clone, "notes", f"--ref={NOTES_REF}", "add", "-f", "-m", json.dumps(envelope), commit)
    assert_blocked(setup.push(*PUSH), "bad-signature", "no-receipt")


def test_a_receipt_signed_by_an_untrusted_key_is_blocked(setup: Setup, tmp_path: Path) -> None:
    stranger = generate_key(tmp_path / "stranger" / "key.pem")
    commit = commit_files(
        setup.clone, {"src/feature.py": "x = 1\n"}, branch="agent/1", start="main"
    )
    attach(setup.clone, commit, sign(make_receipt(setup.clone, commit), stranger))
    assert_blocked(setup.push(*PUSH), "untrusted-key", "no-receipt")


def test_a_removed_receipt_is_blocked(setup: Setup) -> None:
    commit = receipted_commit(setup.clone, {"src/feature.py": "x = 1\n"})
    git(setup.clone, "notes", f"--ref={NOTES_REF}", "remove", commit)
    assert_blocked(setup.push(*PUSH), "no-receipt", "uncovered-commit")


def test_a_receipt_left_behind_is_blocked(setup: Setup) -> None:
    receipted_commit(setup.clone, {"src/feature.py": "x = 1\n"})
    assert_blocked(setup.push("HEAD:refs/heads/main"), "no-receipt")


def test_a_rename_reported_as_a_modification_is_blocked(setup: Setup) -> None:
    commit = commit_files(
        setup.clone, {}, renames={"src/app.py": "src/main.py"}, branch="agent/1", start="main"
    )
    statement = make_receipt(setup.clone, commit, mutate=_rename_as_modification)
    attach(setup.clone, commit, sign(statement))
    assert_blocked(setup.push(*PUSH), "change-differs", "unclaimed-change")


def _rename_as_modification(data: dict[str, Any]) -> None:
    (change,) = data["predicate"]["changes"]
    assert change["status"] == "R"
    change.update(status="M", old_path=None, score=None, old_mode="100644")


def test_a_mode_change_not_in_the_receipt_is_blocked(setup: Setup) -> None:
    commit = commit_files(
        setup.clone, {}, chmod={"src/app.py": 0o755}, branch="agent/1", start="main"
    )

    def hide_mode(data: dict[str, Any]) -> None:
        for change in data["predicate"]["changes"]:
            change["new_mode"] = change["old_mode"]

    attach(setup.clone, commit, sign(make_receipt(setup.clone, commit, mutate=hide_mode)))
    proc = setup.push(*PUSH)
    assert_blocked(proc, "change-differs")
    assert "mode is 100755 in the diff, 100644 in the receipt" in proc.stderr


def test_a_symlink_swapped_for_a_file_is_blocked(setup: Setup) -> None:
    # The run wrote a regular file; the pushed commit has a symlink there instead.
    run_commit = commit_files(
        setup.clone, {"src/config": "/etc/passwd"}, branch="agent/run", start="main"
    )
    statement = make_receipt(setup.clone, run_commit)
    swapped = commit_files(
        setup.clone, symlinks={"src/config": "/etc/passwd"}, branch="agent/1", start="main"
    )
    attach(setup.clone, swapped, sign(statement))
    proc = setup.push(*PUSH)
    assert_blocked(proc, "result-mismatch", "uncovered-commit", "unclaimed-change")

    # Even a signed receipt that names the swapped commit does not hide the type change.
    git(setup.clone, "notes", f"--ref={NOTES_REF}", "remove", swapped)

    def claim_a_file(data: dict[str, Any]) -> None:
        data["predicate"]["changes"] = statement.predicate.model_dump(mode="json")["changes"]

    attach(setup.clone, swapped, sign(make_receipt(setup.clone, swapped, mutate=claim_a_file)))
    proc = setup.push(*PUSH)
    assert_blocked(proc, "change-differs")
    assert "type is symlink in the diff, file in the receipt" in proc.stderr


def test_a_policy_change_on_the_agent_branch_is_judged_by_the_target_policy(setup: Setup) -> None:
    opened = "version: 1\npaths:\n  write: ['**', '.gatekeeper/**', '.github/**']\n"
    receipted_commit(
        setup.clone, {".gatekeeper/policy.yaml": opened, ".github/workflows/x.yml": "on: push\n"}
    )
    proc = setup.push(*PUSH)
    assert_blocked(proc, "protected-path")
    assert "'.gatekeeper/policy.yaml' is a protected path" in proc.stderr
    assert "'.github/workflows/x.yml' is a protected path" in proc.stderr


def test_a_receipt_moved_to_another_commit_is_blocked(setup: Setup) -> None:
    agent = receipted_commit(setup.clone, {"src/feature.py": "x = 1\n"})
    line = git(setup.clone, "notes", f"--ref={NOTES_REF}", "show", agent).strip()
    git(setup.clone, "notes", f"--ref={NOTES_REF}", "remove", agent)
    other = commit_files(
        setup.clone, {"src/evil.py": "import os\n"}, branch="agent/2", start="main"
    )
    attach(setup.clone, other, line)
    proc = setup.push(*PUSH)
    assert_blocked(proc, "result-mismatch", "uncovered-commit", "unclaimed-change")
    assert f"describes another result, {agent[:12]}" in proc.stderr


def test_an_empty_commit_with_no_receipt_is_blocked(setup: Setup) -> None:
    commit_files(setup.clone, {}, message="empty", branch="agent/1", start="main")
    assert_blocked(setup.push("HEAD:refs/heads/main"), "no-receipt", "uncovered-commit")


def test_unprotected_branches_need_no_receipt(setup: Setup) -> None:
    commit = commit_files(setup.clone, {"notes.txt": "wip\n"}, branch="wip", start="main")
    assert_accepted(setup.push("HEAD:refs/heads/wip"))
    assert setup.server_rev("refs/heads/wip") == commit


def test_several_refs_in_one_push_are_each_judged(setup: Setup) -> None:
    assert (
        gk(
            "hooks",
            "install",
            "--server",
            str(setup.bare),
            "--protect",
            "main",
            "--protect",
            "refs/heads/release/*",
        ).returncode
        == 0
    )
    good = receipted_commit(setup.clone, {"src/good.py": "ok = True\n"})
    bad = commit_files(
        setup.clone, {"src/bad.py": "ok = False\n"}, branch="agent/bad", start="main"
    )
    proc = setup.push(
        f"{good}:refs/heads/main", f"{bad}:refs/heads/release/1", f"{NOTES_REF}:{NOTES_REF}"
    )
    assert_blocked(proc, "uncovered-commit")
    assert "refs/heads/main: PASS" in proc.stderr
    assert "refs/heads/release/1: BLOCK" in proc.stderr
    assert setup.server_rev("refs/heads/main") != good  # one refusal refuses the whole push

    also_good = receipted_commit(setup.clone, {"src/also.py": "ok = 2\n"}, branch="agent/3")
    proc = setup.push(
        f"{good}:refs/heads/main", f"{also_good}:refs/heads/release/1", f"{NOTES_REF}:{NOTES_REF}"
    )
    assert_accepted(proc)
    assert setup.server_rev("refs/heads/release/1") == also_good


def test_creating_a_protected_ref_is_judged_against_the_default_branch(setup: Setup) -> None:
    assert (
        gk(
            "hooks",
            "install",
            "--server",
            str(setup.bare),
            "--protect",
            "main",
            "--protect",
            "refs/heads/release/*",
        ).returncode
        == 0
    )
    bad = commit_files(setup.clone, {"src/bad.py": "x\n"}, branch="agent/bad", start="main")
    assert_blocked(setup.push(f"{bad}:refs/heads/release/2"), "uncovered-commit", "no-receipt")
    good = receipted_commit(setup.clone, {"src/ok.py": "x\n"})
    assert_accepted(setup.push(f"{good}:refs/heads/release/2", f"{NOTES_REF}:{NOTES_REF}"))


def test_deleting_a_protected_ref_is_refused_and_others_are_not(setup: Setup) -> None:
    commit_files(setup.clone, {"wip.txt": "x\n"}, branch="wip", start="main")
    assert_accepted(setup.push("HEAD:refs/heads/wip"))
    assert_accepted(setup.push(":refs/heads/wip"))
    proc = setup.push(":refs/heads/main")
    assert proc.returncode != 0
    assert "refs/heads/main: deleting a protected ref is refused" in proc.stderr
    assert setup.server_rev("refs/heads/main") is not None


def test_receipts_that_would_be_lost_are_refused(setup: Setup, tmp_path: Path) -> None:
    receipted_commit(setup.clone, {"src/a.py": "a\n"})
    assert_accepted(setup.push(*PUSH))
    # Another clone rewrites the receipts ref from scratch and force-pushes it.
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", setup.daemon.url(setup.name), str(other))
    lone = commit_files(other, {"src/b.py": "b\n"}, branch="agent/b", start="origin/main")
    attach(other, lone, sign(make_receipt(other, lone)))
    proc = run_git(other, "push", "--force", "origin", f"{NOTES_REF}:{NOTES_REF}")
    assert proc.returncode != 0
    assert "receipts would be lost" in proc.stderr
    assert "git notes --ref=gatekeeper merge -s cat_sort_uniq" in proc.stderr
    assert_blocked(run_git(other, "push", "origin", f":{NOTES_REF}"))


def test_concurrent_receipts_are_merged_not_lost(setup: Setup, tmp_path: Path) -> None:
    """Two clones push receipts; the second merges the first's and retries."""
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", setup.daemon.url(setup.name), str(other))
    first = receipted_commit(setup.clone, {"src/a.py": "a\n"}, branch="agent/a")
    second = receipted_commit(other, {"src/b.py": "b\n"}, branch="agent/b", start="origin/main")
    assert_accepted(setup.push(f"{NOTES_REF}:{NOTES_REF}", "agent/a"))
    refused = run_git(other, "push", "origin", f"{NOTES_REF}:{NOTES_REF}")
    assert refused.returncode != 0  # not a fast-forward: git refuses before the hook is asked
    with ThreadPoolExecutor(2) as pool:
        third = receipted_commit(setup.clone, {"src/c.py": "c\n"}, branch="agent/c")
        futures = [pool.submit(sync_notes, git_dir_of(r), "origin") for r in (setup.clone, other)]
        for future in futures:
            future.result()
    for commit in (first, second, third):
        assert git(setup.bare, "notes", f"--ref={NOTES_REF}", "show", commit).strip()
    # The second clone's agent branch now passes on the server, with the merged receipts.
    run_git(other, "fetch", "-q", "origin")
    proc = run_git(other, "push", "origin", f"{second}:refs/heads/main")
    assert_accepted(proc)


def test_the_first_push_to_an_empty_repository(
    daemon: GitDaemon, tmp_path: Path, key: Path
) -> None:
    bare = daemon.path("bootstrap.git")
    shutil.rmtree(bare, ignore_errors=True)
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    assert gk("hooks", "install", "--server", str(bare)).returncode == 0
    plain = tmp_path / "plain"
    plain.mkdir()
    git(plain, "init", "-q", "-b", "main")
    (plain / "README.md").write_text("no gatekeeper here\n")
    git(plain, "add", "-A")
    git(plain, "commit", "-q", "-m", "plain")
    proc = run_git(plain, "push", daemon.url("bootstrap.git"), "main")
    assert proc.returncode != 0
    assert "must carry .gatekeeper/policy.yaml and .gatekeeper/trusted_keys" in proc.stderr

    seeded = make_repo(tmp_path / "seeded")
    proc = run_git(seeded, "push", daemon.url("bootstrap.git"), "main")
    assert proc.returncode == 0, proc.stderr
    assert "the first protected branch here; accepted" in proc.stderr


@needs_bwrap
@pytest.mark.sandbox
def test_a_real_run_is_accepted_and_a_hand_edit_after_it_is_refused(setup: Setup) -> None:
    """End to end: `gatekeeper run` in the clone, then `git push` to the gated server."""
    proc = gk(
        "run",
        "--repo",
        str(setup.clone),
        "--json",
        "--",
        "sh",
        "-c",
        "mkdir -p src && echo 'def g(): return 2' > src/g.py && rm README.md",
    )
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)
    assert_accepted(setup.push(f"{run['commit']}:refs/heads/main", f"{NOTES_REF}:{NOTES_REF}"))
    assert setup.server_rev("refs/heads/main") == run["commit"]

    proc = gk(
        "run",
        "--repo",
        str(setup.clone),
        "--base",
        run["commit"],
        "--json",
        "--",
        "sh",
        "-c",
        "echo more >> src/g.py",
    )
    second = json.loads(proc.stdout)
    git(setup.clone, "checkout", "-q", "--detach", second["commit"])
    (setup.clone / "src/g.py").write_text("def g(): return 'edited by hand'\n")
    git(setup.clone, "commit", "-q", "-am", "hand edit after the run")
    assert_blocked(
        setup.push("HEAD:refs/heads/main", f"{NOTES_REF}:{NOTES_REF}"),
        "uncovered-commit",
        "change-differs",
    )
    assert_accepted(setup.push(f"{second['commit']}:refs/heads/main", f"{NOTES_REF}:{NOTES_REF}"))
