"""A protected ref at an old commit must never be judged by that commit's old trust file.

The attack: main revokes key A (its trust file names only B). A creates a protected ref at an
older commit, whose trust file still names A (accepted: main already holds that commit), then
pushes a run signed with A onto it. Updates used to be judged by the ref's own old tip alone,
so the revoked key landed code on a protected branch. Every update is now judged also by the
trust file and policy of the default branch's current tip.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_push
from fixtures.gate_receipts import attach, commit_files, git_dir_of, make_receipt, sign
from test_push import Setup, assert_accepted, assert_blocked

from gatekeeper.gate.hooks import pre_merge_commit, pre_push
from gatekeeper.receipt.keys import SigningKey, generate_key, load_key
from gatekeeper.receipt.notes import NOTES_REF

from conftest import git, gk, needs_bwrap

daemon = test_push.daemon
setup = test_push.setup
TRUST = ".gatekeeper/trusted_keys"
POLICY = ".gatekeeper/policy.yaml"
NOTES = f"{NOTES_REF}:{NOTES_REF}"


def admin_moves_main(setup: Setup, commit: str) -> None:
    """The administrator moves main on the server (no hook runs for a fetch into it)."""
    git(setup.clone, "branch", "-f", "admin-main", commit)
    git(setup.bare, "fetch", "-q", str(setup.clone), "+refs/heads/admin-main:refs/heads/main")
    git(setup.clone, "fetch", "-q", "origin", "+refs/heads/*:refs/remotes/origin/*")


def revoke_a(setup: Setup, tmp_path: Path, *, allow_rewind: bool = False) -> tuple[str, SigningKey]:
    """Main's first commit trusts A (the test's own key); main then trusts only B.

    Returns OLD (the commit that trusts A) and B. release/* is protected as well.
    """
    old = setup.server_rev("refs/heads/main")
    assert old is not None
    b = generate_key(tmp_path / "b" / "key.pem")
    revoke = commit_files(
        setup.clone, {TRUST: b.public.line + "\n"}, message="revoke A", branch="revoke", start=old
    )
    admin_moves_main(setup, revoke)
    args = ["--protect", "main", "--protect", "refs/heads/release/*"]
    if allow_rewind:
        args += ["--allow-rewind", "refs/heads/release/*"]
    proc = gk("hooks", "install", "--server", str(setup.bare), *args)
    assert proc.returncode == 0, proc.stderr
    return old, b


def run_on(setup: Setup, start: str, key: SigningKey, name: str, branch: str) -> str:
    """A receipted commit on top of start, signed with key."""
    commit = commit_files(setup.clone, {name: "malicious\n"}, branch=branch, start=start)
    attach(setup.clone, commit, sign(make_receipt(setup.clone, commit), key))
    return commit


@needs_bwrap
@pytest.mark.sandbox
def test_the_reviewers_sequence_a_revoked_key_on_a_release_ref_at_an_old_commit(
    setup: Setup, tmp_path: Path
) -> None:
    old, _ = revoke_a(setup, tmp_path)
    proc = setup.push(f"{old}:refs/heads/release/old")
    assert_accepted(proc)
    assert "which refs/heads/main already holds" in proc.stderr
    git(setup.clone, "branch", "relold", old)
    proc = gk(
        "run",
        "--repo",
        str(setup.clone),
        "--base",
        "relold",
        "--branch",
        "attack",
        "--json",
        "--",
        "sh",
        "-c",
        "echo malicious > payload.txt",
    )
    assert proc.returncode == 0, proc.stderr
    attack = json.loads(proc.stdout)["commit"]
    proc = setup.push("attack:refs/heads/release/old", NOTES_REF)
    assert_blocked(proc, "untrusted-key")
    assert "judged also by the trust file and policy of refs/heads/main" in proc.stderr
    assert setup.server_rev("refs/heads/release/old") == old
    assert setup.server_rev("refs/heads/release/old") != attack


@pytest.mark.parametrize("via", ["tag", "unprotected-branch"])
def test_a_release_ref_created_from_a_tag_or_branch_at_an_old_commit(
    setup: Setup, tmp_path: Path, via: str
) -> None:
    old, _ = revoke_a(setup, tmp_path)
    holder = "refs/tags/v0" if via == "tag" else "refs/heads/wip"
    assert_accepted(setup.push(f"{old}:{holder}"))
    git(setup.clone, "fetch", "-q", "origin", f"+{holder}:refs/remotes/holder")
    assert_accepted(setup.push("refs/remotes/holder:refs/heads/release/old"))
    attack = run_on(setup, old, load_key(), "payload.txt", "attack")
    assert_blocked(setup.push(f"{attack}:refs/heads/release/old", NOTES), "untrusted-key")
    assert setup.server_rev("refs/heads/release/old") == old


def test_a_release_ref_created_by_a_trusted_run_over_an_old_base(
    setup: Setup, tmp_path: Path
) -> None:
    """B (trusted now) creates release/2 from OLD; its tip's trust file still names A."""
    old, b = revoke_a(setup, tmp_path)
    legit = run_on(setup, old, b, "src/fix.py", "legit")
    proc = setup.push(f"{legit}:refs/heads/release/2", NOTES)
    assert_accepted(proc)
    attack = run_on(setup, legit, load_key(), "payload.txt", "attack")
    assert_blocked(setup.push(f"{attack}:refs/heads/release/2", NOTES), "untrusted-key")
    assert setup.server_rev("refs/heads/release/2") == legit

    # Nor can A create a new ref forking from that stale one (its merge-base is the nearest).
    proc = setup.push(f"{attack}:refs/heads/release/3", NOTES)
    assert_blocked(proc, "untrusted-key")
    assert "forks from: refs/heads/release/2" in proc.stderr
    assert setup.server_rev("refs/heads/release/3") is None

    # A key must be trusted by both: release/2's own trust file does not name B, so nothing
    # lands there until an administrator brings it up to date (docs/gate.md says how).
    more = run_on(setup, legit, b, "src/more.py", "more")
    proc = setup.push(f"{more}:refs/heads/release/2", NOTES)
    assert_blocked(proc, "untrusted-key")
    assert "refs/heads/release/2: PASS" in proc.stderr  # by main's trust file


def test_a_rewind_may_not_bring_back_an_old_trust_file(setup: Setup, tmp_path: Path) -> None:
    """An allowed rewind of release/1 onto a run over OLD would make A trusted there again."""
    old, b = revoke_a(setup, tmp_path, allow_rewind=True)
    main = setup.server_rev("refs/heads/main")
    assert main is not None
    first = run_on(setup, main, b, "src/one.py", "one")
    assert_accepted(setup.push(f"{first}:refs/heads/release/1", NOTES))
    over_old = run_on(setup, old, b, "src/two.py", "two")
    proc = setup.push(f"+{over_old}:refs/heads/release/1", NOTES)
    assert proc.returncode != 0, proc.stderr
    assert "this rewind would change .gatekeeper/trusted_keys" in proc.stderr
    assert setup.server_rev("refs/heads/release/1") == first


def test_a_ref_left_behind_by_a_revocation_is_judged_by_the_current_trust_file(
    setup: Setup, tmp_path: Path
) -> None:
    """release/1 was made while A was trusted; after main revokes A, A may not push there."""
    assert gk(
        "hooks", "install", "--server", str(setup.bare), "--protect", "refs/heads/release/*"
    ).returncode == 0  # fmt: skip
    main = setup.server_rev("refs/heads/main")
    assert main is not None
    first = run_on(setup, main, load_key(), "src/one.py", "one")
    assert_accepted(setup.push(f"{first}:refs/heads/release/1", NOTES))
    revoke_a(setup, tmp_path)
    attack = run_on(setup, first, load_key(), "payload.txt", "attack")
    assert_blocked(setup.push(f"{attack}:refs/heads/release/1", NOTES), "untrusted-key")
    assert setup.server_rev("refs/heads/release/1") == first


def test_an_old_looser_policy_does_not_judge_alone(setup: Setup, tmp_path: Path) -> None:
    """Main narrows paths.write; a release ref at the older commit may not use the old policy."""
    old = setup.server_rev("refs/heads/main")
    assert old is not None
    narrowed = "version: 1\npaths:\n  write: ['src/**']\n"
    tightened = commit_files(
        setup.clone, {POLICY: narrowed}, message="narrow", branch="narrow", start=old
    )
    admin_moves_main(setup, tightened)
    proc = gk("hooks", "install", "--server", str(setup.bare), "--protect", "refs/heads/release/*")
    assert proc.returncode == 0, proc.stderr
    assert_accepted(setup.push(f"{old}:refs/heads/release/old"))
    outside = run_on(setup, old, load_key(), "payload.txt", "outside")
    proc = setup.push(f"{outside}:refs/heads/release/old", NOTES)
    assert_blocked(proc, "policy-mismatch", "unapproved-write")
    assert setup.server_rev("refs/heads/release/old") == old


def test_the_default_branch_is_still_judged_once_by_its_own_tip(setup: Setup) -> None:
    """No second judgement when the ref's own tip is what the repository trusts now."""
    main = setup.server_rev("refs/heads/main")
    assert main is not None
    good = run_on(setup, main, load_key(), "src/ok.py", "good")
    proc = setup.push(f"{good}:refs/heads/main", NOTES)
    assert_accepted(proc)
    assert "judged also by" not in proc.stderr
    assert proc.stderr.count("refs/heads/main: PASS") == 1


def test_the_local_pre_push_hook_says_the_same(setup: Setup, tmp_path: Path) -> None:
    """pre-push judges the update also by the remote default branch's current trust file."""
    old, _ = revoke_a(setup, tmp_path)
    assert_accepted(setup.push(f"{old}:refs/heads/release/old"))
    git(setup.clone, "config", "--add", "gatekeeper.protect", "refs/heads/release/*")
    attack = run_on(setup, old, load_key(), "payload.txt", "attack")
    said: list[str] = []
    stdin = f"refs/heads/attack {attack} refs/heads/release/old {old}\n".encode()
    code = pre_push(git_dir_of(setup.clone), setup.clone, ["origin"], stdin, said.append)
    assert code == 1, "\n".join(said)
    assert any("untrusted-key" in line for line in said), said
    assert any("what origin trusts now" in line for line in said), said


def test_with_the_default_branch_unprotected_the_protected_refs_forked_from_judge(
    setup: Setup, tmp_path: Path
) -> None:
    """--no-protect-default: the current tips of the other protected refs stand in for main."""
    old, _ = revoke_a(setup, tmp_path)
    revoked = setup.server_rev("refs/heads/main")
    assert revoked is not None
    git(setup.bare, "update-ref", "refs/heads/release/1", revoked)
    proc = gk(
        "hooks",
        "install",
        "--server",
        str(setup.bare),
        "--protect",
        "refs/heads/release/*",
        "--no-protect-default",
    )
    assert proc.returncode == 0, proc.stderr
    proc = setup.push(f"{old}:refs/heads/release/old")
    assert_accepted(proc)
    assert "which refs/heads/release/1 already holds" in proc.stderr
    attack = run_on(setup, old, load_key(), "payload.txt", "attack")
    proc = setup.push(f"{attack}:refs/heads/release/old", NOTES)
    assert_blocked(proc, "untrusted-key")
    assert "judged also by the trust file and policy of refs/heads/release/1" in proc.stderr
    assert setup.server_rev("refs/heads/release/old") == old


def test_the_local_pre_push_hook_refuses_a_rewind_to_an_old_trust_file(
    setup: Setup, tmp_path: Path
) -> None:
    old, b = revoke_a(setup, tmp_path, allow_rewind=True)
    main = setup.server_rev("refs/heads/main")
    assert main is not None
    git(setup.clone, "config", "--add", "gatekeeper.protect", "refs/heads/release/*")
    git(setup.clone, "config", "--add", "gatekeeper.allowRewind", "refs/heads/release/*")
    over_old = run_on(setup, old, b, "src/two.py", "two")
    said: list[str] = []
    stdin = f"refs/heads/two {over_old} refs/heads/release/1 {main}\n".encode()
    code = pre_push(git_dir_of(setup.clone), setup.clone, ["origin"], stdin, said.append)
    assert code == 1, "\n".join(said)
    assert any("this rewind would change .gatekeeper/trusted_keys" in line for line in said)


def test_the_local_pre_merge_commit_hook_says_the_same(setup: Setup, tmp_path: Path) -> None:
    """Merging A's run into a local release branch at OLD: origin/main's trust file refuses A."""
    old, _ = revoke_a(setup, tmp_path)
    git(setup.clone, "config", "--add", "gatekeeper.protect", "refs/heads/release/*")
    attack = run_on(setup, old, load_key(), "payload.txt", "attack")
    git(setup.clone, "checkout", "-q", "-B", "release/old", old)
    said: list[str] = []
    environ = {"GIT_REFLOG_ACTION": f"merge {attack}"}
    code = pre_merge_commit(git_dir_of(setup.clone), setup.clone, environ, said.append)
    assert code == 1, "\n".join(said)
    assert any("untrusted-key" in line for line in said), said
    assert any("what origin trusts now" in line for line in said), said
