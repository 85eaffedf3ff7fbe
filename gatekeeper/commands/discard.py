"""`gatekeeper discard`: remove what unfinished runs left behind, and say what and why.

A live run (its launcher still holds the run's lock) is never touched. Without a run id, the
branch of a finished run is kept (it is work to review; only its worktree goes); the branch of
a run that never finished is removed. A named run loses its branch too unless --keep-branch.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import GitError, UsageError
from gatekeeper.git import discover, git
from gatekeeper.receipt.notes import PENDING_PREFIX, envelopes_for
from gatekeeper.run import layers
from gatekeeper.run.records import (
    all_records,
    is_live,
    is_run_id,
    read_record,
    save_state,
    settle,
)
from gatekeeper.run.worktree import remove_tree, remove_worktree, repository_folder, worktrees_root
from gatekeeper.sandbox.limits import kill_strays, remove_leftover


@dataclass
class Leftover:
    run_id: str
    worktree: Path | None
    branch: str | None
    head: str | None


def _worktrees(git_dir: Path) -> dict[str, Leftover]:
    """Every worktree gatekeeper created for this repository, by run id."""
    out = git("worktree", "list", "--porcelain", "-z", git_dir=git_dir).decode()
    root = str(worktrees_root())
    found: dict[str, Leftover] = {}
    for block in out.split("\0\0"):
        fields = dict((item.split(" ", 1) + [""])[:2] for item in block.split("\0") if item)
        path = fields.get("worktree", "")
        if not path.startswith(root + "/"):
            continue
        branch = fields.get("branch", "").removeprefix("refs/heads/") or None
        found[Path(path).name] = Leftover(Path(path).name, Path(path), branch, fields.get("HEAD"))
    admin_root = git_dir / "worktrees"
    for admin in sorted(admin_root.glob("*")) if admin_root.is_dir() else []:
        gitdir_file = admin / "gitdir"
        if admin.name not in found and gitdir_file.is_file():
            target = Path(gitdir_file.read_text().strip()).parent
            if str(target).startswith(root + "/"):
                found[admin.name] = Leftover(admin.name, target, None, None)
    return found


def _candidates(git_dir: Path) -> dict[str, Leftover]:
    found = _worktrees(git_dir)
    for record in all_records(git_dir):
        if record.run_id in found or record.state in ("finished", "discarded"):
            continue
        found[record.run_id] = Leftover(record.run_id, Path(record.worktree) if record.worktree
                                        else None, record.branch, None)  # fmt: skip
    return found


def _branch_head(git_dir: Path, branch: str) -> str | None:
    try:
        return git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}",
                   git_dir=git_dir).decode().strip()  # fmt: skip
    except GitError:
        return None


PENDING_MAX_AGE = 24 * 3600  # seconds: a receipt writer takes a moment, never a day


def _dead_pending_refs(git_dir: Path) -> list[str]:
    """Private notes refs left by receipt writers that were killed: a run's whose launcher no
    longer holds the run's lock, or any other older than a day.

    Never judged by a process id: a writer in another pid namespace (a container) has no
    /proc entry here, and removing its ref mid-write would cost receipts. A run's lock is a
    flock on the repository's own files, which holds across namespaces.
    """
    out = git("for-each-ref", "--format=%(committerdate:unix) %(refname)", PENDING_PREFIX,
              git_dir=git_dir).decode()  # fmt: skip
    now = time.time()
    dead = []
    for line in out.splitlines():
        stamp, _, ref = line.partition(" ")
        owner = ref.removeprefix(PENDING_PREFIX).rpartition("-")[0]
        if is_run_id(owner):
            if not is_live(git_dir, owner):
                dead.append(ref)
        elif stamp.isdigit() and now - int(stamp) > PENDING_MAX_AGE:
            dead.append(ref)
    return dead


def discard(*, repo: Path, run_id: str | None = None, keep_branch: bool = False) -> int:
    paths = discover(repo)
    git_dir = paths.git_dir
    candidates = _candidates(git_dir)
    if run_id is not None:
        if is_live(git_dir, run_id):
            record = read_record(git_dir, run_id)
            raise UsageError(f"run {run_id} is still running"
                             + (f" (launcher pid {record.pid})" if record else ""),
                             hint="stop it first (Ctrl-C in its terminal, or kill the launcher); "
                             "its result is then committed and signed")  # fmt: skip
        record = read_record(git_dir, run_id)
        if run_id not in candidates and record is None:
            raise UsageError(f"no run {run_id!r} in {git_dir}",
                             hint="`gatekeeper runs` lists the runs")  # fmt: skip
        candidates = {run_id: candidates.get(run_id) or Leftover(
            run_id, Path(record.worktree) if record and record.worktree else None,
            record.branch if record else None, None)}  # fmt: skip
    acted = False
    for rid, left in sorted(candidates.items()):
        if is_live(git_dir, rid):
            print(f"left {rid} alone: still running", file=sys.stderr)
            continue
        record = read_record(git_dir, rid)
        if record is not None:
            record = settle(git_dir, record)  # its launcher is gone: killed, lock file removed
        head = left.head or (_branch_head(git_dir, left.branch) if left.branch else None)
        signed = bool(head and envelopes_for(git_dir, head))
        finished = signed or (record is not None and record.state == "finished")
        if run_id is not None:
            why = "named"
            drop_branch = None if keep_branch else left.branch
        elif finished:
            why = "finished; its branch is kept for review"
            drop_branch = None
        else:
            why = ("its launcher ended before the run finished" if record is not None
                   else "no receipt and no record of a finished run")  # fmt: skip
            drop_branch = None if keep_branch else left.branch
        # Before the worktree: a sandbox left starting up holds it open.
        strays = kill_strays(rid)
        if drop_branch and record is not None and record.resumed_from:
            # The branch was the resumed run's before this one: it goes back to that result.
            removed = remove_worktree(git_dir, rid, left.worktree, None)
            with contextlib.suppress(GitError):
                git("update-ref", f"refs/heads/{drop_branch}", record.base, head or record.base,
                    git_dir=git_dir)  # fmt: skip
                removed.append(f"branch {drop_branch} back at run {record.resumed_from}'s "
                               f"result {record.base[:12]}")  # fmt: skip
        else:
            removed = remove_worktree(git_dir, rid, left.worktree, drop_branch)
        # A launcher killed outright leaves its private scratch folder (agent git dir, events).
        for scratch in Path(tempfile.gettempdir()).glob(f"gatekeeper-run-{rid}-*"):
            remove_tree(scratch)  # read-only folders the agent made included
            removed.append(str(scratch))
        if remove_leftover(rid):
            removed.append("process cgroup")
        if strays:
            removed.append(f"{strays} sandbox process(es) left starting up")
        if record is not None and (run_id is not None or not finished):
            save_state(git_dir, record, "discarded", reason=why)
        acted = acted or bool(removed)
        print(f"discarded {rid} ({why}): " + (", ".join(removed) or "nothing left"),
              file=sys.stderr)  # fmt: skip
    for ref in _dead_pending_refs(git_dir):
        with contextlib.suppress(GitError):
            git("update-ref", "-d", ref, git_dir=git_dir)
    git("worktree", "prune", git_dir=git_dir)
    # Base checkouts of layered worktrees that no worktree uses any more.
    for base in layers.collect_unused(repository_folder(git_dir)):
        acted = True
        print(f"removed the unused base checkout {base}", file=sys.stderr)
    if not candidates and not acted:
        print("nothing to discard", file=sys.stderr)
    return 0
