"""`pip install .` (not editable) ships the package with its templates, hooks and policies."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_wheel_ships_templates_hooks_and_policies(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("gatekeeper-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every module of the package (a subpackage missing from pyproject.toml would be left out).
    modules = [p.relative_to(ROOT).as_posix() for p in (ROOT / "gatekeeper").rglob("*.py")]
    for expected in (
        *modules,
        "gatekeeper/templates/report.html.j2", "gatekeeper/templates/report.md.j2",
        "gatekeeper/templates/dashboard.html.j2",
        "gatekeeper/hooks/pre-receive", "gatekeeper/hooks/pre-push",
        "gatekeeper/policies/default.yaml", "gatekeeper/policies/docs-only.yaml",
        "gatekeeper/policies/example.yaml",
    ):  # fmt: skip
        assert expected in names, expected
    # Installed into a fresh environment, the command finds its shipped files.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True)  # fmt: skip
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from gatekeeper.resources import resource_path as r; import gatekeeper;"
         "print(gatekeeper.__file__); print(r('templates')); print(r('policies')); print(r('hooks'))"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    lines = probe.stdout.splitlines()
    assert str(venv) in lines[0]
    for line in lines[1:]:
        assert str(venv) in line and Path(line).is_dir()
