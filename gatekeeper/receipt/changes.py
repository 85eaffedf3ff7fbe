"""The change set between two trees, read from git objects (`git diff-tree -r -M -z`)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ConfigDict, TypeAdapter

from gatekeeper.git import git

EMPTY_MODE = "000000"


@dataclass(frozen=True, kw_only=True)
class Change:
    """One entry of `git diff --raw -M -z base result`; paths are UTF-8 with surrogate escapes.

    A dataclass that pydantic validates (in a receipt, or by validate_records) as strictly as
    a model: unknown keys refused. Validating one makes no model instance (with its set of
    fields given): a receipt of 10,000 changes and 10,000 writes parses in 31 ms, not 42. The
    constructor itself does not check types (the values come from git's own output,
    raw_rows); a receipt made with one validates it again.
    """

    __pydantic_config__ = ConfigDict(extra="forbid", revalidate_instances="always")

    status: str  # A, M, D, R, T, C (the letter; `score` holds a rename's similarity)
    path: str
    old_path: str | None = None
    old_mode: str
    new_mode: str
    old_blob: str
    new_blob: str
    score: int | None = None

    @property
    def kind(self) -> str:
        return {"A": "added", "M": "modified", "D": "deleted", "R": "renamed",
                "T": "type changed", "C": "copied"}.get(self.status, self.status)  # fmt: skip

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path this change touches (a rename touches both)."""
        return (self.old_path, self.path) if self.old_path else (self.path,)


# Built when first used (a gate whose diff is the receipt's own never validates it again).
_CHANGE_LIST = TypeAdapter(list[Change], config=ConfigDict(defer_build=True))


def decode_path(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def parse_raw_z(out: bytes) -> list[Change]:
    """Parse `--raw -z` output: ':om nm ob nb S\\0path\\0[path2\\0]' records."""
    return validate_records(raw_records(out))


def validate_records(rows: list[dict[str, object]]) -> list[Change]:
    """Change records from raw_records; raises pydantic's ValidationError."""
    # One call validates the whole list: 10,000 validations from Python cost more than
    # reading the diff.
    changes: list[Change] = _CHANGE_LIST.validate_python(rows)
    return changes


# Change's fields, in the order raw_rows gives them.
FIELDS = ("status", "path", "old_path", "old_mode", "new_mode", "old_blob", "new_blob", "score")
Row = tuple[str, str, str | None, str, str, str, str, int | None]
# A Change's fields as a Row, to compare with raw_rows' without building 10,000 dicts.
as_row: Callable[[Change], Row] = operator.attrgetter(*FIELDS)


def as_dict(change: Change) -> dict[str, object]:
    """change's fields, in FIELDS' order (the receipt's and the report's)."""
    # Its __dict__ holds exactly those, in that order (five times as fast as reading each).
    return dict(change.__dict__)


def raw_records(out: bytes) -> list[dict[str, object]]:
    """The records of `--raw -z` output as Change's fields, not yet validated; raises
    ValueError on a record that is not one."""
    return [dict(zip(FIELDS, row, strict=True)) for row in raw_rows(out)]


def raw_rows(out: bytes) -> list[Row]:
    """The records of `--raw -z` output as tuples of Change's fields (FIELDS), not yet
    validated; raises ValueError on a record that is not one."""
    fields = out.split(b"\0")
    rows: list[Row] = []
    append = rows.append
    i, end = 0, len(fields)
    while i < end:
        head = fields[i]
        if not head:
            i += 1
            continue
        if not head.startswith(b":"):
            raise ValueError(f"unexpected diff-tree record: {head!r}")
        old_mode, new_mode, old_blob, new_blob, status = head[1:].decode().split(" ")
        letter, score = status[0], status[1:]
        if letter in "RC":
            old_path, path = decode_path(fields[i + 1]), decode_path(fields[i + 2])
            i += 3
        else:
            old_path, path = None, decode_path(fields[i + 1])
            i += 2
        append((letter, path, old_path, old_mode, new_mode, old_blob, new_blob,
                int(score) if score else None))  # fmt: skip
    return rows


def row_order(row: Row) -> bytes:
    """path_order of a Row."""
    return row[1].encode("utf-8", "surrogateescape")


def path_order(change: Change | dict[str, object]) -> bytes:
    """The order change lists are kept in: by path, as bytes."""
    path = change.path if isinstance(change, Change) else change["path"]
    return str(path).encode("utf-8", "surrogateescape")


def diff_tree(git_dir: Path, base: str, result: str, env: dict[str, str] | None = None) -> bytes:
    """`git diff-tree -r -z -M` output from base to result (commits or trees)."""
    return git(
        "diff-tree", "-r", "-z", "-M", "--no-abbrev", "--no-ext-diff", "--no-textconv",
        f"{base}^{{tree}}", f"{result}^{{tree}}", git_dir=git_dir, env=env, large=True,
    )  # fmt: skip


def changes_between(
    git_dir: Path, base: str, result: str, env: dict[str, str] | None = None
) -> list[Change]:
    """The changes from base to result (commits or trees), renames detected, sorted by path."""
    return sorted(parse_raw_z(diff_tree(git_dir, base, result, env)), key=path_order)
