"""After the sandbox: commit what the agent changed, then write and sign its receipt.

Everything here runs in the launcher from what it observed; nothing the agent says is taken
as a record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from gatekeeper import __version__
from gatekeeper.git import tree_of
from gatekeeper.policy.model import LoadedPolicy, Policy
from gatekeeper.receipt.changes import Change, changes_between
from gatekeeper.receipt.keys import SigningKey
from gatekeeper.receipt.models import (
    Base,
    CommandResult,
    Counts,
    Escalation,
    NetworkRequest,
    PolicyRef,
    Predicate,
    Process,
    Write,
)
from gatekeeper.receipt.models import Sandbox as SandboxInfo
from gatekeeper.receipt.notes import add_receipt_note
from gatekeeper.receipt.statement import make_statement, sign_statement
from gatekeeper.run.agentgit import Imported
from gatekeeper.run.grants import Grants
from gatekeeper.run.worktree import (
    Worktree,
    collect_changes,
    commit_result,
    gitlinks_at,
    unsafe_reason,
)
from gatekeeper.sandbox.launch import Outcome, Sandbox
from gatekeeper.sandbox.limits import ProcessLimit
from gatekeeper.sandbox.mounts import bwrap_version
from gatekeeper.sandbox.supervise.setup import Observed
from gatekeeper.text import short_command


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


@dataclass
class Committed:
    """The result commit and which touched paths made it in."""

    commit: str
    tree: str
    touched: list[tuple[str, str]]  # (status letter, path)
    allowed: list[str]
    denied: list[str]
    changes: list[Change]


@dataclass
class Observations:
    """What the launcher saw of a run, gathered after the sandbox ended."""

    argv: list[str]
    outcome: Outcome
    checks: list[Outcome]
    started: float
    finished: float
    observed: Observed
    imported: Imported
    network: list[NetworkRequest]
    denied_destinations: list[str]


def commit_changes(
    wt: Worktree,
    git_dir,
    policy: Policy,
    argv: list[str],
    outcome: Outcome,
    imported: Imported,  # type: ignore[no-untyped-def]
) -> Committed:
    """Commit the worktree's allowed changes on top of the agent's own imported commits."""
    touched, index = collect_changes(wt, git_dir, start=imported.tip)
    try:
        gitlinks = gitlinks_at(git_dir, imported.tip)
        unsafe = {p: r for _, p in touched if (r := unsafe_reason(wt.path, p, gitlinks))}
        allowed = [p for _, p in touched if policy.allows_write(p) and p not in unsafe]
        denied = [p for _, p in touched if p not in allowed]
        message = (
            f"gatekeeper run {wt.run_id}\n\n$ {short_command(argv, 200)}\n\n"
            f"Gatekeeper-Run: {wt.run_id}\nGatekeeper-Exit: {outcome.exit_code}\n"
        )
        commit, tree, skipped = commit_result(wt, git_dir, index, allowed, message,
                                              parent=imported.tip)  # fmt: skip
        denied += skipped
        allowed = [p for p in allowed if p not in skipped]
    finally:
        index.unlink(missing_ok=True)
    denied += [c.path for c in imported.refused_changes or []]
    changes = changes_between(git_dir, wt.base, commit)
    return Committed(commit, tree, touched, allowed, denied, changes)


def _op_for(letter: str) -> str:
    return {"A": "create", "D": "delete", "M": "modify", "T": "modify"}.get(letter, "modify")


def _process(o: Outcome, cwd: str) -> Process:
    return Process(
        pid=o.pid or 0, ppid=o.ppid, argv=o.argv, cwd=cwd, decision="allow",
        exit_code=o.exit_code, signal=o.signal, time=iso(o.started_at),
    )  # fmt: skip


def _failed(p: Process) -> bool:
    return p.decision == "allow" and (p.killed or p.exit_code not in (0, None))


def build_predicate(
    *, wt: Worktree, git_dir, loaded: LoadedPolicy, policy: Policy, seen: Observations,  # type: ignore[no-untyped-def]
    committed: Committed, grants: Grants, sandbox: Sandbox, process_limit: ProcessLimit,
    limit_s: int,
) -> Predicate:  # fmt: skip
    """The receipt's predicate, from what the launcher observed and committed."""
    observed, outcome = seen.observed, seen.outcome
    writes = list(observed.writes)
    writes += [Write(path=p, op=_op_for(letter),
                     decision="allow" if p in committed.allowed else "deny", source="commit")
               for letter, p in committed.touched]  # fmt: skip
    for change in seen.imported.refused_changes or []:
        writes.append(Write(path=change.path, op="commit", decision="deny", source="commit"))
    escalations = [Escalation(kind=k, value=v, decision="granted")
                   for k, _, v in (g.partition("=") for g in grants.as_strings)]  # fmt: skip
    escalations += observed.escalations
    commands = [outcome, *seen.checks]
    processes = observed.processes or [_process(o, str(wt.path)) for o in commands]
    denied_paths = sorted({w.path for w in writes if w.decision != "allow"})
    counts = Counts(
        files_touched=len(committed.changes), denied_writes=len(denied_paths),
        escalations=len(escalations),
        commands_run=sum(1 for p in processes if p.decision == "allow"),
        failed_commands=sum(1 for p in processes if _failed(p))
        or sum(1 for o in commands if o.exit_code != 0),
        network_requests=len(seen.network),
    )  # fmt: skip
    return Predicate(
        run_id=wt.run_id, branch=wt.branch, started_at=iso(seen.started),
        finished_at=iso(seen.finished), launcher=f"gatekeeper {__version__}",
        policy=PolicyRef(path=loaded.path, sha256=loaded.sha256,
                         source_commit=loaded.source_commit),
        base=Base(commit=wt.base, tree=tree_of(git_dir, wt.base)),
        command=CommandResult(argv=seen.argv, exit_code=outcome.exit_code),
        checks=[CommandResult(argv=o.argv, exit_code=o.exit_code) for o in seen.checks],
        processes=processes, writes=writes, network=seen.network, escalations=escalations,
        changes=committed.changes, counts=counts, agent_commits=seen.imported.commits,
        secret_lookups=sorted({str(s["path"]) for s in observed.secrets}),
        sandbox=SandboxInfo(
            tool="bubblewrap", version=bwrap_version(sandbox.bwrap), network="proxy",
            timed_out=outcome.timed_out, supervised=sandbox.supervisor_config is not None,
            supervisor_failed=any(o.supervisor_failed for o in commands),
            limits={"timeout": limit_s, "max_processes": policy.limits.max_processes,
                    "max_file_size": policy.limits.max_file_size,
                    "process_limit_enforced": int(process_limit.mechanism != "none")},
        ),
    )  # fmt: skip


def sign_receipt(git_dir, predicate: Predicate, committed: Committed, key: SigningKey) -> None:  # type: ignore[no-untyped-def]
    """Sign the statement about the result commit and store it in the commit's note."""
    statement = make_statement(predicate, committed.commit, committed.tree)
    add_receipt_note(git_dir, committed.commit, sign_statement(statement, key))
