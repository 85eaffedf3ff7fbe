"""Runs whose work reached the target under other commit ids.

A run whose result commit is in the target's history has landed; so has one whose change a
commit of the target makes exactly: a forge's "squash and merge" of the run, or its "rebase
and merge", gives the run's work new ids. Such a run's receipt may not cover its change once
more (say after a revert). A squash of several runs into one commit is not recognised here.
"""

from __future__ import annotations

from pathlib import Path

from gatekeeper.gate.compare import State, effects
from gatekeeper.git import git
from gatekeeper.receipt.changes import Change, decode_path

# Commits of the target read (newest first); a run that landed further back than this is not
# recognised by its change.
MAX_LANDED_SCAN = 10_000

Signature = frozenset[tuple[str, State, State]]


def target_signatures(git_dir: Path, tip: str) -> set[Signature]:
    """What each of the newest MAX_LANDED_SCAN non-merge commits of tip's history changes
    (its own diff against its parent), read with one `git log`. Raises GitError or
    ValueError when git fails or prints what it should not."""
    out = git(
        "log", "-z", "--raw", "-r", "--no-merges", "--no-renames", "--no-abbrev",
        "--format=%x01", f"--max-count={MAX_LANDED_SCAN}", tip, "--",
        git_dir=git_dir,
    )  # fmt: skip
    found: set[Signature] = set()
    current: set[tuple[str, State, State]] | None = None
    fields = out.split(b"\0")
    i = 0
    while i < len(fields):
        head = fields[i].lstrip(b"\n")
        if head == b"\x01":
            if current is not None:
                found.add(frozenset(current))
            current = set()
            i += 1
        elif head.startswith(b":") and current is not None:
            old_mode, new_mode, old_blob, new_blob, status = head[1:].decode().split(" ")
            change = Change(status=status[0], path=decode_path(fields[i + 1]), old_mode=old_mode,
                            new_mode=new_mode, old_blob=old_blob, new_blob=new_blob)  # fmt: skip
            current.update(effects(change))
            i += 2
        elif head:
            raise ValueError(f"unexpected git log record: {head[:40]!r}")
        else:
            i += 1
    if current is not None:
        found.add(frozenset(current))
    return found
