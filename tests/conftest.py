"""Shared fixtures: an isolated HOME, real repositories in temporary folders, the real CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REAL_HOME = os.environ.get("HOME", "")


def git(cwd: Path, *args: str, input: bytes | None = None, check: bool = True) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"], GIT_CONFIG_NOSYSTEM="1")
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=env, input=input, capture_output=True, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"git {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout.decode()}\n"
            f"{proc.stderr.decode()}"
        )
    return proc.stdout.decode("utf-8", "surrogateescape")


def gk(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run the real `gatekeeper` command line in a subprocess."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args], cwd=cwd, env=full_env, input=input,
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def overlay_mounts() -> list[str]:
    """The mount points of every overlay mounted here, in mount order."""
    from gatekeeper.run.layers import overlay_points

    return overlay_points()


@pytest.fixture(autouse=True)
def isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Every test gets its own HOME, key folder and git identity; the real HOME stays untouched."""
    home = tmp_path_factory.mktemp("home")
    gitconfig = home / ".gitconfig"
    gitconfig.write_text(
        "[user]\n\tname = Test User\n\temail = test@example.invalid\n"
        '[init]\n\tdefaultBranch = main\n[protocol "file"]\n\tallow = always\n'
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GATEKEEPER_HOME", str(home / ".config" / "gatekeeper"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)
    yield home
    # Runs as root leave their worktrees mounted (overlays) until `discard`: none outlives
    # the test that made it.
    base = str(tmp_path_factory.getbasetemp())
    for point in reversed(overlay_mounts()):
        if point.startswith(base + "/"):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    if REAL_HOME and Path(REAL_HOME, ".config", "gatekeeper", "signing_key.pem.tmp").exists():
        pytest.fail("a test wrote to the real HOME")


@pytest.fixture
def key(isolated_home: Path) -> Path:
    """A signing key generated with the real command."""
    proc = gk("keys", "generate")
    assert proc.returncode == 0, proc.stderr
    return Path(os.environ["GATEKEEPER_HOME"]) / "signing_key.pem"


def make_repo(path: Path, policy: str | None = None, files: dict[str, str] | None = None) -> Path:
    """A real repository with one commit holding files, and `gatekeeper init` applied."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in (files or {"README.md": "# demo\n", "src/app.py": "print('hi')\n"}).items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    proc = gk("init", "--repo", str(path), "--no-hooks")
    assert proc.returncode == 0, proc.stderr
    if policy is not None:
        (path / ".gatekeeper" / "policy.yaml").write_text(policy)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture
def repo(tmp_path: Path, key: Path) -> Path:
    return make_repo(tmp_path / "repo")


def has_bwrap() -> bool:
    return shutil.which("bwrap") is not None


# Where GATEKEEPER_REQUIRE_BWRAP is set (the test script sets it), a missing bwrap fails the
# sandbox tests instead of skipping them.
needs_bwrap = pytest.mark.skipif(
    not has_bwrap() and not os.environ.get("GATEKEEPER_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `root` need root (they make users, network namespaces or cgroups): for any
    other user (CI's unprivileged pass) they are skipped, with the reason."""
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (marked `root`); this pass runs unprivileged")
    for item in items:
        if item.get_closest_marker("root") is not None:
            item.add_marker(skip)
