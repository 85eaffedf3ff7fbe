"""The CI recipes in docs/ci: their fetch and gate steps, run as the forge would run them, on a
real clone of a real remote (the comment and upload steps talk to the forge and are not run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures.gate_receipts import commit_files, receipted_commit

from gatekeeper.receipt.notes import NOTES_REF

from conftest import git

ROOT = Path(__file__).resolve().parent.parent
GITHUB = yaml.safe_load((ROOT / "docs/ci/github-actions.yml").read_text())
GITLAB = yaml.safe_load((ROOT / "docs/ci/gitlab-ci.yml").read_text())


def _bash(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    full.update(GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"], GIT_CONFIG_NOSYSTEM="1")
    full["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    full.update(env)
    return subprocess.run(
        ["bash", "-eo", "pipefail", "-c", script], cwd=cwd, env=full, capture_output=True,
        text=True, check=False, timeout=300,
    )  # fmt: skip


@pytest.fixture
def forge(repo: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A bare remote holding main and its receipts, and the pull request's branch on it."""
    remote = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "origin", "main")
    return repo, remote


def _pull_request(repo: Path, remote: Path, tmp_path: Path, *, human: bool) -> tuple[Path, str]:
    head = receipted_commit(repo, {"src/feature.py": "x = 1\n"}, branch="agent/pr")
    if human:
        head = commit_files(repo, {"src/feature.py": "x = 2\n"}, branch="agent/pr", message="fix")
    git(repo, "push", "-q", "origin", "agent/pr", NOTES_REF)
    # The forge's checkout: a fresh clone at the pull request's head, without the notes.
    work = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", "--no-checkout", str(remote), str(work))
    git(work, "checkout", "-q", "--detach", head)
    return work, head


def _steps(workflow: dict) -> dict[str, dict]:
    return {s.get("id", s.get("name", "")): s for s in workflow["jobs"]["gate"]["steps"]}


@pytest.mark.parametrize("human", [False, True], ids=["receipted", "human-edit"])
def test_github_actions_gate_steps(forge: tuple[Path, Path], tmp_path: Path, human: bool) -> None:
    work, head = _pull_request(*forge, tmp_path, human=human)
    steps = _steps(GITHUB)
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    output = temp / "github-output"
    env = {
        "GITHUB_WORKSPACE": str(work),
        "GITHUB_OUTPUT": str(output),
        "RUNNER_TEMP": str(temp),
        "BASE": "main",
        "HEAD_SHA": head,
    }
    fetched = _bash(steps["fetch"]["run"], env, work)
    assert fetched.returncode == 0, fetched.stderr
    gate = _bash(steps["gate"]["run"], env, temp)
    assert gate.returncode == 0, gate.stderr  # the verdict is the last step's
    code = dict(line.split("=", 1) for line in output.read_text().split())["code"]
    report = (temp / "gate.md").read_text()
    assert report.startswith("<!-- gatekeeper-report -->")
    sarif = json.loads((temp / "gate.sarif").read_text())
    assert (temp / "gate.html").read_text().lstrip().lower().startswith("<!doctype html")
    verdict = _bash(
        steps["Verdict"]["run"].replace("${{ steps.gate.outputs.code }}", code), env, temp
    )
    if human:
        assert code == "1" and verdict.returncode == 1
        assert "BLOCK" in report and "uncovered-commit" in report
        assert any(r["ruleId"] for r in sarif["runs"][0]["results"])
    else:
        assert code == "0" and verdict.returncode == 0, report
        assert "PASS" in report and sarif["runs"][0]["results"] == []


@pytest.mark.parametrize("human", [False, True], ids=["receipted", "human-edit"])
def test_gitlab_ci_gate_script(forge: tuple[Path, Path], tmp_path: Path, human: bool) -> None:
    work, head = _pull_request(*forge, tmp_path, human=human)
    job = GITLAB["gatekeeper"]
    assert job["variables"]["GIT_DEPTH"] == "0"
    env = {
        "CI_PROJECT_DIR": str(work),
        "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main",
        "CI_COMMIT_SHA": head,
    }
    script = "\n".join(job["script"][:2])  # the fetch and the gate; the comment needs the forge
    ran = _bash(script, env, work)
    assert ran.returncode == 0, ran.stderr
    code = (work / "gate.code").read_text().strip()
    assert code == ("1" if human else "0")
    assert ("BLOCK" if human else "PASS") in (work / "gate.md").read_text()
    assert json.loads((work / "gate.sarif").read_text())["version"] == "2.1.0"
    assert _bash(job["script"][-1], {}, work).returncode == int(code)
