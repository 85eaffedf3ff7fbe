"""Nothing the agent made is left out silently: files .gitignore covers are listed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

# A .gitignore that ignores itself, a build folder and a log file.
SCRIPT = ("printf '.gitignore\\nbuild/\\n*.log\\n' > .gitignore && mkdir -p build && "
          "echo keep > build/keep.txt && echo log > debug.log && echo ok > src/ok.py")  # fmt: skip


def predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


def test_ignored_files_are_listed_in_the_summary_json_and_receipt(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    proc, data = run_json(repo, "sh", "-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert sorted(data["ignored"]) == [".gitignore", "build/", "debug.log"]
    assert data["ignored_count"] == 3
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert "src/ok.py" in files
    assert not {".gitignore", "build/keep.txt", "debug.log"} & set(files)
    pred = predicate(repo, data["commit"])
    assert sorted(pred["ignored"]) == [".gitignore", "build/", "debug.log"]
    assert pred["ignored_count"] == 3
    summary = gk("run", "--repo", str(repo), "--", "sh", "-c", SCRIPT)
    assert "ignored   3 new path(s) .gitignore covers, not committed" in summary.stderr
    assert "~ build/" in summary.stderr


def test_a_policy_may_commit_ignored_files(tmp_path: Path, key: Path) -> None:
    policy = "version: 1\npaths: {write: ['**'], commit_ignored: true}\n"
    repo = make_repo(tmp_path / "repo", policy=policy)
    proc, data = run_json(repo, "sh", "-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr
    files = set(git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split())
    assert {".gitignore", "build/keep.txt", "debug.log", "src/ok.py"} <= files
    assert data["ignored_count"] == 3  # listed all the same
    assert gk("check", "--repo", str(repo), "--base", "main", data["branch"]).returncode == 0
