"""The gate as a pre-push hook of the pre-commit framework, run by real pre-commit and git."""

from __future__ import annotations

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
MANIFEST = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    not (BIN / "pre-commit").exists(), reason="pre-commit is not installed in the test environment"
)


def _push(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PRE_COMMIT"))}
    env.update(
        GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"],
        GIT_CONFIG_NOSYSTEM="1",
        PATH=f"{BIN}:{os.environ['PATH']}",
    )
    return subprocess.run(
        ["git", "push", *args], cwd=repo, env=env, capture_output=True, text=True, check=False,
        timeout=300,
    )  # fmt: skip


def _config(hook_id: str) -> str:
    """A local hook with the manifest's entry and stages: what `repo: <gatekeeper>` would run,
    with the gatekeeper already installed here (`language: system`), so nothing is fetched."""
    hook = next(h for h in MANIFEST if h["id"] == hook_id)
    return yaml.safe_dump(
        {
            "repos": [
                {
                    "repo": "local",
                    "hooks": [
                        {
                            "id": hook["id"],
                            "name": hook["name"],
                            "entry": hook["entry"],
                            "language": "system",
                            "stages": hook["stages"],
                            "pass_filenames": hook["pass_filenames"],
                            "always_run": hook["always_run"],
                        }
                    ],
                }
            ]
        }
    )


@pytest.fixture(params=["gatekeeper", "gatekeeper-check"])
def framework(request: pytest.FixtureRequest, repo: Path, tmp_path: Path) -> tuple[Path, str]:
    remote = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "origin", "main")
    git(repo, "fetch", "-q", "origin")
    git(repo, "remote", "set-head", "origin", "main")
    (repo / ".pre-commit-config.yaml").write_text(_config(request.param))
    with (repo / ".git" / "info" / "exclude").open("a") as fh:
        fh.write(".pre-commit-config.yaml\n")
    subprocess.run(
        [str(BIN / "pre-commit"), "install", "--hook-type", "pre-push"],
        cwd=repo, check=True, capture_output=True,
    )  # fmt: skip
    return repo, request.param


def test_manifest_names_the_pre_push_entry() -> None:
    assert {h["id"] for h in MANIFEST} == {"gatekeeper", "gatekeeper-check"}
    for hook in MANIFEST:
        assert hook["stages"] == ["pre-push"] and hook["pass_filenames"] is False
        assert hook["entry"].startswith("gatekeeper hooks pre-commit")


def test_an_unreceipted_commit_on_main_is_refused(framework: tuple[Path, str]) -> None:
    repo, _ = framework
    before = git(repo, "rev-parse", "refs/remotes/origin/main").strip()
    commit_files(repo, {"src/app.py": "by hand\n"}, branch="main", message="by hand")
    proc = _push(repo, "origin", "main")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "refs/heads/main: BLOCK" in out and "uncovered-commit" in out
    remote = repo.parent / "origin.git"
    assert git(remote, "rev-parse", "refs/heads/main").strip() == before


def test_receipted_work_passes(framework: tuple[Path, str]) -> None:
    repo, _ = framework
    agent = receipted_commit(repo, {"src/feature.py": "x = 1\n"})
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--ff-only", agent)
    proc = _push(repo, "origin", "main", NOTES_REF)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gatekeeper gate" in proc.stdout and "Passed" in proc.stdout  # quiet when it passes
    assert git(repo.parent / "origin.git", "rev-parse", "main").strip() == agent


def test_other_branches_are_judged_only_by_the_check_hook(framework: tuple[Path, str]) -> None:
    repo, hook_id = framework
    commit_files(repo, {"wip.txt": "x\n"}, branch="wip", start="main")
    proc = _push(repo, "origin", "wip")
    out = proc.stdout + proc.stderr
    if hook_id == "gatekeeper":
        assert proc.returncode == 0, out
    else:
        assert proc.returncode != 0 and "refs/heads/wip: BLOCK" in out
        agent = receipted_commit(repo, {"src/feature.py": "x = 1\n"}, branch="agent/ok")
        passed = _push(repo, "origin", "agent/ok", NOTES_REF)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        assert agent


def test_outside_the_framework_it_says_what_it_is_for(repo: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "hooks", "pre-commit"], cwd=repo,
        capture_output=True, text=True, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("PRE_COMMIT")},
    )  # fmt: skip
    assert proc.returncode == 2
    assert "pre-commit framework's pre-push stage" in proc.stderr
