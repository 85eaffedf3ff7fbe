"""The agent's private index starts from the launcher's checkout of the base (stat data and
all), and only from the run's own linked worktree; anything else is built from the tree."""

from __future__ import annotations

import shutil
from pathlib import Path

from gatekeeper.run import agentgit
from gatekeeper.run.worktree import create_worktree, new_run_id

from conftest import git, make_repo


def _status(private: agentgit.PrivateGit, worktree: Path) -> str:
    return git(worktree, f"--git-dir={private.path}", f"--work-tree={worktree}", "status",
               "--porcelain")  # fmt: skip


def test_the_agents_index_is_the_checkouts_index(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "repo", files={f"d/f{i}.txt": f"{i}\n" for i in range(50)})
    git_dir = repo / ".git"
    base = git(repo, "rev-parse", "HEAD").strip()
    run_id = new_run_id()
    wt = create_worktree(git_dir, base, f"agent/{run_id}", run_id)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    private = agentgit.prepare(git_dir, wt.path, base, f"agent/{run_id}", scratch)
    assert agentgit._checkout_index(git_dir, wt.path) == wt.admin_dir / "index"
    assert _status(private, wt.path) == ""
    # What the agent changes shows, as with an index read from the tree.
    (wt.path / "d" / "f1.txt").write_text("changed\n")
    assert _status(private, wt.path).split() == ["M", "d/f1.txt"]


def test_a_tree_that_only_claims_to_be_a_worktree_is_indexed_from_the_base(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo", files={"a.txt": "a\n"})
    git_dir = repo / ".git"
    base = git(repo, "rev-parse", "HEAD").strip()
    other = create_worktree(git_dir, base, "agent/other", new_run_id())
    (other.path / "a.txt").write_text("other\n")
    git(other.path, "add", "a.txt")  # the other worktree's index no longer matches base
    tree = tmp_path / "tree"  # a copy of base's files, as a check's fresh checkout is
    shutil.copytree(repo, tree, ignore=shutil.ignore_patterns(".git"))
    # A .git file naming another worktree's admin folder (a check's tree has none at all).
    (tree / ".git").write_text(f"gitdir: {other.admin_dir}\n")
    assert agentgit._checkout_index(git_dir, tree) is None
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    private = agentgit.prepare(git_dir, tree, base, "agent/check", scratch)
    assert _status(private, tree) == ""
    assert agentgit._checkout_index(git_dir, other.path) == other.admin_dir / "index"
