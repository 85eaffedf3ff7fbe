"""Which receipts verify, and which commits of the range they cover.

A receipt covers, as one block of commits:
- the run's own commit: its tree is the receipt's result tree and its first parent's tree the
  base tree (or its parent the last commit the agent made inside the run); a message-only amend
  or a squash onto the same base keeps both;
- the commits the agent made inside the run, named by id in the receipt (each judged alone);
- a rewritten commit (rebase, amend, squash) whose own diff is exactly the composition of one or
  more whole runs' change sets, where the runs chain (each started from the tree the one before
  it produced) and the first is anchored: it started from the commit's parent's tree, from a
  commit in the target's history, or from the tree the run covering the parent produced;
- a rebased run whose agent committed inside the sandbox: consecutive commits whose own diffs
  are, in order, those of the run's own commits (read from the originals, which must be in the
  repository), the empty ones optionally dropped; and an empty commit right after a rewritten
  run of that kind (the launcher's commit a rebase keeps).
Each run covers at most one block, and a run whose result is in the target's history none: no
change is counted twice.

A receipt attached to a commit it does not cover (and covering nothing else in the range) is
`base-mismatch` when only the starting point differs and `result-mismatch` otherwise; a
non-merge commit that no receipt covers is `uncovered-commit`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gatekeeper.gate.compare import compare, net_changes
from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.gate.history import CommitInfo
from gatekeeper.gate.notes import NoteLine
from gatekeeper.gate.rewrites import (
    Net,
    ReceiptPool,
    Signature,
    change_signature,
    compose,
    net_of,
    only_children,
    same_change,
    touches,
)
from gatekeeper.gate.verified import Verdicts, VerifiedReceipt, verify_note
from gatekeeper.git import HEX40
from gatekeeper.receipt.changes import Change
from gatekeeper.receipt.keys import PublicKey

__all__ = ["Context", "Coverage", "VerifiedReceipt", "match_receipts", "uncovered", "verify_note"]

# Bounds on the search for rewritten commits: runs tried per commit when composing a squash,
# and original agent commits whose diffs are read in all (past either, a commit stays uncovered).
MAX_CHAIN_STEPS = 20_000
# The same for all commits of one judgement together: many commits that each send the search
# through many runs (an agent's own runs that flip a file back and forth) cost no more.
MAX_CHAIN_STEPS_IN_ALL = 100_000
MAX_AGENT_COMMITS_READ = 4_096


def _run_key(receipt: VerifiedReceipt) -> tuple[str, str]:
    return receipt.run_id, receipt.statement.result_commit


@dataclass
class Coverage:
    """The outcome of matching receipts to commits."""

    receipts: list[VerifiedReceipt] = field(default_factory=list)
    covered: dict[str, VerifiedReceipt] = field(default_factory=dict)  # commit -> its receipt
    covers: dict[str, list[str]] = field(default_factory=dict)  # receipt line -> commits
    findings: list[Finding] = field(default_factory=list)
    # Note lines that do not speak for the commit they are on: each does not verify, or is a
    # verified receipt of another result (judged with the other accounts of that commit; see
    # judgement). A line over the range's limit in all, or a receipt that names a commit of the
    # range as its result, is in findings instead.
    note_findings: list[Finding] = field(default_factory=list)
    found: int = 0  # receipts attached to commits of the range, verified or not
    explained: set[str] = field(default_factory=set)  # uncovered commits with their own finding
    # The last commit of each block -> the receipts whose changes it ends, in the runs' order.
    blocks: dict[str, list[VerifiedReceipt]] = field(default_factory=dict)
    # A commit whose content is a run's result (a block's last commit) -> that run's receipt.
    ends: dict[str, VerifiedReceipt] = field(default_factory=dict)
    # A run (its id and result) -> the last commit of the block it covers: one block per run,
    # however many receipt lines (re-signed, copied) speak for it.
    used: dict[tuple[str, str], str] = field(default_factory=dict)
    runs: dict[str, list[str]] = field(default_factory=dict)  # commit -> run ids covering it
    hints: dict[str, str] = field(default_factory=dict)  # uncovered commit -> what would help

    def add_receipt(self, receipt: VerifiedReceipt) -> None:
        if all(r.note.line != receipt.note.line for r in self.receipts):
            self.receipts.append(receipt)

    def covering(self) -> list[VerifiedReceipt]:
        """The receipts that cover a commit of the range (not one only attached to one)."""
        return [r for r in self.receipts if r.note.line in self.covers]

    def cover(self, commit: CommitInfo, receipt: VerifiedReceipt) -> None:
        self.add_receipt(receipt)
        self.covered.setdefault(commit.oid, receipt)
        runs = self.runs.setdefault(commit.oid, [])
        if receipt.run_id not in runs:
            runs.append(receipt.run_id)
        commits = self.covers.setdefault(receipt.note.line, [])
        if commit.oid not in commits:
            commits.append(commit.oid)

    def cover_block(self, block: list[CommitInfo], receipts: list[VerifiedReceipt]) -> None:
        """block (consecutive commits) makes exactly the changes of receipts (chained runs)."""
        end = block[-1].oid
        for commit in block:
            for receipt in receipts:
                self.cover(commit, receipt)
            self.covered[commit.oid] = receipts[-1]
        self.blocks.setdefault(end, []).extend(receipts)
        self.ends.setdefault(end, receipts[-1])
        for receipt in receipts:
            self.used.setdefault(_run_key(receipt), end)

    def is_free(self, receipt: VerifiedReceipt, end: str | None = None) -> bool:
        """May receipt still cover a block (ending at end)? Each receipt covers one block."""
        return self.used.get(_run_key(receipt), end) == end

    def claimed(self, commit: str) -> list[Change]:
        """What the runs covering commit claim there, composed in the runs' order (net_changes
        composes a list in order): the changes of each run whose block ends at commit, nothing
        for a commit inside a block (its block's last commit claims for it)."""
        return [c for r in self.blocks.get(commit, []) for c in r.statement.predicate.changes]

    def run_ids(self) -> dict[str, str]:
        """Commit -> the run (or runs, for a squash) covering it."""
        return {c: ", ".join(runs) for c, runs in self.runs.items()}


@dataclass
class Context:
    """What matching needs from the repository."""

    trusted: list[PublicKey]
    commit_changes: Callable[[CommitInfo], list[Change]]  # the commit's own diff
    in_target: Callable[[str], bool]  # is this commit in the target's history?
    # The target policy's findings on a commit's own diff against its first parent, less
    # the unapproved writes the run's approvals lift (the run whose receipt covers it, if any).
    judge_alone: Callable[[CommitInfo, VerifiedReceipt | None], list[Finding]] = (
        lambda _commit, _receipt: []
    )
    is_ancestor: Callable[[str, str], bool] = lambda _a, _b: False
    history: Callable[[str, str], set[str]] = lambda _tip, _base: set()  # tip --not base
    # A commit's parents, None when it is not in the repository.
    parents_of: Callable[[str], tuple[str, ...] | None] = lambda _oid: None
    # The changes between two commits or trees, None when one is not in the repository.
    diff: Callable[[str, str], list[Change] | None] = lambda _a, _b: None
    # What the target's recent non-merge commits change (landed.py): runs landed under new ids.
    target_signatures: Callable[[], set[Signature]] = lambda: set()


def _mismatch(commit: CommitInfo, receipt: VerifiedReceipt, signature: Signature | None) -> Finding:
    """Why a receipt attached to commit does not cover it."""
    s, short = receipt.statement, commit.short
    base = s.predicate.base
    run_signature = change_signature(s.predicate.changes)
    same_changes = signature is not None and run_signature == signature
    if same_changes or s.result_tree == commit.tree:
        where = (
            "which is not in the target's history (nor the result of the run before it)"
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
        rebased = _rebased_over(run_signature, signature)
        if rebased:
            shown = ", ".join(repr(p) for p in rebased[:3]) + (" ..." if len(rebased) > 3 else "")
            text += (
                f": {short} changes the same paths, but from other content ({shown}), as run "
                f"{receipt.run_id} rebased over the target's own changes to those files would; "
                "what the merge of the two made is no run's work, so merge the target into the "
                "run's own commit instead of rebasing it (git's clean merge of both is accepted), "
                "have the agent redo the run on the new base, or have a person the trust file "
                "names sign the commit (`git commit --amend -S`)"
            )
    return Finding(Kind.result_mismatch, text, commit=commit.oid)


def _rebased_over(run_signature: Signature, signature: Signature | None) -> list[str]:
    """The paths a commit (signature, its own diff) changes from other content than the run
    (run_signature, what its changes do) did, when it changes exactly the run's paths, in
    the same way (added, modified, deleted) and at least one from other content: what a
    rebase over the target's own changes to those files makes. Empty otherwise."""
    if signature is None:
        return []
    run = {path: (before, after) for path, before, after in run_signature}
    commit = {path: (before, after) for path, before, after in signature}
    if set(run) != set(commit):
        return []
    moved = []
    for path, (before, after) in commit.items():
        run_before, run_after = run[path]
        if (before is None) != (run_before is None) or (after is None) != (run_after is None):
            return []
        if before != run_before:
            moved.append(path)
    return sorted(moved)


class _Matcher:
    """Finds the receipts covering each commit, in the order described in the module doc."""

    def __init__(
        self, commits: list[CommitInfo], coverage: Coverage, ctx: Context, pool: ReceiptPool
    ) -> None:
        self.commits, self.coverage, self.ctx, self.pool = commits, coverage, ctx, pool
        self.child = only_children(commits)
        self.signatures: dict[str, Signature] = {}
        self.targets: dict[str, bool] = {}
        self.units_cache: dict[tuple[str, tuple[str, ...], str], list[Signature] | None] = {}
        self.units_read = 0
        self.launcher_taken: set[str] = set()
        self.missing: set[tuple[str, tuple[str, ...], str]] = set()
        self.budget = 0
        self.landed_signatures: set[Signature] | None = None
        self.landed: dict[str, bool] = {}  # receipt line -> has its run landed (by its change)?
        self.steps_left = MAX_CHAIN_STEPS_IN_ALL

    def signature(self, commit: CommitInfo) -> Signature:
        if commit.oid not in self.signatures:
            self.signatures[commit.oid] = change_signature(self.ctx.commit_changes(commit))
        return self.signatures[commit.oid]

    def in_target(self, oid: str) -> bool:
        """Is oid a commit of the target's history? Ids from receipts, including ones read
        without verifying, reach git only when they are object ids (never an option)."""
        if oid not in self.targets:
            self.targets[oid] = bool(HEX40.fullmatch(oid)) and self.ctx.in_target(oid)
        return self.targets[oid]

    def spendable(self, receipt: VerifiedReceipt, end: str | None = None) -> bool:
        """May receipt cover a block (ending at end)? Not when it covers another block, nor
        when its result is in the target's history: that run's work has landed already."""
        return self.coverage.is_free(receipt, end) and not self.in_target(
            receipt.statement.result_commit
        )

    def reusable(self, receipt: VerifiedReceipt, end: str | None = None) -> bool:
        """May receipt cover a rewritten commit? As spendable, and its change is not one a
        commit of the target makes already (the run landed under other ids: a forge's squash
        or rebase), read only when a rewritten commit needs it."""
        if not self.spendable(receipt, end):
            return False
        if receipt.line not in self.landed:
            if self.landed_signatures is None:
                self.landed_signatures = self.ctx.target_signatures()
            signature = change_signature(receipt.statement.predicate.changes)
            self.landed[receipt.line] = signature in self.landed_signatures
        return not self.landed[receipt.line]

    def anchored(self, receipt: VerifiedReceipt, commit: CommitInfo) -> bool:
        """Did the run start from content accounted for before commit: the commit's parent's
        tree, what the run covering the parent produced, or a commit of the target?"""
        base = receipt.statement.predicate.base
        if base.tree == commit.parent_tree:
            return True
        end = self.coverage.ends.get(commit.parents[0]) if commit.parents else None
        if end is not None and end.statement.result_tree == base.tree:
            return True
        return self.in_target(base.commit)

    # --- the runs' own commits ---------------------------------------------------------------

    def own_commits(self, attached: dict[str, list[VerifiedReceipt]]) -> None:
        for commit in self.commits:

            def usable(r: VerifiedReceipt, oid: str = commit.oid) -> bool:
                # A copy of the run's commit (an amend, or the same trees made again by hand)
                # may not repeat a change the target has made under other ids already.
                copy = r.statement.result_commit != oid
                return self.spendable(r, oid) and (not copy or self.reusable(r, oid))

            mine = [r for r in attached.get(commit.oid, []) if r.has_trees(commit) and usable(r)]
            if not mine:
                found = self.pool.lookup("trees", (commit.tree, commit.parent_tree))
                found += self.pool.lookup("result_tree", commit.tree)  # on agent commits
                mine = [r for r in found if r.has_trees(commit) and usable(r)][:1]
            for receipt in mine:
                self.coverage.cover_block([commit], [receipt])
                self.launcher_taken.add(receipt.line)  # this is the launcher's commit

    # --- rewritten commits -------------------------------------------------------------------

    def rewritten(self, commit: CommitInfo) -> None:
        real = net_of(self.ctx.commit_changes(commit))
        if real is None:
            return
        if self.agent_block(commit):
            return
        chain = self.chain(commit, real)
        if chain:
            self.coverage.cover_block([commit], chain)
            if len(chain) > 1:  # a squash: no launcher's commit of one of them may follow
                self.launcher_taken.update(r.line for r in chain)
            return
        self.launcher_commit(commit)

    def chain(self, commit: CommitInfo, real: Net) -> list[VerifiedReceipt] | None:
        """Whole runs, chained and anchored, whose composed changes are commit's own diff."""
        free = self.reusable
        exact = self.pool.lookup("changes", self.signature(commit))
        for receipt in exact:
            if free(receipt) and self.anchored(receipt, commit):
                return [receipt]
        if not real:
            return None
        # The last run to touch a path left it as the commit does: start from those runs.
        probe = min(real, key=lambda p: self.pool.count("after", (p, real[p][1])))
        granted = self.budget = min(MAX_CHAIN_STEPS, self.steps_left)
        try:
            return self.search(commit, real, probe)
        finally:
            self.steps_left -= granted - max(self.budget, 0)
            if self.budget <= 0:
                self.coverage.hints.setdefault(
                    commit.oid,
                    "the search for runs whose changes compose to it stopped at its bound "
                    f"({MAX_CHAIN_STEPS} chains per commit, {MAX_CHAIN_STEPS_IN_ALL} in all)",
                )

    def search(self, commit: CommitInfo, real: Net, probe: str) -> list[VerifiedReceipt] | None:
        """Chains ending in a run that left probe as commit does, within the budget."""
        free = self.reusable
        for last in self.pool.lookup("after", (probe, real[probe][1])):
            if not free(last):
                continue
            stack = [[last]]
            while stack and self.budget > 0:
                chain = stack.pop()
                self.budget -= 1
                if self.anchored(chain[0], commit):
                    found = self.extend(real, chain, probe)
                    if found:
                        return found
                start = chain[0].statement.predicate.base.tree
                for before in self.pool.lookup("result_tree", start):
                    if free(before) and all(before.line != r.line for r in chain):
                        stack.append([before, *chain])
        return None

    def extend(
        self, real: Net, chain: list[VerifiedReceipt], probe: str
    ) -> list[VerifiedReceipt] | None:
        """chain, or chain followed by later runs (none touching probe), composing to real."""
        acc: Net = {}
        for receipt in chain:
            step = compose(acc, receipt.statement.predicate.changes)
            if step is None:
                return None
            acc = step
        stack = [(chain, acc)]
        while stack and self.budget > 0:
            runs, net = stack.pop()
            self.budget -= 1
            if same_change(real, net):
                return runs
            for after in self.pool.lookup("base_tree", runs[-1].statement.result_tree):
                if (
                    self.reusable(after)
                    and all(after.line != r.line for r in runs)
                    and not touches(after, probe)
                ):
                    more = compose(net, after.statement.predicate.changes)
                    if more is not None:
                        stack.append(([*runs, after], more))
        return None

    def units(
        self, base: str, agent_commits: tuple[str, ...], result_tree: str
    ) -> list[Signature] | None:
        """The own diffs of a run's commits (the agent's, then the launcher's), from the
        originals; None when one is missing, is a merge or does not follow the one before."""
        key = (base, agent_commits, result_tree)
        if key in self.units_cache:
            return self.units_cache[key]
        if not all(HEX40.fullmatch(oid) for oid in (base, result_tree, *agent_commits)):
            self.units_cache[key] = None  # read without verifying: never passed to git
            return None
        out: list[Signature] | None = None
        own: list[Signature] = []
        previous = base
        for oid in agent_commits:
            self.units_read += 1
            parents = None if self.units_read > MAX_AGENT_COMMITS_READ else self.ctx.parents_of(oid)
            if parents != (previous,):
                if parents is None and self.units_read <= MAX_AGENT_COMMITS_READ:
                    self.missing.add(key)  # the original is not in this repository
                break
            changes = self.ctx.diff(previous, oid)
            if changes is None:
                break
            own.append(change_signature(changes))
            previous = oid
        else:
            # The launcher's commit, from its tree: an amend may have replaced the commit.
            last = self.ctx.diff(previous, result_tree)
            out = None if last is None else [*own, change_signature(last)]
        self.units_cache[key] = out
        return out

    def agent_block(self, commit: CommitInfo) -> bool:
        """Cover commit and the ones after it if they replay, in order, a run's own commits."""
        signature = self.signature(commit)
        candidates: dict[int, VerifiedReceipt] = {}
        seen: set[int] = set()
        for path in {path for path, _, _ in signature}:
            for index, _peek in self.pool.peeks("agent_path", path):
                if index in seen:
                    continue
                seen.add(index)
                # Verified first: ids read from unverified notes (anyone may push them) never
                # cost a git process each. A run whose work has landed is no candidate.
                receipt = self.pool.verify(index)
                if receipt is None or not self.reusable(receipt):
                    continue
                p = receipt.statement.predicate
                key = (p.base.commit, tuple(p.agent_commits), receipt.statement.result_tree)
                units = self.units(*key)
                if next((u for u in units or [] if u), None) == signature:
                    candidates[index] = receipt
                elif units is None and key in self.missing:
                    self.coverage.hints.setdefault(
                        commit.oid,
                        f"if it is a rebased commit of run {receipt.run_id}, whose agent "
                        "committed inside the sandbox, the run's own commits (which the receipt "
                        "names) are not in this repository to compare it with: push the run's "
                        "branch with the receipts, or squash the run into one commit",
                    )
        for receipt in candidates.values():
            p = receipt.statement.predicate
            units = self.units(p.base.commit, tuple(p.agent_commits), receipt.statement.result_tree)
            if not units or not self.anchored(receipt, commit):
                continue
            block, launcher_kept = self.replay(commit, units)
            if block:
                if launcher_kept:
                    self.launcher_taken.add(receipt.line)
                for inner in block[:-1]:
                    self.coverage.findings.extend(self.ctx.judge_alone(inner, receipt))
                self.coverage.cover_block(block, [receipt])
                return True
        return False

    def replay(self, commit: CommitInfo, units: list[Signature]) -> tuple[list[CommitInfo], bool]:
        """The commits from commit on that make the run's commits' changes in order (empty
        ones may be missing), and whether the last of them, the launcher's, is among them."""
        block: list[CommitInfo] = []
        current: CommitInfo | None = commit
        kept = False
        for unit in units:
            kept = False
            if (
                current is not None
                and not current.is_merge
                and current.oid not in self.coverage.covered
                and current.oid not in self.coverage.explained
                and self.signature(current) == unit
            ):
                block.append(current)
                current = self.child.get(current.oid)
                kept = True
            elif unit:
                return [], False  # a non-empty commit of the run is not there
        return block, kept

    def launcher_commit(self, commit: CommitInfo) -> None:
        """An empty commit right after a rewritten run whose agent committed: the launcher's."""
        if commit.tree != commit.parent_tree or not commit.parents:
            return
        end = self.coverage.ends.get(commit.parents[0])
        if (
            end is None
            or not end.statement.predicate.agent_commits
            or end.statement.result_commit == commit.parents[0]
            or end.line in self.launcher_taken
        ):
            return
        self.launcher_taken.add(end.line)
        self.coverage.cover(commit, end)
        self.coverage.ends[commit.oid] = end


def match_receipts(
    commits: list[CommitInfo],
    notes: dict[str, list[NoteLine]],
    ctx: Context | None,
    elsewhere_notes: Callable[[], dict[str, list[NoteLine]]] | None = None,
) -> Coverage:
    """Verify the receipts attached to the range and find the ones covering each commit.

    Receipts attached elsewhere (say, to the commit before a rebase; read through
    elsewhere_notes, only when a commit needs them) may cover a commit too; their failures are
    not reported, as they concern other commits. With ctx None (no usable trust file) nothing
    verifies.
    """
    coverage = Coverage()
    attached: dict[str, list[VerifiedReceipt]] = {}
    verdicts: Verdicts = {}  # each distinct line verified once
    for commit in commits:
        for note in notes.get(commit.oid, []):
            coverage.found += 1
            if ctx is None and note.problem is None:
                continue
            outcome = verify_note(note, ctx.trusted if ctx is not None else [], verdicts)
            if isinstance(outcome, Finding):
                # (the range's notes cut short: about every commit's notes, never ignored)
                (coverage.findings if note.cut else coverage.note_findings).append(outcome)
            else:
                attached.setdefault(commit.oid, []).append(outcome)
    if ctx is None:
        return coverage

    in_range = {c.oid for c in commits}

    def load() -> list[NoteLine]:
        others = elsewhere_notes() if elsewhere_notes is not None else notes
        return [n for oid, lines in others.items() if oid not in in_range for n in lines]

    def verify(note: NoteLine) -> VerifiedReceipt | None:
        outcome = verify_note(note, ctx.trusted, verdicts)
        return outcome if isinstance(outcome, VerifiedReceipt) else None

    pool = ReceiptPool(verify, load)
    for receipts in attached.values():
        for receipt in receipts:
            coverage.add_receipt(receipt)
            pool.add_verified(receipt)
    matcher = _Matcher(commits, coverage, ctx, pool)
    matcher.own_commits(attached)
    _cover_agent_commits(commits, coverage, ctx)
    for commit in commits:  # parents before children: a chain may continue the parent's run
        done = commit.oid in coverage.covered or commit.oid in coverage.explained
        if not (commit.is_merge or done):
            matcher.rewritten(commit)
    for commit in commits:
        for receipt in attached.get(commit.oid, []):
            if receipt.line not in coverage.covers:
                signature = None if commit.is_merge else matcher.signature(commit)
                mismatch = _mismatch(commit, receipt, signature)
                # A trusted signer's receipt that names a commit of the range as its result,
                # and does not describe the commit it is on, contradicts what covers them:
                # never ignored.
                named = receipt.statement.result_commit in in_range
                (coverage.findings if named else coverage.note_findings).append(mismatch)
    return coverage


def _agent_commit_problem(
    commit: CommitInfo,
    receipt: VerifiedReceipt,
    own: set[str],
    ctx: Context,
    ends_of: Callable[[VerifiedReceipt], list[str]],
) -> str | None:
    """Why a commit the receipt lists as the agent's is not covered by it, or None.

    own holds the commits of this run already covered (parents come before children).
    """
    s = receipt.statement
    base, result = s.predicate.base.commit, s.result_commit
    run = f"run {receipt.run_id} lists commit {commit.short} ({commit.subject!r}) as its agent's"
    # Below the commit the receipt covers as its result (the launcher's, or a message-only
    # amend of it: the original may never have reached this repository).
    ends = [e for e in ends_of(receipt) if e != commit.oid]
    if commit.oid == result or not (
        ctx.is_ancestor(base, commit.oid) and any(ctx.is_ancestor(commit.oid, e) for e in ends)
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
    if ctx.judge_alone(commit, receipt):
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

    def ends_of(receipt: VerifiedReceipt) -> list[str]:
        return [e for e, rs in coverage.blocks.items() if any(r.line == receipt.line for r in rs)]

    for receipt in list(coverage.receipts):
        if receipt.line not in coverage.covers or not receipt.statement.predicate.agent_commits:
            continue
        listed = set(receipt.statement.predicate.agent_commits)
        own = set(coverage.covers[receipt.line])
        for commit in commits:  # parents before children
            if commit.oid not in listed or commit.oid in coverage.covered:
                continue
            problem = _agent_commit_problem(commit, receipt, own, ctx, ends_of)
            if problem is not None:
                coverage.findings.extend(ctx.judge_alone(commit, receipt))
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
            "receipted run, or was changed after one"
            + (f"; {coverage.hints[c.oid]}" if c.oid in coverage.hints else ""),
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
        # The same records in the same order (the usual case, cheap to see) do the same.
        if real == claimed or change_signature(real) == change_signature(claimed):
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
