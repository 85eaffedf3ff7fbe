"""`gatekeeper run`: a sandboxed agent run with a signed receipt."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from gatekeeper.errors import UsageError
from gatekeeper.policy.profile import load_profile
from gatekeeper.receipt.redact import Redactor
from gatekeeper.run.grants import parse_grants
from gatekeeper.run.result import RunResult
from gatekeeper.run.runner import run_agent
from gatekeeper.sandbox.supervise.display import escape
from gatekeeper.text import short_command


def _summary(result: RunResult) -> str:
    lines = [f"run       {result.run_id}", f"branch    {result.branch} ({result.commit[:12]})",
             f"worktree  {result.worktree}"]  # fmt: skip
    status = (
        "timed out"
        if result.outcome.timed_out
        else ("interrupted" if result.outcome.interrupted else f"exit {result.outcome.exit_code}")
    )
    outcome = result.outcome
    if outcome.signal is not None and not (outcome.timed_out or outcome.interrupted):
        status = f"killed by {outcome.signal_name} (signal {outcome.signal})"
        if outcome.exit_code is not None:
            status += f", exit {outcome.exit_code}"
    lines.append(f"command   {short_command(result.outcome.argv)}  -> {status}")
    for check in result.checks:
        mark = "ok" if check.exit_code == 0 else f"FAILED (exit {check.exit_code})"
        if check.signal is not None:
            mark = f"FAILED (killed by {check.signal_name}, signal {check.signal})"
        lines.append(f"check     {short_command(check.argv)}  -> {mark}")
    lines.append(f"changes   {len(result.changes)} file(s)")
    for change in result.changes[:20]:
        shown = f"{change.old_path} -> {change.path}" if change.old_path else change.path
        lines.append(f"  {change.status} {shown}")
    if len(result.changes) > 20:
        lines.append(f"  ... and {len(result.changes) - 20} more")
    denied_writes = sorted({*result.denied, *(w.path for w in result.observed.denied_writes)})
    if denied_writes:
        lines.append(f"denied    {len(denied_writes)} write(s) outside the policy")
        for path in denied_writes[:20]:
            lines.append(f"  ! {path}")
    for process in result.observed.denied_commands[:20]:
        lines.append(
            f"denied    command {short_command(process.argv, 80)}"
            + (f" (rule `{process.rule}`)" if process.rule else "")
        )
    for escalation in result.observed.escalations:
        if escalation.decision == "pending":
            lines.append(
                f"pending   {escalation.kind} `{escalation.value}` needs approval: "
                f'rerun with --grant {escalation.kind}="{escalation.value}" or --ask tty'
            )
    for line in result.denied_destinations[:20]:
        lines.append(f"denied    network {line}")
    if result.network:
        total = sum(r.count or 1 for r in result.network)
        lines.append(f"network   {total} request(s) through the proxy or refused")
    if result.imported and result.imported.commits:
        lines.append(f"commits   {len(result.imported.commits)} made by the agent, imported")
    if result.imported and result.imported.refused:
        lines.append(f"refused   the agent's own commits: {result.imported.refused}")
    if result.not_committed:
        lines.append(f"left out  {len(result.not_committed)} path(s) not committed "
                     "(not a policy decision)")  # fmt: skip
        for path, reason in list(result.not_committed.items())[:20]:
            lines.append(f"  - {path}: {reason}")
    if result.ignored:
        taken = result.policy.policy.paths.commit_ignored
        how = "committed" if taken else "not committed (paths.commit_ignored: true takes them)"
        lines.append(f"ignored   {len(result.ignored)} new path(s) .gitignore covers, {how}")
        for path in result.ignored[:20]:
            lines.append(f"  ~ {path}")
        if len(result.ignored) > 20:
            lines.append(f"  ... and {len(result.ignored) - 20} more")
    for error in result.launcher_errors:
        lines.append(f"ERROR     {error}")
    if result.supervisor_failed:
        lines.append("FAILED    the syscall supervisor stopped; the run was killed")
    lines.append(f"receipt   signed, in {result.receipt_ref} on {result.commit[:12]}"
                 f" (`gatekeeper receipt show {result.branch}`)")  # fmt: skip
    # Paths, argv and values come from the agent: nothing of theirs may steer the terminal.
    return "\n".join(escape(line) for line in lines)


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
    profile: str | None = None,
) -> int:
    parsed = parse_grants(grants or [])
    loaded_profile = load_profile(profile) if profile else None
    check_argvs = []
    for check in checks or []:
        parts = shlex.split(check)
        if not parts:
            raise UsageError("--check needs a command, e.g. --check 'pytest -q'")
        check_argvs.append(parts)
    # With --json, stdout carries only the JSON object: the agent's output goes to stderr.
    result = run_agent(
        repo=repo, argv=argv, base=base, policy_file=policy_file, branch=branch,
        checks=check_argvs, grants=parsed, ask=ask, timeout=timeout, profile=loaded_profile,
        stdout=sys.stderr.fileno() if json_out else None,
    )  # fmt: skip
    # Secrets passed in never reach what the launcher prints (paths, hosts, argv included).
    redactor = result.redactor or Redactor()
    if json_out:
        keep = frozenset({"changes", "commit", "tree", "base", "run_id", "branch", "worktree",
                          "agent_commits", "receipt"})  # fmt: skip
        print(json.dumps(redactor.data(result.as_json(), keep), indent=2))
    else:
        print(redactor.text(_summary(result)), file=sys.stderr)
    return result.exit_code
