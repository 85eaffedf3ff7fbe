"""A receipt line checked against the target's trust file: verified, or the finding why not."""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.errors import BadSignatureError, ReceiptError, UntrustedKeyError, VerificationError
from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.gate.history import CommitInfo
from gatekeeper.gate.notes import NoteLine
from gatekeeper.receipt.keys import PublicKey
from gatekeeper.receipt.models import Statement
from gatekeeper.receipt.statement import verify_envelope


@dataclass(frozen=True)
class VerifiedReceipt:
    """A receipt whose signature verified against the target's trust file."""

    statement: Statement
    signer: PublicKey
    note: NoteLine

    @property
    def run_id(self) -> str:
        return self.statement.predicate.run_id

    @property
    def line(self) -> str:
        return self.note.line

    def has_trees(self, commit: CommitInfo) -> bool:
        """Is commit the run's own result (or a copy of it with the same trees and parent)?"""
        if self.statement.result_tree != commit.tree:
            return False
        agent_commits = self.statement.predicate.agent_commits
        if agent_commits:
            # The launcher's commit sits on the agent's own commits, which the receipt names.
            return bool(commit.parents) and commit.parents[0] == agent_commits[-1]
        return self.statement.predicate.base.tree == commit.parent_tree


# What verifying a line gave: (statement, signer), or (finding kind, why).
Verdicts = dict[str, tuple[Statement, PublicKey] | tuple[Kind, str]]


def verify_note(
    note: NoteLine, trusted: list[PublicKey], verdicts: Verdicts | None = None
) -> VerifiedReceipt | Finding:
    """Verify one envelope line; a failure becomes the finding that names it. With verdicts,
    a line verified before (the same envelope noted on many commits) is not verified again:
    each verification parses and hashes the whole line, megabytes in a note anyone may push."""
    where = note.annotated

    def finding(kind: Kind, text: str) -> Finding:
        return Finding(kind, f"receipt on {where[:12]} ({note.source}): {text}", commit=where)

    if note.problem is not None:
        return finding(Kind.malformed_receipt, note.problem)
    verdict = verdicts.get(note.line) if verdicts is not None else None
    if verdict is None:
        try:
            verdict = verify_envelope(note.line, trusted)
        except BadSignatureError as exc:
            verdict = (Kind.bad_signature, exc.message)
        except UntrustedKeyError as exc:
            verdict = (Kind.untrusted_key, exc.message)
        except (VerificationError, ReceiptError) as exc:
            verdict = (Kind.malformed_receipt, exc.message)
        if verdicts is not None:
            verdicts[note.line] = verdict
    if isinstance(verdict[0], Kind):
        return finding(verdict[0], str(verdict[1]))
    statement, signer = verdict
    assert isinstance(statement, Statement) and isinstance(signer, PublicKey)
    return VerifiedReceipt(statement, signer, note)
