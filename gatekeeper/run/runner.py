"""A whole agent run: prepare, sandbox, checks, commit, sign, clean up (the CLI's `run`)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gatekeeper.errors import GitError, PolicyError, SandboxError, UsageError
from gatekeeper.git import RepoPaths, open_repository
from gatekeeper.policy.model import (
    POLICY_PATH,
    LoadedPolicy,
    Policy,
    load_policy_at,
    load_policy_file,
    policy_warnings,
)
from gatekeeper.receipt.keys import SigningKey, config_dir, load_key
from gatekeeper.receipt.models import ProfileRef, build_validators
from gatekeeper.receipt.redact import Redactor
from gatekeeper.run import agentgit, early
from gatekeeper.run.grants import Grants
from gatekeeper.run.profiles import home_file_binds, profile_environment, profile_grants
from gatekeeper.run.record import Observations, build_predicate, commit_changes, sign_receipt
from gatekeeper.run.records import LiveRun, RunRecord, records_dir
from gatekeeper.run.redaction import (
    redact_observations,
    redact_predicate,
    redactor_for,
)
from gatekeeper.run.result import RunResult, exit_code_of
from gatekeeper.run.resume import Resume, resume_worktree
from gatekeeper.run.worktree import (
    Worktree,
    check_branch_name,
    create_worktree,
    new_run_id,
    remove_tree,
    remove_worktree,
    worktrees_root,
)
from gatekeeper.sandbox import ahead
from gatekeeper.sandbox.ahead import Standby
from gatekeeper.sandbox.launch import Outcome, Sandbox, limit_standby
from gatekeeper.sandbox.limits import ProcessLimit
from gatekeeper.sandbox.machine import randomization_warning
from gatekeeper.sandbox.mounts import (
    bwrap_path,
    bwrap_version,
    plan_sandbox,
    remove_placeholders,
    start_system_search,
)
from gatekeeper.sandbox.net import NetworkSession
from gatekeeper.sandbox.net.classify import HostRule
from gatekeeper.sandbox.programs import resolve_program
from gatekeeper.sandbox.supervise.setup import Observed, read_events, write_config

if TYPE_CHECKING:  # (a profile's models are loaded only for a run given one)
    from gatekeeper.policy.profile import LoadedProfile


def resolve_policy(
    git_dir: Path, base_commit: str, policy_file: Path | None,
    read: Callable[[], bytes | None] | None = None,
) -> LoadedPolicy:  # fmt: skip
    """The run's policy: --policy FILE, else the one committed at the base revision (read:
    gives its bytes, read from git already)."""
    if policy_file is not None:
        return load_policy_file(policy_file)
    loaded = load_policy_at(git_dir, base_commit, read=read)
    if loaded is None:
        raise PolicyError(
            f"no policy at the base revision ({POLICY_PATH} at {base_commit[:12]})",
            hint="run `gatekeeper init` and commit .gatekeeper/, or pass --policy FILE",
        )
    return loaded


def bridge_python() -> tuple[str, list[str]]:
    """An interpreter for the network bridge inside the sandbox, and binds that show it."""
    for candidate in ("/usr/bin/python3", "/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate, []
    real = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    return real, ["--ro-bind", prefix, prefix]


def _with_grants(loaded: LoadedPolicy, grants: Grants) -> Policy:
    """The policy the sandbox enforces for this run: the base policy plus granted writes, and
    the paths a denial in force withholds protected (a write pattern must name one
    explicitly, and no grant does)."""
    policy = loaded.policy
    if not grants.writes and not grants.withheld_writes:
        return policy
    update: dict[str, object] = {"write": [*policy.paths.write, *grants.writes]}
    if grants.withheld_writes:
        update["protected"] = [*policy.paths.protected_patterns, *grants.withheld_writes]
    paths = policy.paths.model_copy(update=update)
    return policy.model_copy(update={"paths": paths})


@dataclass
class Prepared:
    """Everything decided before anything is created: repository, base, policy, key, names."""

    paths: RepoPaths
    base_commit: str
    loaded: LoadedPolicy
    policy: Policy
    key: SigningKey
    run_id: str
    branch: str
    limit_s: int
    grants: Grants
    ask: str
    profile: LoadedProfile | None = None
    program_roots: list[Path] = field(default_factory=list)
    # The package registries the installed tools use, looked up once in the background while
    # the worktree is made (asking npm and pip takes a while), for the agent and its checks.
    registries: Future[dict[str, list[HostRule]]] = field(default_factory=Future)
    resume: Resume | None = None  # `run --resume`: the run this one continues

    @property
    def git_dir(self) -> Path:
        return self.paths.git_dir

    @property
    def passed_env(self) -> list[str]:
        """Variables passed through by name (the policy's pass_env and the profile's)."""
        profile = list(self.profile.profile.pass_env) if self.profile is not None else []
        return [*self.policy.secrets.pass_env, *profile]

    @cached_property
    def redactor(self) -> Redactor:
        """Knows the values of every secret passed into the run (read once, at the start)."""
        return redactor_for(self.grants, self.passed_env)

    def profile_ref(self) -> ProfileRef | None:
        if self.profile is None:
            return None
        p = self.profile.profile
        return ProfileRef(name=p.name, source=self.profile.source, sha256=self.profile.sha256,
                          env=sorted(p.env), pass_env=list(p.pass_env),
                          secrets=list(p.secrets), home_files=sorted(p.home_files),
                          state_files=list(p.state_files))  # fmt: skip


# A Unix socket's path holds at most 107 bytes; the proxy's sockets live in the scratch folder.
_SOCKET_ROOM = 40


def _scratch_parent() -> str | None:
    """Where a run's scratch folder goes: $TMPDIR, unless it is too deep for the proxy's socket
    paths (a deep TMPDIR made `run` fail with "AF_UNIX path too long"); then /tmp."""
    if len(os.fsencode(tempfile.gettempdir())) <= _SOCKET_ROOM:
        return None
    return "/tmp"


def prepare(
    *, repo: Path, argv: list[str], base: str, policy_file: Path | None, branch: str | None,
    grants: Grants, ask: str, timeout: int | None, profile: LoadedProfile | None = None,
    resume: Resume | None = None,
) -> Prepared:  # fmt: skip
    """Resolve the repository, base, policy, key and run names; create nothing yet."""
    if not argv:
        raise SandboxError("no command to run", hint="gatekeeper run -- CMD [ARG...]")
    ahead = early.take(repo, base, policy_file)  # (read while the launcher loaded)
    found = ahead.result() if ahead is not None else early.locate(repo, base, policy_file is None)
    paths, base_commit = found.paths, found.base_commit
    loaded = resolve_policy(paths.git_dir, base_commit, policy_file, read=lambda: found.policy)
    for warning in policy_warnings(loaded.policy):
        print(f"gatekeeper: warning: {loaded.path}: {warning}", file=sys.stderr)
    host = randomization_warning()
    if host is not None:
        print(f"gatekeeper: warning: {host}", file=sys.stderr)
    if profile is not None:
        grants = profile_grants(profile, grants, argv)
    policy = _with_grants(loaded, grants)
    key = load_key()
    run_id = new_run_id()
    if resume is None and branch:
        check_branch_name(paths.git_dir, branch)
    # A name of its own (agent/<run id>) is a valid branch name; the worktree's creation
    # refuses it should it exist.
    branch = branch or f"agent/{run_id}"
    if resume is not None:
        resume.check(paths.git_dir)  # a resumed run continues on the run's own branch
    search = os.environ.get("PATH") or "/usr/bin:/bin"
    program = resolve_program(argv[0], path_var=search, cwd=paths.work_tree or paths.git_dir,
                              private=[config_dir()])  # fmt: skip
    # Never a program or file in the worktrees, the user's checkout or the git dir.
    avoid = [worktrees_root(), paths.git_dir, *([paths.work_tree] if paths.work_tree else [])]
    lookup = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gatekeeper-registries")
    # The tools' answers are kept between runs while what they came from is unchanged.
    cache = config_dir() / "cache" / "registries.json"
    registries = lookup.submit(_registry_sources, policy.network.registries, avoid, cache)
    lookup.shutdown(wait=False)
    return Prepared(paths, base_commit, loaded, policy, key, run_id, branch,
                    timeout or policy.limits.timeout, grants, ask, profile,
                    program.roots, registries, resume)  # fmt: skip


def _registry_sources(
    policy_registries: list[str], avoid: list[Path], cache: Path
) -> dict[str, list[HostRule]]:
    """registries.registry_sources, its module (and the parsers of the tools' configuration
    files it reads) loaded here, on the lookup's thread, while the run is prepared."""
    from gatekeeper.sandbox.net.registries import registry_sources

    return registry_sources(policy_registries, None, avoid, cache)


def open_tty(ask: str) -> int | None:
    """The launcher's terminal for `--ask tty`; raise UsageError when there is none."""
    if ask != "tty":
        return None
    try:
        return os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(
            f"--ask tty needs a terminal to ask on ({exc.strerror})",
            hint="run it from a terminal, or use --grant KIND=VALUE to approve in advance",
        ) from None


def glob_escape(path: str) -> str:
    """path as a gitignore line that matches only itself."""
    return "".join(f"\\{c}" if c in "*?[]\\!# " else c for c in path)


@dataclass
class Boundary:
    """The sandbox built for one run and what runs beside it."""

    sandbox: Sandbox
    network: NetworkSession
    private: agentgit.PrivateGit
    events: Path


def build_sandbox(
    run: Prepared, wt: Worktree, scratch: Path, process_limit: ProcessLimit, tty_fd: int | None,
    on_network: list[NetworkSession], head: str | None = None, standby: Standby | None = None,
) -> Boundary:  # fmt: skip
    """The private git dir, the network proxy, the mount plan and the supervisor's config.

    head is the commit the worktree holds (the base for the agent, the result for checks).
    """
    git_dir, policy, paths = run.git_dir, run.policy, run.paths
    events = scratch / "events.jsonl"
    private = agentgit.prepare(git_dir, wt.path, head or run.base_commit, run.branch, scratch,
                               exact=wt.layered)  # fmt: skip
    # The only way out: the launcher's proxy, reached through a socket bound inside.
    network = NetworkSession(policy, grants=run.grants.network, ask=run.ask, run_dir=scratch,
                             sources=run.registries.result(),
                             record_grants=False)  # fmt: skip
    on_network.append(network)
    net = network.start()
    python, python_binds = bridge_python()
    extra = [*agentgit.sandbox_binds(private, wt.path), *python_binds]
    home = os.path.realpath(os.environ.get("HOME") or "/root")  # the plan's HOME, fresh inside
    if run.profile is not None:
        extra += home_file_binds(run.profile, scratch, home)
    for source, target in net.binds:
        extra += ["--ro-bind", str(source), target]
    plan = plan_sandbox(
        worktree=wt.path, git_common_dir=git_dir, policy=policy, run_id=run.run_id,
        scratch=scratch, private_dirs=[config_dir(), worktrees_root(), scratch],
        user_checkout=paths.work_tree, extra_args=extra, programs=run.program_roots,
        walk_cache=wt.walk_cache, write_files=run.grants.file_writes,
    )  # fmt: skip
    plan.env.update(net.env)
    if plan.stand_ins:
        # Empty read-only stand-ins that hold protected names: not work for the agent's git.
        info = private.path / "info"
        info.mkdir(exist_ok=True)
        (info / "exclude").write_text("".join(f"/{glob_escape(rel)}\n" for rel in plan.stand_ins))
    if run.profile is not None:
        if plan.env.get("HOME") != home:
            raise SandboxError(f"the sandbox's HOME is {plan.env.get('HOME')}, not {home}")
        plan.env.update(profile_environment(run.profile, home))
    for name in run.grants.secrets:
        if name in os.environ:
            plan.env[name] = os.environ[name]
    config = scratch / "supervisor.json"
    write_config(
        config, events=events, policy=policy, worktree=wt.path,
        scratch=["/tmp", "/var/tmp", home, agentgit.SANDBOX_GIT_DIR],
        granted_commands=run.grants.commands, exact_commands=run.grants.exact_commands,
        ask=run.ask, hidden=plan.hidden,
        bwrap=bwrap_path(), tty_fd=tty_fd, launcher_argv=net.wrap([], python),
        watches=plan.watches,
        scaffold=[wt.path, git_dir, *([paths.work_tree] if paths.work_tree else [])],
        home=home,
        readonly=[str(git_dir), *([str(paths.work_tree)] if paths.work_tree else []),
                  *plan.toolchains],
    )  # fmt: skip
    sandbox = Sandbox(plan, max_file_size=policy.limits.max_file_size,
                      process_limit=process_limit, supervisor_config=config,
                      tty_fd=tty_fd, wrap=lambda a: net.wrap(a, python),
                      standby=standby)  # fmt: skip
    sandbox.output_secrets = [v.encode() for v in run.redactor.values]
    return Boundary(sandbox, network, private, events)


@contextmanager
def stop_on_signals(sandbox: Sandbox) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the sandbox; the result is still committed and signed."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if sandbox.interrupted:  # a second interrupt: stop waiting altogether
            print(f"\ngatekeeper: interrupted again (signal {signum}): stopping without "
                  "committing or signing the result", file=sys.stderr)  # fmt: skip
            raise KeyboardInterrupt(SECOND_INTERRUPT)
        sandbox.interrupted = True
        sandbox.interrupted_by = signum
        print(f"\ngatekeeper: stopping the run (signal {signum}); the result is still "
              "committed and signed (interrupt again to stop without that)",
              file=sys.stderr)  # fmt: skip
        sandbox.kill()

    previous = {
        s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def checkout_result(git_dir: Path, commit: str, dest: Path) -> None:
    """Check commit out into the new folder dest, for checks: the repository's index and
    worktrees are not touched, and no filter program runs (libgit2 checks out)."""
    import pygit2  # only for checks: a run without them never loads libgit2

    try:
        repo = open_repository(git_dir)
        tree = repo[commit].peel(pygit2.Tree)
        dest.mkdir(mode=0o700)
        strategy = pygit2.enums.CheckoutStrategy
        repo.checkout_tree(tree, directory=str(dest),
                           strategy=strategy.FORCE | strategy.DONT_UPDATE_INDEX)  # fmt: skip
    except (pygit2.GitError, KeyError) as exc:
        raise OSError(f"libgit2: {exc}") from exc
    # A placeholder for the worktree's .git link; the private git dir's is bound over it.
    (dest / ".git").write_text("gitdir: /nonexistent\n")


def _failed_to_start(check: list[str], why: str) -> Outcome:
    print(f"gatekeeper: check {check!r} could not start: {why}", file=sys.stderr)
    now = time.time()
    return Outcome(argv=list(check), pid=None, ppid=0, exit_code=None, signal=None,
                   timed_out=False, interrupted=False, started_at=now, finished_at=now)  # fmt: skip


def run_checks(
    run: Prepared, commit: str, checks: list[list[str]], seen: Observations, scratch: Path,
    process_limit: ProcessLimit, tty_fd: int | None, on_network: list[NetworkSession],
    deadline: float, stdout: int | None, stopped: Callable[[], bool] = lambda: False,
) -> None:  # fmt: skip
    """Each --check on the committed result, in a fresh worktree and sandbox of its own.

    The checks never see the agent's worktree: only what was committed, checked out anew, with
    a mount plan computed for that checkout. What a check writes is thrown away with its
    worktree; its exit code, processes, network requests and refusals go into seen.
    """
    first = seen.outcome
    for number, check in enumerate(checks, 1):
        if first.interrupted or first.supervisor_failed or stopped():
            break
        if time.monotonic() >= deadline:
            break
        where = scratch / f"check-{number}"
        tree = where / "tree"
        try:
            where.mkdir()
            checkout_result(run.git_dir, commit, tree)
        except OSError as exc:
            seen.checks.append(_failed_to_start(check, f"no checkout of the result: {exc}"))
            remove_tree(where)
            continue
        wt = Worktree(run.run_id, run.branch, tree, where, commit)
        try:
            boundary = build_sandbox(run, wt, where, process_limit, tty_fd, on_network,
                                     head=commit)  # fmt: skip
        except (SandboxError, PolicyError) as exc:
            # The result holds something the boundary cannot be built over (a write entry
            # that now leads through a symlink, say): the check failed; the run goes on.
            seen.checks.append(_failed_to_start(check, exc.message))
            remove_tree(where)
            continue
        try:
            with stop_on_signals(boundary.sandbox):
                try:
                    outcome = boundary.sandbox.run(check, deadline=deadline, stdout=stdout)
                except SandboxError as exc:
                    outcome = _failed_to_start(check, exc.message)
            seen.checks.append(outcome)
            _merge_check_record(seen, boundary, outcome)
        finally:
            boundary.network.stop()
            boundary.sandbox.close()
            remove_tree(where)
        if outcome.interrupted or outcome.supervisor_failed:
            break
    seen.finished = time.time()


def _record_direct_attempts(network: NetworkSession, observed: Observed) -> None:
    """Log the supervisor's `connect` events (connects, datagrams and TCP Fast Open sends to
    outside addresses) as refused direct attempts; `via` names the call, as the method."""
    for attempt in observed.connects:
        pid, via, last = attempt.get("pid"), attempt.get("via"), attempt.get("last_time")
        first = str(attempt.get("time") or "") or None
        count = int(attempt.get("count") or 1)  # type: ignore[call-overload]
        if attempt.get("more"):  # past the destinations the supervisor's record lists
            network.count_unlisted_attempts(count, first, None if last is None else str(last))
            continue
        network.record_direct_attempt(
            str(attempt["host"]), int(str(attempt["port"])), pid if isinstance(pid, int) else None,
            method=None if via is None else str(via), time=first, count=count,
            last_time=None if last is None else str(last),
        )  # fmt: skip


def _merge_check_record(seen: Observations, boundary: Boundary, outcome: Outcome) -> None:
    """Add what the supervisor and the proxy saw of one check to the run's observations."""
    observed = read_events(boundary.events)
    outcome.take_signal(observed)
    network = boundary.network
    _record_direct_attempts(network, observed)
    requests, escalations = network.stop()
    observed.escalations.extend(escalations)
    seen.observed.take(observed)
    seen.network.extend(requests)
    seen.denied_destinations.extend(
        d for d in network.denied_summary() if d not in seen.denied_destinations
    )


def gather(
    run: Prepared, boundary: Boundary, argv: list[str], outcome: Outcome,
    checks: list[Outcome], started: float,
) -> Observations:  # fmt: skip
    """After the sandbox: the supervisor's events, the proxy's log, the agent's own commits."""
    finished = time.time()
    observed = read_events(boundary.events)
    outcome.take_signal(observed)
    network = boundary.network
    _record_direct_attempts(network, observed)
    errors: list[str] = []
    lost = network.bridge_lost(outcome.finished_at)
    if lost is not None:
        errors.append(
            f"the network bridge inside the sandbox ended {outcome.finished_at - lost:.1f} s "
            "before the sandbox did (killed?); the agent had no network from then"
        )
    requests, net_escalations = network.stop()
    observed.escalations.extend(net_escalations)
    # Never raises: whatever the agent left in its git dir is imported or refused with a reason.
    imported = agentgit.import_commits(run.git_dir, boundary.private, run.base_commit,
                                       run.policy.allows_write,
                                       max_bytes=run.policy.limits.max_added_bytes)  # fmt: skip
    return Observations(argv, outcome, checks, started, finished, observed, imported, requests,
                        network.denied_summary(), errors=errors,
                        registries=network.registries_found())  # fmt: skip


def commit_and_sign(
    run: Prepared, wt: Worktree, boundary: Boundary, seen: Observations,
    process_limit: ProcessLimit, on_committed: Callable[[str], None] | None = None,
) -> RunResult:  # fmt: skip
    """Commit the result, write the receipt from what was observed, sign and store it.

    on_committed runs between the commit and the receipt with the result commit (the checks
    run there, and add what they did to seen).
    """
    state = tuple(run.profile.profile.state_files) if run.profile is not None else ()
    committed = commit_changes(wt, run.git_dir, run.policy, seen.argv, seen.outcome,
                               seen.imported, agent_state=state)  # fmt: skip
    if on_committed is not None:
        on_committed(committed.commit)  # the checks: the predicate below is redacted whole
    sandbox = boundary.sandbox
    predicate = build_predicate(
        wt=wt, git_dir=run.git_dir, loaded=run.loaded, policy=run.policy, seen=seen,
        committed=committed, grants=run.grants, sandbox=sandbox, process_limit=process_limit,
        limit_s=run.limit_s,
    )  # fmt: skip
    redactor = run.redactor
    resumed = run.resume.predicate_fields() if run.resume is not None else {}
    predicate = redact_predicate(predicate.model_copy(update={"profile": run.profile_ref(),
                                                              **resumed}),
                                 redactor)  # fmt: skip
    sign_receipt(run.git_dir, predicate, committed, run.key)
    commands = [seen.outcome, *seen.checks]
    return RunResult(
        run_id=wt.run_id, branch=wt.branch, commit=committed.commit, tree=committed.tree,
        worktree=wt.path, base=wt.base, exit_code=exit_code_of(seen.outcome, commands),
        outcome=seen.outcome, checks=seen.checks, changes=committed.changes,
        denied=sorted(set(committed.denied)), policy=run.loaded, hidden=sandbox.plan.hidden,
        writable=sandbox.plan.writable, observed=seen.observed, imported=seen.imported,
        supervisor_errors=seen.observed.errors,
        supervisor_failed=any(o.supervisor_failed for o in commands) or bool(seen.observed.errors),
        network=seen.network, denied_destinations=seen.denied_destinations,
        not_committed=dict(sorted(committed.not_committed.items())),
        launcher_errors=list(predicate.launcher_errors),
        grants=run.grants.as_strings,
        profile=None if run.profile is None else {
            "name": run.profile.profile.name, "source": run.profile.source,
            "sha256": run.profile.sha256},
        redactor=redactor,
        ignored=committed.ignored,
        escalations=list(predicate.escalations),
    )  # fmt: skip


SECOND_INTERRUPT = "interrupted a second time, before the result was committed and signed"


def _reason(exc: BaseException, *places: Path) -> str:
    """exc for a run's record: its start and its end (where git's own message is), bounded;
    and, when one of places lies on a disk with no room left, that (git often says only that
    it "couldn't write" a file)."""
    if isinstance(exc, KeyboardInterrupt):
        return str(exc) or "interrupted before the result was committed and signed"
    text = f"{type(exc).__name__}: {exc}".strip()
    text = text if len(text) <= 600 else f"{text[:200]} ... {text[-400:]}"
    for place in places:
        try:
            usage = shutil.disk_usage(place)
        except OSError:
            continue
        if usage.free < FULL_DISK_BYTES:
            return f"no space left on the disk of {place} ({usage.free} bytes free): {text}"
    return text


# Less than this free, a disk counts as full in a failed run's reason.
FULL_DISK_BYTES = 1 << 20


def _failure_of(result: RunResult) -> str | None:
    """Why a run that reached its receipt still failed (its record says so), or None."""
    if result.supervisor_failed:
        return ("the syscall supervisor stopped, and the sandbox with it; what the agent did up "
                "to then is committed and signed")  # fmt: skip
    if result.launcher_errors:
        return "; ".join(result.launcher_errors)[:500]
    return None


def _start_aside(thread: threading.Thread) -> None:
    """Start thread, work done ahead of need: without a thread to spare (the system's limit),
    it is done when first needed instead."""
    try:
        thread.start()
    except RuntimeError:
        pass


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
    profile: LoadedProfile | None = None,
    resume: Resume | None = None,
) -> RunResult:
    """Run argv in a sandboxed worktree, commit its result and sign a receipt.

    Raises PolicyError, GitError, KeyFileError before anything is created, and SandboxError
    when bubblewrap cannot build the boundary (what was created is removed again).
    """
    start_system_search(repo)
    # The supervisor of the agent's sandbox starts now, on another core, while the run is
    # prepared; closed unused if the run ends before its sandbox.
    standby = ahead.take()
    try:
        return _run_agent(standby, repo=repo, argv=argv, base=base, policy_file=policy_file,
                          branch=branch, checks=checks, grants=grants, ask=ask,
                          timeout=timeout, stdout=stdout, profile=profile,
                          resume=resume)  # fmt: skip
    finally:
        standby.close()


def _run_agent(
    standby: Standby,
    *,
    repo: Path,
    argv: list[str],
    base: str,
    policy_file: Path | None,
    branch: str | None,
    checks: list[list[str]] | None,
    grants: Grants | None,
    ask: str,
    timeout: int | None,
    stdout: int | None,
    profile: LoadedProfile | None,
    resume: Resume | None,
) -> RunResult:
    run = prepare(repo=repo, argv=argv, base=base, policy_file=policy_file, branch=branch,
                  grants=grants or Grants(), ask=ask, timeout=timeout,
                  profile=profile, resume=resume)  # fmt: skip
    tty_fd = open_tty(ask)
    # The record and its lock come first: `discard` never takes a live run's worktree.
    record = RunRecord(run.run_id, run.branch, run.base_commit, "", time.time(),
                       resumed_from=resume.run_id if resume else None)  # fmt: skip
    try:
        live = LiveRun(run.git_dir, record)
    except OSError as exc:  # a repository this user may read but not write
        raise GitError(
            f"cannot record the run in {records_dir(run.git_dir)}: {exc.strerror or exc}",
            hint="a run adds its record, branch, worktree and receipt to the repository's git "
            "folder: run gatekeeper as a user who may write there (its owner)",
        ) from None
    try:
        wt = (create_worktree(run.git_dir, run.base_commit, run.branch, run.run_id)
              if resume is None else resume_worktree(run.git_dir, resume, run.run_id))  # fmt: skip
    except BaseException:
        live.forget()
        raise
    live.update(worktree=str(wt.path))
    scratch = Path(tempfile.mkdtemp(prefix=f"gatekeeper-run-{run.run_id}-", dir=_scratch_parent()))
    process_limit = ProcessLimit(run.run_id, run.policy.limits.max_processes)
    # The standby supervisor joins the run's limits now, while the sandbox is planned.
    standby.prepare(lambda pid: limit_standby(pid, process_limit))
    started_network: list[NetworkSession] = []
    boundary: Boundary | None = None

    def discard_unstarted() -> None:
        # The boundary could not be built: nothing ran, so nothing is kept.
        for network in started_network:
            network.stop()
        # A resumed run's branch is the earlier run's: it stays.
        remove_worktree(run.git_dir, run.run_id, wt.path, run.branch if resume is None else None)
        live.forget()

    try:
        try:
            boundary = build_sandbox(run, wt, scratch, process_limit, tty_fd, started_network,
                                     standby=standby)  # fmt: skip
        except (SandboxError, PolicyError, UsageError):
            discard_unstarted()
            raise
        with stop_on_signals(boundary.sandbox):
            started = time.time()
            deadline = time.monotonic() + run.limit_s
            # The receipt's validators are built (and bubblewrap's version asked) while the
            # agent runs (the launcher waits): once the sandbox is under way, not before,
            # where they would hold the interpreter while the sandbox is started.
            bwrap = boundary.sandbox.bwrap

            def ahead_of_receipt() -> None:
                build_validators()
                bwrap_version(bwrap)  # (the receipt names it)

            validators = threading.Thread(target=ahead_of_receipt, name="gatekeeper-models",
                                          daemon=True)  # fmt: skip
            try:
                outcome = boundary.sandbox.run(
                    argv, deadline=deadline, stdout=stdout,
                    on_start=lambda: _start_aside(validators),
                )  # fmt: skip
            except SandboxError:
                discard_unstarted()
                raise
            finally:
                if validators.ident is not None:
                    validators.join()
            # What the launcher created for write entries and the agent left empty goes.
            remove_placeholders(boundary.sandbox.plan)
            seen = gather(run, boundary, argv, outcome, [], started)
            seen = redact_observations(seen, run.redactor)  # the commit message quotes argv
            agent_sandbox = boundary.sandbox

            def check_result(commit: str) -> None:
                # Checks run on the committed result, each in a fresh worktree (never the
                # agent's); an interrupt stops the check, and the receipt is still signed.
                run_checks(run, commit, checks or [], seen, scratch, process_limit, tty_fd,
                           started_network, deadline, stdout,
                           stopped=lambda: agent_sandbox.interrupted)  # fmt: skip

            result = commit_and_sign(run, wt, boundary, seen, process_limit,
                                     on_committed=check_result)  # fmt: skip
            failure = _failure_of(result)
            live.finish(state="failed" if failure else "finished", commit=result.commit,
                        exit_code=result.exit_code, reason=failure)  # fmt: skip
            return result
    except BaseException as exc:
        if live.record.state == "running":
            try:
                live.finish(state="failed", reason=_reason(exc, run.git_dir, wt.path))
            except OSError as record_error:  # the run failed either way; say both
                print(f"gatekeeper: could not record the run's failure: {record_error}",
                      file=sys.stderr)  # fmt: skip
        raise
    finally:
        live.release()
        for network in started_network:
            network.stop()
        if boundary is not None:
            boundary.sandbox.close()
        try:
            standby.close()  # (unused: the sandbox was never built) before its cgroup goes
        finally:
            process_limit.remove()
        # The agent's private git dir is in there, read-only folders and all.
        remove_tree(scratch)
        if tty_fd is not None:
            os.close(tty_fd)
