"""Receipts for rewritten commits: the index of every receipt the gate may use, and change sets
composed path by path.

A rebase, an amend or a squash gives a run's work new commit ids, so its receipt is found by
content instead: by the trees it starts and ends with, by its exact change set, or (for a squash
of several runs) by the state it leaves a path in. The notes read here are indexed without
verifying them; a receipt is verified against the target's trust file before it is used.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gatekeeper.gate.compare import State, effects
from gatekeeper.gate.history import CommitInfo
from gatekeeper.gate.notes import NoteLine
from gatekeeper.gate.verified import VerifiedReceipt
from gatekeeper.receipt.changes import Change, validate_records
from gatekeeper.receipt.models import Statement

Signature = frozenset[tuple[str, State, State]]
Net = dict[str, tuple[State, State]]  # path -> (state before, state after)


def change_signature(changes: Iterable[Change]) -> Signature:
    """What a change list does, independent of how renames were paired."""
    return frozenset(e for c in changes for e in effects(c))


def net_of(changes: Iterable[Change]) -> Net | None:
    """One diff as path -> (before, after); None when it names a path twice (not a real diff)."""
    net: Net = {}
    for change in changes:
        for path, before, after in effects(change):
            if path in net:
                return None
            net[path] = (before, after)
    return net


def compose(acc: Net, changes: Iterable[Change]) -> Net | None:
    """acc followed by changes; None when a change does not start where acc left its path.

    A path added by one run and deleted by a later one stays in the result as a no-op
    (absent -> absent), so a claim is never silently dropped.
    """
    step = net_of(changes)
    if step is None:
        return None
    out = dict(acc)
    for path, (before, after) in step.items():
        if path in out:
            first, last = out[path]
            if last != before:
                return None
            out[path] = (first, after)
        else:
            out[path] = (before, after)
    return out


def same_change(real: Net, composed: Net) -> bool:
    """Does a commit's own diff (real) change exactly what the composed runs changed?

    Every path the runs changed must end as the commit leaves it, starting where the commit's
    parent had it; paths the runs left as they found them must not change in the commit.
    """
    for path, (before, after) in composed.items():
        if before == after:
            if path in real:
                return False
        elif real.get(path) != (before, after):
            return False
    return all(path in composed for path in real)


@dataclass(frozen=True)
class Peek:
    """What indexing needs of a receipt: its trees, its base, its changes, its agent commits."""

    base_commit: str
    base_tree: str
    result_commit: str
    result_tree: str
    changes: tuple[Change, ...]
    agent_commits: tuple[str, ...]


def peek_statement(statement: Statement) -> Peek:
    p = statement.predicate
    return Peek(p.base.commit, p.base.tree, statement.result_commit, statement.result_tree,
                tuple(p.changes), tuple(p.agent_commits))  # fmt: skip


def peek_line(line: str) -> Peek | None:
    """The same, read without verifying (only to index); None when it does not parse."""
    try:
        data: Any = json.loads(base64.b64decode(json.loads(line)["payload"], validate=True))
        predicate = data["predicate"]
        return Peek(
            str(predicate["base"]["commit"]),
            str(predicate["base"]["tree"]),
            str(data["subject"][0]["digest"]["gitCommit"]),
            str(data["subject"][0]["digest"]["gitTree"]),
            tuple(validate_records(predicate["changes"])),
            tuple(str(a) for a in predicate.get("agent_commits") or []),
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
        # Unverified notes anyone may push: deep nesting exhausts json's recursion.
        return None


INDEXES = ("trees", "result_tree", "base_tree", "changes", "after", "agent_path")


def index_keys(kind: str, peek: Peek) -> list[Any]:
    """The keys a receipt is found under in one index (see ReceiptPool.lookup)."""
    if kind == "trees":
        return [(peek.result_tree, peek.base_tree)]
    if kind == "result_tree":
        return [peek.result_tree]
    if kind == "base_tree":
        return [peek.base_tree]
    if kind == "changes":
        return [change_signature(peek.changes)]
    if kind == "after":
        return [(path, after) for c in peek.changes for path, _, after in effects(c)]
    if kind == "agent_path":
        return [path for c in peek.changes for path in c.paths] if peek.agent_commits else []
    raise KeyError(kind)


class ReceiptPool:
    """Every receipt that may cover a commit of the range, indexed by what it starts and ends with.

    Receipts attached to the range come in verified; the others (notes on commits outside the
    range, say a rebase's original commit) are read only when a lookup first needs them and
    verified one by one when a lookup returns them. Each index is built when a lookup first
    asks it (a run of 10,000 changes has 10,000 keys in some): a range whose commits are the
    runs' own commits asks none.
    """

    def __init__(
        self,
        verify: Callable[[NoteLine], VerifiedReceipt | None],
        load: Callable[[], Iterable[NoteLine]] | None = None,
    ) -> None:
        self._verify_note = verify
        self._load = load
        self.notes: list[tuple[NoteLine, Peek]] = []
        self._lines: set[str] = set()
        self._verified: dict[str, VerifiedReceipt | None] = {}
        self._by: dict[str, dict[Any, list[int]]] = {}  # only the indexes built so far

    def add_verified(self, receipt: VerifiedReceipt) -> None:
        self._verified[receipt.line] = receipt
        self._add(receipt.note, peek_statement(receipt.statement))

    def _add(self, note: NoteLine, peek: Peek) -> None:
        if note.line in self._lines:
            return
        self._lines.add(note.line)
        self.notes.append((note, peek))
        for kind, index in self._by.items():
            self._index_note(kind, index, len(self.notes) - 1)

    def _index_note(self, kind: str, index: dict[Any, list[int]], i: int) -> None:
        for key in index_keys(kind, self.notes[i][1]):
            index.setdefault(key, []).append(i)

    def _index(self, kind: str) -> dict[Any, list[int]]:
        """The index of kind over every receipt read (reading the others first, once)."""
        if kind not in INDEXES:
            raise KeyError(kind)
        self._ensure()
        if kind not in self._by:
            index: dict[Any, list[int]] = {}
            for i in range(len(self.notes)):
                self._index_note(kind, index, i)
            self._by[kind] = index
        return self._by[kind]

    def _ensure(self) -> None:
        if self._load is None:
            return
        load, self._load = self._load, None
        for note in load():
            if note.problem is None and note.line not in self._lines:
                peek = peek_line(note.line)
                if peek is not None:
                    self._add(note, peek)

    def verify(self, index: int) -> VerifiedReceipt | None:
        note = self.notes[index][0]
        if note.line not in self._verified:
            self._verified[note.line] = self._verify_note(note)
        return self._verified[note.line]

    def count(self, kind: str, key: Any) -> int:
        return len(self._index(kind).get(key, []))

    def lookup(self, kind: str, key: Any) -> list[VerifiedReceipt]:
        """Verified receipts under key in one index: trees (result tree, base tree),
        result_tree, base_tree, changes (a signature), after ((path, state)), agent_path (a
        path the changes of a run whose agent committed touch)."""
        found = (self.verify(i) for i in self._index(kind).get(key, []))
        return [r for r in found if r is not None]

    def peeks(self, kind: str, key: Any) -> list[tuple[int, Peek]]:
        """Unverified (index, peek) pairs under key, to build further indexes from."""
        return [(i, self.notes[i][1]) for i in self._index(kind).get(key, [])]


def touches(receipt: VerifiedReceipt, path: str) -> bool:
    return any(path in c.paths for c in receipt.statement.predicate.changes)


def only_children(commits: list[CommitInfo]) -> dict[str, CommitInfo]:
    """Commit -> its one non-merge child in the range (by first parent), when it has exactly one."""
    children: dict[str, list[CommitInfo]] = {}
    for commit in commits:
        if commit.parents and not commit.is_merge:
            children.setdefault(commit.parents[0], []).append(commit)
    return {parent: kids[0] for parent, kids in children.items() if len(kids) == 1}
