"""The range under review: the merge-base of target and head, and the commits after it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING

from gatekeeper.gate.diffread import read_git
from gatekeeper.git import HEX40, git

if TYPE_CHECKING:  # loaded by range_changes: the range itself is found without the models
    from gatekeeper.receipt.changes import Change

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


@dataclass(frozen=True)
class CommitInfo:
    """A commit in the range, with the trees a receipt's base and result are matched against."""

    oid: str
    tree: str
    parents: tuple[str, ...]
    parent_tree: str  # the first parent's tree; the empty tree for a root commit
    subject: str

    @property
    def is_merge(self) -> bool:
        return len(self.parents) > 1

    @property
    def short(self) -> str:
        return self.oid[:12]


@dataclass(frozen=True)
class RangeAhead:
    """The range found ahead, each part on a thread (gate.later): calling one waits for it and
    gives what merge_base and range_commits gave, or raises what they raised."""

    merge_base: Callable[[], str | None]
    commits: Callable[[], list[CommitInfo]]


SUBJECT_COLUMNS = 200  # of a commit's subject, at most (git cuts it, ending in "..")


def merge_base(git_dir: Path, target: str, head: str) -> str | None:
    """The best common ancestor of target and head, or None when they share no history."""
    out = git("merge-base", target, head, git_dir=git_dir, check=False).decode().strip()
    return out or None


def trees_of(git_dir: Path, revs: list[str]) -> dict[str, str]:
    """Map each revision to its tree id with one `git cat-file --batch-check`."""
    if not revs:
        return {}
    unique = list(dict.fromkeys(revs))
    out = git(
        "cat-file",
        "--batch-check=%(objectname)",
        git_dir=git_dir,
        input="".join(f"{r}^{{tree}}\n" for r in unique).encode(),
    ).decode()
    return {rev: line.split(" ")[0] for rev, line in zip(unique, out.splitlines(), strict=True)}


def range_commits(git_dir: Path, base: str | None, head: str) -> list[CommitInfo]:
    """Commits reachable from head but not from base, oldest first (parents before children)."""
    # (A subject is cut to SUBJECT_COLUMNS: a pushed commit's may be megabytes, each shown in
    # findings, reports and the hook's answer to the pusher.)
    args = ["log", "-z", "--reverse", "--topo-order",
            f"--format=%H %T %P%x01%<({SUBJECT_COLUMNS},trunc)%s", head]  # fmt: skip
    if base:
        args += ["--not", base]
    # Read with the bounds of every listing of what a pusher chose (gate.diffread): git keeps
    # each commit it lists in memory, and dozens of megabyte messages are a small push.
    out = read_git(git_dir, args, "the list of the range's commits", limit=None)
    rows = []
    for record in out.split(b"\0"):
        if not record.strip():
            continue
        ids, _, subject = record.decode("utf-8", "replace").partition("\x01")
        oid, tree, *parents = ids.split()
        rows.append((oid, tree, tuple(parents), subject.rstrip(" ")))  # (padded to the width)
    parent_trees = trees_of(git_dir, [r[2][0] for r in rows if r[2]])
    return [
        CommitInfo(oid, tree, parents, parent_trees[parents[0]] if parents else EMPTY_TREE, subject)
        for oid, tree, parents, subject in rows
    ]


def commit_parents(git_dir: Path, oid: str) -> tuple[str, ...] | None:
    """The parents of commit oid (a full object id), or None when it is not a commit here."""
    if not HEX40.fullmatch(oid):
        return None
    out = git("rev-list", "--parents", "-n", "1", oid, "--", git_dir=git_dir, check=False)
    fields = out.decode().split()
    if not fields or fields[0] != oid:
        return None
    return tuple(fields[1:])


def range_changes(
    git_dir: Path, base: str, head: str, claimed: list[Change], raw: bytes | None = None
) -> list[Change]:
    """changes_between(base, head), read with gate.diffread's bound (from raw, read_diff's
    output, when the caller has it).
    Where git's records are exactly the ones claimed (a receipt's, validated when it was
    read), in the same order, those objects stand for them: the same fields and values,
    without validating 10,000 records a second time. Raises GitError, DiffTooLarge or ValueError."""
    from gatekeeper.gate.diffread import read_diff
    from gatekeeper.receipt.changes import FIELDS, as_row, raw_rows, row_order, validate_records

    raw = read_diff(git_dir, base, head) if raw is None else raw
    rows = raw_rows(raw)
    # ASCII paths sort as their bytes do without encoding each of them again.
    rows.sort(key=itemgetter(1) if raw.isascii() else row_order)
    # A Change holds exactly its fields (extra fields are forbidden): equal rows, equal records.
    if len(rows) == len(claimed) and rows == list(map(as_row, claimed)):
        return list(claimed)
    return validate_records([dict(zip(FIELDS, row, strict=True)) for row in rows])
