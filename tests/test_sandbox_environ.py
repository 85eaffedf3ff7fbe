"""The launcher's environment is in no process the sandbox can see: bubblewrap, the sandbox's
pid 1, runs with an empty environment (its /proc/1/environ is readable from inside)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gatekeeper.policy.model import parse_policy
from gatekeeper.sandbox.launch import Sandbox
from gatekeeper.sandbox.limits import ProcessLimit
from gatekeeper.sandbox.mounts import build_env

from conftest import make_repo, needs_bwrap
from helpers import run_json, sandbox_plan

pytestmark = [needs_bwrap, pytest.mark.sandbox]

# Reads every environment block the sandbox can see, its pid 1 (bubblewrap) included.
SCAN = (
    "import os\n"
    "hits = []\n"
    "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
    "    try:\n"
    "        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    if b'selftest-leak-' in data:\n"
    "        hits.append(pid)\n"
    "open('out/scan.txt', 'w').write(' '.join(hits) or 'none')\n"
)
POLICY = "paths: {read: ['**'], write: ['out/**']}\n"


def test_the_launchers_environment_is_not_in_any_process_inside(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy=POLICY, files={"out/.keep": "", "README.md": "r\n"})
    env = {"GITHUB_TOKEN": "selftest-leak-1", "AWS_SECRET_ACCESS_KEY": "selftest-leak-2"}
    proc, data = run_json(repo, "python3", "-c", SCAN, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (Path(data["worktree"]) / "out" / "scan.txt").read_text() == "none"


def test_without_the_supervisor_bubblewrap_holds_no_launcher_environment(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "selftest-leak-3")
    repo = make_repo(tmp_path / "r", files={"out/.keep": "", "README.md": "r\n"})
    policy = parse_policy(POLICY.encode(), "p.yaml")
    run_id, wt, plan = sandbox_plan(repo, policy, tmp_path / "scratch")
    sandbox = Sandbox(plan, max_file_size=1 << 20, process_limit=ProcessLimit(run_id, 64))
    try:
        outcome = sandbox.run(["python3", "-c", SCAN], deadline=time.monotonic() + 60)
    finally:
        sandbox.close()
    assert outcome.exit_code == 0
    assert (wt.path / "out" / "scan.txt").read_text() == "none"


def test_the_sandboxs_path_names_each_folder_once_in_its_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each folder a PATH search tries is an exec the supervisor answers: one named twice
    finds nothing the first try did not, so it is tried once."""
    monkeypatch.setenv("PATH", "/opt/a/bin:/usr/bin:/opt/a/bin::/bin:/usr/bin:")
    env = build_env(parse_policy(POLICY.encode(), "policy.yaml"), tmp_path, "r1")
    assert env["PATH"] == "/opt/a/bin:/usr/bin::/bin"
