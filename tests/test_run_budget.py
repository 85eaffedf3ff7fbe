"""The launcher's work after the agent: linear in the files it adds, bounded in bytes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

POLICY = """\
paths: {read: ['**'], write: ['src/**']}
limits: {max_added_bytes: 1048576}
"""


def predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


def counting_git(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose `git` logs each call, then runs the real one."""
    real = next(Path(d, "git") for d in os.environ["PATH"].split(":") if Path(d, "git").is_file())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "git-calls"
    wrapper = bin_dir / "git"
    wrapper.write_text(f'#!/bin/sh\necho "$2 $3 $4 $5" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def test_twenty_thousand_new_files_are_committed_with_a_bounded_number_of_gits(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo", policy="paths: {read: ['**'], write: ['src/**']}\n")
    env, log = counting_git(tmp_path)
    # One path that has a `.git` segment in another case among them (refused by the
    # supervisor; were it there, git would refuse to stage it): it must not turn the one
    # staging call into one git per file, nor be committed.
    script = ("import os\nos.makedirs('src/d', exist_ok=True)\n"
              "for i in range(20000):\n    open(f'src/d/f{i}.txt', 'w').write(str(i))\n"
              "try:\n    os.makedirs('src/d/.GIT')\nexcept PermissionError:\n    pass\n")  # fmt: skip
    proc, data = run_json(repo, "python3", "-c", script, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert sum(1 for f in files if f.startswith("src/d/")) == 20000
    # git is started a fixed number of times, not once per file.
    assert len(log.read_text().splitlines()) < 60, log.read_text()
    assert not [f for f in files if ".GIT" in f]
    pred = predicate(repo, data["commit"])
    assert pred["counts"]["files_touched"] == 20000
    assert len(pred["changes"]) == 20000
    # 20,000 creations seen by the supervisor and 20,000 paths in the result: the first
    # 10,000 allowed writes listed, the rest counted.
    allowed = [w for w in pred["writes"] if w["decision"] == "allow"]
    assert len(allowed) == 10000
    assert len(allowed) + pred["writes_unlisted"] >= 40000
    assert pred["counts"]["denied_writes"] == 1  # the .GIT folder, refused and recorded


def test_a_sparse_file_over_the_byte_budget_is_not_committed_and_is_reported(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo", policy=POLICY, files={"src/tracked.bin": "t\n"})
    script = ("echo small > src/small.txt && truncate -s 900M src/big.bin && "
              "truncate -s 800M src/tracked.bin && "
              "head -c 600000 /dev/zero > src/a.bin && head -c 600000 /dev/zero > src/b.bin")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert "src/small.txt" in files and "src/a.bin" in files
    assert "src/big.bin" not in files and "src/b.bin" not in files
    left_out = {e["path"]: e["reason"] for e in data["not_committed"]}
    assert set(left_out) == {"src/big.bin", "src/b.bin", "src/tracked.bin"}
    assert git(repo, "show", f"{data['commit']}:src/tracked.bin") == "t\n"
    assert "budget" in left_out["src/big.bin"] and "943718400 bytes" in left_out["src/big.bin"]
    pred = predicate(repo, data["commit"])
    assert {e["path"] for e in pred["not_committed"]} == set(left_out)
    # Left out for its size, not for the policy: it is no denied write.
    assert not any(w["path"] == "src/big.bin" and w["decision"] == "deny" for w in pred["writes"])
    assert pred["sandbox"]["limits"]["max_added_bytes"] == 1048576
    assert "left out" in gk("run", "--repo", str(repo), "--", "sh", "-c", script).stderr


def test_a_commit_of_the_agent_over_the_byte_budget_is_not_imported(
    tmp_path: Path, key: Path
) -> None:
    # The agent's own commits must not carry past the budget what its worktree may not.
    repo = make_repo(tmp_path / "repo", policy=POLICY)
    script = ("truncate -s 300M src/big.bin && echo ok > src/ok.txt && git add src && "
              "git commit -qm big")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits"] == [] and "budget" in data["agent_commits_refused"]
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert "src/ok.txt" in files and "src/big.bin" not in files
    assert [e["path"] for e in data["not_committed"]] == ["src/big.bin"]


def test_a_refusal_repeated_in_a_loop_is_one_entry_of_the_receipt(
    tmp_path: Path, key: Path
) -> None:
    """A tool retrying a refused write or command: one entry with a count, not one per try,
    whether the agent or its grandchild retries."""
    repo = make_repo(tmp_path / "repo", policy="paths: {read: ['**'], write: ['src/**']}\n"
                     "commands: {deny: ['sudo']}\n")  # fmt: skip
    script = ("import os, subprocess\n"
              "for i in range(20000):\n"
              "    try: open('README.md', 'a')\n"
              "    except OSError: pass\n"
              "for i in range(50):\n"
              "    try: subprocess.run(['/usr/bin/sudo', 'true'])\n"
              "    except OSError: pass\n")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", 'python3 -c "$0"', script)
    assert proc.returncode == 0, proc.stderr
    pred = predicate(repo, data["commit"])
    refused = [w for w in pred["writes"] if w["decision"] != "allow"]
    assert [(w["path"], w.get("count")) for w in refused] == [("README.md", 20000)]
    assert refused[0]["last_time"] >= refused[0]["time"]
    denied = [p for p in pred["processes"] if p["decision"] != "allow"]
    assert [(p["argv"], p.get("count")) for p in denied] == [(["/usr/bin/sudo", "true"], 50)]
    assert pred["counts"]["denied_writes"] == 1
    shown = gk("receipt", "show", "--repo", str(repo), data["commit"])
    assert "denied write README.md (20000 times)" in shown.stdout, shown.stdout
    assert "(50 times)" in shown.stdout
    note = git(repo, "notes", "--ref=refs/notes/gatekeeper", "show", data["commit"])
    assert len(note) < 100_000, len(note)  # one entry per try: some 4 MB


def test_a_flood_of_distinct_refused_paths_is_listed_up_to_a_bound(
    tmp_path: Path, key: Path
) -> None:
    """10,050 distinct refused paths from a grandchild: 10,000 listed, the other 50 one entry."""
    repo = make_repo(tmp_path / "repo", policy="paths: {read: ['**'], write: ['src/**']}\n")
    script = (
        "for i in range(10050):\n    try: open(f'/etc/gk-{i}', 'w')\n    except OSError: pass\n"
    )
    proc, data = run_json(repo, "sh", "-c", 'python3 -c "$0"', script, timeout=600)
    assert proc.returncode == 0, proc.stderr
    pred = predicate(repo, data["commit"])
    refused = [w for w in pred["writes"] if w["decision"] != "allow"]
    assert len(refused) == 10001
    assert refused[-1]["path"] == "(more refused writes)" and refused[-1]["count"] == 50
    assert refused[0]["path"] == "/etc/gk-0" and refused[9999]["path"] == "/etc/gk-9999"
    # Its name is no path to approve: no decision point for it (one per listed path).
    points = [e["value"] for e in pred["escalations"] if e["kind"] == "write"]
    assert "(more refused writes)" not in points and len(points) == 10000


@pytest.mark.parametrize("overlay", ["1", "0"], ids=["layered", "plain"])
def test_fifos_and_sockets_left_in_the_write_set_are_named_as_not_committed(
    tmp_path: Path, key: Path, overlay: str
) -> None:
    # git can hold neither: without a word they would be allowed writes with no change and no
    # entry saying why, left in the kept worktree for whatever opens it next.
    repo = make_repo(tmp_path / "repo", policy=POLICY)
    script = ("import os, socket\nos.makedirs('src/deep', exist_ok=True)\n"
              "os.mkfifo('src/pipe')\nos.mkfifo('src/deep/pipe2')\n"
              "socket.socket(socket.AF_UNIX).bind('src/sock')\n"
              "open('src/real.py', 'w').write('x = 1\\n')\n")  # fmt: skip
    proc, data = run_json(repo, "python3", "-c", script,
                          env={"GATEKEEPER_OVERLAY": overlay})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pred = predicate(repo, data["commit"])
    left = {n["path"]: n["reason"] for n in pred["not_committed"]}
    assert set(left) == {"src/pipe", "src/deep/pipe2", "src/sock"}, left
    assert "fifo" in left["src/pipe"] and "socket" in left["src/sock"], left
    assert [c["path"] for c in pred["changes"]] == ["src/real.py"]
    assert git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split().count("src/real.py")
    writes = {w["path"]: w["decision"] for w in pred["writes"]}
    assert writes.get("src/pipe") == "allow" and writes.get("src/sock") == "allow", writes
