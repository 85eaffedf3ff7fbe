"""`gatekeeper discard`: remove what runs left behind (worktrees, unfinished branches)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from gatekeeper.errors import UsageError
from gatekeeper.git import discover, git
from gatekeeper.receipt.notes import envelopes_for
from gatekeeper.run.worktree import remove_tree, remove_worktree, worktrees_root
from gatekeeper.sandbox.limits import remove_leftover


def _runs(git_dir: Path) -> list[tuple[str, Path, str | None, str | None]]:
    """(run id, worktree path, branch, head) for every worktree gatekeeper created."""
    out = git("worktree", "list", "--porcelain", "-z", git_dir=git_dir).decode()
    root = str(worktrees_root())
    runs = []
    for block in out.split("\0\0"):
        fields = dict((item.split(" ", 1) + [""])[:2] for item in block.split("\0") if item)
        path = fields.get("worktree", "")
        if not path.startswith(root + "/"):
            continue
        branch = fields.get("branch", "").removeprefix("refs/heads/") or None
        runs.append((Path(path).name, Path(path), branch, fields.get("HEAD")))
    for admin in (
        sorted((git_dir / "worktrees").glob("*")) if (git_dir / "worktrees").exists() else []
    ):
        gitdir_file = admin / "gitdir"
        if gitdir_file.exists():
            target = Path(gitdir_file.read_text().strip()).parent
            if str(target).startswith(root + "/") and all(r[0] != admin.name for r in runs):
                runs.append((admin.name, target, None, None))
    return runs


def discard(*, repo: Path, run_id: str | None = None, keep_branch: bool = False) -> int:
    paths = discover(repo)
    runs = _runs(paths.git_dir)
    if run_id is not None:
        runs = [r for r in runs if r[0] == run_id]
        if not runs:
            raise UsageError(f"no leftover run {run_id!r} in {paths.git_dir}",
                             hint="`git worktree list` shows what is there")  # fmt: skip
    for rid, path, branch, head in runs:
        drop_branch = None
        if branch and not keep_branch:
            # Without an id, branches that carry a signed result are kept: they are work to review.
            has_receipt = bool(head and envelopes_for(paths.git_dir, head))
            if run_id is not None or not has_receipt:
                drop_branch = branch
        removed = remove_worktree(paths.git_dir, rid, path, drop_branch)
        # A launcher killed outright leaves its private scratch folder (agent git dir, events).
        for scratch in Path(tempfile.gettempdir()).glob(f"gatekeeper-run-{rid}-*"):
            remove_tree(scratch)  # read-only folders the agent made included
            removed.append(str(scratch))
        if remove_leftover(rid):
            removed.append("process cgroup")
        print(f"discarded {rid}: " + (", ".join(removed) or "nothing left"), file=sys.stderr)
    git("worktree", "prune", git_dir=paths.git_dir)
    if not runs:
        print("nothing to discard", file=sys.stderr)
    return 0
