"""Attacks on the gate's in-place reading of note blobs (receipt.notes.split_note over bounds
in git's output) and on `gatekeeper check`'s plain path.

Every test builds a real repository and fails when the hole it names is open.
"""

from __future__ import annotations

import time
from pathlib import Path

from fixtures.gate_receipts import git_dir_of, receipted_commit
from test_gate_notes import set_note

from gatekeeper.gate import judge

from conftest import git


def test_a_note_padded_with_whitespace_is_read_at_the_speed_of_git(repo: Path) -> None:
    # Anyone who may push may push a notes ref. Whitespace compresses to nearly nothing, so a
    # push of a few hundred kilobytes lands a note of 160 MiB of it on the commits under
    # review. The in-place split stripped each line's ends one byte at a time in Python
    # (seconds per note, for each commit and notes ref it is attached to), where bytes.strip
    # had taken a fraction of a second: a stalled server hook for the price of a small push.
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    padding = b" " * (64 << 20) + b"\n" + b"\r\t" * (16 << 20) + b"\nx" + b" " * (64 << 20)
    set_note(repo, commit, padding)
    base, head = (git(repo, "rev-parse", r).strip() for r in ("main", "agent/1"))
    started = time.monotonic()
    result = judge(git_dir_of(repo), base, head)
    elapsed = time.monotonic() - started
    assert result.receipts_verified == 1, result.findings
    assert result.verdict.value == "block"  # the stray `x` is a malformed receipt
    assert elapsed < 4, f"the gate took {elapsed:.1f}s over a note of whitespace"
