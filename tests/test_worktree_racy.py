"""A same-size rewrite in the second of the checkout is a change like any other.

git trusts a file's stat data against its index entry only when the file is older than the
index: one as new (to the second) is compared by content. The index the launcher collects
the result with starts as a copy of the worktree's, and keeps that index's time: a copy
made later would vouch for the rewritten file, whose stat data matches to the second.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gatekeeper.run.worktree import collect_changes, create_worktree, new_run_id, remove_worktree

from conftest import git, make_repo


@pytest.mark.parametrize("overlay", ["0", "1"])
def test_a_same_size_rewrite_in_the_second_of_the_checkout_is_collected(
    tmp_path: Path,
    key: Path,
    overlay: str,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    if overlay == "1" and os.geteuid() != 0:
        pytest.skip("only root mounts overlays")
    monkeypatch.setenv("GATEKEEPER_OVERLAY", overlay)
    repo = make_repo(tmp_path / "repo", files={"a.txt": "a\n"})
    git_dir = repo / ".git"
    base = git(repo, "rev-parse", "HEAD").strip()
    for _ in range(20):
        time.sleep(1.0 - time.time() % 1)  # at the start of a second
        run_id = new_run_id()
        wt = create_worktree(git_dir, base, f"agent/{run_id}", run_id)
        (wt.path / "a.txt").write_text("d\n")  # the same size, the same inode
        made = int(os.stat(wt.admin_dir / "index").st_mtime)
        if int(os.stat(wt.path / "a.txt").st_ctime) == made:
            break
        remove_worktree(git_dir, run_id, wt.path, f"agent/{run_id}")
    else:
        pytest.fail("no checkout and rewrite within one second in 20 tries")
    time.sleep(1.1)  # the result is collected a second later, as after any agent
    try:
        collected = collect_changes(wt, git_dir)
        collected.index.unlink(missing_ok=True)
        assert ("M", "a.txt") in collected.changes, collected.changes
    finally:
        remove_worktree(git_dir, run_id, wt.path, f"agent/{run_id}")
