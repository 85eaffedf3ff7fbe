"""`gatekeeper run`: a sandboxed agent run with a signed receipt."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gatekeeper.errors import ReceiptError, UsageError
from gatekeeper.policy.patterns import check_pattern, has_glob, is_write_allowed, normalize
from gatekeeper.proc import signal_name
from gatekeeper.receipt.approval import is_literal_write, made_folders
from gatekeeper.receipt.models import UsedApproval
from gatekeeper.receipt.redact import Redactor
from gatekeeper.run.grants import Grants, parse_grants
from gatekeeper.run.result import RunResult
from gatekeeper.run.resume import Resume
from gatekeeper.run.runner import run_agent
from gatekeeper.sandbox.supervise.display import escape
from gatekeeper.text import short_command

if TYPE_CHECKING:
    from gatekeeper.commands.approvals import FoundRun


TERMINAL_RESET = "\x18\x1b\\\x1b[0m"  # CAN, ST, SGR 0


def _summary(result: RunResult) -> list[str]:
    lines = [f"run       {result.run_id}", f"branch    {result.branch} ({result.commit[:12]})",
             f"worktree  {result.worktree}"]  # fmt: skip
    outcome = result.outcome
    status = (
        "timed out"
        if outcome.timed_out
        else (
            f"interrupted by {signal_name(outcome.interrupted_by) or 'a signal'}"
            if outcome.interrupted
            else f"exit {outcome.exit_code}"
        )
    )
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
    pending = [e for e in result.escalations if e.decision == "pending"]
    for escalation in pending[:40]:
        if escalation.kind in ("write", "secret", "external-write"):
            why = {"write": "a write outside the write set, refused",
                   "secret": "a hidden secret was looked up",
                   "external-write": "never runs inside; the person performs it after review",
                   }[escalation.kind]  # fmt: skip
            lines.append(f"pending   {escalation.kind} `{escalation.value}`: {why} "
                         f"[{escalation.id}]")  # fmt: skip
        else:
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
    # Paths, argv and values come from the agent: nothing of theirs may steer the terminal
    # (each line escaped by the caller, after masking).
    return lines


def _add(into: list[str], value: str) -> None:
    if value not in into:
        into.append(value)


def _chain_approvals(repo: Path, found: FoundRun) -> tuple[list[UsedApproval], list[str], set[str]]:
    """The approvals in force now on found's run and on the runs it resumed, less any kind and
    value a decision in force on one of them denies; the write paths so denied; and the
    approved write paths the run tried to make as folders (an approval of one covers what
    lies below it; of a path the agent wrote as a file, that file only).

    Each resumed run is found through its verified receipt on the base commit, as the gate
    follows the chain; never from the list of approvals a receipt says were used, which
    stays as it was when that run started (a later denial would not show there).
    """
    # Only a resumed run needs the gate's rules: `run` does not load the gate otherwise.
    from gatekeeper.commands.approvals import find_run
    from gatekeeper.gate.approvals import MAX_RESUME_DEPTH

    approved: list[UsedApproval] = []
    denied: set[tuple[str, str]] = set()
    folders: set[str] = set()
    run, seen = found, {found.run_id}
    for _ in range(MAX_RESUME_DEPTH + 1):
        made = made_folders(run.statement)
        for d in run.in_force().values():
            if d.decision != "approved":
                denied.add((d.kind, d.value))
                continue
            if d.kind == "write" and has_glob(d.value) and is_literal_write(run.statement, d.value):
                # A path the agent tried whose name holds glob characters: a grant would be
                # read as a pattern, wider than the one path approved.
                print(escape(f"gatekeeper: approval of write `{d.value}` (a path with glob "
                             "characters in its name) grants nothing inside a run; the gate "
                             "still honours it for that path"), file=sys.stderr)  # fmt: skip
                continue
            if d.kind == "write" and d.value in made:
                folders.add(d.value)
            approved.append(UsedApproval(run_id=run.run_id, id=d.id, kind=d.kind, value=d.value,
                                         signer=d.signer.keyid,
                                         envelope_sha256=d.envelope_sha256))  # fmt: skip
        previous = run.statement.predicate.resumed_from
        if not previous or previous in seen:
            break
        seen.add(previous)
        base = run.statement.predicate.base.commit
        earlier: FoundRun | None = None
        try:
            earlier = find_run(repo, base)
            why = f"the receipt on its result {base[:12]} is run {earlier.run_id}'s"
        except (ReceiptError, UsageError) as exc:
            why = exc.message
        if earlier is None or earlier.run_id != previous:
            print(escape(f"gatekeeper: run {run.run_id} resumed run {previous}, whose "
                         f"approvals are not carried over: {why}"), file=sys.stderr)  # fmt: skip
            break
        run = earlier
    kept = [a for a in approved if (a.kind, a.value) not in denied]
    return kept, sorted(value for kind, value in denied if kind == "write"), folders


def _names_exactly(path: str) -> bool:
    """Whether path, read as a write pattern, names that one path as it is (no glob
    characters, nothing normalize() would change)."""
    return check_pattern(path) is None and not has_glob(path) and normalize(path) == path


def _covered_by(paths: list[str]) -> Callable[[str], list[str]]:
    """The paths a write pattern grants, as a function of the pattern: one that names a path
    exactly grants it and what lies below, found in a table of the paths' folders (thousands
    of approvals against thousands of denials would be millions of matches); any other is
    matched path by path."""
    below: dict[str, list[str]] = {}
    for path in paths:
        if is_write_allowed(("**",), (), path):  # (never a path with a `.git` segment)
            parts = path.split("/")
            for end in range(1, len(parts) + 1):
                below.setdefault("/".join(parts[:end]), []).append(path)

    def covered(pattern: str) -> list[str]:
        if not paths:
            return []
        if _names_exactly(pattern) and pattern != ".":
            return below.get(pattern, [])
        return [v for v in paths if is_write_allowed((pattern,), (), v)]

    return covered


def resume_from(repo: Path, spec: str, grants: Grants) -> tuple[Resume, list[str]]:
    """The run spec names, with its approved escalations added to grants, and its command.

    An approval grants what `--grant` would: a write pattern, a command, a destination, a
    secret by its variable name. Approvals still in force on the runs the resumed run itself
    resumed carry over (_chain_approvals). Raise UsageError or ReceiptError when there is no
    such run.
    """
    from gatekeeper.commands.approvals import find_run

    found = find_run(repo, spec)
    used, denied_writes, folders = _chain_approvals(repo, found)
    # A denied path stays unwritten in this run, also inside a folder an approval grants
    # (approved `docs`, denied `docs/secret.txt`): protected for the run. One a pattern cannot
    # name as it is (glob characters, blanks at an end) cannot be withheld so: the approvals
    # that would grant it grant nothing inside the run instead.
    unnamed: list[str] = []
    withheld = dict.fromkeys(grants.withheld_writes)  # (a chain may deny thousands)
    for value in denied_writes:
        if _names_exactly(value):
            withheld[value] = None
        else:
            unnamed.append(value)
    grants.withheld_writes = list(withheld)
    taken: list[UsedApproval] = []
    covered = _covered_by(unnamed)
    for a in used:
        covers = covered(a.value) if a.kind == "write" else []
        if covers:
            print(escape(f"gatekeeper: approval of write `{a.value}` grants nothing inside a "
                         f"run: a denial in force names `{covers[0]}` in it, a path a write "
                         "pattern cannot name exactly; the gate still honours the approval"),
                  file=sys.stderr)  # fmt: skip
            continue
        if a.kind == "write" and _names_exactly(a.value):
            _add(grants.writes, a.value)
            if a.value not in folders:
                _add(grants.file_writes, a.value)
        elif a.kind == "write" and check_pattern(a.value) is None:
            # A path the agent tried that a pattern cannot name as it is (blanks at its ends,
            # a trailing `/`): normalised, the grant would be another path than the one
            # approved.
            print(escape(f"gatekeeper: approval of write `{a.value}` (a path a write "
                         "pattern cannot name exactly) grants nothing inside a run; the gate "
                         "still honours it for that path"), file=sys.stderr)  # fmt: skip
            continue
        elif a.kind == "command":
            # Exactly the command line approved: not a pattern that covers others.
            _add(grants.exact_commands, a.value)
        elif a.kind == "network":
            _add(grants.network, a.value)
        elif a.kind == "secret" and a.value.replace("_", "").isalnum():
            _add(grants.secrets, a.value)  # a variable, by name; a file stays hidden
        else:
            print(escape(f"gatekeeper: approval of {a.kind} `{a.value}` grants nothing inside "
                         "a run (the person performs it)"), file=sys.stderr)  # fmt: skip
            continue
        taken.append(a)
    # An approved file with another approved path below it (`a/b`, then `a`): the run would
    # make `a` a folder for `a/b`, and a grant of `a` would open all of it. Only the paths
    # below are granted; the gate still honours the file's approval for that file.
    below = {w.rpartition("/")[0] for w in grants.writes}
    folders_of = {"/".join(f.split("/")[:n]) for f in below for n in range(1, f.count("/") + 2)}
    for value in [f for f in grants.file_writes if f in folders_of]:
        grants.file_writes.remove(value)
        grants.writes.remove(value)
        taken = [a for a in taken if not (a.kind == "write" and a.value == value)]
        print(escape(f"gatekeeper: approval of write `{value}` (a file) grants nothing inside a "
                     "run: another approved path lies below it; the gate still honours it for "
                     "that file"), file=sys.stderr)  # fmt: skip
    p = found.statement.predicate
    return Resume(found.run_id, p.branch, found.commit, taken), list(p.command.argv)


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
    resume: str | None = None,
) -> int:
    parsed = parse_grants(grants or [])
    resumed: Resume | None = None
    if resume is not None:
        if branch is not None or base != "HEAD":
            raise UsageError("--resume continues the run's own branch from its result; "
                             "leave out --branch and --base")  # fmt: skip
        resumed, previous_argv = resume_from(repo, resume, parsed)
        argv = argv or previous_argv
        base, branch = resumed.commit, resumed.branch
    if not argv:
        raise UsageError("no command to run", hint="gatekeeper run [OPTIONS] -- CMD [ARG...]")
    loaded_profile = None
    if profile:  # (a profile's models are loaded only for a run given one)
        from gatekeeper.policy.profile import load_profile

        loaded_profile = load_profile(profile)
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
        stdout=sys.stderr.fileno() if json_out else None, resume=resumed,
    )  # fmt: skip
    # Secrets passed in never reach what the launcher prints (paths, hosts, argv included).
    redactor = result.redactor or Redactor()
    if json_out:
        keep = frozenset({"changes", "commit", "tree", "base", "run_id", "branch", "worktree",
                          "agent_commits", "receipt"})  # fmt: skip
        print(json.dumps(redactor.data(result.as_json(), keep), indent=2))
    else:
        if sys.stderr.isatty():
            # The agent's own output went to this terminal as it was: end any escape sequence
            # it left open (CAN, ST) and its attributes (concealed, black on black), so the
            # summary below is read as written.
            sys.stderr.write(TERMINAL_RESET)
        lines = _summary(result)
        # Masked before escaping too: a passed-in secret holding a control character or a
        # backslash would otherwise be shown in its escaped form, unmasked.
        print("\n".join(redactor.text(escape(redactor.text(line))) for line in lines),
              file=sys.stderr)  # fmt: skip
    return result.exit_code
