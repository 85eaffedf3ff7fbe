"""A whole agent run: worktree, sandbox, checks, commit, receipt. The CLI's `run` calls `run_agent`."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType

from gatekeeper import __version__
from gatekeeper.changes import Change, changes_between
from gatekeeper.errors import PolicyError, SandboxError
from gatekeeper.git import discover, rev_parse, tree_of
from gatekeeper.keys import config_dir, load_key
from gatekeeper.launch import Outcome, Sandbox
from gatekeeper.limits import ProcessLimit
from gatekeeper.policy import POLICY_PATH, LoadedPolicy, load_policy_at, load_policy_file
from gatekeeper.receipt import (
    NOTES_REF,
    Base,
    CommandResult,
    Counts,
    Escalation,
    PolicyRef,
    Predicate,
    Process,
    Write,
    add_receipt_note,
    make_statement,
    sign_statement,
)
from gatekeeper.receipt import Sandbox as SandboxInfo
from gatekeeper.sandbox import bwrap_version, is_write_allowed, plan_sandbox
from gatekeeper.worktree import (
    Worktree,
    check_branch_name,
    collect_changes,
    commit_result,
    create_worktree,
    new_run_id,
    remove_worktree,
    worktrees_root,
)

TIMEOUT_EXIT = 124


@dataclass
class RunResult:
    run_id: str
    branch: str
    commit: str
    tree: str
    worktree: Path
    base: str
    exit_code: int
    outcome: Outcome
    checks: list[Outcome]
    changes: list[Change]
    denied: list[str]
    policy: LoadedPolicy
    receipt_ref: str = NOTES_REF
    hidden: list[str] = field(default_factory=list)
    writable: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "run_id": self.run_id, "branch": self.branch, "commit": self.commit,
            "tree": self.tree, "worktree": str(self.worktree), "base": self.base,
            "exit_code": self.exit_code, "timed_out": self.outcome.timed_out,
            "interrupted": self.outcome.interrupted,
            "checks": [{"argv": c.argv, "exit_code": c.exit_code} for c in self.checks],
            "changes": [c.model_dump() for c in self.changes],
            "denied_writes": self.denied, "receipt": f"{self.receipt_ref} on {self.commit}",
            "policy": {"path": self.policy.path, "sha256": self.policy.sha256},
        }  # fmt: skip


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


def resolve_policy(git_dir: Path, base_commit: str, policy_file: Path | None) -> LoadedPolicy:
    """The run's policy: --policy FILE, else the one committed at the base revision."""
    if policy_file is not None:
        return load_policy_file(policy_file)
    loaded = load_policy_at(git_dir, base_commit)
    if loaded is None:
        raise PolicyError(
            f"no policy at the base revision ({POLICY_PATH} at {base_commit[:12]})",
            hint="run `gatekeeper init` and commit .gatekeeper/, or pass --policy FILE",
        )
    return loaded


def _op_for(letter: str) -> str:
    return {"A": "create", "D": "delete", "M": "modify", "T": "modify"}.get(letter, "modify")


def _process(o: Outcome, cwd: Path) -> Process:
    return Process(
        pid=o.pid or 0, ppid=o.ppid, argv=o.argv, cwd=str(cwd), decision="allow",
        exit_code=o.exit_code, signal=o.signal, time=_iso(o.started_at),
    )  # fmt: skip


def run_agent(
    *,
    repo: Path,
    argv: list[str],
    base: str = "HEAD",
    policy_file: Path | None = None,
    branch: str | None = None,
    checks: list[list[str]] | None = None,
    timeout: int | None = None,
    stdout: int | None = None,
) -> RunResult:
    """Run argv in a sandboxed worktree, commit its result and sign a receipt.

    Raises PolicyError, GitError, KeyFileError before anything is created, and SandboxError
    when bubblewrap cannot build the boundary (what was created is removed again).
    """
    if not argv:
        raise SandboxError("no command to run", hint="gatekeeper run -- CMD [ARG...]")
    paths = discover(repo)
    git_dir = paths.git_dir
    base_commit = rev_parse(git_dir, base)
    loaded = resolve_policy(git_dir, base_commit, policy_file)
    policy = loaded.policy
    key = load_key()
    run_id = new_run_id()
    branch = branch or f"agent/{run_id}"
    check_branch_name(git_dir, branch)
    limit_s = timeout or policy.limits.timeout

    wt = create_worktree(git_dir, base_commit, branch, run_id)
    scratch = Path(tempfile.mkdtemp(prefix="gatekeeper-run-"))
    process_limit = ProcessLimit(run_id, policy.limits.max_processes)
    sandbox: Sandbox | None = None
    index: Path | None = None
    previous: dict[int, object] = {}
    try:
        try:
            plan = plan_sandbox(
                worktree=wt.path, git_common_dir=git_dir, policy=policy, run_id=run_id,
                scratch=scratch, private_dirs=[config_dir(), worktrees_root(), scratch],
                user_checkout=paths.work_tree,
            )  # fmt: skip
            sandbox = Sandbox(plan, max_file_size=policy.limits.max_file_size,
                              process_limit=process_limit)  # fmt: skip
            sandbox.preflight()
        except (SandboxError, PolicyError):
            remove_worktree(git_dir, run_id, wt.path, branch)
            raise

        def on_signal(signum: int, frame: FrameType | None) -> None:
            assert sandbox is not None
            if sandbox.interrupted:  # a second interrupt: stop waiting altogether
                raise KeyboardInterrupt
            sandbox.interrupted = True
            print(f"\ngatekeeper: stopping the run (signal {signum}); the result is still "
                  "committed and signed", file=sys.stderr)  # fmt: skip
            sandbox.kill()

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, on_signal)

        started = time.time()
        deadline = time.monotonic() + limit_s
        outcome = sandbox.run(argv, deadline=deadline, stdout=stdout)
        check_outcomes: list[Outcome] = []
        for check in checks or []:
            if sandbox.interrupted or time.monotonic() >= deadline:
                break
            check_outcomes.append(sandbox.run(check, deadline=deadline, stdout=stdout))
        finished = time.time()

        result = _commit_and_sign(
            wt, git_dir, loaded, argv, outcome, check_outcomes, started, finished, key,
            sandbox, process_limit, limit_s,
        )  # fmt: skip
        return result
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        if sandbox is not None:
            sandbox.close()
        process_limit.remove()
        shutil.rmtree(scratch, ignore_errors=True)
        if index is not None:
            index.unlink(missing_ok=True)


def _commit_and_sign(
    wt: Worktree, git_dir: Path, loaded: LoadedPolicy, argv: list[str], outcome: Outcome,
    check_outcomes: list[Outcome], started: float, finished: float, key, sandbox: Sandbox,  # type: ignore[no-untyped-def]
    process_limit: ProcessLimit, limit_s: int,
) -> RunResult:  # fmt: skip
    policy = loaded.policy
    touched, index = collect_changes(wt, git_dir)
    try:
        allowed = [p for _, p in touched if is_write_allowed(policy, p)]
        denied = [p for _, p in touched if not is_write_allowed(policy, p)]
        summary = " ".join(argv)
        message = (
            f"gatekeeper run {wt.run_id}\n\n$ {summary[:200]}\n\n"
            f"Gatekeeper-Run: {wt.run_id}\nGatekeeper-Exit: {outcome.exit_code}\n"
        )
        commit, tree = commit_result(wt, git_dir, index, allowed, message)
    finally:
        index.unlink(missing_ok=True)
    changes = changes_between(git_dir, wt.base, commit)
    writes = [
        Write(path=p, op=_op_for(letter), decision="allow" if p in allowed else "deny")
        for letter, p in touched
    ]
    commands = [outcome, *check_outcomes]
    escalations: list[Escalation] = []
    counts = Counts(
        files_touched=len(changes), denied_writes=len(denied), escalations=len(escalations),
        commands_run=len(commands),
        failed_commands=sum(1 for o in commands if o.exit_code != 0),
        network_requests=0,
    )  # fmt: skip
    predicate = Predicate(
        run_id=wt.run_id, branch=wt.branch, started_at=_iso(started), finished_at=_iso(finished),
        launcher=f"gatekeeper {__version__}",
        policy=PolicyRef(path=loaded.path, sha256=loaded.sha256,
                         source_commit=loaded.source_commit),
        base=Base(commit=wt.base, tree=tree_of(git_dir, wt.base)),
        command=CommandResult(argv=argv, exit_code=outcome.exit_code),
        checks=[CommandResult(argv=o.argv, exit_code=o.exit_code) for o in check_outcomes],
        processes=[_process(o, wt.path) for o in commands],
        writes=writes, network=[], escalations=escalations, changes=changes, counts=counts,
        sandbox=SandboxInfo(
            tool="bubblewrap", version=bwrap_version(sandbox.bwrap), network="none",
            timed_out=outcome.timed_out,
            limits={"timeout": limit_s, "max_processes": policy.limits.max_processes,
                    "max_file_size": policy.limits.max_file_size,
                    "process_limit_enforced": int(process_limit.mechanism != "none")},
        ),
    )  # fmt: skip
    statement = make_statement(predicate, commit, tree)
    envelope = sign_statement(statement, key)
    add_receipt_note(git_dir, commit, envelope)

    if outcome.timed_out:
        exit_code = TIMEOUT_EXIT
    elif outcome.interrupted:
        exit_code = 130
    else:
        exit_code = outcome.exit_code if outcome.exit_code is not None else 1
    return RunResult(
        run_id=wt.run_id, branch=wt.branch, commit=commit, tree=tree, worktree=wt.path,
        base=wt.base, exit_code=exit_code, outcome=outcome, checks=check_outcomes,
        changes=changes, denied=denied, policy=loaded, hidden=sandbox.plan.hidden,
        writable=sandbox.plan.writable,
    )  # fmt: skip
