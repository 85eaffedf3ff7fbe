"""Which receipts verify, and which commits of the range they cover.

A receipt covers a commit when
- the commit's tree is the receipt's result tree and its first parent's tree the base tree
  (the run's own commit, or a squash of it onto the same base), or
- the commit makes exactly the receipt's changes, path for path and blob for blob, and the
  run's base is in the target's history (the run's commit rebased onto a newer target).

A receipt attached to a commit it does not cover is `base-mismatch` when only the starting
point differs and `result-mismatch` otherwise; a non-merge commit that no receipt covers is
`uncovered-commit`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.errors import BadSignatureError, ReceiptError, UntrustedKeyError, VerificationError
from gatekeeper.gate.compare import compare, effects, net_changes
from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.gate.history import CommitInfo
from gatekeeper.gate.notes import NoteLine
from gatekeeper.receipt.changes import Change
from gatekeeper.receipt.keys import PublicKey
from gatekeeper.receipt.models import Statement
from gatekeeper.receipt.statement import verify_envelope

Signature = frozenset[tuple[str, object, object]]


def change_signature(changes: list[Change]) -> Signature:
    """What a change list does, independent of how renames were paired."""
    return frozenset(e for c in changes for e in effects(c))


@dataclass(frozen=True)
class VerifiedReceipt:
    """A receipt whose signature verified against the target's trust file."""

    statement: Statement
    signer: PublicKey
    note: NoteLine

    @property
    def run_id(self) -> str:
        return self.statement.predicate.run_id

    def has_trees(self, commit: CommitInfo) -> bool:
        if self.statement.result_tree != commit.tree:
            return False
        agent_commits = self.statement.predicate.agent_commits
        if agent_commits:
            # The launcher's commit sits on the agent's own commits, which the receipt names.
            return bool(commit.parents) and commit.parents[0] == agent_commits[-1]
        return self.statement.predicate.base.tree == commit.parent_tree


@dataclass
class Coverage:
    """The outcome of matching receipts to commits."""

    receipts: list[VerifiedReceipt] = field(default_factory=list)
    covered: dict[str, VerifiedReceipt] = field(default_factory=dict)  # commit -> its receipt
    covers: dict[str, list[str]] = field(default_factory=dict)  # receipt line -> commits
    findings: list[Finding] = field(default_factory=list)
    found: int = 0  # receipts attached to commits of the range, verified or not
    explained: set[str] = field(default_factory=set)  # uncovered commits with their own finding

    def add_receipt(self, receipt: VerifiedReceipt) -> None:
        if all(r.note.line != receipt.note.line for r in self.receipts):
            self.receipts.append(receipt)

    def cover(self, commit: CommitInfo, receipt: VerifiedReceipt) -> None:
        self.add_receipt(receipt)
        self.covered.setdefault(commit.oid, receipt)
        commits = self.covers.setdefault(receipt.note.line, [])
        if commit.oid not in commits:
            commits.append(commit.oid)


@dataclass
class Context:
    """What matching needs from the repository."""

    trusted: list[PublicKey]
    commit_changes: Callable[[CommitInfo], list[Change]]  # the commit's own diff
    in_target: Callable[[str], bool]  # is this commit in the target's history?
    # The target policy's findings on a commit's own diff against its first parent.
    judge_alone: Callable[[CommitInfo], list[Finding]] = lambda _commit: []
    is_ancestor: Callable[[str, str], bool] = lambda _a, _b: False
    history: Callable[[str, str], set[str]] = lambda _tip, _base: set()  # tip --not base


def verify_note(note: NoteLine, trusted: list[PublicKey]) -> VerifiedReceipt | Finding:
    """Verify one envelope line; a failure becomes the finding that names it."""
    where = note.annotated

    def finding(kind: Kind, text: str) -> Finding:
        return Finding(kind, f"receipt on {where[:12]} ({note.source}): {text}", commit=where)

    if note.problem is not None:
        return finding(Kind.malformed_receipt, note.problem)
    try:
        statement, signer = verify_envelope(note.line, trusted)
    except BadSignatureError as exc:
        return finding(Kind.bad_signature, exc.message)
    except UntrustedKeyError as exc:
        return finding(Kind.untrusted_key, exc.message)
    except (VerificationError, ReceiptError) as exc:
        return finding(Kind.malformed_receipt, exc.message)
    return VerifiedReceipt(statement, signer, note)


def _peek(line: str) -> tuple[tuple[str, str], list[Change]] | None:
    """(result and base trees, changes) read without verifying: only to index receipts."""
    try:
        data: Any = json.loads(base64.b64decode(json.loads(line)["payload"], validate=True))
        trees = (
            str(data["subject"][0]["digest"]["gitTree"]),
            str(data["predicate"]["base"]["tree"]),
        )
        return trees, [Change.model_validate(c) for c in data["predicate"]["changes"]]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        # Unverified notes anyone may push: deep nesting exhausts json's recursion.
        return None


class _Elsewhere:
    """Receipts attached to commits outside the range, found by trees or by changes."""

    def __init__(self, notes: dict[str, list[NoteLine]], skip: set[str], ctx: Context) -> None:
        self.ctx = ctx
        self.by_trees: dict[tuple[str, str], list[NoteLine]] = {}
        self.by_changes: dict[Signature, list[NoteLine]] = {}
        self.verified: dict[str, VerifiedReceipt | None] = {}
        for annotated, lines in notes.items():
            if annotated in skip:
                continue
            for note in lines:
                peeked = _peek(note.line) if note.problem is None else None
                if peeked is None:
                    continue
                trees, changes = peeked
                self.by_trees.setdefault(trees, []).append(note)
                self.by_changes.setdefault(change_signature(changes), []).append(note)

    def _verify(self, note: NoteLine) -> VerifiedReceipt | None:
        if note.line not in self.verified:
            outcome = verify_note(note, self.ctx.trusted)
            self.verified[note.line] = outcome if isinstance(outcome, VerifiedReceipt) else None
        return self.verified[note.line]

    def by_tree(self, commit: CommitInfo) -> VerifiedReceipt | None:
        for note in self.by_trees.get((commit.tree, commit.parent_tree), []):
            receipt = self._verify(note)
            if receipt is not None and receipt.has_trees(commit):
                return receipt
        return None

    def by_change(self, signature: Signature) -> list[VerifiedReceipt]:
        found = [self._verify(n) for n in self.by_changes.get(signature, [])]
        return [r for r in found if r is not None]


def _rebased(receipt: VerifiedReceipt, signature: Signature, ctx: Context) -> bool:
    return change_signature(
        list(receipt.statement.predicate.changes)
    ) == signature and ctx.in_target(receipt.statement.predicate.base.commit)


def _mismatch(
    commit: CommitInfo, receipt: VerifiedReceipt, signature: Signature | None, ctx: Context
) -> Finding:
    """Why a receipt attached to commit does not cover it."""
    s, short = receipt.statement, commit.short
    base = s.predicate.base
    same_changes = (
        signature is not None and change_signature(list(s.predicate.changes)) == signature
    )
    if same_changes or s.result_tree == commit.tree:
        where = (
            "which is not in the target's history"
            if same_changes
            else f"tree {base.tree[:12]}, but the parent of {short} has tree "
            f"{commit.parent_tree[:12]}"
        )
        return Finding(
            Kind.base_mismatch,
            f"run {receipt.run_id} started from {base.commit[:12]}, {where}",
            commit=commit.oid,
        )
    if s.result_commit == commit.oid:
        text = (
            f"the receipt names {short} but records tree {s.result_tree[:12]}; the commit "
            f"has tree {commit.tree[:12]}"
        )
    else:
        text = (
            f"the receipt attached to {short} describes another result, "
            f"{s.result_commit[:12]} (tree {s.result_tree[:12]}), and other changes"
        )
    return Finding(Kind.result_mismatch, text, commit=commit.oid)


def match_receipts(
    commits: list[CommitInfo],
    notes: dict[str, list[NoteLine]],
    ctx: Context | None,
    elsewhere_notes: Callable[[], dict[str, list[NoteLine]]] | None = None,
) -> Coverage:
    """Verify the receipts attached to the range and find one covering each commit.

    Receipts attached elsewhere (say, to the commit before a rebase; read through
    elsewhere_notes, only when a commit needs them) may cover a commit too; their failures are
    not reported, as they concern other commits. With ctx None (no usable trust file) nothing
    verifies.
    """
    coverage = Coverage()
    attached: dict[str, list[VerifiedReceipt]] = {}
    for commit in commits:
        for note in notes.get(commit.oid, []):
            coverage.found += 1
            if ctx is None and note.problem is None:
                continue
            outcome = verify_note(note, ctx.trusted if ctx is not None else [])
            if isinstance(outcome, Finding):
                coverage.findings.append(outcome)
            else:
                attached.setdefault(commit.oid, []).append(outcome)
    if ctx is None:
        return coverage

    lazy: list[_Elsewhere] = []

    def elsewhere() -> _Elsewhere:
        if not lazy:
            others = elsewhere_notes() if elsewhere_notes is not None else notes
            lazy.append(_Elsewhere(others, {c.oid for c in commits}, ctx))
        return lazy[0]

    for commit in commits:
        mine = attached.get(commit.oid, [])
        receipt = next((r for r in mine if r.has_trees(commit)), None)
        if receipt is None:
            receipt = elsewhere().by_tree(commit)
        signature: Signature | None = None
        if receipt is None and not commit.is_merge:
            signature = change_signature(ctx.commit_changes(commit))
            receipt = next((r for r in mine if _rebased(r, signature, ctx)), None) or next(
                (r for r in elsewhere().by_change(signature) if _rebased(r, signature, ctx)),
                None,
            )
        if receipt is not None:
            coverage.cover(commit, receipt)
        for other in mine:
            if other is not receipt and not other.has_trees(commit):
                coverage.add_receipt(other)
                coverage.findings.append(_mismatch(commit, other, signature, ctx))
            elif other is not receipt:
                coverage.cover(commit, other)
    _cover_agent_commits(commits, coverage, ctx)
    return coverage


def _agent_commit_problem(
    commit: CommitInfo, receipt: VerifiedReceipt, own: set[str], ctx: Context
) -> str | None:
    """Why a commit the receipt lists as the agent's is not covered by it, or None.

    own holds the commits of this run already covered (parents come before children).
    """
    s = receipt.statement
    base, result = s.predicate.base.commit, s.result_commit
    run = f"run {receipt.run_id} lists commit {commit.short} ({commit.subject!r}) as its agent's"
    if commit.oid == result or not (
        ctx.is_ancestor(base, commit.oid) and ctx.is_ancestor(commit.oid, result)
    ):
        return (
            f"{run}, but it is not between the run's base {base[:12]} and its result "
            f"{result[:12]}; a receipt covers only the history it produced"
        )
    for parent in commit.parents[1:]:
        foreign = sorted(ctx.history(parent, base) - own)
        if foreign:
            return (
                f"{run}, but this merge brings in {len(foreign)} commit(s) that are neither in "
                f"the run's base {base[:12]} nor covered as the run's own (e.g. "
                f"{foreign[0][:12]} through parent {parent[:12]}); history from elsewhere is "
                "not the run's work"
            )
    if ctx.judge_alone(commit):
        return (
            f"{run}, but its own diff against its first parent is outside the target policy "
            "(see the findings on it); each agent commit is judged on its own"
        )
    return None


def _cover_agent_commits(commits: list[CommitInfo], coverage: Coverage, ctx: Context) -> None:
    """Commits the agent made inside a run are covered by that run's receipt, each judged on
    its own.

    The signed receipt names them by id, and an id pins a commit's content and ancestry; the
    receipt must also cover its own result in the range. A listed commit is covered only if it
    lies between the run's base and result, its own diff is inside the target policy, and (a
    merge) its other parents bring no history but the run's own covered commits.
    """
    for receipt in list(coverage.receipts):
        if not any(r is receipt for r in coverage.covered.values()):
            continue
        listed = set(receipt.statement.predicate.agent_commits)
        own = {oid for oid, r in coverage.covered.items() if r is receipt}
        for commit in commits:  # parents before children
            if commit.oid not in listed or commit.oid in coverage.covered:
                continue
            problem = _agent_commit_problem(commit, receipt, own, ctx)
            if problem is not None:
                coverage.findings.extend(ctx.judge_alone(commit))
                coverage.findings.append(Finding(Kind.uncovered_commit, problem, commit=commit.oid))
                coverage.explained.add(commit.oid)
                continue
            own.add(commit.oid)
            coverage.cover(commit, receipt)


def uncovered(commits: list[CommitInfo], coverage: Coverage) -> list[Finding]:
    """`uncovered-commit` for each non-merge commit no receipt covers.

    A merge commit needs no receipt of its own: whatever it adds beyond its parents shows in
    the range's diff, where no receipt claims it.
    """
    return [
        Finding(
            Kind.uncovered_commit,
            f"no receipt covers commit {c.short} ({c.subject!r}): it was not made by a "
            "receipted run, or was changed after one",
            commit=c.oid,
        )
        for c in commits
        if not c.is_merge and c.oid not in coverage.covered and c.oid not in coverage.explained
    ]


def misdescribed(
    coverage: Coverage,
    commits: list[CommitInfo],
    commit_changes: Callable[[CommitInfo], list[Change]],
    trees_changes: Callable[[str, str], list[Change]],
) -> list[Finding]:
    """Where a receipt that covers a commit by its trees lists other changes than the diff
    from its base tree to its result tree.

    The range's diff is compared with what all receipts claim together, so a false entry of
    one receipt is washed out when a later run changes the same path again; each receipt is
    therefore held to its own trees as well (once, at the first commit it covers by them).
    commit_changes is a commit's own diff against its first parent, trees_changes the diff
    between two trees.
    """
    findings: list[Finding] = []
    for receipt in coverage.receipts:
        covered = set(coverage.covers.get(receipt.note.line, []))
        commit = next((c for c in commits if c.oid in covered and receipt.has_trees(c)), None)
        if commit is None:
            continue
        s = receipt.statement
        real = (
            trees_changes(s.predicate.base.tree, s.result_tree)
            if s.predicate.agent_commits
            else commit_changes(commit)  # its trees are the commit's and its first parent's
        )
        claimed = list(s.predicate.changes)
        if change_signature(real) == change_signature(claimed):
            continue
        for f in compare(net_changes([(commit.oid, real)]), net_changes([(commit.oid, claimed)])):
            findings.append(
                Finding(
                    f.kind,
                    f"the receipt of run {receipt.run_id} does not describe its own commit "
                    f"{commit.short} (tree {s.predicate.base.tree[:12]} to "
                    f"{s.result_tree[:12]}): {f.message}",
                    path=f.path,
                    commit=commit.oid,
                )
            )
    return findings
