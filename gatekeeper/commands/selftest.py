"""`gatekeeper selftest [--json]`: the boundary's conformance battery, on this machine.

First the machine: can it build the sandbox at all (bubblewrap, user namespaces, seccomp user
notification; a pids cgroup is optional)? If not, it says why and how to fix it and runs
nothing. Then one real `gatekeeper run` (the runner itself, not a stand-in) in a scratch
world (selftest_scratch): probes as the agent, its child and its grandchild try every action
of the battery at once, and selftest_checks judges each from the host's state and the signed
receipt. Exit 0 when every boundary held, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from gatekeeper.commands.selftest_checks import (
    Check,
    Evidence,
    judge_all,
    snapshot,
    watched_host_paths,
)
from gatekeeper.commands.selftest_scratch import LEVELS, Scratch, probe_python, scratch_world
from gatekeeper.errors import Error
from gatekeeper.receipt.notes import note_envelopes
from gatekeeper.receipt.statement import verify_envelope
from gatekeeper.receipt.trust import trusted_keys_file
from gatekeeper.run.runner import run_agent
from gatekeeper.sandbox.machine import MachineCheck, machine_checks, machine_facts

RUN_TIMEOUT = 60  # seconds; the battery's run takes a few


def _machine_check(check: MachineCheck) -> Check:
    name = f"machine.{check.name.replace(' ', '_')}"
    if check.ok or check.required:
        return Check(name, check.ok, check.detail, None if check.ok else check.fix)
    # Optional and missing: runs still hold the boundary; the detail says what is lost.
    return Check(name, True, f"optional, not available: {check.detail}", check.fix)


def _lingering(marker: str) -> list[int]:
    """Host processes whose command line holds marker (the probes' background processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def _end(pids: list[int]) -> None:
    """Kill the background processes the battery's own probes left (only when a run let them
    outlive it: the check has already failed)."""
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def _probe_reports(worktree: Path) -> dict[str, dict[str, object] | None]:
    reports: dict[str, dict[str, object] | None] = {}
    for level in LEVELS:
        path = worktree / "out" / level / "result.json"
        try:
            data = json.loads(path.read_bytes()[: 8 << 20])
        except (OSError, ValueError):
            data = None
        reports[level] = data if isinstance(data, dict) else None
    return reports


def _gather(s: Scratch) -> Evidence:
    """The battery's one run, and everything the checks weigh afterwards."""
    before = snapshot(watched_host_paths(s))
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        result = run_agent(repo=s.repo, argv=[probe_python(), "probe/probe.py", LEVELS[0]],
                           timeout=RUN_TIMEOUT, stdout=devnull)  # fmt: skip
    finally:
        os.close(devnull)
    lingering = _lingering(s.linger_marker)  # at once: the run is over
    _end(lingering)
    trusted = trusted_keys_file(s.repo / ".gatekeeper" / "trusted_keys")
    lines, problems = note_envelopes(s.git_dir, result.commit)
    ev = Evidence(scratch=s, result=result, before=before,
                  after=snapshot(watched_host_paths(s)), lingering=lingering,
                  envelope=lines[0][1] if lines else None, trusted=trusted,
                  probes=_probe_reports(result.worktree))  # fmt: skip
    if ev.envelope is None:
        ev.receipt_error = "; ".join(p for _, p in problems) or "no receipt note on the result"
    else:
        try:
            ev.statement, _ = verify_envelope(ev.envelope, trusted)
        except Error as exc:
            ev.receipt_error = exc.message
    return ev


def run_battery(policy_override: str | None = None) -> list[Check]:
    """Run the battery in a scratch world; policy_override (tests only) replaces its policy,
    to show that a boundary the policy opens is reported as not holding."""
    with scratch_world(policy_override) as s:
        try:
            return judge_all(_gather(s))
        except Error as exc:
            return [Check("run", False, f"the battery's run failed: {exc.message}", exc.hint)]


def _line(check: Check) -> str:
    mark = "ok" if check.ok else "FAIL"
    if check.ok and check.fix:
        mark = "note"
    text = f"{mark:<5} {check.name}: {check.detail}"
    if check.fix:
        text += f"\n      fix: {check.fix}"
    return text


def selftest(*, json_out: bool = False, policy_override: str | None = None) -> int:
    """Check the machine, then run the battery; print one line per check and a summary.

    Returns 0 when every check held, 1 otherwise (the machine cannot build the sandbox, or a
    boundary did not hold). policy_override is for tests only (see run_battery).
    """
    started = time.monotonic()
    machine = machine_checks()
    checks = [_machine_check(c) for c in machine]
    can_run = all(c.ok for c in machine if c.required)
    if not json_out:
        facts = machine_facts()
        print(f"gatekeeper selftest on Linux {facts['kernel']} ({facts['arch']}), "
              f"uid {facts['uid']}", flush=True)  # fmt: skip
        for check in checks:
            print(_line(check), flush=True)
    battery: list[Check] = []
    if can_run:
        battery = run_battery(policy_override)
        if not json_out:
            for check in battery:
                print(_line(check))
    checks += battery
    failed = sum(1 for c in checks if not c.ok)
    seconds = round(time.monotonic() - started, 2)
    if json_out:
        print(json.dumps({
            "checks": [c.as_json() for c in checks], "passed": len(checks) - failed,
            "failed": failed, "seconds": seconds, "ran": can_run, "machine": machine_facts(),
        }, indent=2))  # fmt: skip
    elif not can_run:
        print(f"selftest: not run: this machine cannot build the sandbox ({failed} problem(s) "
              "above; fix them and run `gatekeeper selftest` again)")  # fmt: skip
    else:
        verdict = "every boundary held" if not failed else "BOUNDARIES DID NOT HOLD"
        print(f"selftest: {len(checks) - failed} passed, {failed} failed in {seconds:.1f} s: "
              f"{verdict}")  # fmt: skip
    sys.stdout.flush()
    return 1 if failed else 0
