"""What the gate can find wrong: a stable kind, the path and commit it concerns, and why."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """Finding kinds; their values are part of the JSON and SARIF output (stable)."""

    no_receipt = "no-receipt"
    malformed_receipt = "malformed-receipt"
    bad_signature = "bad-signature"
    untrusted_key = "untrusted-key"
    base_mismatch = "base-mismatch"
    result_mismatch = "result-mismatch"
    unclaimed_change = "unclaimed-change"
    missing_change = "missing-change"
    change_differs = "change-differs"
    unapproved_write = "unapproved-write"
    protected_path = "protected-path"
    policy_mismatch = "policy-mismatch"
    uncovered_commit = "uncovered-commit"
    internal_error = "internal-error"
    untrusted_signature = "untrusted-signature"
    change_too_large = "change-too-large"


@dataclass(frozen=True)
class Rule:
    """How a kind is presented to code-scanning tools and readers."""

    id: str  # stable SARIF rule id
    title: str
    help: str


RULES: dict[Kind, Rule] = {
    Kind.no_receipt: Rule(
        "GK001",
        "No verified receipt",
        "No signed receipt verified for the changes under review; run the agent with "
        "`gatekeeper run` and push refs/notes/gatekeeper with the branch.",
    ),
    Kind.malformed_receipt: Rule(
        "GK002",
        "Malformed receipt",
        "A note in refs/notes/gatekeeper is not a DSSE envelope holding a gatekeeper statement, "
        "or is over a limit (16 MiB per note, 1,000 lines, 1 MiB and 16 signatures per "
        "envelope).",
    ),
    Kind.bad_signature: Rule(
        "GK003",
        "Bad receipt signature",
        "The receipt was changed after it was signed, or the signature is corrupt.",
    ),
    Kind.untrusted_key: Rule(
        "GK004",
        "Untrusted signing key",
        "The receipt is signed by a key that is not in the target branch's "
        ".gatekeeper/trusted_keys (or that file is missing).",
    ),
    Kind.base_mismatch: Rule(
        "GK005",
        "Receipt base does not match",
        "The run started from a tree other than the parent of the commit it is attached to.",
    ),
    Kind.result_mismatch: Rule(
        "GK006",
        "Receipt result does not match",
        "The receipt describes a result other than the commit it is attached to.",
    ),
    Kind.unclaimed_change: Rule(
        "GK007",
        "Change not in any receipt",
        "The diff changes a path that no verified receipt claims.",
    ),
    Kind.missing_change: Rule(
        "GK008",
        "Claimed change missing from the diff",
        "A receipt claims a change that the diff does not contain.",
    ),
    Kind.change_differs: Rule(
        "GK009",
        "Change differs from the receipt",
        "The diff and the receipt disagree about a path's blob, mode, type or origin.",
    ),
    Kind.unapproved_write: Rule(
        "GK010",
        "Write outside the policy",
        "A changed path is outside the target branch policy's paths.write.",
    ),
    Kind.protected_path: Rule(
        "GK011",
        "Protected path changed",
        "A change to a protected path (policy, trust file, hooks, CI, .gitmodules, "
        ".gitattributes) that the target policy does not name explicitly.",
    ),
    Kind.policy_mismatch: Rule(
        "GK012",
        "Receipt made under another policy",
        "The run's policy is not the target branch's policy (or the target has none).",
    ),
    Kind.uncovered_commit: Rule(
        "GK013",
        "Commit not covered by a receipt",
        "A commit in the range is not the result of a receipted run (a human edit, say).",
    ),
    Kind.internal_error: Rule(
        "GK014", "The gate could not finish", "An internal error stopped the gate; it fails closed."
    ),
    Kind.untrusted_signature: Rule(
        "GK015",
        "Commit signed, but not by a trusted person",
        "A commit no receipt covers carries a git signature that does not account for it: made "
        "by a key the target's trust file does not list on a `person` line, or one that does "
        "not verify, has expired or was revoked.",
    ),
    Kind.change_too_large: Rule(
        "GK016",
        "Change too large to judge",
        "A diff of the range names more than 100,000 paths or takes more than 64 MiB (or its "
        "diffs name more than 1,000,000 in all, or git needs more than 512 MiB or 30 s of "
        "processor time to make one, or 60 s for all of one judgement's; a merge's own paths "
        "and a notes tree are listed with the same bounds); the gate reads no further and "
        "blocks. Land the change in smaller parts.",
    ),
}


@dataclass(frozen=True)
class Finding:
    """One reason to block: kind, the path and commit it concerns (if any), and a message."""

    kind: Kind
    message: str
    path: str | None = None
    commit: str | None = None

    @property
    def rule(self) -> Rule:
        return RULES[self.kind]

    def to_json(self) -> dict[str, str | None]:
        return {
            "kind": self.kind.value,
            "path": self.path,
            "commit": self.commit,
            "message": self.message,
            "rule_id": self.rule.id,
        }

    def sort_key(self) -> tuple[int, str, str, str]:
        order = list(Kind).index(self.kind)
        return (order, self.commit or "", self.path or "", self.message)
