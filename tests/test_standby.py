"""The supervisor started ahead of a run's first sandbox (launch.Standby)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gatekeeper.sandbox.ahead import Standby

from conftest import make_repo, needs_bwrap


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.01)
    return False


def test_a_standby_not_needed_ends_having_done_nothing() -> None:
    standby = Standby()
    proc = standby.proc
    assert proc is not None
    standby.close()
    assert proc.returncode == 0


def test_a_standby_ends_with_the_launcher() -> None:
    """A launcher killed before its sandbox: the standby reads the end of its socket."""
    code = ("import os, sys; from gatekeeper.sandbox.ahead import Standby; s = Standby(); "
            "print(s.proc.pid, flush=True); os.kill(os.getpid(), 9)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)  # fmt: skip
    pid = int(proc.stdout.split()[0])
    assert _gone(pid), f"the standby {pid} outlived its launcher"


def test_a_start_order_gives_the_supervisor_its_arguments_and_descriptors() -> None:
    """The supervisor runs on the arguments sent, with the descriptors sent at the numbers
    asked for: here its usage error, on the error output it was given."""
    read, write = os.pipe()
    done: list[int] = []
    standby = Standby()
    try:
        proc = standby.start(["--bad"], {0: 0, 1: write, 2: write, 9: write}, done.append)
    finally:
        os.close(write)
    assert proc is not None
    assert proc.wait(10) == 2
    with os.fdopen(read) as fh:
        assert "usage: python -m gatekeeper.sandbox.supervise" in fh.read()
    assert done == [proc.pid]  # the limits are set on it before it starts
    assert standby.start(["--bad"], {}, done.append) is None  # once


def test_limits_set_ahead_are_not_set_again_and_a_failure_is_no_standby() -> None:
    """prepare() sets the limits on a thread while the run is prepared: start() waits for
    it and does not set them again; had they failed, the standby is not used (the launcher
    starts a supervisor anew, which meets the same failure where it is reported)."""
    calls: list[tuple[str, int]] = []
    read, write = os.pipe()
    standby = Standby()
    try:
        assert standby.proc is not None
        pid = standby.proc.pid

        def slow(pid: int) -> None:
            time.sleep(0.2)  # start() must wait for it
            calls.append(("ahead", pid))

        standby.prepare(slow)
        standby.prepare(lambda pid: calls.append(("twice", pid)))  # (one preparation only)
        proc = standby.start(["--bad"], {0: 0, 1: write, 2: write},
                             lambda pid: calls.append(("start", pid)))  # fmt: skip
    finally:
        os.close(write)
    assert proc is not None and proc.wait(10) == 2
    with os.fdopen(read) as fh:
        assert "usage: python -m gatekeeper.sandbox.supervise" in fh.read()
    assert calls == [("ahead", pid)]

    failing = Standby()
    assert failing.proc is not None
    waiting = failing.proc

    def refused(pid: int) -> None:
        raise PermissionError(13, "Permission denied", "cgroup.procs")

    failing.prepare(refused)
    assert failing.start(["--bad"], {0: 0, 1: 1, 2: 2}, lambda pid: None) is None
    assert waiting.returncode == 0  # told nothing: it ended on its socket's end

    # Any other failure is the run's: raised, the standby ended, never started unlimited.
    broken = Standby()
    assert broken.proc is not None
    ended = broken.proc

    def bug(pid: int) -> None:
        raise RuntimeError("a bug in the limits")

    broken.prepare(bug)
    with pytest.raises(RuntimeError, match="a bug in the limits"):
        broken.start(["--bad"], {0: 0, 1: 1, 2: 2}, lambda pid: None)
    assert ended.returncode == 0

    unused = Standby()
    assert unused.proc is not None
    unused.prepare(slow)
    unused.close()  # waits for the preparation, then the standby ends
    assert unused.proc is None and calls[-1][0] == "ahead"


def test_a_standby_that_ended_is_not_used() -> None:
    standby = Standby()
    assert standby.proc is not None
    standby.proc.kill()
    standby.proc.wait()
    assert standby.start(["--bad"], {0: 0, 1: 1, 2: 2}, lambda pid: None) is None


@needs_bwrap
@pytest.mark.sandbox
def test_signals_the_launcher_ignores_are_the_sandboxs_to_take(tmp_path: Path, key: Path) -> None:
    """A launcher started with SIGINT and SIGHUP ignored (nohup, a shell's background job):
    its supervisor, started before the launcher handles them, does not pass that on; the
    agent is killed by its own SIGINT."""
    repo = make_repo(tmp_path / "repo")

    def ignoring() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.run([sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--",
                           "sh", "-c", "kill -INT $$"], capture_output=True, text=True,
                          preexec_fn=ignoring, timeout=120, check=False)  # fmt: skip
    assert "killed by SIGINT (signal 2)" in proc.stderr, proc.stderr
