"""Attacks on commits accounted for by a person's signature, with real signatures made by git
and real pushes to a bare repository with the server hook (docs/security.md, rows P...)."""

from __future__ import annotations

from pathlib import Path

import test_push
from test_gate_people import on_main, signed_commit, ssh_person, trust_people
from test_push import Setup, assert_accepted, assert_blocked

from conftest import git

daemon = test_push.daemon
setup = test_push.setup


def test_a_persons_commits_from_another_repository_cannot_be_merged_in(
    setup: Setup, tmp_path: Path
) -> None:
    """P3: Alice signs her commits everywhere. Anyone who may push merges the history of her
    unrelated side project (a `conftest.py` that pytest runs in CI) into main: every commit of
    it is signed by a trusted person, the merge needs no signature, and the gate passed it."""
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    trust_people(setup, alice)
    side = tmp_path / "side-project"
    side.mkdir()
    git(side, "init", "-q", "-b", "main")
    signed_commit(side, {"side/README.md": "# my side project\n"}, "start", ssh_key=alice_key)
    signed_commit(side, {"conftest.py": "import os\nos.system('id')\n"}, "test setup",
                  ssh_key=alice_key)  # fmt: skip

    on_main(setup)
    git(setup.clone, "fetch", "-q", str(side), "main")
    git(setup.clone, "merge", "-q", "--allow-unrelated-histories", "--no-edit",
        "FETCH_HEAD")  # fmt: skip
    proc = setup.push("HEAD:refs/heads/main")
    assert_blocked(proc, "untrusted-signature")
    assert "shares no history with" in proc.stderr
    assert git(setup.bare, "cat-file", "-t", "main:conftest.py", check=False) == ""

    # Her own commit on this repository's history still passes.
    on_main(setup)
    mine = signed_commit(setup.clone, {"docs/notes.md": "by alice\n"}, "notes", ssh_key=alice_key)
    assert_accepted(setup.push(f"{mine}:refs/heads/main"))
