"""`run --resume RUN`: continue a finished run on its branch, from its result, with the
escalations approved for it granted."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.errors import UsageError
from gatekeeper.git import exact_ref
from gatekeeper.receipt.models import UsedApproval
from gatekeeper.run.records import is_live, read_record
from gatekeeper.run.worktree import Worktree, create_worktree, remove_worktree


@dataclass(frozen=True)
class Resume:
    """The run being continued: its id, branch and result commit, and the approvals used."""

    run_id: str
    branch: str
    commit: str
    approvals: list[UsedApproval] = field(default_factory=list)

    def check(self, git_dir: Path) -> None:
        """Raise UsageError unless the branch still points at the run's result."""
        tip = exact_ref(f"refs/heads/{self.branch}", git_dir)
        if tip != self.commit:
            where = f"is at {tip[:12]}" if tip else "no longer exists"
            raise UsageError(
                f"run {self.run_id}'s branch {self.branch} {where}, not at its result "
                f"{self.commit[:12]}; a resumed run continues from the run's result only",
                hint="resume the latest run on that branch (see `gatekeeper runs`)",
            )
        if is_live(git_dir, self.run_id):
            raise UsageError(f"run {self.run_id} is still running; it cannot be resumed yet")

    def predicate_fields(self) -> dict[str, object]:
        return {"resumed_from": self.run_id, "approvals": list(self.approvals)}


def resume_worktree(git_dir: Path, resume: Resume, run_id: str) -> Worktree:
    """A worktree for run_id on the resumed run's branch, at its result.

    The resumed run's own worktree (a finished run's leftover, as `discard` would remove it)
    is removed first: git checks a branch out in one worktree only. Raise UsageError when the
    branch moved.
    """
    resume.check(git_dir)
    record = read_record(git_dir, resume.run_id)
    previous = Path(record.worktree) if record is not None and record.worktree else None
    remove_worktree(git_dir, resume.run_id, previous, None)
    return create_worktree(git_dir, resume.commit, resume.branch, run_id, existing=True)
