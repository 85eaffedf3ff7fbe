"""The gate's answer: a verdict, the findings behind it, and what was looked at."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gatekeeper.gate.findings import Finding
from gatekeeper.gate.history import CommitInfo
from gatekeeper.receipt.changes import Change, as_dict
from gatekeeper.receipt.models import Statement


class Verdict(StrEnum):
    pass_ = "pass"
    block = "block"


@dataclass(frozen=True)
class ReceiptView:
    """A verified receipt as reports show it."""

    statement: Statement
    signer: str  # key id, with the trust file's comment when it has one
    attached_to: str  # the commit whose note holds it
    source: str  # notes ref (or pushed notes commit) it was read from
    covers: tuple[str, ...]  # commits of the range it covers
    approvals: tuple[dict[str, str], ...] = ()  # signed decisions on this run's escalations

    @property
    def run_id(self) -> str:
        return self.statement.predicate.run_id

    def to_json(self) -> dict[str, Any]:
        p = self.statement.predicate
        return {
            "run_id": p.run_id,
            "branch": p.branch,
            "attached_to": self.attached_to,
            "covers": list(self.covers),
            "signer": self.signer,
            "result": self.statement.result_commit,
            "base": p.base.commit,
            "policy_sha256": p.policy.sha256,
            "command": {"argv": p.command.argv, "exit_code": p.command.exit_code},
            "checks": [{"argv": c.argv, "exit_code": c.exit_code} for c in p.checks],
            # Plain ints in field order, as model_dump gives them (without building Counts'
            # serializer, which a check would build for this alone).
            "counts": dict(p.counts.__dict__),
            "approvals": [dict(a) for a in self.approvals],
        }


@dataclass
class GateResult:
    """Everything a report needs; `verdict` is block whenever there is a finding."""

    target: str
    target_name: str
    head: str
    head_name: str
    merge_base: str | None
    commits: list[CommitInfo] = field(default_factory=list)
    covered_by: dict[str, str] = field(default_factory=dict)  # commit -> run id
    signed_by: dict[str, str] = field(default_factory=dict)  # commit -> person who signed it
    changes: list[Change] = field(default_factory=list)
    receipts: list[ReceiptView] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # Note lines on commits otherwise accounted for that do not speak for them: not findings.
    ignored_notes: list[Finding] = field(default_factory=list)

    @property
    def ignored_text(self) -> str:
        """The summary line's count of note lines ignored (empty when there are none)."""
        n = len(self.ignored_notes)
        return f", {n} note line(s) ignored" if n else ""

    @property
    def receipts_verified(self) -> int:
        return len(self.receipts)

    @property
    def verdict(self) -> Verdict:
        accounted = self.receipts or self.signed_by
        return Verdict.block if self.findings or not accounted else Verdict.pass_

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.pass_

    def accounted_for(self, commit: str) -> str | None:
        """Who or what accounts for a commit: a run id, `person: <who> (<key>)`, or None."""
        if commit in self.covered_by:
            return self.covered_by[commit]
        if commit in self.signed_by:
            return f"person: {self.signed_by[commit]}"
        return None

    def kinds(self) -> list[str]:
        return sorted({f.kind.value for f in self.findings})

    def to_json(self) -> dict[str, Any]:
        """The DESIGN.md shape, plus the range, commits and receipts for tools that want them."""
        return {
            "verdict": self.verdict.value,
            "receipts_verified": self.receipts_verified,
            "findings": [f.to_json() for f in self.findings],
            "target": {"name": self.target_name, "commit": self.target},
            "head": {"name": self.head_name, "commit": self.head},
            "merge_base": self.merge_base,
            "commits": [
                {
                    "commit": c.oid,
                    "subject": c.subject,
                    "covered_by": self.covered_by.get(c.oid),
                    "signed_by": self.signed_by.get(c.oid),
                }
                for c in self.commits
            ],
            "receipts": [r.to_json() for r in self.receipts],
            "ignored_notes": [f.to_json() for f in self.ignored_notes],
            "changes": [as_dict(c) for c in self.changes],
        }
