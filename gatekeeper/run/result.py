"""What a finished run returns to the CLI: the run's identity, outcome and record."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.policy.model import LoadedPolicy
from gatekeeper.proc import signal_name
from gatekeeper.receipt.changes import Change, as_dict
from gatekeeper.receipt.models import Escalation, NetworkRequest
from gatekeeper.receipt.notes import NOTES_REF
from gatekeeper.receipt.redact import Redactor
from gatekeeper.run.agentgit import Imported
from gatekeeper.sandbox.launch import Outcome
from gatekeeper.sandbox.supervise.setup import Observed

TIMEOUT_EXIT = 124
SUPERVISOR_FAILED_EXIT = 125
INTERRUPTED_EXIT = 130


@dataclass
class RunResult:
    run_id: str
    branch: str
    commit: str
    tree: str
    worktree: Path
    base: str
    exit_code: int
    outcome: Outcome
    checks: list[Outcome]
    changes: list[Change]
    denied: list[str]
    policy: LoadedPolicy
    receipt_ref: str = NOTES_REF
    hidden: list[str] = field(default_factory=list)
    writable: list[str] = field(default_factory=list)
    observed: Observed = field(default_factory=Observed)
    imported: Imported | None = None
    supervisor_errors: list[str] = field(default_factory=list)
    supervisor_failed: bool = False
    network: list[NetworkRequest] = field(default_factory=list)
    denied_destinations: list[str] = field(default_factory=list)
    not_committed: dict[str, str] = field(default_factory=dict)  # path -> why (not the policy)
    launcher_errors: list[str] = field(default_factory=list)
    grants: list[str] = field(default_factory=list)
    profile: dict[str, str] | None = None
    redactor: Redactor | None = None  # applied to what the CLI prints of this result
    ignored: list[str] = field(default_factory=list)  # new paths .gitignore covers
    escalations: list[Escalation] = field(default_factory=list)  # as in the receipt

    def as_json(self) -> dict[str, object]:
        return {
            "run_id": self.run_id, "branch": self.branch, "commit": self.commit,
            "tree": self.tree, "worktree": str(self.worktree), "base": self.base,
            "exit_code": self.exit_code, "timed_out": self.outcome.timed_out,
            "interrupted": self.outcome.interrupted,
            "interrupted_by": signal_name(self.outcome.interrupted_by),
            "signal": self.outcome.signal, "signal_name": self.outcome.signal_name,
            "checks": [{"argv": c.argv, "exit_code": c.exit_code,
                        **({"signal": c.signal, "signal_name": c.signal_name}
                           if c.signal is not None else {})} for c in self.checks],
            "changes": [as_dict(c) for c in self.changes],
            "denied_writes": sorted({*self.denied, *(w.path for w in self.observed.denied_writes)}),
            "denied_commands": [p.argv for p in self.observed.denied_commands],
            "escalations": [e.model_dump() for e in self.escalations],
            "agent_commits": self.imported.commits if self.imported else [],
            "agent_commits_refused": self.imported.refused if self.imported else None,
            "not_committed": [{"path": p, "reason": r} for p, r in self.not_committed.items()],
            "launcher_errors": self.launcher_errors,
            "supervisor_failed": self.supervisor_failed,
            "network": [r.model_dump(exclude_none=True) for r in self.network],
            "denied_destinations": self.denied_destinations,
            "receipt": f"{self.receipt_ref} on {self.commit}",
            "policy": {"path": self.policy.path, "sha256": self.policy.sha256},
            "grants": self.grants, "profile": self.profile,
            "ignored": self.ignored[:1000], "ignored_count": len(self.ignored),
        }  # fmt: skip


def exit_code_of(outcome: Outcome, commands: list[Outcome]) -> int:
    """The exit code `gatekeeper run` returns for a run that reached its receipt."""
    if any(o.supervisor_failed for o in commands):
        return SUPERVISOR_FAILED_EXIT
    if outcome.timed_out:
        return TIMEOUT_EXIT
    stopped = [o for o in commands if o.interrupted]  # the agent, or a check it was stopped in
    if stopped:
        # 128 + the signal the launcher got, as a shell would say for it (130 for Ctrl-C).
        signum = stopped[-1].interrupted_by
        return 128 + signum if signum else INTERRUPTED_EXIT
    return outcome.exit_code if outcome.exit_code is not None else 1
