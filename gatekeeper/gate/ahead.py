"""What the judgement reads whatever the range holds, started before the judgement loads.

A check (commands/check_early.py) starts these reads of git while the interpreter loads the
models; the judgement takes them instead of reading the same objects again. Each is a call
that waits for its read and gives what it read, or raises what reading raised (gate.later).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.gate.later import later
from gatekeeper.gate.notes import NoteLine, local_sources
from gatekeeper.git import is_shallow, read_blob_at
from gatekeeper.policy import POLICY_PATH, TRUST_PATH

# The ids of the range's commits, and the notes on them (gate.notes.read_notes).
RangeNotes = tuple[set[str], dict[str, list[NoteLine]]]


@dataclass(frozen=True)
class EarlyReads:
    """Whether the repository is shallow, the trust file and the policy of the rules commit
    (None: absent there) and the local notes refs, as is_shallow, read_blob_at and
    local_sources give them; and, once the range is found, the notes on its commits, read
    from those refs."""

    at: Callable[[], tuple[Path, str]]  # the git directory and the rules commit read from
    shallow: Callable[[], bool]
    trust: Callable[[], bytes | None]
    policy: Callable[[], bytes | None]
    sources: Callable[[], list[tuple[str, str]]]
    range_notes: Callable[[], RangeNotes] | None = None


def read_early(at: Callable[[], tuple[Path, str]]) -> EarlyReads:
    """Start the reads EarlyReads holds, each on a thread of its own, once at (a call that
    waits for them) gives the git directory and the rules commit."""

    def blob(path: str) -> bytes | None:
        git_dir, commit = at()
        return read_blob_at(git_dir, commit, path)

    return EarlyReads(
        at,
        later(lambda: is_shallow(at()[0])),
        later(blob, TRUST_PATH),
        later(blob, POLICY_PATH),
        later(lambda: local_sources(at()[0])),
    )
