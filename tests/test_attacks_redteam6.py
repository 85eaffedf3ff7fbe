"""Attacks on the gate's in-place reading of note blobs (receipt.notes.split_note over bounds
in git's output) and on `gatekeeper check`'s plain path.

Every test builds a real repository and fails when the hole it names is open.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures.gate_receipts import git_dir_of, receipted_commit
from test_gate_notes import set_note

import gatekeeper.gate.notes as gate_notes
from gatekeeper.gate import judge
from gatekeeper.receipt import notes as receipt_notes
from gatekeeper.receipt.notes import NOTES_REF, split_note

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
    result = judge(git_dir_of(repo), base, head)
    assert result.receipts_verified == 1, result.findings
    # The stray `x` is a malformed receipt, shown beside the genuine one, not a finding.
    assert [f.kind.value for f in result.ignored_notes] == ["malformed-receipt"]
    assert result.verdict.value == "pass", result.findings
    # The padding is taken off in C, a window at a time: the Python lines run to strip a line
    # of 1 MiB of whitespace are counted (a byte at a time they were millions).
    ran = 0

    def count(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal ran
        if frame.f_code is receipt_notes._stripped.__code__:
            ran += event == "line"
            return count
        return None

    line = b" \t" * (1 << 19) + b"{}" + b"\r " * (1 << 19)
    sys.settrace(count)
    try:
        text = split_note(line)
    finally:
        sys.settrace(None)
    assert text.lines == ["{}"]
    assert ran < 2_000, f"{ran} Python lines to strip 2 MiB of whitespace"


def test_one_padded_note_on_many_commits_is_split_once(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One note blob may sit on every commit of a pushed range (a notes tree of entries that
    # all name the same blob: a few kilobytes to push). It was split once per commit it sat
    # on: a note of hundreds of MiB of whitespace read again for each commit.
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    base = git(repo, "rev-parse", "main").strip()
    tree = git(repo, "rev-parse", f"{commit}^{{tree}}").strip()
    head = commit
    for i in range(50):
        head = git(repo, "commit-tree", tree, "-p", head, "-m", f"empty {i}").strip()
    size = 1 << 20
    blob = git(repo, "hash-object", "-w", "--stdin", input=b" " * size).strip()
    notes_tree = git(repo, "rev-parse", f"{NOTES_REF}^{{tree}}").strip()
    entries = git(repo, "ls-tree", notes_tree)
    ours = "".join(
        f"100644 blob {blob}\t{oid}\n" for oid in git(repo, "rev-list", f"{commit}..{head}").split()
    )
    padded = git(repo, "mktree", input=(entries + ours).encode()).strip()
    parent = git(repo, "rev-parse", NOTES_REF).strip()
    notes = git(repo, "commit-tree", padded, "-p", parent, "-m", "pad").strip()
    git(repo, "update-ref", NOTES_REF, notes)
    splits: list[int] = []

    def counted(data: bytes, start: int = 0, end: int | None = None):  # type: ignore[no-untyped-def]
        splits.append((len(data) if end is None else end) - start)
        return split_note(data, start, end)

    monkeypatch.setattr(gate_notes, "split_note", counted)
    result = judge(git_dir_of(repo), base, head)
    assert result.receipts_verified == 1, result.findings
    assert splits.count(size) == 1, f"the padded note was split {splits.count(size)} times"
