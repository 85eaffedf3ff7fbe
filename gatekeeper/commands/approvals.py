"""`gatekeeper escalations RUN`, `approve RUN` and `deny RUN`: a run's decision points and the
signed decisions on them (stored beside the run's receipt, in the same note)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gatekeeper.commands.runs import _receipt_claims
from gatekeeper.errors import (
    BadSignatureError,
    GitError,
    PolicyError,
    ReceiptError,
    UntrustedKeyError,
    UsageError,
)
from gatekeeper.git import discover, rev_parse
from gatekeeper.policy.model import load_policy_at
from gatekeeper.policy.patterns import is_protected
from gatekeeper.receipt.approval import (
    MAX_APPROVAL_ESCALATIONS,
    ApprovedEscalation,
    Decision,
    decisions_of,
    envelope_sha256,
    is_approval_line,
    is_from_the_future,
    latest,
    made_folders,
    make_approval,
    verify_approval,
)
from gatekeeper.receipt.keys import load_key
from gatekeeper.receipt.models import ESCALATION_KINDS, Escalation, Statement, escalation_id
from gatekeeper.receipt.notes import add_receipt_note, note_envelopes
from gatekeeper.receipt.statement import verify_envelope
from gatekeeper.receipt.trust import TrustFile, trust_file_at
from gatekeeper.run.records import is_run_id, read_record
from gatekeeper.sandbox.supervise.display import escape


@dataclass
class FoundRun:
    """A run found by id, branch or commit: its verified receipt and the decisions on it."""

    commit: str
    statement: Statement
    signer: str
    trust: TrustFile
    decisions: list[Decision] = field(default_factory=list)  # verified, for this run
    ignored: list[dict[str, str]] = field(default_factory=list)  # approvals not honoured

    @property
    def run_id(self) -> str:
        return self.statement.predicate.run_id

    def escalations(self) -> list[Escalation]:
        """The run's escalations, one per id (receipts before ids existed get theirs here)."""
        seen: dict[str, Escalation] = {}
        for e in self.statement.predicate.escalations:
            eid = e.id or escalation_id(e.kind, e.value)
            seen.setdefault(eid, e.model_copy(update={"id": eid}))
        return list(seen.values())

    def in_force(self) -> dict[str, Decision]:
        return latest(self.decisions)


def _commit_of(git_dir: Path, spec: str) -> tuple[str, str | None]:
    """(commit, run id if spec named one) for a run id, a branch or a commit."""
    if is_run_id(spec):
        record = read_record(git_dir, spec)
        if record is not None and record.commit:
            return record.commit, spec
        claim = _receipt_claims(git_dir).get(spec)
        if claim is not None:
            return claim[0], spec
        raise UsageError(f"no finished run {spec} in this repository",
                         hint="list the runs with `gatekeeper runs`")  # fmt: skip
    return rev_parse(git_dir, spec), None


def find_run(repo: Path, spec: str) -> FoundRun:
    """The run spec names, its receipt verified against the trust file at HEAD, and the
    approvals on it verified against that file's approvers; raise ReceiptError or
    UsageError when there is no such run or no verified receipt."""
    git_dir = discover(repo).git_dir
    commit, wanted = _commit_of(git_dir, spec)
    trust = trust_file_at(git_dir, rev_parse(git_dir, "HEAD"))
    lines, problems = note_envelopes(git_dir, commit)
    receipts: list[tuple[Statement, str]] = []
    errors = [p for _, p in problems]
    approvals: list[str] = []
    for _, line in lines:
        if is_approval_line(line):
            approvals.append(line)
            continue
        try:
            statement, signer = verify_envelope(line, trust.signers)
        except ReceiptError as exc:
            errors.append(exc.message)
            continue
        if statement.result_commit == commit and wanted in (None, statement.predicate.run_id):
            receipts.append((statement, f"{signer.keyid} {signer.comment}".strip()))
    if not receipts:
        detail = f" ({'; '.join(errors)})" if errors else ""
        raise ReceiptError(
            f"no verified receipt of {spec} on {commit[:12]}{detail}",
            hint="receipts are verified with .gatekeeper/trusted_keys at HEAD",
        )
    if len({s.predicate.run_id for s, _ in receipts}) > 1:
        raise UsageError(f"{commit[:12]} holds the receipts of several runs; name the run id")
    found = FoundRun(commit, receipts[0][0], receipts[0][1], trust)
    for line in approvals:
        if problems:
            # Lines past a note's limits are not read, and whoever may push notes can put a
            # denial there (reordering loses no line): no decision counts, none is resumed with.
            found.ignored.append({"envelope_sha256": envelope_sha256(line),
                                  "status": f"ignored: the note on {commit[:12]} could not be "
                                            f"read whole ({problems[0][1]})"})  # fmt: skip
            continue
        try:
            approval, approver = verify_approval(line, trust.approvers)
        except ReceiptError as exc:
            why = (
                "bad signature" if isinstance(exc, BadSignatureError)
                else "not signed by an approver" if isinstance(exc, UntrustedKeyError)
                else "malformed"
            )  # fmt: skip
            found.ignored.append({"envelope_sha256": envelope_sha256(line),
                                  "status": f"ignored: {why}: {exc.message}"})  # fmt: skip
            continue
        if approval.predicate.run_id != found.run_id or approval.result_commit != commit:
            found.ignored.append({"envelope_sha256": envelope_sha256(line),
                                  "status": f"ignored: for another run "
                                            f"({approval.predicate.run_id})"})  # fmt: skip
            continue
        found.decisions += decisions_of(approval, approver, line)
        if any(is_from_the_future(d) for d in found.decisions[-1:]):
            found.ignored.append({"envelope_sha256": envelope_sha256(line),
                                  "status": f"ignored: dated {approval.predicate.time}, in "
                                            "the future"})  # fmt: skip
    return found


def _rows(found: FoundRun) -> list[dict[str, Any]]:
    in_force = found.in_force()
    rows = []
    for e in found.escalations():
        d = in_force.get(e.id)
        rows.append({
            "id": e.id, "kind": e.kind, "value": e.value, "time": e.time,
            "recorded": e.decision,
            "decision": d.decision if d is not None else e.decision,
            "decided_by": d.signer_text if d is not None else None,
            "decided_at": d.time if d is not None else None,
            "approval": d.envelope_sha256 if d is not None else None,
        })  # fmt: skip
    return rows


def escalations(*, repo: Path, run: str, json_out: bool = False) -> int:
    """Print a run's escalations with the decision in force and who made it."""
    found = find_run(repo, run)
    rows = _rows(found)
    if json_out:
        print(json.dumps({"run_id": found.run_id, "branch": found.statement.predicate.branch,
                          "commit": found.commit, "escalations": rows,
                          "ignored_approvals": found.ignored}, indent=2))  # fmt: skip
        return 0
    print(escape(f"run {found.run_id} ({found.statement.predicate.branch}, "
                 f"{found.commit[:12]}): {len(rows)} escalation(s)"))  # fmt: skip
    for row in rows:
        by = f" by {row['decided_by']} at {row['decided_at']}" if row["decided_by"] else ""
        print(escape(f"  {row['id']}  {row['kind']:<14} {row['decision']:<9} "
                     f"`{row['value']}`{by}"))  # fmt: skip
    for ignored in found.ignored:
        print(escape(f"  approval {ignored['envelope_sha256'][:12]}: {ignored['status']}"))
    return 0


def _select(found: FoundRun, selectors: list[str]) -> list[Escalation]:
    """The escalations selectors name (ids or KIND=VALUE); all pending ones without any.

    Raises UsageError for a selector that names none of the run's escalations.
    """
    known = found.escalations()
    if not selectors:
        in_force = found.in_force()
        return [e for e in known if e.id not in in_force and e.decision == "pending"]
    chosen: list[Escalation] = []
    for selector in selectors:
        kind, sep, value = selector.partition("=")
        if sep and kind in ESCALATION_KINDS:
            hits = [e for e in known if e.kind == kind and e.value == value]
        else:
            hits = [e for e in known if e.id == selector]
        if not hits:
            listed = ", ".join(f"{e.id} ({e.kind}={e.value})" for e in known) or "none"
            raise UsageError(f"run {found.run_id} has no escalation {selector!r}",
                             hint=f"its escalations: {listed}")  # fmt: skip
        chosen += [e for e in hits if all(c.id != e.id for c in chosen)]
    return chosen


def decide(*, repo: Path, run: str, selectors: list[str], decision: str,
           json_out: bool = False) -> int:  # fmt: skip
    """Sign decision ("approved" or "denied") on the selected escalations of run and store it
    in the note of the run's result commit. Raise UsageError, ReceiptError, KeyFileError."""
    found = find_run(repo, run)
    chosen = _select(found, selectors)
    verb = "approve" if decision == "approved" else "deny"
    if not chosen:
        print(f"run {found.run_id}: nothing pending to {verb}", file=sys.stderr)
        if json_out:
            print(json.dumps({"run_id": found.run_id, "decision": decision, "escalations": []}))
        return 0
    if len(chosen) > MAX_APPROVAL_ESCALATIONS:
        raise UsageError(
            f"{len(chosen)} escalations selected; one decision covers at most "
            f"{MAX_APPROVAL_ESCALATIONS} (the gate reads no larger one, and nothing was signed)",
            hint=f"`gatekeeper {verb}` them in parts: select by id, or by kind with fewer at once",
        )
    key = load_key()
    if all(k.keyid != key.public.keyid for k in found.trust.approvers):
        print(f"gatekeeper: warning: your key {key.public.keyid} is not an approver in "
              ".gatekeeper/trusted_keys at HEAD; the gate honours only approvers of the "
              "target's trust file (`gatekeeper trust add --approver`)",
              file=sys.stderr)  # fmt: skip
    now = datetime.now(UTC).isoformat(timespec="microseconds")
    git_dir = discover(repo).git_dir
    envelope = make_approval(
        run_id=found.run_id, branch=found.statement.predicate.branch, commit=found.commit,
        tree=found.statement.result_tree,
        escalations=[ApprovedEscalation(id=e.id, kind=e.kind, value=e.value) for e in chosen],
        decision=decision, time=now, key=key,
    )  # fmt: skip
    add_receipt_note(git_dir, found.commit, envelope)
    signer = f"{key.public.keyid} {key.public.comment}".strip()
    if json_out:
        print(json.dumps({
            "run_id": found.run_id, "commit": found.commit, "decision": decision, "time": now,
            "signer": signer, "envelope_sha256": envelope_sha256(envelope.to_json()),
            "escalations": [{"id": e.id, "kind": e.kind, "value": e.value} for e in chosen],
        }, indent=2))  # fmt: skip
    else:
        print(f"{decision} {len(chosen)} escalation(s) of run {found.run_id}, signed by "
              f"{signer}:", file=sys.stderr)  # fmt: skip
        folders = made_folders(found.statement)
        guarded = _protected_at_head(git_dir)
        for e in chosen:
            print(escape(f"  {e.id}  {e.kind} `{e.value}`"), file=sys.stderr)
            if e.kind != "write" or decision != "approved":
                continue
            if guarded(e.value):
                print(escape(f"    (a protected path: the gate still blocks a change to "
                             f"`{e.value}` as protected-path; only the target policy naming it "
                             "in paths.write opens it)"), file=sys.stderr)  # fmt: skip
            elif e.value in folders:
                print(escape(f"    (a folder the agent made: the approval covers everything "
                             f"below `{e.value}` too)"), file=sys.stderr)  # fmt: skip
    return 0


def _protected_at_head(git_dir: Path) -> Callable[[str], bool]:
    """Whether a path is protected, and not opened, by the policy at HEAD (never when that
    policy cannot be read: the note is only advice)."""
    try:
        loaded = load_policy_at(git_dir, rev_parse(git_dir, "HEAD"))
    except (GitError, PolicyError):
        loaded = None
    if loaded is None:
        return lambda _path: False
    policy = loaded.policy
    return lambda path: (is_protected(policy.paths.protected_patterns, path)
                         and not policy.allows_write(path))  # fmt: skip
