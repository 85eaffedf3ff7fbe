"""Faults lose nothing: a launcher killed at any phase, a supervisor or proxy killed mid-run,
a disk that fills up, an interrupted `receipt sync`; and a process a signal ends is recorded
with the signal.

After each fault: the user's checkout and refs are unchanged, no lock or half-written note is
left, `git fsck` is clean, the next run works, `discard` cleans up, and the run that was hit is
listed as failed or killed with the reason, never as a success.
"""

from __future__ import annotations

import base64
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import git, gk, make_repo, needs_bwrap
from helpers import pids_with, run_json, sandbox_plan, small_tmpfs, user_visible_state

pytestmark = [needs_bwrap, pytest.mark.sandbox]


def predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    note = git(repo, "notes", "--ref=refs/notes/gatekeeper", "show", commit)
    envelope = json.loads(note.strip().splitlines()[-1])
    return json.loads(base64.b64decode(envelope["payload"]))["predicate"]


def test_a_process_killed_by_a_signal_is_recorded_with_it(repo: Path) -> None:
    # The children are reaped by their shell at once: their end is known only to the pidfd.
    script = ("sleep 30 & sleep 0.2; kill -9 $!; wait; "
              "sleep 30 & sleep 0.2; kill -TERM $!; wait; kill -KILL $$")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script,
                          extra=["--check", "sh -c 'kill -TERM $$'", "--check", "sh -c 'exit 137'"])  # fmt: skip
    assert proc.returncode == 137, proc.stderr
    assert data["exit_code"] == 137
    assert (data["signal"], data["signal_name"]) == (9, "SIGKILL")
    assert data["checks"][0] == {"argv": ["sh", "-c", "kill -TERM $$"], "exit_code": 143,
                                 "signal": 15, "signal_name": "SIGTERM"}  # fmt: skip
    # An exit code of 137 is not a signal.
    assert data["checks"][1] == {"argv": ["sh", "-c", "exit 137"], "exit_code": 137}
    pred = predicate(repo, data["commit"])
    assert pred["command"]["signal"] == 9 and pred["command"]["signal_name"] == "SIGKILL"
    assert pred["checks"][0]["signal_name"] == "SIGTERM" and "signal" not in pred["checks"][1]
    sleeps = [p for p in pred["processes"] if p["argv"] == ["sleep", "30"]]
    assert [(p["killed"], p["signal"], p["signal_name"]) for p in sleeps] == [
        (True, 9, "SIGKILL"), (True, 15, "SIGTERM")]  # fmt: skip
    shells = [p for p in pred["processes"] if p["argv"][:2] == ["sh", "-c"]]
    assert (shells[0]["signal"], shells[0]["signal_name"]) == (9, "SIGKILL")
    shown = gk("receipt", "show", data["branch"], "--repo", str(repo))
    assert "exit 137 (killed by SIGKILL, signal 9)" in shown.stdout + shown.stderr
    summary = gk("run", "--repo", str(repo), "--", "sh", "-c", "kill -INT $$")
    assert "killed by SIGINT (signal 2)" in summary.stderr, summary.stderr


# --- the launcher killed at each phase ------------------------------------------------------

# Each phase of a run is recognised by the git command the launcher runs there. A `git` first
# on PATH stops the launcher (its parent) at that command and says so; the test then kills it
# with SIGKILL. The wrapper runs the real git before stopping when `after` is set (the note
# written on the writer's private ref, not yet moved to the shared one), else never.
PHASES = {  # phase: (a case pattern the git command line matches, run it first)
    # the worktree and record exist; the sandbox is being built (the agent's git config)
    "set-up": ('*"config --file"*', False),
    # the result's files are hashed; commit-tree would make the result commit
    "commit": ('*"commit-tree"*', False),
    # the result commit is on the branch; the receipt is being built and signed
    "signing": ('*" diff-tree -r -z -M "*', False),
    # the note is written on the writer's private ref; the shared ref is not moved yet
    "note write": ('*"gatekeeper-pending/"*" add "*', True),
}

WRAPPER = """#!/bin/sh
case "$*" in
  {match})
    if mkdir "{stamp}.taken" 2>/dev/null; then
      {after}
      # Stopped before the stamp says so: a signal the test sends on seeing it (and its
      # SIGCONT) comes after the stop, never before it, which would stop the caller for good.
      kill -STOP "$PPID"
      echo "$PPID" > "{stamp}.tmp" && mv "{stamp}.tmp" "{stamp}"
      while kill -0 "$PPID" 2>/dev/null; do sleep 0.05; done
      exit 1
    fi ;;
esac
exec {git} "$@"
"""


def stopping_git(folder: Path, match: str, after: bool) -> tuple[Path, Path]:
    """A `git` that stops its caller at the first command containing match; (folder, stamp)."""
    real = shutil.which("git")
    assert real is not None
    folder.mkdir()
    stamp = folder / "stopped"
    script = WRAPPER.format(match=match, stamp=stamp, git=real,
                            after=f'{real} "$@" || exit $?' if after else ":")  # fmt: skip
    (folder / "git").write_text(script)
    (folder / "git").chmod(0o755)
    return folder, stamp


def launch(repo: Path, script: str, env: dict[str, str] | None = None,
           args: tuple[str, ...] = ()) -> subprocess.Popen[str]:  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json", *args,
         "--", "sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def wait_for(predicate_fn, what: str, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate_fn():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def runs_json(repo: Path) -> dict[str, dict[str, object]]:
    proc = gk("runs", "--repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr
    return {r["run_id"]: r for r in json.loads(proc.stdout)}


def hit_run(repo: Path, before: set[str]) -> str:
    new = set(runs_json(repo)) - before
    assert len(new) == 1, new
    return new.pop()


def git_locks(repo: Path) -> list[str]:
    return [str(p.relative_to(repo)) for p in (repo / ".git").rglob("*.lock")]


def assert_notes_whole(repo: Path) -> None:
    """Every receipt note parses: one DSSE envelope per line, nothing half-written."""
    assert git(repo, "for-each-ref", "refs/notes/gatekeeper-pending/") == ""
    listing = git(repo, "notes", "--ref=refs/notes/gatekeeper", "list", check=False)
    for line in listing.splitlines():
        blob = line.split()[0]
        for envelope in git(repo, "cat-file", "blob", blob).splitlines():
            assert json.loads(envelope)["payloadType"] == "application/vnd.in-toto+json"


def assert_lost_nothing(repo: Path, before: dict[str, str], hit: str,
                        states: tuple[str, ...] = ("killed", "failed")) -> None:  # fmt: skip
    """What every fault must leave: see the module's docstring."""
    assert user_visible_state(repo) == before
    row = runs_json(repo)[hit]
    assert row["state"] in states, row
    assert row["reason"], row
    record = json.loads((repo / ".git" / "gatekeeper" / "runs" / f"{hit}.json").read_text())
    assert record["state"] in states and record["reason"], record
    fsck = subprocess.run(["git", "-C", str(repo), "fsck", "--no-progress", "--no-dangling"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert fsck.returncode == 0 and "error" not in fsck.stderr, fsck.stderr
    # The next run works, and its receipt verifies.
    proc, data = run_json(repo, "sh", "-c", "echo next > next.txt")
    assert proc.returncode == 0, proc.stderr
    assert gk("receipt", "show", data["branch"], "--repo", str(repo)).returncode == 0
    # discard takes what the hit run left, and only that.
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert hit in proc.stderr, proc.stderr
    assert git_locks(repo) == []
    assert_notes_whole(repo)
    assert not glob.glob(f"{tempfile.gettempdir()}/gatekeeper-run-{hit}-*")
    listed = git(repo, "worktree", "list", "--porcelain")
    assert hit not in listed
    # A run that left a signed receipt keeps its state (and branch); any other is discarded.
    assert runs_json(repo)[hit]["state"] in ("discarded", *(s for s in states if s != "killed"))
    assert user_visible_state(repo) == before
    assert gk("receipt", "show", data["branch"], "--repo", str(repo)).returncode == 0


def test_an_interrupt_while_the_sandbox_starts_stops_it(repo: Path, tmp_path: Path) -> None:
    """Ctrl-C (or SIGTERM) that comes while the sandbox's process is being started, before the
    launcher holds it, finds nothing to kill then: the process is killed the moment it is
    held, not left to run to its end."""
    from gatekeeper.policy.model import builtin_policy
    from gatekeeper.run.worktree import remove_worktree
    from gatekeeper.sandbox.ahead import Standby
    from gatekeeper.sandbox.launch import Sandbox
    from gatekeeper.sandbox.limits import ProcessLimit
    from gatekeeper.sandbox.mounts import bwrap_path
    from gatekeeper.sandbox.supervise.setup import write_config

    policy = builtin_policy().policy
    scratch = tmp_path / "scratch"
    run_id, wt, plan = sandbox_plan(repo, policy, scratch)
    config = scratch / "supervisor.json"
    write_config(config, events=scratch / "events.jsonl", policy=policy, worktree=wt.path,
                 scratch=["/tmp"], granted_commands=[], ask="never", hidden=plan.hidden,
                 bwrap=bwrap_path())  # fmt: skip
    limit = ProcessLimit(run_id, 64)
    for standby in (None, Standby()):  # a supervisor started anew, and one started ahead
        sandbox = Sandbox(plan, max_file_size=1 << 20, process_limit=limit,
                          supervisor_config=config, standby=standby)  # fmt: skip
        sandbox.interrupted, sandbox.interrupted_by = True, signal.SIGINT  # (as on_signal does)
        started = time.monotonic()
        try:
            outcome = sandbox.run(["sleep", "30"], deadline=time.monotonic() + 60)
        finally:
            sandbox.close()
        assert time.monotonic() - started < 15, "the sandbox ran on after the interrupt"
        assert outcome.interrupted and outcome.exit_code is None
    limit.remove()
    remove_worktree(repo / ".git", run_id, wt.path, wt.branch)


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_a_launcher_killed_at_a_phase_loses_nothing(repo: Path, tmp_path: Path,
                                                    phase: str) -> None:  # fmt: skip
    before, known = user_visible_state(repo), set(runs_json(repo))
    indexes = set(glob.glob(f"{tempfile.gettempdir()}/gatekeeper-index-*"))
    match, after = PHASES[phase]
    folder, stamp = stopping_git(tmp_path / "wrap", match, after)
    launcher = launch(repo, "echo partial > p.txt",
                      env={"PATH": f"{folder}:{os.environ['PATH']}"})  # fmt: skip
    wait_for(lambda: stamp.exists() or launcher.poll() is not None, f"the {phase} phase")
    assert stamp.exists(), launcher.communicate()[1]
    assert int(stamp.read_text()) == launcher.pid
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.communicate()
    assert_lost_nothing(repo, before, hit_run(repo, known))
    # The index the result is committed from went with the worktree (none left in /tmp).
    assert set(glob.glob(f"{tempfile.gettempdir()}/gatekeeper-index-*")) <= indexes


def test_a_launcher_killed_while_the_agent_runs_loses_nothing(repo: Path) -> None:
    before, known = user_visible_state(repo), set(runs_json(repo))
    marker = f"sleep {6000 + os.getpid() % 1000}.25"
    launcher = launch(repo, f"echo partial > p.txt; {marker}")
    wait_for(lambda: bool(pids_with(marker)), "the agent")
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.communicate()
    wait_for(lambda: not pids_with(marker), "the agent's end", timeout=10)
    assert_lost_nothing(repo, before, hit_run(repo, known))


def supervisor_of(launcher: int) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
            stat_line = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat_line[stat_line.rfind(")") + 2 :].split()[1])
        if ppid == launcher and b"gatekeeper.sandbox.supervise" in cmdline:
            return int(entry)
    raise AssertionError("no supervisor")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP])
def test_a_supervisor_killed_mid_run_fails_the_run_and_loses_nothing(
    repo: Path, signum: int
) -> None:
    """Killed by any signal the launcher did not send (SIGHUP: a terminal it was made to
    hold hung up), the supervisor fails the run."""
    before, known = user_visible_state(repo), set(runs_json(repo))
    marker = f"sleep {7000 + os.getpid() % 1000}.25"
    launcher = launch(repo, f"echo partial > p.txt; {marker}")
    wait_for(lambda: bool(pids_with(marker)), "the agent")
    os.kill(supervisor_of(launcher.pid), signum)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 125, err
    data = json.loads(out)
    assert data["supervisor_failed"] is True
    wait_for(lambda: not pids_with(marker), "the agent's end", timeout=10)
    # What the agent did up to then is committed and signed; the run is failed, not finished.
    assert gk("receipt", "show", data["branch"], "--repo", str(repo)).returncode == 0
    assert predicate(repo, data["commit"])["sandbox"]["supervisor_failed"] is True
    row = runs_json(repo)[data["run_id"]]
    assert row["state"] == "failed" and "supervisor" in str(row["reason"]), row
    assert data["run_id"] == hit_run(repo, known)
    assert_lost_nothing(repo, before, data["run_id"], states=("failed",))


# The launcher, with a supervisor that has a bug: its 40th notification raises where nothing
# catches it (the loop itself). Everything else is the real launcher, bubblewrap and sandbox.
BROKEN_SUPERVISOR = r"""
import sys
import gatekeeper.sandbox.ahead as launch
BREAK = ("from gatekeeper.sandbox.supervise.supervisor import Supervisor; "
         "serve = Supervisor._serve_one; seen = []; "
         "Supervisor._serve_one = lambda self: (seen.append(1), len(seen) < 40 or 1 / 0, "
         "serve(self)); ")
# Both ways a supervisor starts: anew (checks), and ahead (the agent's sandbox).
for name, line in (("SUPERVISOR", "import main; "), ("STANDBY", "import serve; ")):
    flag, code = getattr(launch, name)[:-1], getattr(launch, name)[-1]
    broken = code.replace(line, line + BREAK)
    assert broken != code
    setattr(launch, name, (*flag, broken))
from gatekeeper.__main__ import main
sys.argv = ["gatekeeper", *sys.argv[1:]]
main()
"""


def test_a_supervisor_that_fails_on_its_own_error_fails_the_run(repo: Path) -> None:
    """An error of the supervisor's own ends it with the sandbox; the run is failed, never
    reported as the command's exit code (an uncaught exception's 1), and the error is told."""
    before, known = user_visible_state(repo), set(runs_json(repo))
    proc = subprocess.run(
        [sys.executable, "-c", BROKEN_SUPERVISOR, "run", "--repo", str(repo), "--json", "--",
         "sh", "-c", "for i in $(seq 200); do echo $i > n.txt; done; exit 3"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 125, proc.stderr
    assert "ZeroDivisionError" in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    assert data["supervisor_failed"] is True and data["exit_code"] != 3, data
    pred = predicate(repo, data["commit"])
    assert pred["sandbox"]["supervisor_failed"] is True
    assert data["run_id"] == hit_run(repo, known)
    assert_lost_nothing(repo, before, data["run_id"], states=("failed",))


# --- a disk that fills up -------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs (root only: it is a mount), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    where = tmp_path / "small"
    where.mkdir()
    with small_tmpfs(where):
        yield where


@pytest.mark.root
def test_a_disk_filled_by_the_agent_loses_nothing(repo: Path, small_disk: Path) -> None:
    # The worktrees live on the small disk: the agent's writes fill it, the launcher goes on.
    before, known = user_visible_state(repo), set(runs_json(repo))
    env = {"GATEKEEPER_WORKTREES": str(small_disk / "worktrees")}
    proc = gk("run", "--repo", str(repo), "--json", "--", "sh", "-c",
              "echo kept > kept.txt; dd if=/dev/zero of=big bs=1M count=64 2>/dev/null; "
              "echo after > after.txt", env=env)  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr  # the agent's last write failed: no space left
    assert git(repo, "show", f"{data['commit']}:kept.txt") == "kept\n"
    assert gk("receipt", "show", data["branch"], "--repo", str(repo)).returncode == 0
    assert data["run_id"] == hit_run(repo, known)
    row = runs_json(repo)[data["run_id"]]
    assert row["state"] == "finished" and row["exit_code"] == 1, row
    assert user_visible_state(repo) == before
    assert git_locks(repo) == []


@pytest.mark.root
def test_a_disk_that_fills_during_the_commit_fails_the_run_and_loses_nothing(
    tmp_path: Path, key: Path, small_disk: Path
) -> None:
    # The repository and the worktrees share the small disk: the agent's 14 MiB of random
    # bytes fit in its worktree, their copy in the object store does not.
    repo = make_repo(small_disk / "repo")
    before, known = user_visible_state(repo), set(runs_json(repo))
    env = {"GATEKEEPER_WORKTREES": str(small_disk / "worktrees")}
    proc = gk("run", "--repo", str(repo), "--json", "--", "sh", "-c",
              "head -c 14000000 /dev/urandom > noise.bin", env=env)  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode != 0, proc.stdout
    hit = hit_run(repo, known)
    row = runs_json(repo)[hit]
    assert row["state"] == "failed" and "space" in str(row["reason"]).lower(), row
    # Room again for the next run (what the agent left goes with discard afterwards).
    for big in (small_disk / "worktrees").rglob("noise.bin"):
        if ".layers" not in big.parts:  # a layered worktree's own layer is the mount's to change
            big.unlink()
    assert_lost_nothing(repo, before, hit, states=("failed",))


# --- an interrupted `receipt sync` -----------------------------------------------------------


def receipts_on(repo: Path, ref: str = "refs/notes/gatekeeper") -> set[str]:
    """Every envelope line under ref."""
    lines: set[str] = set()
    listing = git(repo, "notes", f"--ref={ref}", "list", check=False)
    for line in listing.splitlines():
        lines.update(git(repo, "cat-file", "blob", line.split()[0]).split())
    return lines


SYNC_PHASES = {  # phase: (case pattern, run it first, signal)
    "fetch": ('*" fetch "*', False, signal.SIGKILL),
    "merge": ('*"notes --ref=refs/notes/gatekeeper merge"*', True, signal.SIGKILL),
    "push": ('*" push "*', False, signal.SIGKILL),
    "push, Ctrl-C": ('*" push "*', False, signal.SIGINT),
}


@pytest.mark.parametrize("phase", sorted(SYNC_PHASES))
def test_an_interrupted_receipt_sync_loses_nothing(tmp_path: Path, key: Path,
                                                   phase: str) -> None:  # fmt: skip
    remote = tmp_path / "remote.git"
    first = make_repo(tmp_path / "first")
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(first, "remote", "add", "origin", str(remote))
    git(first, "push", "-q", "origin", "main")
    proc, _ = run_json(first, "sh", "-c", "echo one > one.txt")
    assert proc.returncode == 0, proc.stderr
    assert gk("receipt", "sync", "--repo", str(first)).returncode == 0
    second = tmp_path / "second"
    git(tmp_path, "clone", "-q", str(remote), str(second))
    proc, _ = run_json(second, "sh", "-c", "echo two > two.txt")
    assert proc.returncode == 0, proc.stderr
    before = user_visible_state(second)
    ours, theirs = receipts_on(second), receipts_on(first)
    match, after, signum = SYNC_PHASES[phase]
    folder, stamp = stopping_git(tmp_path / "wrap", match, after)
    syncing = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "receipt", "sync", "--repo", str(second)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"},
        # As from a terminal: a test run started in the background (`cmd &` in a script)
        # ignores SIGINT, and Python keeps a SIGINT ignored at its start ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    wait_for(lambda: stamp.exists() or syncing.poll() is not None, f"the {phase} phase")
    assert stamp.exists(), syncing.communicate()[1]
    os.kill(syncing.pid, signum)
    os.kill(syncing.pid, signal.SIGCONT)
    _, err = syncing.communicate(timeout=60)
    if signum == signal.SIGINT:
        assert syncing.returncode == 130 and "Traceback" not in err, err
        assert "interrupted" in err
    # Nothing of ours is lost, nothing is half-merged or locked.
    assert ours <= receipts_on(second)
    assert git_locks(second) == []
    assert not list((second / ".git").glob("NOTES_MERGE_*"))
    assert_notes_whole(second)
    fsck = subprocess.run(["git", "-C", str(second), "fsck", "--no-progress", "--no-dangling"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert fsck.returncode == 0 and "error" not in fsck.stderr, fsck.stderr
    after_state = {k: v for k, v in user_visible_state(second).items()
                   if not k.startswith("ref refs/notes/remotes/")}  # fmt: skip
    assert after_state == before  # the fetched receipts' tracking ref aside
    # The next sync lands the union, on both sides.
    proc = gk("receipt", "sync", "--repo", str(second))
    assert proc.returncode == 0, proc.stderr
    assert ours | theirs <= receipts_on(second)
    assert ours | theirs <= receipts_on(remote)


# --- the proxy's way in killed mid-run -------------------------------------------------------


def children_of(pid: int) -> list[tuple[int, bytes]]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat_line = Path("/proc", entry, "stat").read_text()
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat_line[stat_line.rfind(")") + 2 :].split()[1]) == pid:
            found.append((int(entry), cmdline))
    return found


def parent_of(pid: int) -> int:
    stat_line = Path("/proc", str(pid), "stat").read_text()
    return int(stat_line[stat_line.rfind(")") + 2 :].split()[1])


def test_the_proxy_bridge_killed_mid_run_closes_the_network_and_loses_nothing(
    repo: Path,
) -> None:
    # The proxy runs in the launcher (a thread: killing it is killing the launcher, above);
    # its way into the sandbox is the bridge, a process there that the agent itself can kill.
    if shutil.which("curl") is None:
        pytest.skip("needs curl")
    before, known = user_visible_state(repo), set(runs_json(repo))
    marker = f"sleep 4.{os.getpid() % 1000:03d}1"  # unique, and long enough to act in
    fetch = "curl -s -m 20 -o /dev/null -w '%{http_code}' http://example.invalid/"
    script = f'{fetch} > before.txt; {marker}; {fetch} > after.txt; echo " $?" >> after.txt'
    launcher = launch(repo, script)
    wait_for(lambda: bool(pids_with(marker)), "the agent")
    shell = parent_of(pids_with(marker)[0])
    bridges = [pid for pid, cmdline in children_of(shell) if b"bridge.py" in cmdline]
    assert len(bridges) == 1, children_of(shell)
    os.kill(bridges[0], signal.SIGKILL)
    started = time.monotonic()
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err
    data = json.loads(out)
    assert time.monotonic() - started < 20, "a request after the bridge died hung"
    # Before: the proxy answered (403, the policy refuses the host); after: no way out at all.
    assert git(repo, "show", f"{data['commit']}:before.txt") == "403"
    assert git(repo, "show", f"{data['commit']}:after.txt").split() == ["000", "7"]
    assert gk("receipt", "show", data["branch"], "--repo", str(repo)).returncode == 0
    hosts = [n["host"] for n in predicate(repo, data["commit"])["network"]]
    assert hosts.count("example.invalid") == 1
    assert data["run_id"] == hit_run(repo, known)
    # The run that was hit is failed, with the reason; what it did is committed and signed.
    row = runs_json(repo)[data["run_id"]]
    assert row["state"] == "failed" and "network bridge" in str(row["reason"]), row
    assert any("network bridge" in e for e in predicate(repo, data["commit"])["launcher_errors"])
    assert user_visible_state(repo) == before
    assert git_locks(repo) == []


def test_discard_ends_a_sandbox_left_starting_up(tmp_path: Path, key: Path) -> None:
    """A launcher killed while bubblewrap starts the sandbox can leave bubblewrap's first
    process in it waiting for good (its parent is gone before it arms --die-with-parent),
    holding the worktree open; without a cgroup nothing else ends it. `discard` does, found
    by the run's scratch folder on its command line; another run's is left alone."""
    repo = make_repo(tmp_path / "repo")
    proc, data = run_json(repo, "true")
    assert proc.returncode == 0 and data is not None, proc.stderr
    rid, other = data["run_id"], "20000101-000000-000000"
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    read_end, write_end = os.pipe()
    waiting = [
        subprocess.Popen(
            [
                bwrap,
                "--block-fd",
                str(read_end),
                "--setenv",
                "SCRATCH",
                f"{tempfile.gettempdir()}/gatekeeper-run-{run}-x1y2",
                "--ro-bind",
                "/",
                "/",
                "true",
            ],
            pass_fds=(read_end,),
        )  # fmt: skip
        for run in (rid, other)
    ]
    try:
        time.sleep(0.2)
        assert all(p.poll() is None for p in waiting)
        done = gk("discard", "--repo", str(repo), rid)
        assert done.returncode == 0, done.stderr
        assert "sandbox process(es) left starting up" in done.stderr, done.stderr
        assert waiting[0].wait(timeout=5) == -signal.SIGKILL
        assert waiting[1].poll() is None
    finally:
        for p in waiting:
            p.kill()
            p.wait()
        os.close(read_end)
        os.close(write_end)


def test_discard_ends_a_sandbox_left_starting_up_by_a_bubblewrap_since_removed(
    tmp_path: Path, key: Path
) -> None:
    """bubblewrap upgraded (its file replaced) while a sandbox waited: the process's program
    reads `bwrap (deleted)`; `discard` still finds and ends it."""
    repo = make_repo(tmp_path / "repo")
    proc, data = run_json(repo, "true")
    assert proc.returncode == 0 and data is not None, proc.stderr
    installed = shutil.which("bwrap")
    assert installed is not None
    bwrap = tmp_path / "bin" / "bwrap"
    bwrap.parent.mkdir()
    shutil.copy2(installed, bwrap)
    read_end, write_end = os.pipe()
    scratch = f"{tempfile.gettempdir()}/gatekeeper-run-{data['run_id']}-x1y2"
    waiting = subprocess.Popen(
        [str(bwrap), "--block-fd", str(read_end), "--setenv", "SCRATCH", scratch,
         "--ro-bind", "/", "/", "true"],
        pass_fds=(read_end,),
    )  # fmt: skip
    try:
        time.sleep(0.2)
        bwrap.unlink()
        assert os.readlink(f"/proc/{waiting.pid}/exe").endswith("bwrap (deleted)")
        done = gk("discard", "--repo", str(repo), data["run_id"])
        assert done.returncode == 0, done.stderr
        assert "sandbox process(es) left starting up" in done.stderr, done.stderr
        assert waiting.wait(timeout=5) == -signal.SIGKILL
    finally:
        waiting.kill()
        waiting.wait()
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("limit", [12, 40])
def test_too_low_an_open_file_limit_is_a_clear_error_and_changes_nothing(
    repo: Path, limit: int
) -> None:
    """A run started under an open-file limit too low for it (a service's, a shell's
    `ulimit -n`) ends with what is wrong and how to fix it, not a traceback; nothing of the
    user's changes, and no agent runs."""
    import resource

    before = user_visible_state(repo)
    marker = repo.parent / f"ran-{limit}"

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--",
         "sh", "-c", f"touch {marker}"],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=low,
    )  # fmt: skip
    assert proc.returncode in (2, 125), (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "open-file limit" in proc.stderr or "out of open files" in proc.stderr, proc.stderr
    assert "ulimit -n" in proc.stderr, proc.stderr
    assert not marker.exists()
    assert user_visible_state(repo) == before
