"""Several runs at once on one repository lose nothing; `runs` and `discard` tell them apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import git, gk, needs_bwrap
from helpers import pids_with, user_visible_state

pytestmark = [needs_bwrap, pytest.mark.sandbox, pytest.mark.slow]


def launch(repo: Path, script: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json", "--",
         "sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def runs_json(repo: Path) -> dict[str, dict[str, object]]:
    proc = gk("runs", "--repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr
    return {r["run_id"]: r for r in json.loads(proc.stdout)}


def receipt_verifies(repo: Path, branch: str) -> bool:
    return gk("receipt", "show", branch, "--repo", str(repo)).returncode == 0


def test_eight_runs_at_once_keep_eight_receipts(repo: Path) -> None:
    before = user_visible_state(repo)
    launchers = [launch(repo, f"echo {i} > src_{i}.txt") for i in range(8)]
    results = []
    for launcher in launchers:
        out, err = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, err
        results.append(json.loads(out))
    assert len({r["run_id"] for r in results}) == 8
    assert len({r["worktree"] for r in results}) == 8
    for result in results:
        assert receipt_verifies(repo, result["branch"]), result["branch"]
    listed = runs_json(repo)
    assert {r["run_id"] for r in results} <= set(listed)
    assert {listed[r["run_id"]]["state"] for r in results} == {"finished"}
    for result in results:
        row = listed[result["run_id"]]
        assert row["commit"] == result["commit"] and row["exit_code"] == 0
        assert row["counts"]["files_touched"] == 1
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    branches = git(repo, "branch", "--list", "agent/*").split()
    assert sorted(branches) == sorted(r["branch"] for r in results)
    for result in results:
        assert receipt_verifies(repo, result["branch"])
    assert user_visible_state(repo) == before


def test_a_run_killed_beside_three_others_leaves_them_whole(repo: Path) -> None:
    before = user_visible_state(repo)
    marker = f"sleep {4000 + os.getpid() % 1000}.5"
    victim = launch(repo, f"echo partial > p.txt; {marker}")
    others = [launch(repo, f"sleep 2; echo {i} > o_{i}.txt") for i in range(3)]
    deadline = time.time() + 60
    while not pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert pids_with(marker), "the victim's agent never started"
    # While it runs, it is listed as running and discard leaves it alone.
    running = [r for r in runs_json(repo).values() if r["state"] == "running"]
    assert running, "a live run must be listed as running"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    results = []
    for launcher in others:
        out, err = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, err
        results.append(json.loads(out))
    deadline = time.time() + 10
    while pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert pids_with(marker) == [], "a process of the killed run outlived it"
    assert user_visible_state(repo) == before
    listed = runs_json(repo)
    killed = [rid for rid, r in listed.items() if r["state"] == "killed"]
    assert len(killed) == 1
    victim_branch = listed[killed[0]]["branch"]
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert killed[0] in proc.stderr and "launcher ended" in proc.stderr
    branches = git(repo, "branch", "--list", "agent/*").split()
    assert victim_branch not in branches
    assert sorted(branches) == sorted(r["branch"] for r in results)
    for result in results:
        assert receipt_verifies(repo, result["branch"])
        assert git(repo, "show", f"{result['commit']}:o_{results.index(result)}.txt")
    assert runs_json(repo)[killed[0]]["state"] == "discarded"
    assert user_visible_state(repo) == before


def test_discard_refuses_a_live_run_and_runs_shows_accepted(repo: Path) -> None:
    marker = f"sleep {5000 + os.getpid() % 1000}.5"
    live = launch(repo, marker)
    deadline = time.time() + 60
    while not pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    (run_id,) = [rid for rid, r in runs_json(repo).items() if r["state"] == "running"]
    proc = gk("discard", run_id, "--repo", str(repo))
    assert proc.returncode == 2 and "still running" in proc.stderr
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0 and f"left {run_id} alone" in proc.stderr
    live.send_signal(signal.SIGINT)
    out, _ = live.communicate(timeout=120)
    first = json.loads(out)
    second = launch(repo, "echo merged > m.txt")
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    merged = json.loads(out)
    git(repo, "merge", "-q", "--ff-only", merged["branch"])
    listed = runs_json(repo)
    assert listed[merged["run_id"]]["state"] == "accepted"
    assert listed[first["run_id"]]["state"] == "finished"
    assert listed[first["run_id"]]["exit_code"] == 130


NOTE_WRITER = """
import sys
from pathlib import Path
from gatekeeper.receipt import dsse
from gatekeeper.receipt.keys import load_key
from gatekeeper.receipt.notes import add_receipt_note
git_dir, commits = Path(sys.argv[1]), sys.argv[2:]
key = load_key()
for commit in commits:
    add_receipt_note(git_dir, commit, dsse.sign(commit.encode(), key))
"""


def test_concurrent_note_writers_never_overwrite_each_other(repo: Path) -> None:
    from gatekeeper.receipt.notes import NOTES_REF

    commits = []
    for i in range(48):
        blob = git(repo, "hash-object", "-w", "--stdin", input=f"{i}\n".encode()).strip()
        tree = git(repo, "mktree", input=f"100644 blob {blob}\tf\n".encode()).strip()
        commits.append(git(repo, "commit-tree", tree, "-m", f"c{i}").strip())
    writers = [
        subprocess.Popen([sys.executable, "-c", NOTE_WRITER, str(repo / ".git"), *commits[i::8]])
        for i in range(8)
    ]
    for writer in writers:
        assert writer.wait(timeout=300) == 0
    noted = git(repo, "notes", f"--ref={NOTES_REF}", "list").split()[1::2]
    assert sorted(noted) == sorted(commits)
    assert git(repo, "for-each-ref", "refs/notes/gatekeeper-pending/").strip() == ""


def test_a_pending_ref_removed_mid_write_never_drops_earlier_receipts(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gatekeeper.git import git as gitcall
    from gatekeeper.receipt import dsse, notes
    from gatekeeper.receipt.keys import load_key

    git_dir = repo / ".git"
    key = load_key()
    commits = []
    for i in range(5):
        blob = git(repo, "hash-object", "-w", "--stdin", input=f"{i}\n".encode()).strip()
        tree = git(repo, "mktree", input=f"100644 blob {blob}\tf\n".encode()).strip()
        commits.append(git(repo, "commit-tree", tree, "-m", f"c{i}").strip())
    for commit in commits[:4]:
        notes.add_receipt_note(git_dir, commit, dsse.sign(commit.encode(), key))
    real_add = notes._add_note
    removed = []

    def remove_and_add(git_dir_: Path, ref: str, commit: str, line: str) -> bool:
        # The private ref goes after it was set and before the note is written on it.
        if ref.startswith(notes.PENDING_PREFIX) and not removed:
            gitcall("update-ref", "-d", ref, git_dir=git_dir_)  # what a careless cleaner does
            removed.append(ref)
        return real_add(git_dir_, ref, commit, line)

    monkeypatch.setattr(notes, "_add_note", remove_and_add)
    notes.add_receipt_note(git_dir, commits[4], dsse.sign(commits[4].encode(), key))
    assert removed
    noted = git(repo, "notes", f"--ref={notes.NOTES_REF}", "list").split()[1::2]
    assert sorted(noted) == sorted(commits)
