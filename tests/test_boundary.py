"""The mount layer alone (no supervisor): the kernel refuses writes outside the write set."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from gatekeeper.policy.model import parse_policy
from gatekeeper.sandbox.launch import Sandbox
from gatekeeper.sandbox.limits import ProcessLimit

from conftest import make_repo, needs_bwrap
from helpers import sandbox_plan

pytestmark = [needs_bwrap, pytest.mark.sandbox]


def test_mount_layer_refuses_writes_without_the_supervisor(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", files={"src/a.py": "a\n", "README.md": "r\n"})
    policy = parse_policy(b"paths: {read: ['**'], write: ['src/**']}\n", "p.yaml")
    run_id, wt, plan = sandbox_plan(repo, policy, tmp_path / "scratch")
    limit = ProcessLimit(run_id, 256)
    sandbox = Sandbox(plan, max_file_size=1 << 20, process_limit=limit)
    out = tmp_path / "out.txt"
    script = (
        "for target in README.md new.txt .git .gatekeeper/policy.yaml "
        f"{repo}/README.md {repo}/.git/config {repo}/.git/hooks/pre-commit /etc/x /usr/x; do "
        "  (echo x > $target) 2>&1; done; echo ok > src/b.py && echo wrote-src"
    )
    with out.open("wb") as fh:
        outcome = sandbox.run(["sh", "-c", script], deadline=time.monotonic() + 60, stdout=fh)
    limit.remove()
    text = out.read_text()
    assert outcome.exit_code == 0
    # Of the repository's git dir only its objects are shown: hooks/ is not even there.
    assert text.count("Read-only file system") == 8, text
    assert "pre-commit: Directory nonexistent" in text, text
    assert "wrote-src" in text and (wt.path / "src" / "b.py").read_text() == "ok\n"
    assert (repo / "README.md").read_text() == "r\n"
    assert subprocess.run(["git", "-C", str(repo), "status", "--porcelain"],
                          capture_output=True, text=True).stdout == ""  # fmt: skip
