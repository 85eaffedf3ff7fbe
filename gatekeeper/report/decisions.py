"""What every report shows of a receipt beyond its claims: its decision points with their
decisions and approvers, and what the boundary refused (writes, commands, destinations,
secret lookups); long commands shown short, the full text kept for a fold."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.gate.result import ReceiptView
from gatekeeper.gate.shown import visible as visible  # shown by every report

SHORT_WIDTH = 120  # characters of a command shown before the fold


@dataclass(frozen=True)
class CommandText:
    """A command line as reports show it: its first line cut to SHORT_WIDTH, and the whole."""

    full: str
    short: str

    @property
    def is_folded(self) -> bool:
        return self.short != self.full


def command_text(argv: list[str] | str) -> CommandText:
    """argv (or a shell line) shown short: the first line, cut with an ellipsis."""
    full = argv if isinstance(argv, str) else shlex.join(argv)
    lines = full.splitlines() or [""]
    first = lines[0]
    short = first if len(first) <= SHORT_WIDTH else first[: SHORT_WIDTH - 1] + "…"
    if len(lines) > 1 and short == first:
        short += " …"
    return CommandText(full=full, short=short)


@dataclass(frozen=True)
class Decided:
    """One decision point of a run and the signed decisions that name it."""

    id: str
    kind: str
    value: CommandText
    decision: str
    time: str | None
    approvals: tuple[dict[str, str], ...] = ()

    @property
    def decided_by(self) -> str:
        """`decided by <signer>` for each signed decision, with how the gate took it."""
        return "; ".join(
            f"{a.get('decision', '?')}, decided by {a.get('signer', '?')} ({a.get('status', '?')})"
            for a in self.approvals
        )


@dataclass(frozen=True)
class DeniedCommand:
    command: CommandText
    rule: str | None


@dataclass(frozen=True)
class Refusals:
    """A receipt's decision points and refusals, for one section of a report."""

    run_id: str
    escalations: list[Decided] = field(default_factory=list)
    denied_writes: list[str] = field(default_factory=list)
    denied_commands: list[DeniedCommand] = field(default_factory=list)
    denied_destinations: list[str] = field(default_factory=list)
    secret_lookups: list[str] = field(default_factory=list)
    # Signed decisions that name no decision point of this receipt (shown, never dropped).
    unmatched: list[dict[str, str]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        shown = (self.escalations, self.denied_writes, self.denied_commands,
                 self.denied_destinations, self.secret_lookups, self.unmatched)  # fmt: skip
        return not any(shown)

    def to_json(self) -> dict[str, Any]:
        return {
            "escalations": [
                {"id": e.id, "kind": e.kind, "value": e.value.full, "decision": e.decision,
                 "time": e.time, "approvals": [dict(a) for a in e.approvals]}
                for e in self.escalations
            ],
            "denied_writes": self.denied_writes,
            "denied_commands": [{"command": d.command.full, "rule": d.rule}
                                for d in self.denied_commands],
            "denied_destinations": self.denied_destinations,
            "secret_lookups": self.secret_lookups,
            "unmatched_approvals": [dict(a) for a in self.unmatched],
        }  # fmt: skip


def destination(host: str, port: int | None, category: str | None, decision: str,
                count: int | None) -> str:  # fmt: skip
    where = f"{host}:{port}" if port is not None else host
    times = f", {count} times" if count and count > 1 else ""
    return f"{where} ({category or '?'}, {decision}{times})"


def refusals(view: ReceiptView) -> Refusals:
    """The decision points (with the approvals that decide them, matched by id) and refusals
    a verified receipt records."""
    p = view.statement.predicate
    approvals = list(view.approvals)
    escalations = []
    ids = set()
    for e in p.escalations:
        ids.add(e.id)
        mine = tuple(a for a in approvals if e.id and a.get("id") == e.id)
        escalations.append(Decided(e.id, e.kind, command_text(e.value), e.decision, e.time,
                                   mine))  # fmt: skip
    denied_commands: dict[str, DeniedCommand] = {}
    for proc in p.processes:
        if proc.decision != "allow":
            shown = command_text(proc.argv)
            denied_commands.setdefault(shown.full, DeniedCommand(shown, proc.rule))
    destinations = [destination(n.host, n.port, n.category, n.decision, n.count)
                    for n in p.network if n.decision != "allow"]  # fmt: skip
    return Refusals(
        run_id=p.run_id,
        escalations=escalations,
        denied_writes=sorted({w.path for w in p.writes if w.decision != "allow"}),
        denied_commands=list(denied_commands.values()),
        denied_destinations=list(dict.fromkeys(destinations)),
        secret_lookups=list(p.secret_lookups),
        unmatched=[dict(a) for a in approvals if a.get("id") not in ids],
    )
