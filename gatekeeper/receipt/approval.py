"""Signed decisions on a run's escalations: approvals (and denials) stored beside its receipt.

An approval is an in-toto Statement v1 (`predicateType: urn:gatekeeper:approval:v1`) about the
run's result commit, in a DSSE envelope of its own payload type, signed by the person who
decided. It sits in the same git note as the run's receipt, one envelope per line, so it
travels with `git push` and `gatekeeper receipt sync` like receipts do.

Readers of a note dispatch on the envelope's payload type: APPROVAL_PAYLOAD_TYPE lines are
approvals, everything else is read as a receipt (and a line that is neither is malformed).

When several decisions name the same escalation, the latest (by its signed time) wins; on a
tie, `denied` wins over `approved`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict

from gatekeeper.errors import ReceiptError, UntrustedKeyError
from gatekeeper.receipt import dsse
from gatekeeper.receipt.keys import PublicKey, SigningKey
from gatekeeper.receipt.models import (
    ESCALATION_KINDS,
    STATEMENT_TYPE,
    InTotoStatement,
    Statement,
    Subject,
    escalation_id,
    load_validated,
)

APPROVAL_PAYLOAD_TYPE = "application/vnd.gatekeeper.approval+json"
APPROVAL_PREDICATE_TYPE = "urn:gatekeeper:approval:v1"
DECIDED = ("approved", "denied")
# An approval names a few escalations; a line longer than this is never read as one.
MAX_APPROVAL_BYTES = 1 << 20
MAX_APPROVAL_ESCALATIONS = 1000
# How far ahead of the reader's clock an approval's time may be (clocks differ a little).
MAX_CLOCK_SKEW = timedelta(minutes=10)


class _Model(BaseModel):
    # Validators built when first used, as the receipt's (gatekeeper.receipt.models): a check
    # whose runs have no approvals never builds these.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class ApprovedEscalation(_Model):
    id: str
    kind: str
    value: str


class ApprovalPredicate(_Model):
    run_id: str
    escalations: list[ApprovedEscalation]
    decision: str  # "approved" | "denied"
    time: str  # ISO 8601 with a time zone
    approver: str  # key id of the key that signed the decision


class ApprovalStatement(InTotoStatement):
    """A signed decision on escalations: the in-toto Statement of an approval or a denial."""

    predicate: ApprovalPredicate


def parse_time(text: str) -> datetime:
    """A decision's time; raise ReceiptError unless it is ISO 8601 with a time zone."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ReceiptError(f"malformed approval: time {text[:40]!r} is not ISO 8601") from None
    if when.tzinfo is None:
        raise ReceiptError(f"malformed approval: time {text[:40]!r} has no time zone")
    return when


def make_approval(
    *, run_id: str, branch: str, commit: str, tree: str,
    escalations: list[ApprovedEscalation], decision: str, time: str, key: SigningKey,
) -> dsse.Envelope:  # fmt: skip
    """Sign decision on escalations of run_id, whose result is commit; raise ReceiptError
    for a decision that is not approved or denied."""
    if decision not in DECIDED:
        raise ReceiptError(f"a decision is one of {', '.join(DECIDED)}, not {decision!r}")
    if not escalations or len(escalations) > MAX_APPROVAL_ESCALATIONS:
        # The gate reads no approval of more (verify_approval): signed, it would count for
        # nothing, and a denial of that many would leave every approval before it in force.
        raise ReceiptError(f"an approval decides 1 to {MAX_APPROVAL_ESCALATIONS} escalations, "
                           f"not {len(escalations)}")  # fmt: skip
    statement = ApprovalStatement(
        _type=STATEMENT_TYPE,
        subject=[Subject(name=branch, digest={"gitCommit": commit, "gitTree": tree})],
        predicateType=APPROVAL_PREDICATE_TYPE,
        predicate=ApprovalPredicate(
            run_id=run_id,
            escalations=escalations,
            decision=decision,
            time=time,
            approver=key.public.keyid,
        ),  # fmt: skip
    )
    envelope = dsse.sign(statement.to_bytes(), key, APPROVAL_PAYLOAD_TYPE)
    if len(envelope.to_json()) > MAX_APPROVAL_BYTES:
        raise ReceiptError(f"the approval would be over {MAX_APPROVAL_BYTES} bytes, which the "
                           "gate does not read")  # fmt: skip
    return envelope


def is_approval_line(line: str) -> bool:
    """Whether a note line is an approval envelope (by its payload type, before verifying).

    Lines over MAX_APPROVAL_BYTES, and lines that are no envelope at all, are not: they go to
    the receipt reader, which reports them as malformed receipts.
    """
    if len(line) > MAX_APPROVAL_BYTES or APPROVAL_PAYLOAD_TYPE not in line:
        return False
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json recurses
        return False
    return isinstance(data, dict) and data.get("payloadType") == APPROVAL_PAYLOAD_TYPE


def envelope_sha256(line: str) -> str:
    """The digest that names one approval envelope (its line as stored in the note)."""
    return hashlib.sha256(line.strip().encode("utf-8", "surrogateescape")).hexdigest()


def parse_approval(payload: bytes) -> ApprovalStatement:
    """Parse verified payload bytes; raise ReceiptError naming what is wrong."""
    try:
        data = json.loads(payload)
    except RecursionError as exc:
        raise ReceiptError("malformed approval: nested too deeply") from exc
    except ValueError as exc:
        raise ReceiptError(f"malformed approval: not JSON ({exc})") from exc
    # Say what the statement is before how it fails to be an approval.
    kind = data.get("predicateType") if isinstance(data, dict) else None
    if kind != APPROVAL_PREDICATE_TYPE:
        raise ReceiptError(f"not an approval: predicateType {str(kind)[:60]!r}")
    statement = load_validated(ApprovalStatement, payload, "approval")
    if statement.type_ != STATEMENT_TYPE:
        raise ReceiptError(f"malformed approval: _type is {statement.type_!r}")
    if statement.predicateType != APPROVAL_PREDICATE_TYPE:
        raise ReceiptError(f"not an approval: predicateType {statement.predicateType!r}")
    if not statement.subject or "gitCommit" not in statement.subject[0].digest:
        raise ReceiptError("malformed approval: subject lacks gitCommit")
    p = statement.predicate
    if p.decision not in DECIDED:
        raise ReceiptError(f"malformed approval: decision {p.decision[:20]!r}")
    parse_time(p.time)
    if not p.escalations or len(p.escalations) > MAX_APPROVAL_ESCALATIONS:
        raise ReceiptError(f"malformed approval: {len(p.escalations)} escalations")
    for e in p.escalations:
        if e.kind not in ESCALATION_KINDS:
            raise ReceiptError(f"malformed approval: escalation kind {e.kind[:20]!r}")
    return statement


def verify_approval(line: str, approvers: list[PublicKey]) -> tuple[ApprovalStatement, PublicKey]:
    """Verify one approval envelope line against the approver keys, then parse it.

    Raises ReceiptError (malformed), BadSignatureError or UntrustedKeyError.
    """
    envelope = dsse.parse_envelope(line)
    if envelope.payloadType != APPROVAL_PAYLOAD_TYPE:
        raise ReceiptError(f"not an approval: payload type {envelope.payloadType!r}")
    if not approvers:
        raise UntrustedKeyError("no approver keys: the trust file has no `approver` line")
    payload, signer = dsse.verify(envelope, approvers, APPROVAL_PAYLOAD_TYPE)
    statement = parse_approval(payload)
    if statement.predicate.approver != signer.keyid:
        raise ReceiptError(
            f"malformed approval: it names approver {statement.predicate.approver[:30]}, but "
            f"is signed by {signer.keyid[:30]}"
        )
    return statement, signer


@dataclass(frozen=True)
class Decision:
    """One signed decision on one escalation of one run."""

    run_id: str
    id: str  # escalation_id(kind, value): recomputed, never taken from the envelope
    kind: str
    value: str
    decision: str
    time: str
    signer: PublicKey
    envelope_sha256: str

    @property
    def signer_text(self) -> str:
        return f"{self.signer.keyid} {self.signer.comment}".strip()


def decisions_of(statement: ApprovalStatement, signer: PublicKey, line: str) -> list[Decision]:
    """The per-escalation decisions a verified approval makes."""
    p = statement.predicate
    digest = envelope_sha256(line)
    return [
        Decision(
            p.run_id,
            escalation_id(e.kind, e.value),
            e.kind,
            e.value,
            p.decision,
            p.time,
            signer,
            digest,
        )  # fmt: skip
        for e in p.escalations
    ]


def is_from_the_future(decision: Decision, now: datetime | None = None) -> bool:
    """True for an approval dated more than MAX_CLOCK_SKEW after now (default: this moment).

    The latest decision is in force; an approval dated years ahead (a clock set forward, or
    on purpose) would otherwise outrank every later denial until then. A denial's date is
    taken as it is: a denial from the future only keeps what it denies denied for longer.
    """
    if decision.decision != "approved":
        return False
    return parse_time(decision.time) > (now or datetime.now(UTC)) + MAX_CLOCK_SKEW


def latest(decisions: Iterable[Decision], now: datetime | None = None) -> dict[str, Decision]:
    """The decision in force for each escalation id: the latest by time; on a tie, denied.
    An approval dated in the future (is_from_the_future) is never in force."""
    found: dict[str, Decision] = {}
    for d in decisions:
        if is_from_the_future(d, now):
            continue
        key = (parse_time(d.time), d.decision == "denied")
        current = found.get(d.id)
        if current is None or key > (parse_time(current.time), current.decision == "denied"):
            found[d.id] = d
    return found


def is_literal_write(statement: Statement, value: str) -> bool:
    """Whether an approved write value is a path the run itself tried to write (a `write`
    decision point its receipt records), and so names that path only, never a pattern.

    The agent chooses the paths it tries: a file named `src/**` must not become, once a person
    approves that decision point, a grant of everything under src/.
    """
    return any(e.kind == "write" and e.value == value for e in statement.predicate.escalations)


def made_folders(statement: Statement) -> set[str]:
    """The paths a run's agent tried to make as folders (a refused mkdir)."""
    return {w.path for w in statement.predicate.writes if w.op == "mkdir"}


def names_literally(value: str, path: str, folder: bool) -> bool:
    """A literal write value covers the path itself and, where the run tried to make it a
    folder, what lies beneath it; nothing else (an approved file `tools` is no folder)."""
    value = value.rstrip("/")
    return path == value or (folder and path.startswith(value + "/"))
