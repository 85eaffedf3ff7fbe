"""Protected refs only move forward: a force-push that drops commits is refused unless allowed."""

from __future__ import annotations

from pathlib import Path

import test_push
from fixtures.gate_receipts import receipted_commit
from test_push import Setup, assert_accepted, run_git

from gatekeeper.commands.hooks import install
from gatekeeper.receipt.notes import NOTES_REF

from conftest import git, gk

daemon = test_push.daemon
setup = test_push.setup


def two_runs_from_the_same_base(setup: Setup) -> tuple[str, str]:
    """Run A (a security fix) lands on main; run B, started from the same base, does not."""
    fix = receipted_commit(setup.clone, {"src/auth.py": "check = True\n"}, branch="agent/fix")
    old = receipted_commit(setup.clone, {"src/old.py": "x = 1\n"}, branch="agent/old")
    assert_accepted(setup.push(f"{fix}:refs/heads/main", f"{NOTES_REF}:{NOTES_REF}"))
    return fix, old


def test_force_pushing_an_older_run_over_a_protected_branch_is_refused(setup: Setup) -> None:
    fix, old = two_runs_from_the_same_base(setup)
    proc = setup.push("--force", f"{old}:refs/heads/main", f"{NOTES_REF}:{NOTES_REF}")
    assert proc.returncode != 0, proc.stderr
    assert "would drop 1 commit(s) from a protected ref" in proc.stderr
    assert "gatekeeper.allowRewind" in proc.stderr
    assert setup.server_rev("refs/heads/main") == fix


def test_a_rewind_to_an_ancestor_is_refused_too(setup: Setup) -> None:
    fix, _ = two_runs_from_the_same_base(setup)
    later = receipted_commit(setup.clone, {"src/more.py": "y\n"}, branch="agent/more", start=fix)
    assert_accepted(setup.push(f"{later}:refs/heads/main", f"{NOTES_REF}:{NOTES_REF}"))
    proc = setup.push("--force", f"{fix}:refs/heads/main")
    assert proc.returncode != 0
    assert "would drop 1 commit(s)" in proc.stderr
    assert setup.server_rev("refs/heads/main") == later


def test_a_rewind_is_accepted_where_the_server_allows_it(setup: Setup) -> None:
    _, old = two_runs_from_the_same_base(setup)
    assert install(repo=Path("."), server=setup.bare, allow_rewind=["main"]) == 0
    assert git(setup.bare, "config", "--get-all", "gatekeeper.allowRewind").split() == [
        "refs/heads/main"
    ]
    proc = setup.push("--force", f"{old}:refs/heads/main", f"{NOTES_REF}:{NOTES_REF}")
    assert_accepted(proc)
    assert "a rewind, allowed by gatekeeper.allowRewind" in proc.stderr
    assert setup.server_rev("refs/heads/main") == old


def test_unprotected_refs_may_still_be_rewound(setup: Setup) -> None:
    fix, old = two_runs_from_the_same_base(setup)
    assert_accepted(setup.push(f"{fix}:refs/heads/wip"))
    assert_accepted(setup.push("--force", f"{old}:refs/heads/wip"))


def test_the_pre_push_hook_says_so_before_the_push(setup: Setup) -> None:
    fix, old = two_runs_from_the_same_base(setup)
    assert gk("hooks", "install", "--repo", str(setup.clone)).returncode == 0
    run_git(setup.clone, "fetch", "-q", "origin")
    proc = run_git(setup.clone, "push", "--force", "origin", f"{old}:refs/heads/main")
    assert proc.returncode != 0
    assert "gatekeeper: refs/heads/main:" in proc.stderr and "would drop" in proc.stderr
    assert "pre-receive hook declined" not in proc.stderr  # refused locally, before sending
