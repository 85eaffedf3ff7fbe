"""Attacks on commits accounted for by a person's signature, with real signatures made by git
and real pushes to a bare repository with the server hook (docs/security.md, rows P...)."""

from __future__ import annotations

import subprocess
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


def _signed_by_hand(repo: Path, key: Path, namespace: str, header: str = "gpgsig") -> str:
    """A commit on HEAD whose SSH signature ssh-keygen made over its payload in namespace,
    put into header by hand (as anyone could), and the branch moved there."""
    tree = git(repo, "write-tree").strip()
    parent = git(repo, "rev-parse", "HEAD").strip()
    payload = git(repo, "commit-tree", tree, "-p", parent, "-m", f"signed in {namespace}").strip()
    raw = git(repo, "cat-file", "commit", payload).encode()
    (repo.parent / "payload").write_bytes(raw)
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", namespace,
                    str(repo.parent / "payload")], check=True, capture_output=True)  # fmt: skip
    signature = (repo.parent / "payload.sig").read_text().strip()
    (repo.parent / "payload.sig").unlink()
    head, _, body = raw.partition(b"\n\n")
    signed = head + f"\n{header} ".encode() + signature.replace("\n", "\n ").encode()
    oid = git(repo, "hash-object", "-t", "commit", "-w", "--stdin",
              input=signed + b"\n\n" + body).strip()  # fmt: skip
    git(repo, "update-ref", "HEAD", oid)
    return oid


def test_an_ssh_signature_for_another_namespace_or_header_does_not_count(
    setup: Setup, tmp_path: Path
) -> None:
    """Held: ssh-keygen signatures over the very commit payload, made for the `file` namespace
    (as for any other data), or put under the SHA-256 header in a SHA-1 repository."""
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    trust_people(setup, alice)
    on_main(setup)
    for name in ("a.txt", "b.txt", "c.txt"):
        (setup.clone / name).write_text(name)
    git(setup.clone, "add", "a.txt")
    other = _signed_by_hand(setup.clone, alice_key, "file")
    assert_blocked(setup.push(f"{other}:refs/heads/main"), "untrusted-signature")
    on_main(setup)
    git(setup.clone, "add", "b.txt")
    moved = _signed_by_hand(setup.clone, alice_key, "git", header="gpgsig-sha256")
    assert_blocked(setup.push(f"{moved}:refs/heads/main"), "uncovered-commit")
    on_main(setup)
    git(setup.clone, "add", "c.txt")
    good = _signed_by_hand(setup.clone, alice_key, "git")  # the control: made right, it counts
    assert_accepted(setup.push(f"{good}:refs/heads/main"))
