"""A note blob is split in place, inside the output git wrote it in, exactly as splitting a
copy of it line by line did: the same lines, the same problems, the same limits."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.gate_receipts import attach, commit_files, git_dir_of, make_receipt, sign
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper.gate.notes import blob_spans, read_blobs, read_notes
from gatekeeper.receipt import notes as notes_module
from gatekeeper.receipt.notes import NOTES_REF, NoteText, split_note

from conftest import git


def split_copy(data: bytes) -> NoteText:
    """The way a note was split before: the blob copied, split, each line stripped and
    decoded (kept here as the reference)."""
    text = NoteText()
    pieces = data.split(b"\n", notes_module.MAX_NOTE_LINES)
    if len(pieces) > notes_module.MAX_NOTE_LINES and pieces[-1].strip():
        text.problems.append(
            f"the note has more than {notes_module.MAX_NOTE_LINES} lines (the limit); "
            "the rest was not read"
        )
        pieces = pieces[:-1]
    for piece in pieces:
        piece = piece.strip()
        if not piece:
            continue
        if len(piece) > notes_module.MAX_ENVELOPE_BYTES:
            text.problems.append(
                f"a line of {len(piece)} bytes, over the envelope limit of "
                f"{notes_module.MAX_ENVELOPE_BYTES}; not read"
            )
            continue
        text.lines.append(piece.decode("utf-8", "replace"))
    return text


PIECES = st.lists(
    st.one_of(
        st.sampled_from(
            [
                b"\n",
                b" ",
                b"\t",
                b"\r",
                b"\x0b",
                b"\x0c",
                b"\xc3",
                b"\xa9",
                b"\xff",
                b"{}",
                b"ab",
                b"\xe2\x82",
                b"\xac",
                b"\x00",
            ]
        ),  # fmt: skip
        st.binary(max_size=12),
    ),
    max_size=40,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(
    data=PIECES,
    before=st.binary(max_size=6),
    after=st.binary(max_size=6),
    lines=st.integers(1, 6),
    longest=st.integers(0, 20),
)
def test_a_note_split_in_place_is_the_note_split_from_a_copy(
    data: bytes, before: bytes, after: bytes, lines: int, longest: int
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(notes_module, "MAX_NOTE_LINES", lines)
        patch.setattr(notes_module, "MAX_ENVELOPE_BYTES", longest)
        expected = split_copy(data)
        assert split_note(data) == expected
        start = len(before)
        assert split_note(before + data + after, start, start + len(data)) == expected


def test_notes_read_in_place_are_the_notes_read_from_copies(repo: Path) -> None:
    commit = commit_files(repo, {"src/new.py": "x = 1\n"}, branch="agent/1", start="main")
    envelope = sign(make_receipt(repo, commit))
    line = envelope.to_json()
    attach(repo, commit, envelope)
    other = commit_files(repo, {"src/b.py": "y = 2\n"}, branch="agent/2", start="main")
    attach(repo, other, "  \nnot an envelope\n\n" + line)
    git_dir = git_dir_of(repo)
    notes = git(repo, "rev-parse", NOTES_REF).strip()
    blobs = [git(repo, "rev-parse", f"{notes}:{c}").strip() for c in (commit, other)]
    out, spans = blob_spans(git_dir, [*blobs, blobs[0], "0" * 40])
    copies = read_blobs(git_dir, [*blobs, "0" * 40])
    assert set(spans) == set(copies) == set(blobs)
    for blob in blobs:
        a, b = spans[blob]
        assert out[a:b] == copies[blob] == git(repo, "cat-file", "blob", blob).encode()
        assert split_note(out, a, b) == split_copy(copies[blob])
    found = read_notes(git_dir, [(NOTES_REF, notes)], wanted={commit, other})
    assert [n.line for n in found[commit]] == [line]
    assert [n.line for n in found[other]] == ["not an envelope", line]
