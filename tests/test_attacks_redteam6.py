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
from gatekeeper.receipt.notes import NOTES_REF

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


def test_one_padded_note_on_many_commits_is_split_once(repo: Path) -> None:
    # One note blob may sit on every commit of a pushed range (a notes tree of entries that
    # all name the same blob: a few kilobytes to push). It was split once per commit it sat
    # on: 256 MiB of whitespace read again for each of 200 commits.
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    base = git(repo, "rev-parse", "main").strip()
    tree = git(repo, "rev-parse", f"{commit}^{{tree}}").strip()
    head = commit
    for i in range(200):
        head = git(repo, "commit-tree", tree, "-p", head, "-m", f"empty {i}").strip()
    blob = git(repo, "hash-object", "-w", "--stdin", input=b" " * (256 << 20)).strip()
    notes_tree = git(repo, "rev-parse", f"{NOTES_REF}^{{tree}}").strip()
    entries = git(repo, "ls-tree", notes_tree)
    ours = "".join(
        f"100644 blob {blob}\t{oid}\n" for oid in git(repo, "rev-list", f"{commit}..{head}").split()
    )
    padded = git(repo, "mktree", input=(entries + ours).encode()).strip()
    parent = git(repo, "rev-parse", NOTES_REF).strip()
    notes = git(repo, "commit-tree", padded, "-p", parent, "-m", "pad").strip()
    git(repo, "update-ref", NOTES_REF, notes)
    started = time.monotonic()
    result = judge(git_dir_of(repo), base, head)
    elapsed = time.monotonic() - started
    assert result.receipts_verified == 1, result.findings
    assert elapsed < 6, f"the gate took {elapsed:.1f}s over one note of whitespace"
