"""A deep TMPDIR (a test runner's, a CI's) must not break the run's proxy sockets."""

from __future__ import annotations

from pathlib import Path

from conftest import needs_bwrap
from helpers import run_json


@needs_bwrap
def test_a_run_works_under_a_deep_tmpdir(repo: Path, tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    proc, data = run_json(repo, "sh", "-c", "echo hi > note.txt", env={"TMPDIR": str(deep)})
    assert proc.returncode == 0, proc.stderr
    assert data["exit_code"] == 0 and "AF_UNIX" not in proc.stderr
    assert not any(deep.iterdir())  # nothing left behind where the scratch folder was not made
