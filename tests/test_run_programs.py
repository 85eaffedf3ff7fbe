"""The agent's program runs wherever it is installed, or the run is refused before it starts."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import git, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]


@pytest.fixture
def install_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="gk-agent-install-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_program_installed_under_tmp_runs_and_its_neighbours_stay_hidden(
    tmp_path: Path, key: Path, install_root: Path
) -> None:
    prefix = install_root / "tool"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "lib" / "helper.sh").write_text("echo from-lib\n")
    agent = prefix / "bin" / "my-agent"
    agent.write_text(f"#!/bin/sh\n. {prefix}/lib/helper.sh\necho edited > src/app.py\n")
    agent.chmod(0o755)
    neighbour = install_root / "other-project-secret.txt"
    neighbour.write_text("not for the agent\n")
    repo = make_repo(tmp_path / "repo")
    proc, data = run_json(repo, str(agent))
    assert proc.returncode == 0, proc.stderr
    assert "from-lib" in proc.stderr
    assert git(repo, "show", f"{data['commit']}:src/app.py") == "edited\n"
    # The installation is shown, never what lies beside it.
    proc, _ = run_json(repo, "sh", "-c", f"cat {neighbour}; ls {install_root}; exit 0")
    assert "not for the agent" not in proc.stderr + proc.stdout


def test_a_program_that_cannot_start_is_refused_before_anything_is_created(
    tmp_path: Path, key: Path, install_root: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    proc, data = run_json(repo, "no-such-agent-program", "--task", "x")
    assert proc.returncode == 2
    assert "no such program on PATH" in proc.stderr
    script = install_root / "broken"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    proc, _ = run_json(repo, str(script))
    assert proc.returncode == 2 and "interpreter" in proc.stderr
    assert git(repo, "branch", "--list", "agent/*").strip() == ""
    assert data is None


def test_a_program_in_the_key_folder_is_refused(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    planted = key.parent / "tool"
    planted.write_text("#!/bin/sh\ntrue\n")
    planted.chmod(0o755)
    proc, _ = run_json(repo, str(planted))
    assert proc.returncode == 2 and "private folder" in proc.stderr
    os.unlink(planted)


def test_no_program_in_the_users_checkout_runs_outside_the_sandbox(
    tmp_path: Path, key: Path
) -> None:
    """Registry discovery asks the installed package managers, outside the sandbox: never one
    found in the user's checkout (a merged agent commit could have put it there)."""
    repo = make_repo(tmp_path / "repo")
    marker = tmp_path / "ran-outside"
    tools = repo / "tools" / "bin"
    tools.mkdir(parents=True)
    for name in ("npm", "python3", "pip", "go", "mvn"):
        fake = tools / name
        fake.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\n')
        fake.chmod(0o755)
    path = f"{tools}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    proc, _ = run_json(repo, "/bin/true", env={"PATH": path})
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), marker.read_text()


def test_a_symlink_committed_into_the_checkout_picks_no_folder_to_show(
    tmp_path: Path, key: Path
) -> None:
    """A folder of the checkout on PATH (direnv's PATH_add bin) holding a committed symlink
    into another project: that project is never shown."""
    other = tmp_path / "otherproj"
    (other / "bin").mkdir(parents=True)
    (other / "lib").mkdir()
    (other / "lib" / "secret.txt").write_text("other project's secret\n")
    tool = other / "bin" / "tool"
    tool.write_text(f"#!/bin/sh\ncat {other}/lib/secret.txt\n")
    tool.chmod(0o755)
    repo = make_repo(tmp_path / "repo")
    (repo / "bin").mkdir()
    (repo / "bin" / "tool").symlink_to(tool)
    git(repo, "add", "bin/tool")
    git(repo, "commit", "-q", "-m", "a link")
    path = f"{repo / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    proc, _ = run_json(repo, "tool", env={"PATH": path})
    assert "other project's secret" not in proc.stdout + proc.stderr
