"""What a new protected ref is judged against, and which branch is the default one.

The attack: with only `refs/heads/release/*` protected, put your key into the (unprotected)
default branch's trust file, then create a release branch, which used to be judged against
the default branch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import test_push
from fixtures.gate_receipts import attach, commit_files, make_receipt, receipted_commit, sign
from test_push import PUSH, Setup, assert_accepted, assert_blocked, run_git

from gatekeeper.commands.hooks import install
from gatekeeper.receipt.keys import SigningKey, generate_key
from gatekeeper.receipt.notes import NOTES_REF

from conftest import git, gk, make_repo

daemon = test_push.daemon
setup = test_push.setup
TRUST = ".gatekeeper/trusted_keys"


def protect_release_only(setup: Setup) -> None:
    proc = gk("hooks", "install", "--server", str(setup.bare), "--protect", "refs/heads/release/*")
    assert proc.returncode == 0, proc.stderr


def plant_key(setup: Setup, tmp_path: Path, start: str = "main") -> tuple[str, SigningKey]:
    """A commit that adds an attacker's key to the trust file, and the key."""
    attacker = generate_key(tmp_path / "attacker" / "key.pem")
    trust = (setup.clone / TRUST).read_text() + attacker.public.line + "\n"
    planted = commit_files(setup.clone, {TRUST: trust}, branch="plant", start=start)
    return planted, attacker


def attacker_run(setup: Setup, start: str, attacker: SigningKey) -> str:
    commit = commit_files(setup.clone, {"src/evil.py": "x\n"}, branch="evil", start=start)
    attach(setup.clone, commit, sign(make_receipt(setup.clone, commit), attacker))
    return commit


def test_the_default_branch_stays_protected_when_other_patterns_are_given(
    setup: Setup, tmp_path: Path
) -> None:
    protect_release_only(setup)
    planted, _ = plant_key(setup, tmp_path)
    before = setup.server_rev("refs/heads/main")
    assert_blocked(setup.push(f"{planted}:refs/heads/main"), "protected-path")
    assert setup.server_rev("refs/heads/main") == before


def test_a_new_release_branch_is_judged_against_the_protected_ref_it_forks_from(
    setup: Setup, tmp_path: Path
) -> None:
    protect_release_only(setup)
    good = receipted_commit(setup.clone, {"src/ok.py": "ok\n"})
    proc = setup.push(f"{good}:refs/heads/release/1", f"{NOTES_REF}:{NOTES_REF}")
    assert_accepted(proc)
    assert "judged against the protected ref(s) it forks from: refs/heads/main" in proc.stderr

    # The administrator stops protecting the default branch; the attacker plants a key there.
    assert install(repo=Path("."), server=setup.bare, protect_default=False) == 0
    planted, attacker = plant_key(setup, tmp_path)
    assert_accepted(setup.push(f"{planted}:refs/heads/main"))
    evil = attacker_run(setup, planted, attacker)
    proc = setup.push(f"{evil}:refs/heads/release/2", f"{NOTES_REF}:{NOTES_REF}")
    assert_blocked(proc, "untrusted-key")
    assert "forks from: refs/heads/release/1" in proc.stderr
    assert setup.server_rev("refs/heads/release/2") is None


def test_a_new_protected_ref_with_nothing_protected_to_fork_from_is_refused(
    setup: Setup,
) -> None:
    protect_release_only(setup)
    assert install(repo=Path("."), server=setup.bare, protect_default=False) == 0
    good = receipted_commit(setup.clone, {"src/ok.py": "ok\n"})
    proc = setup.push(f"{good}:refs/heads/release/1", f"{NOTES_REF}:{NOTES_REF}")
    assert proc.returncode != 0
    assert "a new protected ref must fork from a protected ref" in proc.stderr
    assert setup.server_rev("refs/heads/release/1") is None


def test_a_new_ref_forking_from_two_protected_refs_must_pass_against_both(
    setup: Setup, tmp_path: Path
) -> None:
    assert gk(
        "hooks", "install", "--server", str(setup.bare), "--protect", "refs/heads/release/*"
    ).returncode == 0  # fmt: skip
    base = setup.server_rev("refs/heads/main")
    assert base is not None
    # Two protected refs whose merge-base with the new commit is the same (main's tip).
    one = receipted_commit(setup.clone, {"src/one.py": "1\n"}, branch="agent/one")
    assert_accepted(setup.push(f"{one}:refs/heads/release/1", f"{NOTES_REF}:{NOTES_REF}"))
    two = receipted_commit(setup.clone, {"src/two.py": "2\n"}, branch="agent/two")
    assert_accepted(setup.push(f"{two}:refs/heads/release/2", f"{NOTES_REF}:{NOTES_REF}"))
    three = receipted_commit(setup.clone, {"src/three.py": "3\n"}, branch="agent/three")
    proc = setup.push(f"{three}:refs/heads/release/3", f"{NOTES_REF}:{NOTES_REF}")
    assert_accepted(proc)
    assert "forks from: refs/heads/main, refs/heads/release/1, refs/heads/release/2" in proc.stderr


def test_install_finds_the_real_default_branch(setup: Setup) -> None:
    git(setup.bare, "symbolic-ref", "HEAD", "refs/heads/master")  # only main exists
    git(setup.bare, "config", "--unset-all", "gatekeeper.defaultBranch")
    proc = gk("hooks", "install", "--server", str(setup.bare))
    assert proc.returncode == 0, proc.stderr
    assert "default branch: refs/heads/main (HEAD names refs/heads/master" in proc.stderr
    assert git(setup.bare, "config", "gatekeeper.defaultBranch").strip() == "refs/heads/main"
    assert "protected refs: refs/heads/main" in proc.stderr
    unreceipted = commit_files(setup.clone, {"src/x.py": "x\n"}, branch="h", start="main")
    assert_blocked(setup.push(f"{unreceipted}:refs/heads/main"), "uncovered-commit")


def test_without_a_stored_default_the_hook_still_finds_it(setup: Setup) -> None:
    git(setup.bare, "symbolic-ref", "HEAD", "refs/heads/master")
    git(setup.bare, "config", "--unset-all", "gatekeeper.defaultBranch")
    unreceipted = commit_files(setup.clone, {"src/x.py": "x\n"}, branch="h", start="main")
    assert_blocked(setup.push(f"{unreceipted}:refs/heads/main"), "uncovered-commit")
    good = receipted_commit(setup.clone, {"src/ok.py": "ok\n"})
    assert_accepted(setup.push(f"{good}:refs/heads/main", *PUSH[1:]))


def test_a_new_protected_ref_at_an_already_protected_commit_is_accepted(setup: Setup) -> None:
    protect_release_only(setup)
    main = setup.server_rev("refs/heads/main")
    proc = setup.push(f"{main}:refs/heads/release/1")
    assert_accepted(proc)
    assert "which refs/heads/main already holds" in proc.stderr


@pytest.mark.parametrize("stored", [True, False])
def test_pushing_the_branch_head_names_does_not_move_the_default_away(
    setup: Setup, tmp_path: Path, stored: bool
) -> None:
    """Installed on an empty repository, the hook stores the branch HEAD names (master) as the
    default; the team pushes main. Once someone created master, the stored name existed and
    became the default: main was no longer protected, and master's trust file judged what is
    new. The default found (main) is now stored at the first push that finds it."""
    git(setup.bare, "symbolic-ref", "HEAD", "refs/heads/master")
    if stored:
        git(setup.bare, "config", "gatekeeper.defaultBranch", "refs/heads/master")
    else:
        git(setup.bare, "config", "--unset-all", "gatekeeper.defaultBranch")
    unreceipted = commit_files(setup.clone, {"src/x.py": "x\n"}, branch="h", start="main")
    assert_accepted(setup.push(f"{unreceipted}:refs/heads/master"))  # not protected: main is
    assert git(setup.bare, "config", "gatekeeper.defaultBranch").strip() == "refs/heads/main"
    assert_blocked(setup.push(f"{unreceipted}:refs/heads/main"), "uncovered-commit")
    good = receipted_commit(setup.clone, {"src/ok.py": "ok\n"})
    assert_accepted(setup.push(f"{good}:refs/heads/main", *PUSH[1:]))


@pytest.mark.parametrize("first", ["feature", "master-after"])
def test_on_an_empty_server_no_push_order_leaves_main_unprotected(
    daemon: test_push.GitDaemon, tmp_path: Path, key: Path, first: str
) -> None:
    """Installed on an empty repository whose HEAD names master, while the team pushes main:
    - someone pushed another branch first: it was the only branch, so it became the default
      (stored for good) and main was never protected;
    - someone created master after main: the stored name then existed, and became the default.
    Until the default exists, main, master and HEAD's branch are each protected; the first
    of them pushed starts the repository (it must carry the policy and trust file), whatever
    else was pushed before, and stays the default."""
    bare = daemon.path(f"empty-{first}.git")
    shutil.rmtree(bare, ignore_errors=True)
    git(tmp_path, "init", "-q", "--bare", str(bare))
    git(bare, "symbolic-ref", "HEAD", "refs/heads/master")
    proc = gk("hooks", "install", "--server", str(bare))
    assert proc.returncode == 0, proc.stderr
    assert "until it exists, refs/heads/master, refs/heads/main are each protected" in proc.stderr
    team = make_repo(tmp_path / "team")
    url = daemon.url(f"empty-{first}.git")
    junk = commit_files(team, {"src/x.py": "x\n"}, branch="junk", start="main")
    if first == "feature":
        assert_accepted(run_git(team, "push", url, f"{junk}:refs/heads/feature"))
    bare_main = tmp_path / "bare-main"
    bare_main.mkdir()
    git(bare_main, "init", "-q", "-b", "main")
    (bare_main / "README.md").write_text("no gatekeeper here\n")
    git(bare_main, "add", "-A")
    git(bare_main, "commit", "-q", "-m", "plain")
    proc = run_git(bare_main, "push", url, "main")
    assert proc.returncode != 0 and "must carry .gatekeeper/policy.yaml" in proc.stderr
    proc = run_git(team, "push", url, "main")
    assert_accepted(proc)
    assert "the first protected branch here; accepted" in proc.stderr
    if first == "master-after":
        assert_accepted(run_git(team, "push", url, f"{junk}:refs/heads/feature"))
        # Not protected once main is the default, and no longer able to become the default.
        assert_accepted(run_git(team, "push", url, f"{junk}:refs/heads/master"))
    assert_blocked(run_git(team, "push", url, f"{junk}:refs/heads/main"), "uncovered-commit")
    assert git(bare, "config", "gatekeeper.defaultBranch").strip() == "refs/heads/main"


def test_a_push_of_many_new_protected_refs_asks_git_once_per_ref_not_per_pair(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new protected ref was compared with every existing one, a git call per pair: a push
    of 200 release refs beside 200 took minutes. Refs that share a tip share one merge-base,
    and the ref already holding the new commit is found by one listing."""
    import gatekeeper.gate.hooks as hooks

    main = setup.server_rev("refs/heads/main")
    assert main is not None
    for n in range(40):
        git(setup.bare, "update-ref", f"refs/heads/release/{n}", main)
    calls: list[str] = []
    real = hooks.merge_base

    def counted(git_dir: Path, target: str, head: str) -> str | None:
        calls.append(target)
        return real(git_dir, target, head)

    monkeypatch.setattr(hooks, "merge_base", counted)
    patterns = ["refs/heads/main", "refs/heads/release/*"]
    tips = hooks._protected_tips(setup.bare, patterns, "refs/heads/release/new")
    assert len(tips) == 41 and set(tips.values()) == {main}
    assert hooks._holder(setup.bare, main, tips) == "refs/heads/main"
    good = receipted_commit(setup.clone, {"src/ok.py": "ok\n"})
    assert_accepted(setup.push(f"{good}:refs/heads/agent/1", f"{NOTES_REF}:{NOTES_REF}"))
    assert hooks._holder(setup.bare, good, tips) is None
    targets = hooks.fork_targets(setup.bare, good, tips)
    assert len(calls) == 1 and len(targets) == 41
