"""Layered worktrees (as root): an overlay of one shared checkout of the base per run.

The shared checkout is never written, whatever the agent does; each run sees its own writes
only; what a run changed is what a plain checkout would give; `discard` leaves no mount.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import git, gk, needs_bwrap, overlay_mounts
from helpers import run_json, snapshot

pytestmark = [needs_bwrap, pytest.mark.sandbox, pytest.mark.root]

# Everything a run may do to a checkout: change, delete, rename a folder, chmod, symlink, a
# new folder, a folder emptied and made again, a file that becomes a folder and a folder that
# becomes a file, a hard link, a touched file, an ignored file, and commits of its own.
SCENARIO = r"""
set -e
echo changed >> a/one.txt
rm a/two.txt
mv b b-renamed
chmod +x c/run.sh
ln -s a/one.txt link
mkdir -p new/sub && echo n > new/sub/x
rm -rf d && mkdir d && echo only > d/only.txt
rm e/file.txt && mkdir e/file.txt && echo inner > e/file.txt/inner
rm -rf f && echo now-a-file > f
ln g/keep.txt g/hardlink.txt && echo via-link >> g/hardlink.txt
touch h/same.txt
printf 'ign/\n' > .gitignore && mkdir ign && echo i > ign/x.txt
git add -A >/dev/null 2>&1
git -c user.name=a -c user.email=a@b commit -qm "one $GATEKEEPER_RUN_ID"
echo after >> h/same.txt && git -c user.name=a -c user.email=a@b commit -qam two
git rm -q i/gone.txt && git -c user.name=a -c user.email=a@b commit -qm three
echo back > i/gone.txt
"""

FILES = {
    "a/one.txt": "1\n", "a/two.txt": "2\n", "b/x.txt": "x\n", "b/deep/y.txt": "y\n",
    "c/run.sh": "#!/bin/sh\n", "d/1.txt": "1\n", "d/2.txt": "2\n", "e/file.txt": "e\n",
    "f/inside.txt": "f\n", "g/keep.txt": "keep\n", "h/same.txt": "same\n", "i/gone.txt": "g\n", "i/stay.txt": "s\n",
}  # fmt: skip


def make_tree(repo: Path) -> None:
    for rel, text in FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "files")


def bases(repo: Path) -> list[Path]:
    root = Path(os.environ["XDG_DATA_HOME"]) / "gatekeeper" / "worktrees"
    return sorted(p for p in root.glob("*/.bases/*") if p.is_dir() and not p.name.startswith("."))


def changes_of(data: dict[str, object]) -> list[tuple[object, ...]]:
    return sorted((c["status"], c["path"], c["new_blob"], c["new_mode"])  # type: ignore[index]
                  for c in data["changes"])  # type: ignore[attr-defined]  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts overlays")
def test_a_run_changes_what_a_checkout_would_and_never_the_shared_one(repo: Path) -> None:
    make_tree(repo)
    proc, layered = run_json(repo, "sh", "-c", SCENARIO)
    assert proc.returncode == 0, proc.stderr
    worktree = layered["worktree"]
    assert worktree in overlay_mounts(), "the worktree is not layered"
    [base] = bases(repo)
    before = snapshot(base / "files")
    assert set(before) >= set(FILES)  # the base's files, as committed
    for rel, text in FILES.items():
        assert (base / "files" / rel).read_text() == text
    # The same run in a plain checkout gives the same changes, ignored files and commits.
    proc, plain = run_json(repo, "sh", "-c", SCENARIO, env={"GATEKEEPER_OVERLAY": "0"})
    assert proc.returncode == 0, proc.stderr
    assert plain["worktree"] not in overlay_mounts()
    assert changes_of(layered) == changes_of(plain)
    assert len(layered["changes"]) >= 15
    assert layered["ignored"] == plain["ignored"] == ["ign/"]
    assert len(layered["agent_commits"]) == len(plain["agent_commits"]) == 3, (
        layered.get("agent_commits_refused"),
        plain.get("agent_commits_refused"),
    )
    tree = git(repo, "rev-parse", f"{layered['commit']}^{{tree}}")
    assert tree == git(repo, "rev-parse", f"{plain['commit']}^{{tree}}")
    # The worktree shows the run's result, and git there sees no leftover change.
    assert (Path(worktree) / "a/one.txt").read_text() == "1\nchanged\n"
    assert git(Path(worktree), "status", "--porcelain", "--untracked-files=no") == ""
    assert snapshot(base / "files") == before
    for rel, text in FILES.items():
        assert (base / "files" / rel).read_text() == text


@pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts overlays")
def test_runs_share_one_base_and_see_none_of_each_others_writes(repo: Path) -> None:
    make_tree(repo)
    script = 'cat a/one.txt > seen.txt; echo "$0" >> a/one.txt; sleep 1; cat a/one.txt >> seen.txt'
    launchers = [
        subprocess.Popen([sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json",
                          "--", "sh", "-c", script, name],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("first", "second", "third")
    ]  # fmt: skip
    results = []
    for launcher, name in zip(launchers, ("first", "second", "third"), strict=True):
        out, err = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, err
        data = json.loads(out)
        seen = git(repo, "show", f"{data['commit']}:seen.txt")
        assert seen == f"1\n1\n{name}\n", seen  # its own write only
        results.append(data)
    assert len(bases(repo)) == 1
    assert all(r["worktree"] in overlay_mounts() for r in results)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts overlays")
def test_discard_unmounts_and_removes_layers_and_unused_bases(repo: Path) -> None:
    make_tree(repo)
    proc, first = run_json(repo, "sh", "-c", "echo 1 > out.txt")
    assert proc.returncode == 0, proc.stderr
    (repo / "a" / "one.txt").write_text("moved on\n")
    git(repo, "commit", "-qam", "main moves")
    proc, second = run_json(repo, "sh", "-c", "echo 2 > out.txt")
    assert proc.returncode == 0, proc.stderr
    assert len(bases(repo)) == 2  # the first run's worktree still uses the old base
    layers = Path(first["worktree"]).parent / ".layers"
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    mounts = overlay_mounts()
    assert first["worktree"] not in mounts and second["worktree"] not in mounts
    assert not Path(first["worktree"]).exists() and not Path(second["worktree"]).exists()
    assert not any(layers.iterdir())
    assert not bases(repo)  # no worktree uses either base any more
    assert "removed the unused base checkout" in proc.stderr
    # The next run makes the base it needs, and keeps only that one.
    proc, third = run_json(repo, "true")
    assert proc.returncode == 0, proc.stderr
    assert len(bases(repo)) == 1
    # Branches of finished runs are kept, with their results.
    assert git(repo, "show", f"{first['branch']}:out.txt") == "1\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts overlays")
def test_a_killed_launcher_leaves_a_mount_that_discard_removes(repo: Path) -> None:
    make_tree(repo)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--", "sh", "-c",
         "echo started > started.txt; sleep 60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        root = Path(os.environ["XDG_DATA_HOME"]) / "gatekeeper" / "worktrees"
        for _ in range(300):
            if list(root.glob("*/*/started.txt")):
                break
            subprocess.run(["sleep", "0.1"], check=True)
        [marker] = list(root.glob("*/*/started.txt"))
    finally:
        launcher.kill()
        launcher.wait()
    worktree = str(marker.parent)
    assert worktree in overlay_mounts()
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert worktree not in overlay_mounts()
    assert not Path(worktree).exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    proc, _ = run_json(repo, "true")
    assert proc.returncode == 0, proc.stderr


def test_without_overlay_a_worktree_is_a_plain_checkout(repo: Path) -> None:
    make_tree(repo)
    proc, data = run_json(repo, "sh", "-c", "echo x >> a/one.txt",
                          env={"GATEKEEPER_OVERLAY": "0"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert data["worktree"] not in overlay_mounts()
    assert not bases(repo)
    assert [c["path"] for c in data["changes"]] == ["a/one.txt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts overlays")
def test_a_path_with_a_space_is_layered_and_compared_by_its_layer(
    tmp_path: Path, key: Path
) -> None:
    from gatekeeper.run.layers import touched

    from conftest import make_repo

    repo = make_repo(tmp_path / "my repo\twith tab")
    proc, data = run_json(repo, "sh", "-c", "echo x > 'new file.txt'")
    assert proc.returncode == 0, proc.stderr
    assert data["worktree"] in overlay_mounts()
    assert [c["path"] for c in data["changes"]] == ["new file.txt"]
    assert touched(Path(data["worktree"])) == ["new file.txt"]
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert data["worktree"] not in overlay_mounts()


@pytest.mark.parametrize("overlay", ["1", "0"])
def test_after_a_run_the_worktree_index_is_the_commit_with_its_stat_data(
    repo: Path, overlay: str
) -> None:
    """The worktree's index is the one the result was committed from: `git status` there is
    clean, and git finds nothing to hash again (stat data kept)."""
    make_tree(repo)
    script = "echo x >> a/one.txt; rm a/two.txt; echo new > b/new.txt; chmod +x d/1.txt"
    proc, data = run_json(repo, "sh", "-c", script, env={"GATEKEEPER_OVERLAY": overlay})
    assert proc.returncode == 0, proc.stderr
    assert len(data["changes"]) == 4
    wt = Path(data["worktree"])
    head = git(wt, "rev-parse", "HEAD").strip()
    assert head == data["commit"]
    assert git(wt, "write-tree").strip() == git(wt, "rev-parse", "HEAD^{tree}").strip()
    # diff-files does not refresh: an entry without stat data would be listed here.
    assert git(wt, "diff-files", "--name-only").split() == []
    assert git(wt, "status", "--porcelain").splitlines() == []
