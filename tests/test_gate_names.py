"""Names given to the gate resolve to one thing or are refused: a tag never stands in for a branch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.gate_receipts import attach, commit_files, make_receipt, receipted_commit, sign

from gatekeeper.errors import GitError
from gatekeeper.git import resolve_object
from gatekeeper.receipt.keys import generate_key

from conftest import git, gk

TRUST = ".gatekeeper/trusted_keys"


@pytest.fixture
def clone(repo: Path, tmp_path: Path) -> Path:
    path = tmp_path / "ci"
    git(tmp_path, "clone", "-q", str(repo), str(path))
    return path


def attacker_branch(clone: Path, tmp_path: Path) -> tuple[str, str]:
    """An attacker's trust-file commit T and a run on it signed with the attacker's key."""
    attacker = generate_key(tmp_path / "attacker" / "key.pem")
    trust = (clone / TRUST).read_text() + attacker.public.line + "\n"
    planted = commit_files(clone, {TRUST: trust}, branch="plant", start="origin/main")
    head = commit_files(clone, {"src/x.py": "evil = 1\n"}, branch="work", start=planted)
    attach(clone, head, sign(make_receipt(clone, head), attacker))
    return planted, head


def test_a_tag_named_like_the_remote_branch_is_refused_as_ambiguous(
    clone: Path, tmp_path: Path
) -> None:
    planted, head = attacker_branch(clone, tmp_path)
    git(clone, "tag", "origin/main", planted)  # as fetched from the attacker's pushed tag
    proc = gk("check", "--repo", str(clone), "--base", "origin/main", "--format", "json", head)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "'origin/main' is ambiguous" in proc.stderr
    assert "refs/remotes/origin/main" in proc.stderr
    assert "refs/tags/origin/main" in proc.stderr
    assert "full ref name" in proc.stderr

    # Named in full, the real target judges: the attacker's key is not trusted there.
    proc = gk(
        "check", "--repo", str(clone), "--base", "refs/remotes/origin/main", "--format", "json",
        head,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    found = {f["kind"] for f in json.loads(proc.stdout)["findings"]}
    assert {"untrusted-key", "protected-path"} <= found


def test_the_default_target_is_not_shadowed_by_a_tag(clone: Path, tmp_path: Path) -> None:
    planted, head = attacker_branch(clone, tmp_path)
    git(clone, "tag", "origin/main", planted)
    proc = gk("check", "--repo", str(clone), "--format", "json", head)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert "untrusted-key" in {f["kind"] for f in data["findings"]}


def test_a_ref_name_that_is_also_an_abbreviated_commit_id_is_refused(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    other = commit_files(repo, {"src/b.py": "b\n"}, branch="other", start="main")
    abbrev = commit[:10]
    git(repo, "branch", abbrev, other)
    proc = gk("check", "--repo", str(repo), "--base", "main", abbrev)
    assert proc.returncode == 2, proc.stderr
    assert f"'{abbrev}' is ambiguous" in proc.stderr
    assert f"refs/heads/{abbrev}" in proc.stderr and f"object {commit}" in proc.stderr
    # The full id is always fine.
    proc = gk("check", "--repo", str(repo), "--base", "main", commit)
    assert proc.returncode == 0, proc.stderr


def test_a_branch_and_a_tag_of_the_same_name_are_refused(repo: Path) -> None:
    receipted_commit(repo, {"src/a.py": "a\n"})
    git(repo, "tag", "agent/1", "main")
    proc = gk("check", "--repo", str(repo), "--base", "main", "agent/1")
    assert proc.returncode == 2
    assert "refs/heads/agent/1" in proc.stderr and "refs/tags/agent/1" in proc.stderr
    assert gk("check", "--repo", str(repo), "--base", "main", "refs/heads/agent/1").returncode == 0


def test_a_missing_full_ref_does_not_fall_back_to_other_namespaces(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    # `git rev-parse refs/heads/nope` would find refs/tags/refs/heads/nope.
    git(repo, "update-ref", "refs/tags/refs/heads/nope", commit)
    assert git(repo, "rev-parse", "refs/heads/nope").strip() == commit
    proc = gk("check", "--repo", str(repo), "--base", "main", "refs/heads/nope")
    assert proc.returncode == 2
    assert "does not name a commit" in proc.stderr


def test_head_and_head_relative_names_keep_working(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    git(repo, "checkout", "-q", "agent/1")
    assert gk("check", "--repo", str(repo), "--base", "HEAD~1", "HEAD").returncode == 0
    assert gk("check", "--repo", str(repo), "--base", "main", "agent/1^0").returncode == 0
    git_dir = repo / ".git"
    assert resolve_object(git_dir, "HEAD") == commit
    assert resolve_object(git_dir, "agent/1~1") == git(repo, "rev-parse", "main").strip()


@pytest.mark.parametrize("rev", ["@{u}", "main@{1}", "main^{tree}", "HEAD:src", "main..HEAD", "@"])
def test_other_revision_syntax_is_refused_with_a_hint(repo: Path, rev: str) -> None:
    proc = gk("check", "--repo", str(repo), "--base", "main", rev)
    assert proc.returncode == 2
    assert "full ref name" in proc.stderr


def test_an_ambiguous_base_part_of_an_expression_is_refused(repo: Path) -> None:
    receipted_commit(repo, {"src/a.py": "a\n"})
    git(repo, "tag", "agent/1", "main")
    with pytest.raises(GitError, match="ambiguous"):
        resolve_object(repo / ".git", "agent/1~1")


def test_receipt_show_resolves_names_the_same_way(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    git(repo, "tag", "agent/1", "main")
    proc = gk("receipt", "show", "agent/1", cwd=repo)
    assert proc.returncode == 2
    assert "ambiguous" in proc.stderr
    assert gk("receipt", "show", commit, cwd=repo).returncode == 0
