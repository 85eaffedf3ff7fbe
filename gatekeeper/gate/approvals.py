"""Which signed approvals the gate honours, and which `unapproved-write` findings they lift.

A change outside the target's write set stays `unapproved-write` unless every run that made it
has, in force, an approval of a `write` escalation whose value names the path (as a
`paths.write` entry would), for that run or for a run it resumed (`resumed_from`, followed
through verified receipts only). An approval counts only when it verifies against a key on an
`approver` line of the target's trust file, names the run whose result commit holds it, and is
about that commit. Everything else is ignored, and said so in the receipt's `approvals`. A
grant made at launch (`--grant`, a profile) is never an approval.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gatekeeper.errors import (
    BadSignatureError,
    ReceiptError,
    UntrustedKeyError,
)
from gatekeeper.gate.coverage import Coverage, VerifiedReceipt, verify_note
from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.gate.notes import NoteLine
from gatekeeper.gate.result import ReceiptView
from gatekeeper.policy.patterns import check_pattern, matches
from gatekeeper.receipt.approval import (
    Decision,
    decisions_of,
    is_approval_line,
    is_from_the_future,
    latest,
    made_folders,
    names_literally,
    verify_approval,
)
from gatekeeper.receipt.models import escalation_id
from gatekeeper.receipt.trust import TrustFile

# How many `resumed_from` links are followed from one run.
MAX_RESUME_DEPTH = 32

NotesOn = Callable[[str], list[NoteLine]]


def split_approvals(
    notes: dict[str, list[NoteLine]],
) -> tuple[dict[str, list[NoteLine]], dict[str, list[NoteLine]]]:
    """(receipt lines, approval lines) by annotated commit: approvals never reach the receipt
    verifier (where they would be malformed receipts), receipts never the approval verifier."""
    receipts: dict[str, list[NoteLine]] = {}
    approvals: dict[str, list[NoteLine]] = {}
    for annotated, lines in notes.items():
        for note in lines:
            kind = approvals if note.problem is None and is_approval_line(note.line) else receipts
            kind.setdefault(annotated, []).append(note)
    return receipts, approvals


# What of an approval that did not verify is shown (anyone can push one): bounded.
MAX_SHOWN = 200


def _entry(e: dict[str, Any] | Decision, decision: str, signer: str, status: str) -> dict[str, str]:
    if isinstance(e, Decision):
        return {"id": e.id, "kind": e.kind, "value": e.value, "decision": decision,
                "signer": signer, "status": status}  # fmt: skip
    kind, value = str(e.get("kind", ""))[:MAX_SHOWN], str(e.get("value", ""))[:MAX_SHOWN]
    decision, signer = decision[:MAX_SHOWN], signer[:MAX_SHOWN]
    return {"id": escalation_id(kind, value) if kind else "", "kind": kind, "value": value,
            "decision": decision, "signer": signer, "status": status}  # fmt: skip


def _peek(line: str) -> tuple[list[dict[str, Any]], str, str]:
    """(escalations, decision, key ids) of an approval that did not verify, for the report."""
    try:
        envelope = json.loads(line)
        keyids = ", ".join(str(s.get("keyid", "")) for s in envelope.get("signatures", []))
        data = json.loads(base64.b64decode(envelope["payload"], validate=True))
        predicate = data["predicate"]
        escalations: list[dict[str, Any]] = [
            e for e in predicate["escalations"] if isinstance(e, dict)
        ][:10]
        # Every approval that is ignored is shown, even one that names no escalation.
        return escalations or [{}], str(predicate.get("decision", "")), keyids
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return [{}], "", ""


@dataclass
class _Run:
    """One run of a resume chain: its verified receipt and its decisions in force."""

    receipt: VerifiedReceipt
    in_force: dict[str, Decision] = field(default_factory=dict)
    shown: list[dict[str, str]] = field(default_factory=list)
    # Why the note on its result was not read whole (a decision may be hidden), or None.
    unread: str | None = None
    # The paths its agent tried to make as folders, and its write escalations' values (read
    # once, where a write is decided: a run may have thousands of escalations).
    made: set[str] = field(default_factory=set)
    literal: set[str] = field(default_factory=set)


class Approvals:
    """Approvals on the runs that cover the range, judged with the target's trust file."""

    def __init__(self, trust: TrustFile, notes_on: NotesOn) -> None:
        self.trust = trust
        self._notes_on = notes_on
        self._notes: dict[str, list[NoteLine]] = {}
        self._chains: dict[tuple[str, str], list[_Run]] = {}
        self.runs: dict[str, _Run] = {}  # result commit -> run
        self.problems: dict[str, list[str]] = {}  # run id -> why its chain stops

    def notes_on(self, commit: str) -> list[NoteLine]:
        if commit not in self._notes:
            self._notes[commit] = self._notes_on(commit)
        return self._notes[commit]

    def _why_untrusted(self, keyids: str) -> str:
        signers = {k.keyid for k in self.trust.signers}
        if any(k in signers for k in keyids.split(", ")):
            return ("signed by a key the target's trust file lists only as a receipt signer, "
                    "not as an approver")  # fmt: skip
        return "signed by a key that is not an approver in the target's trust file"

    def _judge_line(self, run: _Run, note: NoteLine) -> list[Decision]:
        """The decisions one approval line makes for run, or none (it is shown as ignored)."""
        receipt = run.receipt
        try:
            statement, signer = verify_approval(note.line, self.trust.approvers)
        except (BadSignatureError, UntrustedKeyError, ReceiptError) as exc:
            escalations, decision, keyids = _peek(note.line)
            if isinstance(exc, BadSignatureError):
                failed = "bad signature: the approval was changed after it was signed"
            elif isinstance(exc, UntrustedKeyError):
                failed = self._why_untrusted(keyids)
            else:
                failed = exc.message
            run.shown += [_entry(e, decision, keyids, f"ignored: {failed}") for e in escalations]
            return []
        decisions = decisions_of(statement, signer, note.line)
        signer_text = decisions[0].signer_text if decisions else signer.keyid
        p = statement.predicate
        why: str | None = None
        if p.run_id != receipt.run_id:
            why = (f"for another run ({p.run_id}), found on the result of run "
                   f"{receipt.run_id}")  # fmt: skip
        elif statement.result_commit != receipt.statement.result_commit:
            why = (f"about commit {statement.result_commit[:12]}, not the run's result "
                   f"{receipt.statement.result_commit[:12]}")  # fmt: skip
        if why is not None:
            run.shown += [_entry(d, d.decision, signer_text, f"ignored: {why}") for d in decisions]
            return []
        return decisions

    def _load(self, receipt: VerifiedReceipt) -> _Run:
        commit = receipt.statement.result_commit
        if commit in self.runs:
            return self.runs[commit]
        run = _Run(receipt)
        self.runs[commit] = run
        decisions: list[Decision] = []
        for note in self.notes_on(commit):
            if note.problem is not None:
                # Anyone who may push notes can reorder a note's lines (none is lost) so that
                # a denial sits past a limit: a note not read whole lifts nothing.
                run.unread = run.unread or note.problem
            elif is_approval_line(note.line):
                decisions += self._judge_line(run, note)
        run.in_force = latest(decisions)
        if any(d.kind == "write" for d in run.in_force.values()):
            run.made = made_folders(receipt.statement)
            run.literal = {e.value for e in receipt.statement.predicate.escalations
                           if e.kind == "write"}  # fmt: skip
        for d in decisions:
            current = run.in_force.get(d.id)
            if is_from_the_future(d):
                status = f"ignored: dated {d.time}, in the future; an approval counts from its time"
            elif current is d or current is None:
                status = "honoured"
            else:
                status = f"ignored: superseded by the {current.decision} decision of {current.time}"
            run.shown.append(_entry(d, d.decision, d.signer_text, status))
        return run

    def chain(self, receipt: VerifiedReceipt) -> list[_Run]:
        """receipt's run and the runs it resumed, each through a verified receipt."""
        key = (receipt.run_id, receipt.statement.result_commit)
        if key not in self._chains:
            self._chains[key] = self._follow(receipt)
        return self._chains[key]

    def _follow(self, receipt: VerifiedReceipt) -> list[_Run]:
        runs = [self._load(receipt)]
        current = receipt
        for _ in range(MAX_RESUME_DEPTH):
            previous = current.statement.predicate.resumed_from
            if not previous:
                break
            base = current.statement.predicate.base.commit
            found = None
            for note in self.notes_on(base):
                if note.problem is not None or is_approval_line(note.line):
                    continue
                outcome = verify_note(note, self.trust.signers)
                if (
                    isinstance(outcome, VerifiedReceipt)
                    and outcome.run_id == previous
                    and outcome.statement.result_commit == base
                ):
                    found = outcome
                    break
            if found is None or any(r.receipt.run_id == previous for r in runs):
                self.problems.setdefault(receipt.run_id, []).append(
                    f"run {current.run_id} says it resumed run {previous}, but no verified "
                    f"receipt of {previous} is attached to its base {base[:12]}"
                )
                break
            runs.append(self._load(found))
            current = found
        return runs

    def covers(self, receipt: VerifiedReceipt, path: str) -> bool:
        """Whether an approval in force for receipt's run (or one it resumed) covers path."""
        approved = False
        for run in self.chain(receipt):
            if run.unread is not None:
                why = (f"the note on run {run.receipt.run_id}'s result "
                       f"{run.receipt.statement.result_commit[:12]} could not be read whole "
                       f"({run.unread}), so a decision in it may be hidden")  # fmt: skip
                if why not in self.problems.get(receipt.run_id, []):
                    self.problems.setdefault(receipt.run_id, []).append(why)
                return False
            for d in run.in_force.values():
                if d.kind != "write":
                    continue
                literal = d.value in run.literal
                folder = literal and d.value.rstrip("/") in run.made
                if not (names_literally(d.value, path, folder) if literal
                        else _names(d.value, path)):  # fmt: skip
                    continue
                if d.decision == "denied":
                    return False
                approved = True
        return approved


def _names(pattern: str, path: str) -> bool:
    if check_pattern(pattern) is not None:
        return False
    try:
        return matches(pattern, path)
    except re.error:
        return False


def _claims(coverage: Coverage) -> dict[str, list[VerifiedReceipt]]:
    """Path -> the covering runs whose receipts claim a change to it."""
    found: dict[str, list[VerifiedReceipt]] = {}
    seen: set[int] = set()
    # A squash of several runs is covered by all of them (its block), not only the last.
    every = [*coverage.covered.values(), *(r for rs in coverage.blocks.values() for r in rs)]
    for receipt in every:
        if id(receipt) in seen:
            continue
        seen.add(id(receipt))
        for change in receipt.statement.predicate.changes:
            for path in change.paths:
                runs = found.setdefault(path, [])
                if not any(r is receipt for r in runs):
                    runs.append(receipt)
    return found


def honour_approvals(
    coverage: Coverage,
    path_findings: list[Finding],
    views: list[ReceiptView],
    approvals: Approvals | None,
) -> tuple[list[Finding], list[ReceiptView]]:
    """path_findings less the `unapproved-write` findings approvals lift, and views with each
    run's approvals (honoured or ignored, and why). approvals: judged with the trust file of
    the target, None when it could not be read (a finding of its own already: then no
    approval counts)."""
    if approvals is None:
        return path_findings, views
    kept: list[Finding] = []
    claims = _claims(coverage) if path_findings else {}
    for finding in path_findings:
        if finding.kind is not Kind.unapproved_write or finding.path is None:
            kept.append(finding)
            continue
        runs = claims.get(finding.path, [])
        if runs and all(approvals.covers(r, finding.path) for r in runs):
            continue
        names = ", ".join(r.run_id for r in runs) or "no receipted run"
        problems = [p for r in runs for p in approvals.problems.get(r.run_id, [])]
        extra = f"; {'; '.join(problems)}" if problems else ""
        kept.append(replace(finding, message=(
            f"{finding.message}; no approval in force by an approver of the target's trust "
            f"file covers it for {names} (a grant at launch is not an approval){extra}"
        )))  # fmt: skip
    in_range = {r.run_id for r in coverage.receipts}
    shown: list[ReceiptView] = []
    for view in views:
        receipt = next((r for r in coverage.receipts if r.statement is view.statement), None)
        if receipt is None:
            shown.append(view)
            continue
        # A run's own approvals; those of the runs it resumed only when they have no view here.
        chain = approvals.chain(receipt)
        entries = [*chain[0].shown,
                   *(e for run in chain[1:] if run.receipt.run_id not in in_range
                     for e in run.shown)]  # fmt: skip
        shown.append(replace(view, approvals=tuple(entries)))
    return kept, shown
