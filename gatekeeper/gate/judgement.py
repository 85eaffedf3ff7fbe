"""Judge a range: receipts against the real diff and the target branch's policy and trust file.

The gate fails closed: a missing trust file or policy, zero verified receipts or an internal
error each end in a block with a finding that says which.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path

from gatekeeper.errors import Error, GitError, KeyFileError, PolicyError, ReceiptError
from gatekeeper.gate.ahead import EarlyReads, RangeNotes
from gatekeeper.gate.approvals import Approvals, honour_approvals, split_approvals
from gatekeeper.gate.compare import State, compare, effects, net_changes
from gatekeeper.gate.coverage import Context, Coverage, match_receipts, misdescribed, uncovered
from gatekeeper.gate.diffread import (
    MAX_DIFF_PATHS,
    MAX_DIFF_PATHS_IN_ALL,
    DiffTooLarge,
    git_time,
    read_diff,
)
from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.gate.history import (
    EMPTY_TREE,
    CommitInfo,
    RangeAhead,
    commit_parents,
    merge_base,
    range_changes,
    range_commits,
)
from gatekeeper.gate.landed import target_signatures
from gatekeeper.gate.later import later
from gatekeeper.gate.merges import (
    MAX_CONTENT_MERGES,
    MAX_MERGED_BYTES,
    MERGED_KINDS,
    accounted_paths,
    check_merges,
)
from gatekeeper.gate.notes import (
    ELSEWHERE_BUDGET,
    NoteLine,
    ReadAhead,
    local_sources,
    read_ahead,
    read_notes,
)
from gatekeeper.gate.people import account_for_people, joined_to_target, range_findings
from gatekeeper.gate.policy_check import check_paths
from gatekeeper.gate.result import GateResult, ReceiptView
from gatekeeper.gate.rewrites import Signature
from gatekeeper.gate.verified import VerifiedReceipt
from gatekeeper.git import git, is_ancestor, is_shallow
from gatekeeper.policy.model import POLICY_PATH, TRUST_PATH, LoadedPolicy, load_policy_at
from gatekeeper.receipt.changes import Change, parse_raw_z, path_order
from gatekeeper.receipt.keys import PublicKey
from gatekeeper.receipt.trust import TrustFile, trust_file_at


def _trust(read: Callable[[], TrustFile], target: str, findings: list[Finding]) -> TrustFile | None:
    try:
        return read()
    except (ReceiptError, KeyFileError) as exc:
        findings.append(
            Finding(
                Kind.untrusted_key,
                f"no receipt can be trusted: {exc.message} (the trust file is read from "
                f"{target[:12]}, never from the branch under review)",
                path=TRUST_PATH,
                commit=target,
            )
        )
        return None


def _policy(
    read: Callable[[], LoadedPolicy | None], target: str, findings: list[Finding]
) -> LoadedPolicy | None:
    try:
        loaded = read()
    except PolicyError as exc:
        findings.append(
            Finding(
                Kind.policy_mismatch,
                f"the target's policy is unusable: {exc.message}",
                path=POLICY_PATH,
                commit=target,
            )
        )
        return None
    if loaded is None:
        findings.append(
            Finding(
                Kind.policy_mismatch,
                f"the target {target[:12]} has no {POLICY_PATH}; the gate judges only with the "
                "target branch's policy",
                path=POLICY_PATH,
                commit=target,
            )
        )
    return loaded


def _policy_mismatches(coverage: Coverage, policy: LoadedPolicy) -> list[Finding]:
    return [
        Finding(
            Kind.policy_mismatch,
            f"run {r.run_id} ran under policy {r.statement.predicate.policy.path} with sha256 "
            f"{r.statement.predicate.policy.sha256[:16]}..., "
            f"the target's is {policy.sha256[:16]}...",
            commit=r.note.annotated,
        )
        for r in coverage.covering()  # (a receipt of another result speaks for nothing here)
        if r.statement.predicate.policy.sha256 != policy.sha256
    ]


def _range_notes(
    git_dir: Path,
    sources: Callable[[], list[tuple[str, str]]],
    in_range: set[str],
    ahead: Callable[[], ReadAhead],
) -> tuple[list[tuple[str, str]], dict[str, list[NoteLine]]]:
    """The notes sources and the notes on the range's commits."""
    found = sources()
    return found, read_notes(git_dir, found, wanted=in_range, ahead=ahead())


def _range_notes_read(
    git_dir: Path,
    read: Callable[[], RangeNotes],
    sources: Callable[[], list[tuple[str, str]]],
    in_range: set[str],
    ahead: Callable[[], ReadAhead],
) -> tuple[list[tuple[str, str]], dict[str, list[NoteLine]]]:
    """_range_notes, taken from read (the notes read from sources already) when it read the
    notes on these very commits."""
    wanted, notes = read()
    if wanted != in_range:
        return _range_notes(git_dir, sources, in_range, ahead)
    return sources(), notes


def _head_notes(
    git_dir: Path, sources: Callable[[], list[tuple[str, str]]], head: str
) -> ReadAhead:
    """The note blobs on head (which holds the receipt of a run's branch), read while the range
    is found; nothing when that fails (read_notes then reads them, and fails, in turn)."""
    try:
        return read_ahead(git_dir, sources(), head)
    except Exception:  # noqa: BLE001 - read again, in turn, where any error is reported
        return {}


class _CommitDiffs:
    """Each diff read once: a commit's own diff is the one from its first parent's tree to its
    tree, so a receipt's base and result trees name the same diff as the commit they cover.

    Each diff is read with a bound (gate.diffread), and so are all of them together: past
    MAX_DIFF_PATHS_IN_ALL paths read, DiffTooLarge. Diffs are kept for asking again while
    those kept name at most KEPT_PATHS paths of KEPT_BYTES together (a path may be thousands
    of bytes long); later ones are read again when asked again."""

    KEPT_PATHS = 2 * MAX_DIFF_PATHS
    KEPT_BYTES = 64 << 20

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = git_dir
        self.cache: dict[tuple[str, str], list[Change]] = {}
        self.read = 0  # paths named by the diffs read so far (the range's included)
        self.kept = 0  # paths named by the diffs in cache
        self.kept_bytes = 0  # and their length

    def __call__(self, commit: CommitInfo) -> list[Change]:
        try:
            return self.between(commit.parent_tree, commit.tree)
        except DiffTooLarge as exc:
            what = f"the diff of commit {commit.short} (against its first parent)"
            raise exc.naming(what, commit.oid) from None

    def count(self, base: str, result: str, changes: list[Change]) -> int:
        """Add the paths of changes (one diff read) to those read; raises DiffTooLarge past
        MAX_DIFF_PATHS_IN_ALL."""
        paths = len(changes) + sum(1 for c in changes if c.old_path is not None)
        self.read += paths
        if self.read > MAX_DIFF_PATHS_IN_ALL:
            what = f"the diffs read for this range (the last from {base[:12]} to {result[:12]})"
            raise DiffTooLarge(what, MAX_DIFF_PATHS_IN_ALL)
        return paths

    def keep(self, base: str, result: str, changes: list[Change], paths: int) -> None:
        if (base, result) in self.cache or self.kept + paths > self.KEPT_PATHS:
            return
        size = sum(len(c.path) + len(c.old_path or "") for c in changes)
        if self.kept_bytes + size <= self.KEPT_BYTES:
            self.cache[base, result] = changes
            self.kept += paths
            self.kept_bytes += size

    def between(self, base: str, result: str) -> list[Change]:
        """The changes between two commits or trees (raises GitError, DiffTooLarge)."""
        if (base, result) in self.cache:
            return self.cache[base, result]
        changes = sorted(parse_raw_z(read_diff(self.git_dir, base, result)), key=path_order)
        self.keep(base, result, changes, self.count(base, result, changes))
        return changes

    def between_or_none(self, base: str, result: str) -> list[Change] | None:
        """The same, None when one is not in the repository."""
        try:
            return self.between(base, result)
        except GitError:
            return None


def _attribution(
    commits: list[CommitInfo], coverage: Coverage, diffs: _CommitDiffs
) -> dict[str, str]:
    """Path -> the last uncovered commit of the range that changed it, to name in findings."""
    blame: dict[str, str] = {}
    for commit in commits:
        if commit.is_merge or commit.oid in coverage.covered:
            continue
        for change in diffs(commit):
            for path in change.paths:
                blame[path] = commit.oid
    return blame


def _merged_hint(finding: Finding, combined: dict[str, list[str]]) -> Finding:
    """finding, saying so when a clean merge combined edits to its path (and that did not
    account for it)."""
    if finding.kind not in MERGED_KINDS:
        return finding
    merge = next((oid for oid, paths in combined.items() if finding.path in paths), None)
    if merge is None:
        return finding
    return replace(finding, message=(
        f"{finding.message} (merge {merge[:12]} combined edits to it: such a file counts only "
        "where every merge of the range is git's clean merge, with git's defaults, of states "
        "the runs, signed persons and the target made there, one merge base each, at most "
        f"{MAX_CONTENT_MERGES} files of {MAX_MERGED_BYTES >> 20} MiB)"
    ))  # fmt: skip


def _made_states(
    commits: list[CommitInfo], coverage: Coverage, signed: Collection[str], diffs: _CommitDiffs
) -> dict[str, set[State]]:
    """Each path's states the range's runs (their claims) and signed persons' commits left it
    in."""
    made: dict[str, set[State]] = {}
    for commit in commits:
        if commit.oid in coverage.covered:
            changes = coverage.claimed(commit.oid)
        elif commit.oid in signed:
            changes = diffs(commit)
        else:
            continue
        for change in changes:
            for path, _, after in effects(change):
                made.setdefault(path, set()).add(after)
    return made


def _record_receipts(result: GateResult, coverage: Coverage, trusted: list[PublicKey]) -> None:
    """Put the verified receipts, and the run covering each commit, into the result."""
    comments = {k.keyid: k.comment for k in trusted}
    for receipt in coverage.receipts:
        comment = comments.get(receipt.signer.keyid, receipt.signer.comment)
        result.receipts.append(
            ReceiptView(
                receipt.statement,
                f"{receipt.signer.keyid} {comment}".strip(),
                receipt.note.annotated,
                receipt.note.source,
                tuple(coverage.covers.get(receipt.note.line, [])),
            )
        )
    result.covered_by = coverage.run_ids()


@dataclass(frozen=True)
class _Early:
    """What the judgement reads whatever the range holds, started before the range is known
    (each a git process of its own): whether the repository is shallow, the trust file and
    the policy of the rules commit, the notes refs receipts are read from and the notes on
    head (or, for a check, taken from what it read of them before the judgement loaded,
    gate.ahead, with the notes on the range). Collected, and any error raised, where they
    were read in turn before."""

    shallow: Callable[[], bool]
    trust: Callable[[], TrustFile]
    policy: Callable[[], LoadedPolicy | None]
    sources: Callable[[], list[tuple[str, str]]]  # the notes refs, by default the local ones
    head_notes: Callable[[], ReadAhead]
    range_notes: Callable[[], RangeNotes] | None = None  # read from sources, once found

    @classmethod
    def start(
        cls,
        git_dir: Path,
        rules: str,
        sources: list[tuple[str, str]] | None,
        head: str,
        head_notes: Callable[[], ReadAhead] | None = None,
        reads: EarlyReads | None = None,
    ) -> _Early:
        if reads is not None and reads.at() != (git_dir, rules):
            reads = None  # read elsewhere: not what this judgement reads
        if sources is not None:
            found: Callable[[], list[tuple[str, str]]] = functools.partial(list, sources)
        else:
            found = later(local_sources, git_dir) if reads is None else reads.sources
        return cls(
            later(is_shallow, git_dir) if reads is None else reads.shallow,
            later(trust_file_at, git_dir, rules, reads and reads.trust),
            later(load_policy_at, git_dir, rules, POLICY_PATH, reads and reads.policy),
            found,
            head_notes or later(_head_notes, git_dir, found, head),
            None if reads is None or sources is not None else reads.range_notes,
        )


def _judge(
    git_dir: Path, result: GateResult, rules: str, early: _Early, ahead: RangeAhead | None
) -> None:
    findings = result.findings
    if early.shallow():
        # git treats the shallow boundary as root commits, like grafts: not the real history.
        raise GitError(
            "the repository is shallow, so its history is not the real one; "
            "fetch the full history (`git fetch --unshallow`) and check again"
        )
    base, head = result.merge_base, result.head
    commits = range_commits(git_dir, base, head) if ahead is None else ahead.commits()
    result.commits = commits
    # git works out the range's diff meanwhile, while the receipts are read and verified.
    range_diff = later(read_diff, git_dir, base or EMPTY_TREE, head) if commits else None
    in_range = {c.oid for c in commits}
    # Only the notes on the range are read whole (megabytes for a large run: meanwhile, the
    # trust file and the policy are read); others only when a rebased commit needs them.
    notes_ahead = early.head_notes if head in in_range else dict  # (not waited for when unused)
    if early.range_notes is None:
        notes_read = later(_range_notes, git_dir, early.sources, in_range, notes_ahead)
    else:  # read before the judgement loaded
        notes_read = functools.partial(
            _range_notes_read, git_dir, early.range_notes, early.sources, in_range, notes_ahead
        )
    trust_file = _trust(early.trust, rules, findings)  # read once for receipts, people, approvals
    trusted = None if trust_file is None else trust_file.signers
    policy = _policy(early.policy, rules, findings)
    sources, range_notes = notes_read()
    notes, _ = split_approvals(range_notes)

    def elsewhere_notes() -> dict[str, list[NoteLine]]:
        return read_notes(git_dir, sources, exclude=in_range, budget=ELSEWHERE_BUDGET)

    diffs = _CommitDiffs(git_dir)

    # The target's history is its tip's, not the merge-base's: a run that landed on the
    # target after head forked has landed (a copy of it made on an older fork would otherwise
    # bring its change back after a revert on the target).
    target = result.target

    def in_target(oid: str) -> bool:
        # A commit of the range is, by the range's definition, not in the target's history.
        return oid not in in_range and is_ancestor(git_dir, oid, target)

    @functools.cache
    def landed() -> set[Signature]:  # one `git log` over the target, and only if asked
        return target_signatures(git_dir, target)

    def notes_on(oid: str) -> list[NoteLine]:
        # A commit of the range: its notes were read above (one receipt may be megabytes).
        if oid in in_range:
            return range_notes.get(oid, [])
        return read_notes(git_dir, sources, wanted={oid}).get(oid, [])

    approvals = None if trust_file is None else Approvals(trust_file, notes_on)

    def judge_alone(commit: CommitInfo, receipt: VerifiedReceipt | None) -> list[Finding]:
        if policy is None:
            return []  # the missing policy is a finding of its own already
        changes = diffs(commit)
        found = check_paths(policy, changes, {p: commit.oid for c in changes for p in c.paths})
        if receipt is None or approvals is None:
            return found
        # An agent commit of a run is judged with that run's approvals, as the run's whole
        # change is: an approved write the agent committed itself is approved too.
        return [f for f in found if f.kind is not Kind.unapproved_write or f.path is None
                or not approvals.covers(receipt, f.path)]  # fmt: skip

    def history(tip: str, since: str) -> set[str]:
        out = git("rev-list", tip, "--not", since, "--", git_dir=git_dir)
        return set(out.decode().split())

    context = (
        None
        if trusted is None
        else Context(
            trusted,
            diffs,
            in_target,
            judge_alone=judge_alone,
            is_ancestor=lambda a, b: is_ancestor(git_dir, a, b),
            history=history,
            parents_of=lambda oid: commit_parents(git_dir, oid),
            diff=diffs.between_or_none,
            target_signatures=landed,
        )
    )
    coverage = match_receipts(commits, notes, context, elsewhere_notes)
    findings.extend(coverage.findings)
    # A merge needs no receipt, but may hold nothing of its own (the ends alone would not show
    # content one merge adds and a later one drops).
    merges = check_merges(git_dir, [c for c in commits if c.oid not in coverage.covered])
    findings.extend(merges.findings)
    # Commits no receipt covers may be a person's, by their own git signature.
    people = account_for_people(
        git_dir,
        [c for c in commits if c.oid not in coverage.covered and c.oid not in coverage.explained],
        trust_file,
        policy,
        diffs,
        joined=joined_to_target(commits),
    )
    findings.extend(people.findings)
    # A note line that does not speak for the commit it is on (it does not verify, or is a
    # receipt of another result), on a commit a verified receipt or a trusted person's
    # signature accounts for, tells nothing about that commit: anyone who may push notes can
    # add one. Shown as ignored, never a finding; on any other commit it says why none does.
    # A merge git made cleanly, holding nothing of its own, is accounted for by its parents.
    unclean = {f.commit for f in merges.findings} | coverage.explained
    accounted = set(coverage.covered) | set(people.signed)
    accounted |= {c.oid for c in commits if c.is_merge and c.oid not in unclean}
    for finding in coverage.note_findings:
        if finding.commit in accounted:
            result.ignored_notes.append(finding)
        else:
            findings.append(finding)
    findings.extend(f for f in uncovered(commits, coverage) if f.commit not in people.accounted)
    if policy is not None:
        findings.extend(_policy_mismatches(coverage, policy))
    _record_receipts(result, coverage, trusted or [])
    result.signed_by = people.labels()

    if not commits:
        findings.append(
            Finding(
                Kind.no_receipt,
                f"{result.head_name} adds no commits to {result.target_name} (it is merged "
                "already, or holds nothing new): there is no work of a receipted run to judge",
                commit=head,
            )
        )
        return
    if not coverage.covering() and not people.signed:  # (a receipt of another result: none)
        findings.append(
            Finding(
                Kind.no_receipt,
                f"no receipt verified for {len(commits)} commit(s) "
                f"({coverage.found} receipt(s) found on them); "
                "fetch or push refs/notes/gatekeeper, "
                "or run the agent with `gatekeeper run`",
                commit=head,
            )
        )

    # What the receipts claim, in order; a person's commit claims its own diff.
    claims = [x for c in commits if c.oid in coverage.covered for x in coverage.claimed(c.oid)]
    try:
        raw = range_diff() if range_diff is not None else None
    except DiffTooLarge as exc:
        what = f"the diff of the range ({(base or EMPTY_TREE)[:12]}..{head[:12]})"
        raise exc.naming(what, head) from None
    result.changes = range_changes(git_dir, base or EMPTY_TREE, head, claims, raw)
    read = diffs.count(base or EMPTY_TREE, head, result.changes)
    if commits[-1].parents[:1] == (base,):  # head on the base: its own diff is the range's
        diffs.keep(commits[-1].parent_tree, commits[-1].tree, result.changes, read)
    blame = _attribution(commits, coverage, diffs)
    unblamed: str | None = None  # the commit of a path commit_of does not list
    if not people.signed and claims == result.changes:
        # The claims are the diff's own records: both compose to the same states at every
        # path, where compare() finds nothing. (A diff from git never copies: each record's
        # paths are the ones it changes.)
        commit_of, unblamed = blame, head  # a path no uncovered commit changed is head's
    else:
        real = net_changes([(None, result.changes)])
        for path, change in real.items():
            change.commit = blame.get(path, head)
        claimed = net_changes(
            (c.oid, coverage.claimed(c.oid)) if c.oid in coverage.covered else (c.oid, diffs(c))
            for c in commits
            if c.oid in coverage.covered or c.oid in people.signed
        )
        found = compare(real, claimed)
        if merges.combined:  # claims composed in a line miss what git's clean merges combined
            made = _made_states(commits, coverage, people.signed, diffs)
            merged = accounted_paths(git_dir, base, commits, merges.combined, found, made)
            found = [f for f in found if f.kind not in MERGED_KINDS or f.path not in merged]
            found = [_merged_hint(f, merges.combined) for f in found]
        findings.extend(found)
        commit_of = {p: c.commit or head for p, c in real.items()}
    findings.extend(misdescribed(coverage, commits, diffs, diffs.between))
    if policy is not None:
        on_paths = check_paths(policy, result.changes, commit_of, unblamed)
        # Signed approvals by the target's approvers may lift `unapproved-write` (approvals.py).
        on_paths, result.receipts = honour_approvals(coverage, on_paths, result.receipts,
                                                     approvals)  # fmt: skip
        findings.extend(range_findings(policy, on_paths, people, coverage.covering(), findings))


def judge(
    git_dir: Path,
    target: str,
    head: str,
    *,
    target_name: str | None = None,
    head_name: str | None = None,
    notes: list[tuple[str, str]] | None = None,
    rules: str | None = None,
    head_notes: Callable[[], ReadAhead] | None = None,
    range_ahead: RangeAhead | None = None,
    reads: EarlyReads | None = None,
) -> GateResult:
    """Judge head against target (both commit ids); never raises for a problem in the range.

    The range is merge-base(target, head)..head; `rules` is the commit whose trust file and
    policy judge it (default: target), so a hook can judge what an update adds with the trust
    file the repository holds now rather than with an older one. `notes` lists (label, notes
    commit) to read receipts from; by default the local receipts ref and its remote-tracking
    copies. head_notes: the note blobs on head, read already (read_ahead: they are found by
    their ids, so any blob read there is the one the judgement wants). range_ahead: the
    merge-base of target and head and the commits after it, being found already. reads:
    the rules commit's trust file and policy, the local notes refs and the notes on the
    range, being read already (gate.ahead; taken only when read in the same git directory at
    the same rules commit, and the notes only when notes is not given). Any error while
    judging becomes an `internal-error` finding, so the verdict is block.
    """
    result = GateResult(target, target_name or target[:12], head, head_name or head[:12], None)
    with git_time():  # git's processor time for this judgement's listings (or a hook's)
        _judge_bounded(git_dir, result, target, head, rules, notes, head_notes, reads,
                       range_ahead)  # fmt: skip
    result.findings.sort(key=Finding.sort_key)
    # (Messages quote text from the repository as it is: each text output shows them through
    # gate.shown.visible(); JSON and SARIF carry them exact.)
    return result


def _judge_bounded(
    git_dir: Path,
    result: GateResult,
    target: str,
    head: str,
    rules: str | None,
    notes: list[tuple[str, str]] | None,
    head_notes: Callable[[], ReadAhead] | None,
    reads: EarlyReads | None,
    range_ahead: RangeAhead | None,
) -> None:
    """judge's work, any error a finding."""
    try:
        early = _Early.start(git_dir, rules or target, notes, head, head_notes, reads)
        result.merge_base = (
            merge_base(git_dir, target, head) if range_ahead is None else range_ahead.merge_base()
        )
        _judge(git_dir, result, rules or target, early, range_ahead)
    except DiffTooLarge as exc:  # read no further: block, and say how to land it
        result.findings.append(
            Finding(Kind.change_too_large, exc.message, commit=exc.commit or head)
        )
    except Exception as exc:  # noqa: BLE001 - fail closed on anything, and say what it was
        detail = exc.message if isinstance(exc, Error) else f"{type(exc).__name__}: {exc}"
        if "from promisor remote" in detail:  # git.judging_offline
            detail = (
                "the repository is a partial clone, and objects the gate must read are not "
                "here (git fetches nothing while the gate judges: the fetch would run what "
                "the repository's config names for the remote); check in a full clone, or "
                "fetch what is missing first"
            )
        import traceback  # (loaded only on this failure)

        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" (at {Path(last[0].filename).name}:{last[0].lineno})" if last else ""
        result.findings.append(
            Finding(Kind.internal_error, f"the gate could not finish: {detail}{where}", commit=head)
        )
