"""The built-in demo, as the README's first command runs it: end to end, twice in one folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import gk, needs_bwrap, overlay_mounts

pytestmark = [needs_bwrap, pytest.mark.sandbox, pytest.mark.slow]


def test_the_demo_runs_blocks_the_edit_and_leaves_reports_and_no_mount(tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    for _ in range(2):  # the second replaces the first (whose worktree may have been a mount)
        proc = gk("demo", "--out", str(out), timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "BLOCK agent/edited into main" in proc.stdout + proc.stderr
        assert "PASS" in proc.stdout + proc.stderr
        for name in ("pass.html", "block.html", "block.md"):
            assert (out / "reports" / name).is_file(), name
        assert not [p for p in overlay_mounts() if p.startswith(f"{out}/")]
    proc = gk("demo", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "not a demo folder" in proc.stderr
