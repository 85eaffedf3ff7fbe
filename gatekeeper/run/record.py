"""After the sandbox: commit what the agent changed, then write and sign its receipt.

Everything here runs in the launcher from what it observed; nothing the agent says is taken
as a record.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from gatekeeper import __version__
from gatekeeper.errors import GitError
from gatekeeper.git import rev_parse, tree_of
from gatekeeper.policy.model import LoadedPolicy, Policy
from gatekeeper.policy.patterns import matches_any
from gatekeeper.proc import signal_name
from gatekeeper.receipt.changes import Change, changes_between
from gatekeeper.receipt.keys import SigningKey
from gatekeeper.receipt.models import (
    Base,
    CommandResult,
    Counts,
    Escalation,
    NetworkRequest,
    NotCommitted,
    PolicyRef,
    Predicate,
    Process,
    Write,
    escalation_id,
)
from gatekeeper.receipt.models import Sandbox as SandboxInfo
from gatekeeper.receipt.notes import add_receipt_note
from gatekeeper.receipt.statement import make_statement, sign_statement
from gatekeeper.run import layers
from gatekeeper.run.agentgit import Imported
from gatekeeper.run.failures import is_failed
from gatekeeper.run.grants import Grants
from gatekeeper.run.worktree import (
    MAX_IGNORED_LISTED,
    Worktree,
    collect_changes,
    commit_result,
    commit_tree,
    gitlinks_at,
    restore_access,
    unsafe_reason,
)
from gatekeeper.sandbox.launch import Outcome, Sandbox
from gatekeeper.sandbox.limits import ProcessLimit
from gatekeeper.sandbox.mounts import bwrap_version
from gatekeeper.sandbox.supervise.setup import (
    MAX_LISTED_WRITES,
    MORE_REFUSED_WRITES_OP,
    Observed,
)
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
    not_committed: dict[str, str] = field(default_factory=dict)  # path -> why (not policy)
    errors: list[str] = field(default_factory=list)  # what failed in the launcher
    ignored: list[str] = field(default_factory=list)  # new paths .gitignore covers


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
    errors: list[str] = field(default_factory=list)  # what failed while gathering
    registries: list[str] = field(default_factory=list)  # package registries found, by source


def _message(wt: Worktree, argv: list[str], outcome: Outcome) -> str:
    return (
        f"gatekeeper run {wt.run_id}\n\n$ {short_command(argv, 200)}\n\n"
        f"Gatekeeper-Run: {wt.run_id}\nGatekeeper-Exit: {outcome.exit_code}\n"
    )


def commit_changes(
    wt: Worktree,
    git_dir: Path,
    policy: Policy,
    argv: list[str],
    outcome: Outcome,
    imported: Imported,
    agent_state: tuple[str, ...] = (),
) -> Committed:
    """Commit the worktree's allowed changes on top of the agent's own imported commits.

    New paths that match agent_state (the agent's own caches and history, from its profile)
    are not committed; they are listed in not_committed.

    Never raises for what the agent left behind: when the worktree cannot be collected, the
    result is the imported tip (or base) unchanged and the error is part of the record.
    """
    try:
        return _commit_worktree(wt, git_dir, policy, argv, outcome, imported, agent_state)
    except (GitError, OSError, ValueError) as exc:
        error = f"the worktree could not be committed: {_first_lines(str(exc))}"
    # Nothing more of the worktree is taken; the branch still gets a commit for the receipt
    # (the launcher's own, when the failure came after it was made).
    current = rev_parse(git_dir, f"refs/heads/{wt.branch}")
    if current != wt.base:
        commit = current
    else:
        commit = commit_tree(wt, git_dir, tree_of(git_dir, imported.tip),
                             _message(wt, argv, outcome), imported.tip)  # fmt: skip
    changes = changes_between(git_dir, wt.base, commit)
    denied = [c.path for c in imported.refused_changes or []]
    return Committed(commit, tree_of(git_dir, commit), [], [], denied, changes, {}, [error])


def _under_any(path: str, folders: dict[str, str]) -> bool:
    parts = path.split("/")
    return any("/".join(parts[:i]) in folders for i in range(1, len(parts)))


def _first_lines(text: str, n: int = 6) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[:n])


def _commit_worktree(
    wt: Worktree, git_dir: Path, policy: Policy, argv: list[str], outcome: Outcome,
    imported: Imported, agent_state: tuple[str, ...] = (),
) -> Committed:  # fmt: skip
    # The agent may have left folders or files its owner cannot read: give read access back
    # first, so nothing vanishes silently; what stays unreadable is reported, not committed.
    layer = layers.touched(wt.path)  # what a layered worktree's own layer holds, read once
    unreadable = restore_access(wt.path, only=layer)
    collected = collect_changes(wt, git_dir, start=imported.tip,
                                max_bytes=policy.limits.max_added_bytes,
                                commit_ignored=policy.paths.commit_ignored,
                                layer=layer)  # fmt: skip
    touched, index, over = collected.changes, collected.index, collected.over
    try:
        # The whole tree's listing, only when a changed path is to be checked against it.
        gitlinks = gitlinks_at(git_dir, imported.tip) if touched else set()
        unsafe: dict[str, str] = {}
        unnamed: dict[str, str] = {}  # (a path past PATH_MAX, say: nothing reads it by name)
        for _, p in touched:
            try:
                if reason := unsafe_reason(wt.path, p, gitlinks):
                    unsafe[p] = reason
            except OSError as exc:
                unnamed[p] = f"the launcher cannot look it up ({exc.strerror})"
        not_committed: dict[str, str] = {}
        for path, reason in unreadable.items():
            if path in (".", ""):
                continue
            not_committed[path] = reason
        allowed_set: set[str] = set()
        denied: list[str] = []
        for letter, p in touched:
            if letter == "A" and agent_state and matches_any(agent_state, p):
                not_committed[p] = "the agent's own state (its profile keeps it out)"
            elif p in unsafe or not policy.allows_write(p):
                denied.append(p)
            elif p in unnamed:
                not_committed[p] = unnamed[p]
            elif p in not_committed or _under_any(p, unreadable):
                not_committed.setdefault(p, "inside a folder the launcher cannot read")
            else:
                allowed_set.add(p)
        # Beyond the byte or file budget: never read, never committed (reported, not denied).
        not_committed.update({p: r for p, r in over.items() if p in allowed_set})
        staged = [p for p in sorted(allowed_set) if p not in over]
        message = _message(wt, argv, outcome)
        commit, tree, skipped = commit_result(wt, git_dir, index, staged, message,
                                              parent=imported.tip,
                                              plain_index=not over)  # fmt: skip
        not_committed.update(skipped)
        allowed = [p for p in staged if p not in skipped]
    finally:
        index.unlink(missing_ok=True)
    denied += [c.path for c in imported.refused_changes or []]
    changes = changes_between(git_dir, wt.base, commit)
    return Committed(commit, tree, touched, allowed, denied, changes, not_committed,
                     ignored=collected.ignored)  # fmt: skip


def _op_for(letter: str) -> str:
    return {"A": "create", "D": "delete", "M": "modify", "T": "modify"}.get(letter, "modify")


def _process(o: Outcome, cwd: str) -> Process:
    return Process(
        pid=o.pid or 0, ppid=o.ppid, argv=o.argv, cwd=cwd, decision="allow",
        exit_code=o.exit_code, signal=o.signal, signal_name=o.signal_name,
        time=iso(o.started_at),
        killed=o.signal is not None
        or (o.exit_code is None and (o.timed_out or o.interrupted)),
    )  # fmt: skip


def _stopped(p: Process) -> Process:
    """p, as the launcher's stop left it: a process whose end nobody saw was running when
    the sandbox was killed (SIGKILL to its every process, at a timeout or an interrupt)."""
    if p.decision != "allow" or p.exit_code is not None or p.signal is not None:
        return p
    return replace(p, killed=True, signal=int(signal.SIGKILL),
                   signal_name=signal.SIGKILL.name)  # fmt: skip


def _result(argv: list[str], o: Outcome) -> CommandResult:
    """A command as the receipt has it; one the launcher stopped (no exit code) was
    killed with the sandbox, by SIGKILL."""
    signum = o.signal
    if signum is None and o.exit_code is None and (o.timed_out or o.interrupted):
        signum = int(signal.SIGKILL)
    return CommandResult(argv=argv, exit_code=o.exit_code, signal=signum,
                         signal_name=signal_name(signum))  # fmt: skip


def _failed(p: Process) -> bool:
    return p.decision == "allow" and is_failed(p.argv, p.exit_code, p.killed)


# A decision made at the run's own prompt (`--ask tty`) in the words of the receipt.
_DECISION_WORDS = {"approved": "granted", "refused": "denied", "allow": "granted",
                   "deny": "denied"}  # fmt: skip


def decision_points(
    *, grants: Grants, observed: list[Escalation], writes: list[Write],
    secrets: list[dict[str, object]], started: str, finished: str,
) -> list[Escalation]:  # fmt: skip
    """Every decision point of a run, one per kind and value, each with its id.

    `granted` for what --grant or a profile named; the supervisor's and the proxy's
    escalations (commands, destinations, external writes) as they were decided; one
    pending `write` per path the boundary refused, and one pending `secret` per hidden
    secret looked up, however often. A later decision replaces a pending one. What was
    found only after the sandbox (a refused commit of the agent's) has the finish time.
    """
    points: dict[str, Escalation] = {}

    def add(kind: str, value: str, decision: str, time: str | None) -> None:
        decision = _DECISION_WORDS.get(decision, decision)
        key = escalation_id(kind, value)
        earlier = points.get(key)
        if earlier is None:
            points[key] = Escalation(kind=kind, value=value, decision=decision,
                                     time=time or finished, id=key)  # fmt: skip
        elif earlier.decision == "pending" and decision != "pending":
            points[key] = earlier.model_copy(update={"decision": decision})

    for grant in grants.as_strings:
        kind, _, value = grant.partition("=")
        add(kind, value, "granted", started)
    for escalation in observed:
        add(escalation.kind, escalation.value, escalation.decision, escalation.time)
    for write in writes:
        # The one entry for the refused writes past the listed ones names no path to approve
        # (its name is a path a repository may hold: approving it would grant that path), nor
        # does a refusal no approval could lift (a label for a path that cannot be named, the
        # worktree's own folder or .git), which says why in its reason.
        if (
            write.decision != "allow"
            and write.op != MORE_REFUSED_WRITES_OP
            and (write.source != "syscall" or write.reason is None)
        ):
            add("write", write.path, "pending", write.time)
    for lookup in secrets:
        add("secret", os.path.normpath(str(lookup["path"])), "pending",
            str(lookup["time"]) if lookup.get("time") else None)  # fmt: skip
    return list(points.values())


def build_predicate(
    *, wt: Worktree, git_dir, loaded: LoadedPolicy, policy: Policy, seen: Observations,  # type: ignore[no-untyped-def]
    committed: Committed, grants: Grants, sandbox: Sandbox, process_limit: ProcessLimit,
    limit_s: int,
) -> Predicate:  # fmt: skip
    """The receipt's predicate, from what the launcher observed and committed."""
    observed, outcome = seen.observed, seen.outcome
    writes = list(observed.writes)
    writes_unlisted = observed.writes_unlisted
    allowed = set(committed.allowed)
    # The result's allowed paths as writes, after the supervisor's: past MAX_LISTED_WRITES
    # allowed writes in all, counted.
    listed = sum(1 for w in writes if w.decision == "allow")
    for letter, p in committed.touched:
        if p in committed.not_committed:
            continue
        if p in allowed:
            listed += 1
            if listed > MAX_LISTED_WRITES:
                writes_unlisted += 1
                continue
        writes.append(
            Write(
                path=p,
                op=_op_for(letter),
                decision="allow" if p in allowed else "deny",
                source="commit",
            )
        )
    refused = seen.imported.refused
    for change in seen.imported.refused_changes or []:
        writes.append(Write(path=change.path, op="commit", decision="deny", source="commit",
                            reason=refused))  # fmt: skip
    escalations = decision_points(grants=grants, observed=observed.escalations, writes=writes,
                                  secrets=observed.secrets, started=iso(seen.started),
                                  finished=iso(seen.finished))  # fmt: skip
    commands = [outcome, *seen.checks]
    # Without the supervisor, the commands the launcher started are all it knows of.
    processes = observed.processes or [_process(o, str(wt.path)) for o in commands]
    stopped = [o for o in commands if o.timed_out or o.interrupted]
    if stopped:
        processes = [_stopped(p) for p in processes]
    denied_paths = sorted({w.path for w in writes if w.decision != "allow"})
    counts = Counts(
        files_touched=len(committed.changes), denied_writes=len(denied_paths),
        escalations=len(escalations),
        commands_run=sum(1 for p in processes if p.decision == "allow")
        + observed.processes_unlisted,
        failed_commands=sum(1 for p in processes if _failed(p)),
        network_requests=sum(r.count or 1 for r in seen.network),
    )  # fmt: skip
    return Predicate(
        run_id=wt.run_id, branch=wt.branch, started_at=iso(seen.started),
        finished_at=iso(seen.finished), launcher=f"gatekeeper {__version__}",
        policy=PolicyRef(path=loaded.path, sha256=loaded.sha256,
                         source_commit=loaded.source_commit),
        base=Base(commit=wt.base, tree=wt.base_tree or tree_of(git_dir, wt.base)),
        command=_result(seen.argv, outcome),
        checks=[_result(o.argv, o) for o in seen.checks],
        processes=processes, writes=writes, network=seen.network, escalations=escalations,
        changes=committed.changes, counts=counts, agent_commits=seen.imported.commits,
        secret_lookups=sorted({os.path.normpath(str(s["path"])) for s in observed.secrets}),
        agent_commits_refused=seen.imported.refused,
        not_committed=[NotCommitted(path=p, reason=r)
                       for p, r in sorted(committed.not_committed.items())],
        launcher_errors=[*seen.errors, *committed.errors],
        ignored=committed.ignored[:MAX_IGNORED_LISTED], ignored_count=len(committed.ignored),
        processes_unlisted=observed.processes_unlisted, writes_unlisted=writes_unlisted,
        sandbox=SandboxInfo(
            tool="bubblewrap", version=bwrap_version(sandbox.bwrap), network="proxy",
            timed_out=outcome.timed_out, supervised=sandbox.supervisor_config is not None,
            interrupted=bool(stopped) and not outcome.timed_out,
            interrupted_by=next((signal_name(o.interrupted_by) for o in stopped
                                 if o.interrupted_by), None),
            registries=seen.registries,
            cgroup=process_limit.mechanism == "cgroup", cgroup_reason=process_limit.cgroup_reason,
            process_limit=process_limit.mechanism, launcher_root=os.geteuid() == 0,
            # The same as the run's own report: a command's supervisor killed, or an error
            # it recorded (a call it could not judge, an exec it had no descriptor left for).
            supervisor_failed=any(o.supervisor_failed for o in commands) or bool(observed.errors),
            limits={"timeout": limit_s, "max_processes": policy.limits.max_processes,
                    "max_file_size": policy.limits.max_file_size,
                    "max_added_bytes": policy.limits.max_added_bytes,
                    "process_limit_enforced": int(process_limit.mechanism != "none")},
        ),
    )  # fmt: skip


def sign_receipt(git_dir, predicate: Predicate, committed: Committed, key: SigningKey) -> None:  # type: ignore[no-untyped-def]
    """Sign the statement about the result commit and store it in the commit's note."""
    statement = make_statement(predicate, committed.commit, committed.tree)
    add_receipt_note(git_dir, committed.commit, sign_statement(statement, key),
                     owner=predicate.run_id)  # fmt: skip
