"""The trust file's roles and `gatekeeper trust add|list`."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from gatekeeper.errors import KeyFileError
from gatekeeper.receipt.keys import load_key
from gatekeeper.receipt.trust import parse_trust, parse_trust_file

from conftest import git, gk

KEY = base64.b64encode(bytes(range(32))).decode()


def _ssh_key(tmp_path: Path, kind: str = "ed25519") -> str:
    path = tmp_path / f"id_{kind}"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "ana@example", "-f", str(path)],
        check=True,
    )
    return (path.parent / (path.name + ".pub")).read_text().strip()


def test_roles_are_separate(tmp_path: Path) -> None:
    person = _ssh_key(tmp_path)
    trust = parse_trust_file(
        f"# c\ned25519 {KEY} launcher\napprover ed25519 {KEY} lead\nperson {person}\n", "t"
    )
    assert [k.comment for k in trust.signers] == ["launcher"]
    assert [k.comment for k in trust.approvers] == ["lead"]
    assert [(p.kind, p.comment) for p in trust.people] == [("ssh", "ana@example")]
    # An approver line alone does not let a key sign receipts, nor a person line.
    assert parse_trust(f"approver ed25519 {KEY} lead\nperson {person}\n", "t") == []


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("rsa AAAA x", "expected 'ed25519"),
        ("approver ssh-ed25519 AAAA", "expected 'ed25519"),
        ("person ssh-dss AAAA x", "unknown person key type"),
        ("person ssh-ed25519 !!!", "not valid base64"),
        ("person", "expected 'person"),
    ],
)
def test_malformed_lines_say_which_and_why(line: str, says: str) -> None:
    with pytest.raises(KeyFileError) as caught:
        parse_trust_file(f"ed25519 {KEY}\n{line}\n", "trust")
    assert "trust line 2" in caught.value.message and says in caught.value.diagnostics()


def test_init_trusts_the_users_key_to_sign_and_to_approve(repo: Path) -> None:
    trust = parse_trust_file((repo / ".gatekeeper/trusted_keys").read_text(), "t")
    mine = load_key().public.raw
    assert [k.raw for k in trust.signers] == [mine]
    assert [k.raw for k in trust.approvers] == [mine]
    assert gk("init", "--repo", str(repo), "--no-hooks").returncode == 0  # idempotent
    again = parse_trust_file((repo / ".gatekeeper/trusted_keys").read_text(), "t")
    assert (len(again.signers), len(again.approvers)) == (1, 1)


def test_trust_add_and_list(repo: Path, tmp_path: Path) -> None:
    pub = tmp_path / "id_ed25519.pub"
    pub.write_text(_ssh_key(tmp_path) + "\n")
    assert gk("trust", "add", "--person", str(pub), "--repo", str(repo)).returncode == 0
    ecdsa = _ssh_key(tmp_path, "ecdsa")
    assert gk("trust", "add", "--person", ecdsa, "--repo", str(repo)).returncode == 0
    added = gk("trust", "add", "--approver", f"ed25519 {KEY} lead", "--repo", str(repo))
    assert added.returncode == 0, added.stderr
    again = gk("trust", "add", "--person", str(pub), "--repo", str(repo))
    assert again.returncode == 0 and "already" in again.stderr
    listed = gk("trust", "list", "--json", "--repo", str(repo))
    rows = json.loads(listed.stdout)
    assert [r["role"] for r in rows] == ["signer", "approver", "approver", "person", "person"]
    assert rows[2]["comment"] == "lead"
    assert [r["type"] for r in rows[3:]] == ["ssh-ed25519", "ecdsa-sha2-nistp256"]
    # The committed file is what `--at` reads: nothing of the new lines until committed.
    committed = json.loads(
        gk("trust", "list", "--json", "--at", "HEAD", "--repo", str(repo)).stdout
    )
    assert len(committed) == 2
    git(repo, "commit", "-qam", "trust")
    assert (
        len(json.loads(gk("trust", "list", "--json", "--at", "HEAD", "--repo", str(repo)).stdout))
        == 5
    )


def test_trust_add_refuses_bad_keys_and_both_roles(repo: Path) -> None:
    before = (repo / ".gatekeeper/trusted_keys").read_text()
    bad = gk("trust", "add", "--person", "ssh-ed25519 nope!", "--repo", str(repo))
    assert bad.returncode == 2 and "base64" in bad.stderr
    both = gk("trust", "add", "--person", "--approver", f"ed25519 {KEY}", "--repo", str(repo))
    assert both.returncode == 2 and "exclude" in both.stderr
    assert (repo / ".gatekeeper/trusted_keys").read_text() == before


@pytest.mark.parametrize(
    "link", [".gatekeeper", ".gatekeeper/policy.yaml", ".gatekeeper/trusted_keys"]
)
def test_init_and_trust_add_never_write_through_a_committed_link(
    key: Path, tmp_path: Path, link: str
) -> None:
    """A branch can commit `.gatekeeper` or one of its files as a symlink to anywhere: `init`
    and `trust add` refuse it, say which, write nothing (inside or outside), and work once
    it is gone."""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    outside.mkdir()
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    (repo / ".gatekeeper").mkdir()
    if link == ".gatekeeper":
        (repo / ".gatekeeper").rmdir()
        target = outside
    else:
        target = outside / "file"
    (repo / link).symlink_to(target)
    refusing = [["init", "--no-hooks"]]
    if not link.endswith("policy.yaml"):
        refusing += [["trust", "add"], ["trust", "list"]]
    for argv in refusing:
        proc = gk(*argv, "--repo", str(repo))
        assert proc.returncode != 0, (argv, proc.stderr)
        assert f"{link} in {repo} is a symbolic link" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert list(outside.iterdir()) == []
    # Nothing written before the refusal either.
    assert not (repo / ".gatekeeper/policy.yaml").exists() or link.endswith("policy.yaml")
    assert not (repo / ".gatekeeper/trusted_keys").exists() or link.endswith("trusted_keys")
    (repo / link).unlink()
    assert gk("init", "--repo", str(repo), "--no-hooks").returncode == 0
    assert (repo / ".gatekeeper/policy.yaml").is_file()
    assert not (repo / ".gatekeeper/trusted_keys").is_symlink()
    assert gk("trust", "list", "--repo", str(repo)).returncode == 0
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        ("folder at policy.yaml", ".gatekeeper/policy.yaml in"),
        ("fifo at trusted_keys", ".gatekeeper/trusted_keys in"),
        ("malformed trusted_keys", "trusted_keys line 1"),
    ],
)
def test_init_refuses_what_is_not_its_files_before_writing_anything(
    key: Path, tmp_path: Path, layout: str, says: str
) -> None:
    """A folder or a fifo where a file belongs, or a trust file that does not parse: `init`
    says which, without a traceback or a hang, and writes nothing (no policy, no temporary
    file); a folder standing at a temporary file's name of the past is no obstacle."""
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    folder = repo / ".gatekeeper"
    (folder / ".trusted_keys.gatekeeper-tmp").mkdir(parents=True)
    if layout == "folder at policy.yaml":
        (folder / "policy.yaml").mkdir()
    elif layout == "fifo at trusted_keys":
        os.mkfifo(folder / "trusted_keys")
    else:
        (folder / "trusted_keys").write_text("not a key\n")
    before = sorted(p.name for p in folder.iterdir())
    proc = gk("init", "--repo", str(repo), "--no-hooks")
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == before


def test_trust_add_keeps_the_files_permissions_but_no_set_id_bits(repo: Path) -> None:
    """The trust file is replaced at once by a new file: with the old one's permissions, not
    its set-id bits, and no temporary file left, whatever stands at names it might take."""
    path = repo / ".gatekeeper/trusted_keys"
    path.chmod(0o6640)
    (path.parent / ".trusted_keys.gatekeeper-tmp").mkdir()  # (a name a branch can commit)
    assert (
        gk("trust", "add", "--approver", f"ed25519 {KEY} lead", "--repo", str(repo)).returncode == 0
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert f"approver ed25519 {KEY} lead" in path.read_text()
    assert sorted(p.name for p in path.parent.iterdir()) == [
        ".trusted_keys.gatekeeper-tmp",
        "policy.yaml",
        "trusted_keys",
    ]


def test_trust_add_in_a_linked_worktree_edits_that_worktrees_file(
    repo: Path, tmp_path: Path
) -> None:
    """The trust file is committed on a branch: `trust add` run in a linked worktree edits the
    file of that worktree's branch, not the main checkout's (on another branch)."""
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "keys", str(worktree))
    main_text = (repo / ".gatekeeper/trusted_keys").read_text()
    added = gk("trust", "add", "--approver", f"ed25519 {KEY} lead", "--repo", str(worktree))
    assert added.returncode == 0, added.stderr
    assert f"ed25519 {KEY} lead" in (worktree / ".gatekeeper/trusted_keys").read_text()
    assert (repo / ".gatekeeper/trusted_keys").read_text() == main_text
    listed = gk("trust", "list", "--json", "--repo", str(worktree))
    assert "lead" in listed.stdout
