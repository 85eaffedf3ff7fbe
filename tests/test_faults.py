"""Faults lose nothing: a launcher killed at any phase, a supervisor or proxy killed mid-run,
a disk that fills up, an interrupted `receipt sync`; and a process a signal ends is recorded
with the signal.

After each fault: the user's checkout and refs are unchanged, no lock or half-written note is
left, `git fsck` is clean, the next run works, `discard` cleans up, and the run that was hit is
listed as failed or killed with the reason, never as a success.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from conftest import git, gk, needs_bwrap
from helpers import run_json

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
    summary = gk("run", "--repo", str(repo), "--", "sh", "-c", "kill -INT $$")
    assert "killed by SIGINT (signal 2)" in summary.stderr, summary.stderr
