"""A whole agent run: worktree, sandbox, checks, commit, receipt (the CLI's `run` calls it)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from gatekeeper import __version__, agentgit
from gatekeeper.changes import Change, changes_between
from gatekeeper.errors import PolicyError, SandboxError, UsageError
from gatekeeper.git import discover, rev_parse, tree_of
from gatekeeper.grants import Grants
from gatekeeper.keys import config_dir, load_key
from gatekeeper.launch import Outcome, Sandbox
from gatekeeper.limits import ProcessLimit
from gatekeeper.net import NetworkSession
from gatekeeper.policy import POLICY_PATH, LoadedPolicy, Policy, load_policy_at, load_policy_file
from gatekeeper.receipt import (
    NOTES_REF,
    Base,
    CommandResult,
    Counts,
    Escalation,
    NetworkRequest,
    PolicyRef,
    Predicate,
    Process,
    Write,
    add_receipt_note,
    make_statement,
    sign_statement,
)
from gatekeeper.receipt import Sandbox as SandboxInfo
from gatekeeper.sandbox import bwrap_path, bwrap_version, is_write_allowed, plan_sandbox
from gatekeeper.supervise.setup import Observed, read_events, write_config
from gatekeeper.text import short_command
from gatekeeper.worktree import (
    Worktree,
    check_branch_name,
    collect_changes,
    commit_result,
    create_worktree,
    gitlinks_at,
    new_run_id,
    remove_worktree,
    unsafe_reason,
    worktrees_root,
)

TIMEOUT_EXIT = 124
SUPERVISOR_FAILED_EXIT = 125


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
    observed: Observed = field(default_factory=Observed)
    imported: agentgit.Imported | None = None
    supervisor_errors: list[str] = field(default_factory=list)
    supervisor_failed: bool = False
    network: list[NetworkRequest] = field(default_factory=list)
    denied_destinations: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "run_id": self.run_id, "branch": self.branch, "commit": self.commit,
            "tree": self.tree, "worktree": str(self.worktree), "base": self.base,
            "exit_code": self.exit_code, "timed_out": self.outcome.timed_out,
            "interrupted": self.outcome.interrupted,
            "checks": [{"argv": c.argv, "exit_code": c.exit_code} for c in self.checks],
            "changes": [c.model_dump() for c in self.changes],
            "denied_writes": sorted({*self.denied, *(w.path for w in self.observed.denied_writes)}),
            "denied_commands": [p.argv for p in self.observed.denied_commands],
            "escalations": [e.model_dump() for e in self.observed.escalations],
            "agent_commits": self.imported.commits if self.imported else [],
            "supervisor_failed": self.supervisor_failed,
            "network": [r.model_dump(exclude_none=True) for r in self.network],
            "denied_destinations": self.denied_destinations,
            "receipt": f"{self.receipt_ref} on {self.commit}",
            "policy": {"path": self.policy.path, "sha256": self.policy.sha256},
        }  # fmt: skip


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


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


def bridge_python() -> tuple[str, list[str]]:
    """An interpreter for the network bridge inside the sandbox, and binds that show it."""
    for candidate in ("/usr/bin/python3", "/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate, []
    real = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    return real, ["--ro-bind", prefix, prefix]


def _with_grants(loaded: LoadedPolicy, grants: Grants) -> Policy:
    """The policy the sandbox enforces for this run: the base policy plus granted writes."""
    policy = loaded.policy
    if not grants.writes:
        return policy
    paths = policy.paths.model_copy(update={"write": [*policy.paths.write, *grants.writes]})
    return policy.model_copy(update={"paths": paths})


def run_agent(
    *,
    repo: Path,
    argv: list[str],
    base: str = "HEAD",
    policy_file: Path | None = None,
    branch: str | None = None,
    checks: list[list[str]] | None = None,
    grants: Grants | None = None,
    ask: str = "never",
    timeout: int | None = None,
    stdout: int | None = None,
) -> RunResult:
    """Run argv in a sandboxed worktree, commit its result and sign a receipt.

    Raises PolicyError, GitError, KeyFileError before anything is created, and SandboxError
    when bubblewrap cannot build the boundary (what was created is removed again).
    """
    if not argv:
        raise SandboxError("no command to run", hint="gatekeeper run -- CMD [ARG...]")
    grants = grants or Grants()
    paths = discover(repo)
    git_dir = paths.git_dir
    base_commit = rev_parse(git_dir, base)
    loaded = resolve_policy(git_dir, base_commit, policy_file)
    policy = _with_grants(loaded, grants)
    key = load_key()
    run_id = new_run_id()
    branch = branch or f"agent/{run_id}"
    check_branch_name(git_dir, branch)
    limit_s = timeout or policy.limits.timeout

    tty_fd: int | None = None
    if ask == "tty":
        try:
            tty_fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(
                f"--ask tty needs a terminal to ask on ({exc.strerror})",
                hint="run it from a terminal, or use --grant KIND=VALUE to approve in advance",
            ) from None
    wt = create_worktree(git_dir, base_commit, branch, run_id)
    scratch = Path(tempfile.mkdtemp(prefix=f"gatekeeper-run-{run_id}-"))
    process_limit = ProcessLimit(run_id, policy.limits.max_processes)
    sandbox: Sandbox | None = None
    previous: dict[int, object] = {}
    events = scratch / "events.jsonl"
    network: NetworkSession | None = None
    try:
        try:
            private = agentgit.prepare(git_dir, wt.path, base_commit, branch, scratch)
            # The only way out: the launcher's proxy, reached through a socket bound inside.
            network = NetworkSession(policy, grants=grants.network, ask=ask, run_dir=scratch,
                                     project=wt.path, record_grants=False)  # fmt: skip
            net = network.start()
            python, python_binds = bridge_python()
            extra = [*agentgit.sandbox_binds(private, wt.path), *python_binds]
            for source, target in net.binds:
                extra += ["--ro-bind", str(source), target]
            plan = plan_sandbox(
                worktree=wt.path, git_common_dir=git_dir, policy=policy, run_id=run_id,
                scratch=scratch, private_dirs=[config_dir(), worktrees_root(), scratch],
                user_checkout=paths.work_tree, extra_args=extra,
            )  # fmt: skip
            plan.env.update(net.env)
            for name in grants.secrets:
                if name in os.environ:
                    plan.env[name] = os.environ[name]
            config = scratch / "supervisor.json"
            write_config(
                config, events=events, policy=policy, worktree=wt.path,
                scratch=["/tmp", "/var/tmp", plan.env["HOME"], agentgit.SANDBOX_GIT_DIR],
                granted_commands=grants.commands, ask=ask, hidden=plan.hidden,
                bwrap=bwrap_path(), tty_fd=tty_fd, launcher_argv=net.wrap([], python),
                watches=plan.watches,
                scaffold=[wt.path, git_dir, *([paths.work_tree] if paths.work_tree else [])],
                readonly=[str(git_dir), *([str(paths.work_tree)] if paths.work_tree else []),
                          *plan.toolchains],
            )  # fmt: skip
            sandbox = Sandbox(plan, max_file_size=policy.limits.max_file_size,
                              process_limit=process_limit, supervisor_config=config,
                              tty_fd=tty_fd, wrap=lambda a: net.wrap(a, python))  # fmt: skip
        except (SandboxError, PolicyError, UsageError):
            if network is not None:
                network.stop()
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
        try:
            outcome = sandbox.run(argv, deadline=deadline, stdout=stdout)
        except SandboxError:
            # The boundary could not be built: nothing ran, so nothing is kept.
            network.stop()
            remove_worktree(git_dir, run_id, wt.path, branch)
            raise
        check_outcomes: list[Outcome] = []
        for check in checks or []:
            if sandbox.interrupted or outcome.supervisor_failed or time.monotonic() >= deadline:
                break
            try:
                check_outcomes.append(sandbox.run(check, deadline=deadline, stdout=stdout))
            except SandboxError as exc:
                # The agent changed the worktree so that the boundary cannot be rebuilt for the
                # check (a protected file moved away, say): the check failed; the run goes on.
                print(f"gatekeeper: check {check!r} could not start: {exc.message}",
                      file=sys.stderr)  # fmt: skip
                now = time.time()
                check_outcomes.append(Outcome(
                    argv=list(check), pid=None, ppid=0, exit_code=None, signal=None,
                    timed_out=False, interrupted=False, started_at=now, finished_at=now,
                ))  # fmt: skip
        finished = time.time()
        observed = read_events(events)
        for attempt in observed.connects:
            network.record_direct_attempt(str(attempt["host"]), int(attempt["port"]),  # type: ignore[call-overload]
                                          attempt.get("pid"))  # type: ignore[arg-type]
        requests, net_escalations = network.stop()
        observed.escalations.extend(net_escalations)
        denied_destinations = network.denied_summary()
        imported = agentgit.import_commits(git_dir, private, base_commit,
                                           lambda p: is_write_allowed(policy, p))  # fmt: skip
        return _commit_and_sign(
            wt, git_dir, loaded, policy, argv, outcome, check_outcomes, started, finished, key,
            sandbox, process_limit, limit_s, observed, imported, grants, requests,
            denied_destinations,
        )  # fmt: skip
    finally:
        if network is not None:
            network.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        if sandbox is not None:
            sandbox.close()
        process_limit.remove()
        shutil.rmtree(scratch, ignore_errors=True)
        if tty_fd is not None:
            os.close(tty_fd)


def _failed(p: Process) -> bool:
    return p.decision == "allow" and (p.killed or p.exit_code not in (0, None))


def _commit_and_sign(
    wt: Worktree, git_dir: Path, loaded: LoadedPolicy, policy: Policy, argv: list[str],
    outcome: Outcome, check_outcomes: list[Outcome], started: float, finished: float, key,  # type: ignore[no-untyped-def]
    sandbox: Sandbox, process_limit: ProcessLimit, limit_s: int, observed: Observed,
    imported: agentgit.Imported, grants: Grants, network: list[NetworkRequest],
    denied_destinations: list[str],
) -> RunResult:  # fmt: skip
    touched, index = collect_changes(wt, git_dir, start=imported.tip)
    try:
        gitlinks = gitlinks_at(git_dir, imported.tip)
        unsafe = {p: r for _, p in touched if (r := unsafe_reason(wt.path, p, gitlinks))}
        allowed = [p for _, p in touched if is_write_allowed(policy, p) and p not in unsafe]
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
    changes = changes_between(git_dir, wt.base, commit)

    writes = list(observed.writes)
    writes += [Write(path=p, op=_op_for(letter), decision="allow" if p in allowed else "deny",
                     source="commit") for letter, p in touched]  # fmt: skip
    for change in imported.refused_changes or []:
        writes.append(Write(path=change.path, op="commit", decision="deny", source="commit"))
    denied += [c.path for c in imported.refused_changes or []]
    escalations = [Escalation(kind=k, value=v, decision="granted")
                   for k, _, v in (g.partition("=") for g in grants.as_strings)]  # fmt: skip
    escalations += observed.escalations
    processes = observed.processes or [_process(o, wt.path) for o in [outcome, *check_outcomes]]
    denied_paths = sorted({w.path for w in writes if w.decision != "allow"})
    commands = [outcome, *check_outcomes]
    counts = Counts(
        files_touched=len(changes), denied_writes=len(denied_paths),
        escalations=len(escalations),
        commands_run=sum(1 for p in processes if p.decision == "allow"),
        failed_commands=sum(1 for p in processes if _failed(p))
        or sum(1 for o in commands if o.exit_code != 0),
        network_requests=len(network),
    )  # fmt: skip
    supervisor_failed = any(o.supervisor_failed for o in commands) or bool(observed.errors)
    predicate = Predicate(
        run_id=wt.run_id, branch=wt.branch, started_at=_iso(started), finished_at=_iso(finished),
        launcher=f"gatekeeper {__version__}",
        policy=PolicyRef(path=loaded.path, sha256=loaded.sha256,
                         source_commit=loaded.source_commit),
        base=Base(commit=wt.base, tree=tree_of(git_dir, wt.base)),
        command=CommandResult(argv=argv, exit_code=outcome.exit_code),
        checks=[CommandResult(argv=o.argv, exit_code=o.exit_code) for o in check_outcomes],
        processes=processes, writes=writes, network=network, escalations=escalations,
        changes=changes, counts=counts, agent_commits=imported.commits,
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
    statement = make_statement(predicate, commit, tree)
    envelope = sign_statement(statement, key)
    add_receipt_note(git_dir, commit, envelope)

    if any(o.supervisor_failed for o in commands):
        exit_code = SUPERVISOR_FAILED_EXIT
    elif outcome.timed_out:
        exit_code = TIMEOUT_EXIT
    elif outcome.interrupted:
        exit_code = 130
    else:
        exit_code = outcome.exit_code if outcome.exit_code is not None else 1
    return RunResult(
        run_id=wt.run_id, branch=wt.branch, commit=commit, tree=tree, worktree=wt.path,
        base=wt.base, exit_code=exit_code, outcome=outcome, checks=check_outcomes,
        changes=changes, denied=sorted(set(denied)), policy=loaded, hidden=sandbox.plan.hidden,
        writable=sandbox.plan.writable, observed=observed, imported=imported,
        supervisor_errors=observed.errors, supervisor_failed=supervisor_failed,
        network=network, denied_destinations=denied_destinations,
    )  # fmt: skip
