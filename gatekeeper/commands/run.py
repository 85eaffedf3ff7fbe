"""`gatekeeper run`: a sandboxed agent run with a signed receipt."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from gatekeeper.errors import UsageError
from gatekeeper.runner import RunResult, run_agent
from gatekeeper.text import short_command


def _summary(result: RunResult) -> str:
    lines = [f"run       {result.run_id}", f"branch    {result.branch} ({result.commit[:12]})",
             f"worktree  {result.worktree}"]  # fmt: skip
    status = "timed out" if result.outcome.timed_out else (
        "interrupted" if result.outcome.interrupted else f"exit {result.outcome.exit_code}")
    lines.append(f"command   {short_command(result.outcome.argv)}  -> {status}")
    for check in result.checks:
        mark = "ok" if check.exit_code == 0 else f"FAILED (exit {check.exit_code})"
        lines.append(f"check     {short_command(check.argv)}  -> {mark}")
    lines.append(f"changes   {len(result.changes)} file(s)")
    for change in result.changes[:20]:
        shown = f"{change.old_path} -> {change.path}" if change.old_path else change.path
        lines.append(f"  {change.status} {shown}")
    if len(result.changes) > 20:
        lines.append(f"  ... and {len(result.changes) - 20} more")
    if result.denied:
        lines.append(f"denied    {len(result.denied)} write(s) outside the policy, not committed")
        for path in result.denied[:20]:
            lines.append(f"  ! {path}")
    lines.append(f"receipt   signed, in {result.receipt_ref} on {result.commit[:12]}"
                 f" (`gatekeeper receipt show {result.branch}`)")  # fmt: skip
    return "\n".join(lines)


def run(
    *,
    repo: Path,
    argv: list[str],
    policy_file: Path | None = None,
    base: str = "HEAD",
    branch: str | None = None,
    checks: list[str] | None = None,
    grants: list[str] | None = None,
    ask: str = "never",
    timeout: int | None = None,
    json_out: bool = False,
) -> int:
    for grant in grants or []:
        kind, sep, value = grant.partition("=")
        if not sep or kind not in ("command", "network", "write", "secret") or not value:
            raise UsageError(f"--grant {grant!r}: expected KIND=VALUE with KIND one of "
                             "command, network, write, secret")  # fmt: skip
    check_argvs = []
    for check in checks or []:
        parts = shlex.split(check)
        if not parts:
            raise UsageError("--check needs a command, e.g. --check 'pytest -q'")
        check_argvs.append(parts)
    # With --json, stdout carries only the JSON object: the agent's output goes to stderr.
    result = run_agent(
        repo=repo, argv=argv, base=base, policy_file=policy_file, branch=branch,
        checks=check_argvs, timeout=timeout, stdout=sys.stderr.fileno() if json_out else None,
    )  # fmt: skip
    if json_out:
        print(json.dumps(result.as_json(), indent=2))
    else:
        print(_summary(result), file=sys.stderr)
    return result.exit_code
