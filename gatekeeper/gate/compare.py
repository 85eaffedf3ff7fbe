"""Compare what receipts claim with the real change set, path by path, in both directions.

Both sides become a map `path -> (state before, state after)`, where a state is `(mode, blob)`
or absent, so a rename is a deletion plus an addition and stacked runs compose. Comparing
states instead of diff records keeps the check independent of how a change was written down.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.receipt.changes import EMPTY_MODE, Change

State = tuple[str, str] | None  # (mode, blob id), None when the path is absent


@dataclass
class PathChange:
    """The net change at one path and the record (and commit) it came from last."""

    before: State
    after: State
    record: Change
    commit: str | None


def file_type(mode: str) -> str:
    return {
        "100644": "file",
        "100755": "executable file",
        "120000": "symlink",
        "160000": "submodule",
        "040000": "tree",
    }.get(mode, f"mode {mode}")


def _type_class(mode: str) -> str:
    return {"100755": "file", "100644": "file"}.get(mode, file_type(mode))


def describe(state: State) -> str:
    if state is None:
        return "absent"
    mode, blob = state
    return f"{file_type(mode)} {mode} {blob[:12]}"


def effects(change: Change) -> list[tuple[str, State, State]]:
    """(path, before, after) for every path a diff record touches."""
    old: State = None if change.old_mode == EMPTY_MODE else (change.old_mode, change.old_blob)
    new: State = None if change.new_mode == EMPTY_MODE else (change.new_mode, change.new_blob)
    if change.status == "R" and change.old_path is not None:
        return [(change.old_path, old, None), (change.path, None, new)]
    if change.status == "C":
        return [(change.path, None, new)]
    return [(change.path, old, new)]


def net_changes(batches: Iterable[tuple[str | None, list[Change]]]) -> dict[str, PathChange]:
    """Compose change lists applied in order into the net change per path.

    A path whose state ends where it began is kept (as a no-op): a claim that changes nothing
    still has to agree with the diff when the diff does change that path.
    """
    net: dict[str, PathChange] = {}
    for commit, changes in batches:
        for change in changes:
            for path, before, after in effects(change):
                if path in net:
                    net[path].after, net[path].record, net[path].commit = after, change, commit
                else:
                    net[path] = PathChange(before, after, change, commit)
    return net


def _what(change: PathChange, path: str) -> str:
    record = change.record
    if record.status == "R":
        return f"renamed {record.old_path!r} -> {record.path!r}"
    if change.before is None:
        return f"added ({describe(change.after)})"
    if change.after is None:
        return f"deleted (was {describe(change.before)})"
    return f"{record.kind} ({describe(change.before)} -> {describe(change.after)})"


def _differences(path: str, real: PathChange, claim: PathChange) -> list[str]:
    reasons = []
    for label, mine, theirs in (
        ("after", real.after, claim.after),
        ("before", real.before, claim.before),
    ):
        if mine == theirs:
            continue
        if mine is None or theirs is None:
            reasons.append(
                f"{label} the change it is {describe(mine)} in the diff but "
                f"{describe(theirs)} in the receipt"
            )
            continue
        if _type_class(mine[0]) != _type_class(theirs[0]):
            reasons.append(
                f"{label}: type is {file_type(mine[0])} in the diff, "
                f"{file_type(theirs[0])} in the receipt"
            )
        elif mine[0] != theirs[0]:
            reasons.append(f"{label}: mode is {mine[0]} in the diff, {theirs[0]} in the receipt")
        if mine[1] != theirs[1]:
            reasons.append(
                f"{label}: blob is {mine[1][:12]} in the diff, {theirs[1][:12]} in the receipt"
            )
    renamed = real.record.status == "R" and real.record.path == path
    if reasons and renamed and claim.record.status != "R":
        reasons.insert(
            0,
            f"the diff renames {real.record.old_path!r} to it; the receipt reports "
            f"it {claim.record.kind}",
        )
    return reasons


def compare(real: dict[str, PathChange], claimed: dict[str, PathChange]) -> list[Finding]:
    """`unclaimed-change`, `missing-change` and `change-differs` findings, sorted by path."""
    findings = []
    real = {p: c for p, c in real.items() if c.before != c.after}
    for path in sorted(
        real.keys() | claimed.keys(), key=lambda p: p.encode("utf-8", "surrogateescape")
    ):
        mine, theirs = real.get(path), claimed.get(path)
        if mine is not None and theirs is None:
            findings.append(
                Finding(
                    Kind.unclaimed_change,
                    f"{path!r} is {_what(mine, path)} in the diff, "
                    "and no verified receipt claims it",
                    path=path,
                    commit=mine.commit,
                )
            )
        elif theirs is not None and mine is None and theirs.before != theirs.after:
            findings.append(
                Finding(
                    Kind.missing_change,
                    f"a receipt claims {path!r} {_what(theirs, path)}, "
                    "but the diff does not change it",
                    path=path,
                    commit=theirs.commit,
                )
            )
        elif mine is not None and theirs is not None:
            reasons = _differences(path, mine, theirs)
            if reasons:
                findings.append(
                    Finding(
                        Kind.change_differs,
                        f"{path!r}: " + "; ".join(reasons),
                        path=path,
                        commit=theirs.commit,
                    )
                )
    return findings
