"""A receipt's agent_commits cover only the run's own work, each commit judged on its own.

The attack: inside a run, the agent `git merge -s ours` a local-only branch or a hand-made
commit that carries out-of-policy files (a workflow file, data copied from another branch).
The merge changes nothing in the final tree, so the range's diff is clean, and the launcher
lists every commit it imported; the gate used to cover them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fixtures.gate_receipts import attach, commit_files, git_dir_of, make_receipt, sign

from gatekeeper.gate import GateResult, judge

from conftest import git


def check(repo: Path, head: str = "agent/1", base: str = "main") -> GateResult:
    return judge(
        git_dir_of(repo),
        git(repo, "rev-parse", base).strip(),
        git(repo, "rev-parse", head).strip(),
    )


def findings(result: GateResult) -> set[tuple[str, str | None, str | None]]:
    return {(f.kind.value, f.path, f.commit) for f in result.findings}


def receipt_listing(repo: Path, result: str, base: str, agent_commits: list[str]) -> None:
    """Sign a receipt for result (from base) that lists agent_commits, as the launcher does."""

    def listing(data: dict[str, Any]) -> None:
        data["predicate"]["agent_commits"] = agent_commits

    attach(repo, result, sign(make_receipt(repo, result, base=base, mutate=listing)))


def merge_ours(repo: Path, other: str, *extra: str) -> str:
    git(repo, "merge", "-q", "-s", "ours", "--no-edit", *extra, other)
    return git(repo, "rev-parse", "HEAD").strip()


def test_the_launchers_own_chain_of_agent_commits_passes(repo: Path) -> None:
    main = git(repo, "rev-parse", "main").strip()
    first = commit_files(repo, {"src/a.py": "a\n"}, branch="agent/1", start="main")
    second = commit_files(repo, {"src/b.py": "b\n"})
    result = commit_files(repo, {"src/c.py": "c\n"}, message="launcher commit")
    receipt_listing(repo, result, main, [first, second])
    outcome = check(repo)
    assert [f.message for f in outcome.findings] == []
    assert set(outcome.covered_by) == {first, second, result}


def test_a_merged_hand_made_commit_with_a_workflow_file_is_not_covered(repo: Path) -> None:
    main = git(repo, "rev-parse", "main").strip()
    hand = commit_files(
        repo, {".github/workflows/x.yml": "on: push\n"}, branch="local", start="main"
    )
    first = commit_files(repo, {"src/a.py": "a\n"}, branch="agent/1", start="main")
    merge = merge_ours(repo, "local")
    result = commit_files(repo, {"src/c.py": "c\n"}, message="launcher commit")
    receipt_listing(repo, result, main, [first, hand, merge])
    outcome = check(repo)
    assert outcome.verdict.value == "block"
    found = findings(outcome)
    assert ("protected-path", ".github/workflows/x.yml", hand) in found
    assert ("uncovered-commit", None, hand) in found
    assert hand not in outcome.covered_by
    # The final tree has no workflow file: only judging each commit alone finds it.
    assert ".github/workflows/x.yml" not in git(repo, "ls-tree", "-r", "--name-only", result)


def test_a_merge_of_history_from_another_branch_is_not_covered(repo: Path) -> None:
    main = git(repo, "rev-parse", "main").strip()
    git(repo, "checkout", "-q", "--orphan", "data")
    git(repo, "rm", "-rq", "--cached", ".")
    (repo / "secret.csv").write_text("customer,card\n")
    git(repo, "add", "secret.csv")
    git(repo, "commit", "-q", "-m", "data from elsewhere")
    data = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "clean", "-fdq")
    first = commit_files(repo, {"src/a.py": "a\n"}, branch="agent/1", start="main")
    merge = merge_ours(repo, "data", "--allow-unrelated-histories")
    result = commit_files(repo, {"src/c.py": "c\n"}, message="launcher commit")
    receipt_listing(repo, result, main, [first, data, merge])
    outcome = check(repo)
    assert outcome.verdict.value == "block"
    messages = {f.commit: f.message for f in outcome.findings if f.kind.value == "uncovered-commit"}
    assert "not between the run's base" in messages[data]
    assert "this merge brings in 1 commit(s)" in messages[merge]
    assert data not in outcome.covered_by and merge not in outcome.covered_by


def test_an_unlisted_side_branch_makes_the_merge_uncovered(repo: Path) -> None:
    main = git(repo, "rev-parse", "main").strip()
    side = commit_files(repo, {"src/side.py": "s\n"}, branch="side", start="main")
    first = commit_files(repo, {"src/a.py": "a\n"}, branch="agent/1", start="main")
    merge = merge_ours(repo, "side")
    result = commit_files(repo, {"src/c.py": "c\n"}, message="launcher commit")
    receipt_listing(repo, result, main, [first, merge])
    found = findings(check(repo))
    assert ("uncovered-commit", None, merge) in found
    assert ("uncovered-commit", None, side) in found


def test_the_agents_own_side_branch_merged_back_passes(repo: Path) -> None:
    main = git(repo, "rev-parse", "main").strip()
    side = commit_files(repo, {"src/side.py": "s\n"}, branch="side", start="main")
    first = commit_files(repo, {"src/a.py": "a\n"}, branch="agent/1", start="main")
    git(repo, "merge", "-q", "--no-edit", "side")
    merge = git(repo, "rev-parse", "HEAD").strip()
    result = commit_files(repo, {"src/c.py": "c\n"}, message="launcher commit")
    receipt_listing(repo, result, main, [side, first, merge])
    outcome = check(repo)
    assert [f.message for f in outcome.findings] == []
    assert {side, first, merge, result} <= set(outcome.covered_by)


def test_a_receipt_cannot_cover_a_commit_after_its_result(repo: Path) -> None:
    main = git(repo, "rev-parse", "main").strip()
    first = commit_files(repo, {"src/a.py": "a\n"}, branch="agent/1", start="main")
    result = commit_files(repo, {"src/c.py": "c\n"}, message="launcher commit")
    later = commit_files(repo, {"src/app.py": "edited by hand\n"}, message="hand edit")
    receipt_listing(repo, result, main, [later, first])
    outcome = check(repo)
    messages = {f.commit: f.message for f in outcome.findings if f.kind.value == "uncovered-commit"}
    assert "not between the run's base" in messages[later]
    assert later not in outcome.covered_by


def test_an_agent_commit_outside_the_write_set_is_judged_alone(tmp_path: Path, key: Path) -> None:
    from conftest import make_repo

    repo = make_repo(tmp_path / "r", policy="version: 1\npaths:\n  write: ['src/**']\n")
    main = git(repo, "rev-parse", "main").strip()
    first = commit_files(repo, {"notes/plan.txt": "x\n"}, branch="agent/1", start="main")
    undo = commit_files(repo, {"notes/plan.txt": None}, message="undo")
    result = commit_files(repo, {"src/c.py": "c\n"}, message="launcher commit")
    receipt_listing(repo, result, main, [first, undo])
    found = findings(check(repo))
    assert ("unapproved-write", "notes/plan.txt", first) in found
    assert ("uncovered-commit", None, first) in found
