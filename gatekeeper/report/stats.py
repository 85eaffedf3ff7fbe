"""The nine numbers across a repository's runs: the figures, by run and by day, and what the
dashboard charts (escalations by kind and decision, the most denied commands, paths and
destinations).

Built from rows the CLI gathers (run records, verified receipts, the gate's verdict on each
run's branch); nothing here reads git.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.receipt.models import Predicate
from gatekeeper.report.decisions import command_text, destination

# Summed from verified receipts' counts.
RECEIPT_FIGURES = (
    "files_touched", "denied_writes", "escalations", "commands_run", "failed_commands",
    "network_requests",
)  # fmt: skip
# Counted over runs.
RUN_FIGURES = ("discarded_runs", "accepted_runs", "mismatches")
FIGURES = (*RECEIPT_FIGURES, *RUN_FIGURES)
# The gate's findings that mean the receipt and the diff disagree.
MISMATCH_KINDS = ("unclaimed-change", "missing-change", "change-differs", "uncovered-commit")
TOP = 10  # entries in each "most denied" list


@dataclass
class RunStats:
    """One run: where it stands, and its verified receipt (None: none verified)."""

    run_id: str
    branch: str
    commit: str | None
    state: str  # as `gatekeeper runs` says: running, finished, accepted, killed, failed, ...
    started_at: str | None
    accepted: bool  # its result is reachable from the default branch
    discarded: bool
    mismatch: list[str] = field(default_factory=list)  # the gate's mismatch kinds on its branch
    predicate: Predicate | None = None
    report: str | None = None  # a relative link to its report, when one was written

    @property
    def day(self) -> str:
        return (self.started_at or "")[:10] or "unknown"

    @property
    def verified(self) -> bool:
        return self.predicate is not None

    def figures(self) -> dict[str, int]:
        counts = self.predicate.counts.model_dump() if self.predicate else {}
        out = {name: int(counts.get(name, 0)) for name in RECEIPT_FIGURES}
        out.update(discarded_runs=int(self.discarded), accepted_runs=int(self.accepted),
                   mismatches=int(bool(self.mismatch)))  # fmt: skip
        return out

    def to_json(self) -> dict[str, Any]:
        p = self.predicate
        return {
            "run_id": self.run_id, "branch": self.branch, "commit": self.commit,
            "state": self.state, "started_at": self.started_at, "day": self.day,
            "verified": self.verified, "accepted": self.accepted, "discarded": self.discarded,
            "mismatch": self.mismatch, "report": self.report,
            "command": command_text(p.command.argv).full if p else None,
            **self.figures(),
            "escalation_list": [e.model_dump() for e in p.escalations] if p else [],
        }  # fmt: skip


def _total(rows: list[RunStats]) -> dict[str, int]:
    total = dict.fromkeys(FIGURES, 0)
    for row in rows:
        for name, value in row.figures().items():
            total[name] += value
    return {"runs": len(rows), **total}


@dataclass
class Stats:
    """The figures over rows (already filtered by --since), by day, and the dashboard's lists."""

    repository: str
    default_branch: str | None
    since: str | None
    rows: list[RunStats]
    unverified_receipts: int = 0  # receipt lines that did not verify (not counted anywhere)

    @property
    def totals(self) -> dict[str, int]:
        return _total(self.rows)

    @property
    def by_day(self) -> list[dict[str, Any]]:
        days: dict[str, list[RunStats]] = {}
        for row in sorted(self.rows, key=lambda r: (r.started_at or "", r.run_id)):
            days.setdefault(row.day, []).append(row)
        return [{"day": day, **_total(rows)} for day, rows in days.items()]

    def escalations_by_kind(self) -> dict[str, dict[str, int]]:
        """kind -> decision -> how many decision points, over verified receipts."""
        table: dict[str, Counter[str]] = {}
        for row in self.rows:
            for e in row.predicate.escalations if row.predicate else []:
                table.setdefault(e.kind, Counter())[e.decision] += 1
        return {kind: dict(sorted(c.items())) for kind, c in sorted(table.items())}

    def most_denied(self) -> dict[str, list[tuple[str, int]]]:
        """The TOP most often denied commands, paths and destinations, each with the number
        of runs that were refused it (a shell trying each PATH entry, a retry loop or a
        flood of attempts is one refusal of the run)."""
        commands: Counter[str] = Counter()
        paths: Counter[str] = Counter()
        destinations: Counter[str] = Counter()
        for row in self.rows:
            p = row.predicate
            if p is None:
                continue
            commands.update({command_text(x.argv).short for x in p.processes
                             if x.decision != "allow"})  # fmt: skip
            paths.update({w.path for w in p.writes if w.decision != "allow"})
            destinations.update({destination(n.host, n.port, n.category, n.decision, None)
                                 for n in p.network if n.decision != "allow"})  # fmt: skip
        return {
            "commands": _top(commands),
            "paths": _top(paths),
            "destinations": _top(destinations),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "repository": self.repository,
            "default_branch": self.default_branch,
            "since": self.since,
            **self.totals,
            "unverified_receipts": self.unverified_receipts,
            "by_day": self.by_day,
            "escalations_by_kind": self.escalations_by_kind(),
            "most_denied": {k: [{"value": v, "count": n} for v, n in items]
                            for k, items in self.most_denied().items()},
            "rows": [r.to_json() for r in self.rows],
        }  # fmt: skip


def _top(counter: Counter[str]) -> list[tuple[str, int]]:
    return sorted(counter.items(), key=lambda item: (-item[1], item[0]))[:TOP]
