"""Attacks on layered worktrees (as root): the shared base checkout, what a run's layer says it
changed, runs beside each other, faults while a base is made, and the walk kept per base.

Every test runs the real `gatekeeper run` (real bubblewrap, a real repository) and fails when
the hole it names is open.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json, user_visible_state

pytestmark = [
    needs_bwrap,
    pytest.mark.sandbox,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts overlays"),
]

FILES = {
    "a/one.txt": "1\n", "a/deep/er/z.txt": "z\n", "a/deep/x.txt": "x\n", "b/y.txt": "y\n",
    "c/w.sh": "#!/bin/sh\n", "d/1.txt": "1\n", "d/2.txt": "2\n",
}  # fmt: skip


def overlay_mounts() -> list[str]:
    """Mount points of the overlays mounted here, unescaped (a space is \\040 in mountinfo)."""
    with open("/proc/self/mountinfo", "rb") as f:
        points = [line.split(b" ")[4] for line in f if b" - overlay " in line]
    octal = re.compile(rb"\\([0-7]{3})")
    return [os.fsdecode(octal.sub(lambda m: bytes([int(m[1], 8)]), p)) for p in points]


@pytest.fixture(autouse=True)
def no_mount_outlives_the_test(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    for point in reversed(overlay_mounts()):
        if point.startswith(str(tmp_path.parent)):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def worktrees(home_data: str | None = None) -> Path:
    return Path(home_data or os.environ["XDG_DATA_HOME"]) / "gatekeeper" / "worktrees"


def bases(root: Path | None = None) -> list[Path]:
    root = root or worktrees()
    return sorted(p for p in root.glob("*/.bases/*") if p.is_dir())


def tree_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    make_repo(path, files=files or FILES)
    return path


def commit_of(repo: Path, *argv: str, env: dict[str, str] | None = None) -> dict[str, object]:
    proc, data = run_json(repo, *argv, env=env)
    assert proc.returncode == 0 and data is not None, proc.stderr
    return data


def result_tree(repo: Path, data: dict[str, object]) -> str:
    return git(repo, "rev-parse", f"{data['commit']}^{{tree}}").strip()


def test_a_repository_folder_with_a_space_keeps_the_base_a_mounted_worktree_uses(
    tmp_path: Path, key: Path
) -> None:
    """Mount points and layer paths come escaped in /proc/self/mountinfo (a space is \\040):
    read as they are, no base looked mounted, and the next run on another base removed the
    base under a mounted worktree (its files vanished) while discard left the mount."""
    repo = tree_repo(tmp_path / "my repo")
    first = commit_of(repo, "sh", "-c", "echo first >> a/one.txt")
    worktree = Path(str(first["worktree"]))
    assert str(worktree) in overlay_mounts()
    (repo / "b" / "y.txt").write_text("main moved\n")
    git(repo, "commit", "-qam", "main moves")
    commit_of(repo, "true")  # another base: clean-up of unused bases runs here
    assert len(bases()) == 2, bases()
    # The first run's worktree still shows its base's files beside its own write.
    assert (worktree / "a" / "deep" / "x.txt").read_text() == "x\n"
    assert (worktree / "a" / "one.txt").read_text() == "1\nfirst\n"
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert not [p for p in overlay_mounts() if p.startswith(str(worktrees()))]
    assert not bases()


def test_a_launcher_killed_while_making_the_base_leaves_nothing_after_discard(
    tmp_path: Path, key: Path
) -> None:
    """kill -9 while the base is checked out: `discard` must remove the half-made checkout
    (it was kept for an hour, a whole checkout's worth of disk)."""
    files = {f"d{d}/f{f}.txt": f"{d} {f}\n" * 20 for d in range(120) for f in range(100)}
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "gc.auto", "0")  # no gc in the background changes .git mid-test
    tree_repo(repo, files)
    before = user_visible_state(repo)
    launcher = subprocess.Popen([sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo),
                                 "--", "true"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and launcher.poll() is None:
            if list(worktrees().glob("*/.bases/.tmp-*/files/d1*")):
                break
            time.sleep(0.005)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    assert list(worktrees().glob("*/.bases/.tmp-*")), "not killed while the base was made"
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    left = [p.name for p in worktrees().glob("*/.bases/*") if not p.name.endswith(".lock")]
    assert left == [], left
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert user_visible_state(repo) == before
    data = commit_of(repo, "sh", "-c", "echo next > d0/f0.txt")
    assert git(repo, "show", f"{data['commit']}:d0/f0.txt") == "next\n"


def test_no_run_sees_another_runs_layer_or_the_base_through_a_shown_system_folder(
    repo: Path,
) -> None:
    """Every sandbox shows /usr, /etc, /opt (read-only). Worktrees kept below one of them
    (GATEKEEPER_WORKTREES=/opt/...) were shown with them: a run read the shared base, its
    index and walk, and another run's layer and worktree, its writes included."""
    root = Path(f"/opt/gatekeeper-attack-{os.getpid()}")
    env = {"GATEKEEPER_WORKTREES": str(root)}
    spy = ("cat /opt/gatekeeper-attack-*/*/.layers/*/upper/secret.txt "
           "/opt/gatekeeper-attack-*/*/2*/secret.txt > seen.txt 2>/dev/null;"
           "ls -a /opt/gatekeeper-attack-*/*/.bases/* >> seen.txt 2>/dev/null; true")  # fmt: skip
    try:
        first, _ = run_json(repo, "sh", "-c", "echo s3cret > secret.txt", env=env)
        second, data = run_json(repo, "sh", "-c", spy, env=env)
        if first.returncode == 0 or second.returncode == 0:
            assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
            assert data is not None
            seen = git(repo, "show", f"{data['commit']}:seen.txt")
            assert seen == "", seen
        else:  # refused before anything was made, saying why
            assert first.returncode == 2 and "every sandbox shows" in first.stderr, first.stderr
            assert not root.exists() or not any(root.rglob("*"))
    finally:
        for point in reversed(overlay_mounts()):
            if point.startswith(f"{root}/"):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
