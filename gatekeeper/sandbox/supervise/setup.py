"""What the launcher hands the supervisor (a JSON file), and what it reads back (JSON lines)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.policy.model import Policy
from gatekeeper.proc import signal_name
from gatekeeper.receipt.models import (
    PROCESSES,
    WRITES,
    Escalation,
    Process,
    Write,
    escalation_id,
)
from gatekeeper.sandbox.secrets import SECRET_NAMES
from gatekeeper.sandbox.supervise.policing import PSEUDO_ROOTS
from gatekeeper.sandbox.supervise.rules import names_git, split_rule

# Folders of a fresh HOME that tools create entries in (XDG data, state, config and cache).
HOME_TOOL_DIRS = (".local", ".local/share", ".local/state", ".config", ".cache")


def _scaffold(mount_points: list[Path], scratch: list[str], home: str | None) -> list[str]:
    """Folders bwrap made in scratch space (/tmp, HOME) to hold mount points, where a new entry
    is a write next to the worktree, the checkout or the git dir, refused and recorded.

    HOME itself, its ancestors and the folders tools keep their state in stay ordinary scratch
    space, also when they lead to the worktrees (which live under HOME by default).
    """
    free: set[str] = set()
    if home:
        base = Path(home)
        free = {str(base), *(str(a) for a in base.parents)}
        free |= {str(base / d) for d in HOME_TOOL_DIRS}
    return sorted({str(a) for p in mount_points for a in p.parents
                   if any(str(a).startswith(r.rstrip("/") + "/") for r in scratch)
                   and str(a) not in free})  # fmt: skip


# Where a rule's bare name is looked for, besides the launcher's PATH (the sandbox's comes
# from it): the system's own folders.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _folders(search: str | None) -> list[str]:
    """The absolute folders of search (default: PATH and the system's folders), once each."""
    text = search if search is not None else f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}"
    return list(dict.fromkeys(f for f in text.split(":") if f.startswith("/")))


def _bare_names(rules: list[str]) -> list[str]:
    """The programs rules name by a bare name (`sh`, not `/bin/sh` or `./sh`), once each."""
    heads = (split_rule(rule)[:1] for rule in rules)
    return list(dict.fromkeys(h[0] for h in heads
                              if h and "/" not in h[0] and h[0] not in (".", "..")))  # fmt: skip


def rule_programs(
    rules: list[str], search: str | None = None, gits: list[str] | None = None
) -> tuple[dict[str, list[str]], list[list[object]]]:
    """What the program files rules name by a bare name are, found in any folder of search
    (default: PATH and the system's folders), in one pass:

    - {program file: the bare names that lead to it}, for names that are links to a file of
      another name (`sh` -> /usr/bin/dash): a rule names that program, however an exec calls
      it;
    - [device, inode, the bare names that find it] of each such file, and of each file a
      rule names by its full path (with that path; for a path to git, each of gits, git's
      own program files): a hard link of it elsewhere, under any name (`perl5.36.0` is
      `perl`), is that program.
    """
    programs: dict[str, list[str]] = {}
    ids: dict[tuple[int, int], list[str]] = {}
    # A rule naming a program by its full path names that file too, by any other name; one
    # naming git by a path names each of git's own program files (gits).
    for path in dict.fromkeys(h[0] for h in (split_rule(r)[:1] for r in rules)
                              if h and h[0].startswith("/")):  # fmt: skip
        files = [path, *(gits or [])] if _names_git(path) else [path]
        for file in files:
            try:
                st = os.stat(file)
            except (OSError, ValueError):
                continue
            if stat.S_ISREG(st.st_mode):
                ids.setdefault((st.st_dev, st.st_ino), []).append(path)
    for name in _bare_names(rules):
        for folder in _folders(search):
            candidate = os.path.join(folder, name)
            try:
                st = os.stat(candidate)
            except (OSError, ValueError):
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            ids.setdefault((st.st_dev, st.st_ino), []).append(name)
            real = os.path.realpath(candidate)
            names = programs.setdefault(real, [])
            if os.path.basename(real) != name and name not in names:
                names.append(name)
    return (
        {real: names for real, names in programs.items() if names},
        [[dev, ino, list(dict.fromkeys(names))] for (dev, ino), names in ids.items()],
    )


def _git_listing(folder: str) -> set[str]:
    """The NAMEs of folder's git-NAME programs, as git lists them (help.c,
    list_commands_in_dir: a regular file, after symlinks, its owner may run), less any
    `.exe` name (git lists git-NAME.exe as NAME, but runs git-NAME)."""
    try:
        entries = list(os.scandir(folder))
    except (OSError, ValueError):
        return set()
    found = set()
    for entry in entries:
        name = entry.name
        if not name.startswith("git-") or name.endswith(".exe") or len(name) == 4:
            continue
        try:
            st = os.stat(entry.path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IXUSR:
            found.add(name[4:])
    return found


def _names_git(rule: str) -> bool:
    """Whether rule names git: `git`, a path to a file called git, or to a link to one."""
    head = split_rule(rule)[:1]
    if not head:
        return False
    return names_git(head[0]) or (head[0].startswith("/") and names_git(os.path.realpath(head[0])))


def git_facts(rules: list[str]) -> dict[str, object]:
    """What the supervisor needs to judge an exec of git, when a rule names git (else
    nothing is read, and nothing refused):

    - git_builtins: the commands built into git (`git --list-cmds=builtins`);
    - git_commands: those and the git-NAME programs of its exec path and of PATH (an exec of
      git naming another word is refused: it would run an alias, CommandRules._git_unknown);
    - git_exec_path: where git finds its git-NAME programs when nothing points it elsewhere
      (git passes it on to what it runs, in GIT_EXEC_PATH);
    - git_on_path: {NAME: folder} of the git-NAME programs found on PATH only: an exec of git
      naming one is refused unless its PATH holds that folder (elsewhere, git would run an
      alias of that name instead).

    Read from git itself, without any config (no alias); both questions asked at once.
    (Without git on the host there is none in the sandbox either, whose programs are the
    host's.)
    """
    nothing: dict[str, object] = {"git_commands": [], "git_builtins": [], "git_exec_path": "",
                                  "git_on_path": {}}  # fmt: skip
    if not any(_names_git(rule) for rule in rules):
        return nothing
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    answers, asked = [], []
    for option in ("--exec-path", "--list-cmds=builtins"):
        try:
            process = subprocess.Popen(["git", option], stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True, env=env)  # fmt: skip
            asked.append(process)
        except OSError:
            break
    for process in asked:
        try:
            answers.append(process.communicate(timeout=30)[0])
        except subprocess.SubprocessError:
            process.kill()
            process.wait()
            answers.append("")
    exec_path, builtins = answers if len(answers) == 2 else ("", "")
    exec_path = exec_path.strip()
    builtin = {line.strip() for line in builtins.splitlines() if line.strip()}
    if not builtin:  # no git (or one that did not answer): nothing to hold execs of it to
        return nothing
    main = _git_listing(exec_path) if exec_path else set()
    on_path: dict[str, str] = {}
    for folder in _folders(os.environ.get("PATH", "")):
        if folder.rstrip("/") == exec_path.rstrip("/"):
            continue
        for name in sorted(_git_listing(folder) - main):
            on_path.setdefault(name, folder)
    return {"git_commands": sorted(builtin | main | set(on_path)),
            "git_builtins": sorted(builtin), "git_exec_path": exec_path,
            "git_on_path": on_path}  # fmt: skip


def grant_programs(rules: list[str], search: str | None = None) -> dict[str, list[str]]:
    """{a grant's bare program name: the program files it finds in search (default: PATH and
    the system's folders), as real paths}: a grant names the program a person would get by
    that name, not any file of that name (a copy of a shell called `python3` in /tmp)."""
    found: dict[str, list[str]] = {}
    for name in _bare_names(rules):
        files = found[name] = []
        for folder in _folders(search):
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                real = os.path.realpath(candidate)
                if real not in files:
                    files.append(real)
    return found


def write_config(
    path: Path,
    *,
    events: Path,
    policy: Policy,
    worktree: Path,
    scratch: list[str],
    granted_commands: list[str],
    ask: str,
    hidden: list[str],
    bwrap: str,
    watch_reads: bool = False,
    scaffold: list[Path] | None = None,
    home: str | None = None,
    readonly: list[str] | None = None,
    tty_fd: int | None = None,
    launcher_argv: list[str] | None = None,
    watches: dict[str, str] | None = None,
    exact_commands: list[str] | None = None,
) -> None:
    extra = list(policy.secrets.extra)
    named = [*policy.commands.deny, *policy.commands.ask, *policy.commands.external]
    facts = git_facts(named)
    # git's own program files (the one on PATH, the copy in its exec path): a rule naming git
    # by one of its paths names each.
    exec_path = str(facts["git_exec_path"])
    gits = [g for g in (shutil.which("git"), exec_path and os.path.join(exec_path, "git")) if g]
    programs, program_ids = rule_programs(named, gits=gits)
    config = {
        "events": str(events),
        "bwrap": bwrap,
        "ask": ask,
        "watch_reads": watch_reads,
        "tty_fd": tty_fd,
        "watches": watches or {},
        "launcher_argv": [a for a in (launcher_argv or []) if a != "--"],
        "commands": {
            "allow": policy.commands.allow, "ask": policy.commands.ask,
            "deny": policy.commands.deny, "default": policy.commands.default.value,
            "granted": granted_commands, "exact": list(exact_commands or []),
            "grant_programs": grant_programs([*granted_commands, *(exact_commands or [])]),
            # (and /dev, a tmpfs of the sandbox's own: a file made there is the agent's too)
            "writable": [str(worktree), *scratch, *PSEUDO_ROOTS],
            "kept": sorted(readonly or []),
            "worktree": str(worktree),
            "external": policy.commands.external,
            "programs": programs,
            "program_ids": program_ids,
            **facts,
        },
        "writes": {
            "worktree": str(worktree), "write": list(policy.paths.write),
            "protected": list(policy.paths.protected_patterns), "scratch": scratch,
            "secret_names": [*SECRET_NAMES, *(e for e in extra if "/" not in e)],
            "secret_paths": [*(e for e in extra if "/" in e), *hidden],
            # Folders bwrap made to hold mount points, below a scratch root: not places to write.
            # Bound read-only inside scratch space (/tmp, HOME): a write there is a denial.
            "readonly": sorted(readonly or []),
            "scaffold": _scaffold(scaffold or [], scratch, home),
        },
    }  # fmt: skip
    path.write_text(json.dumps(config, indent=1))


# A run's record lists every refused process and write (one repeated by the same process,
# once with a count), every process that failed or was still running at the end, and the
# first of the others; the rest it counts. A build of thousands of files runs tens of
# thousands of compilers: each listed costs the receipt (and every reader of it) a few hundred
# bytes, and past MAX_ENVELOPE_BYTES it could not be read.
MAX_LISTED_PROCESSES = 10_000  # allowed processes that ended with exit code 0
MAX_LISTED_WRITES = 10_000  # allowed writes
# Distinct refused execs and distinct refused writes listed each; past them, the rest of each
# kind are one entry with their count (an agent that tries a million paths cannot make a record
# too large to read, or the launcher's memory grow with it).
MAX_LISTED_REFUSALS = 10_000
MORE_REFUSED_COMMANDS = "(more refused commands)"
MORE_REFUSED_WRITES = "(more refused writes)"
# What the one entry past them says, in place of the event's own fields.
_MORE_EXECS = {"argv": [MORE_REFUSED_COMMANDS], "cwd": "", "exe": None,
               "rule": "(past the listed refusals)", "decision": "deny"}  # fmt: skip
MORE_REFUSED_WRITES_OP = "various"  # an operation the supervisor never records otherwise
_MORE_WRITES = {"path": MORE_REFUSED_WRITES, "op": MORE_REFUSED_WRITES_OP, "decision": "deny",
                "reason": None}  # fmt: skip
_MORE_CONNECTS = {"more": True}  # (the network log counts them in its overflow entry)


@dataclass
class Observed:
    """What the supervisor saw during a run, as receipt entries."""

    processes: list[Process] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    escalations: list[Escalation] = field(default_factory=list)
    # Direct attempts at outside addresses, one per destination and call (host, port, via)
    # with a count; past MAX_LISTED_REFUSALS distinct ones, the rest are one, marked `more`.
    connects: list[dict[str, object]] = field(default_factory=list)
    secrets: list[dict[str, object]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # pid -> (exit code, signal) of how each supervised process ended, as it ended last.
    ends: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    # Allowed processes that ended with exit code 0, and allowed writes, past the listed ones:
    # counted, not listed.
    processes_unlisted: int = 0
    writes_unlisted: int = 0

    @property
    def denied_commands(self) -> list[Process]:
        return [p for p in self.processes if p.decision != "allow"]

    @property
    def denied_writes(self) -> list[Write]:
        return [w for w in self.writes if w.decision != "allow"]

    def take(self, other: Observed) -> None:
        """Add other's record (a check's) to this one."""
        self.processes.extend(other.processes)
        self.writes.extend(other.writes)
        self.escalations.extend(other.escalations)
        self.connects.extend(other.connects)
        self.secrets.extend(other.secrets)
        self.errors.extend(other.errors)
        self.processes_unlisted += other.processes_unlisted
        self.writes_unlisted += other.writes_unlisted


def read_events(path: Path) -> Observed:
    """Fold the supervisor's event lines into receipt entries (exit codes onto their execs),
    line by line: past MAX_LISTED_PROCESSES allowed processes, one that ends with exit code 0
    is counted, not listed (one still running is held until it ends); past
    MAX_LISTED_WRITES allowed writes, the same for writes; a refused exec repeated by one
    parent (the same command line, folder, rule and program path, or any path where nothing
    was there: a PATH search's misses) or a refused write repeated by one process
    (the same path, operation and decision) is one entry with a count and the time of the
    last; past MAX_LISTED_REFUSALS distinct ones of each, the rest are one entry. Direct
    attempts at outside addresses fold the same way, by destination and call."""
    observed = Observed()
    if not path.exists():
        return observed
    execs: list[tuple[int, dict[str, object]]] = []  # (order of the exec, its event)
    last_exec: dict[int, dict[str, object]] = {}
    held: dict[int, tuple[int, dict[str, object]]] = {}  # pid -> an exec past the listed
    listed = allowed_writes = 0
    # A refusal repeated is one entry with a count: a tool that retries a refused write or
    # command in a loop costs the receipt one entry, not one per attempt.
    refused_execs: dict[object, dict[str, object]] = {}
    refused_writes: dict[object, dict[str, object]] = {}
    writes: list[dict[str, object]] = []  # the listed writes' events, in order
    connects: dict[object, dict[str, object]] = {}
    points_seen: set[tuple[str, str, str]] = set()
    secrets_seen: set[object] = set()
    with open(path, encoding="utf-8", errors="replace") as lines:
        for order, line in enumerate(lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            kind = event.pop("t", None)
            if kind == "exec":
                if event.get("decision") != "allow":
                    # Attempts by one parent: each process's own refusals stay its own. The
                    # misses of a PATH search (nothing at each folder's path, refused by name)
                    # are one attempt: one entry, the first folder's path, with a count.
                    # (told by the supervisor's flag, never by the rule's text, which can hold
                    # the agent's own words)
                    missed = event.pop("missed", None) is True
                    key: tuple[object, ...] = (
                        repr(event.get("argv")), event.get("cwd"), event.get("decision"),
                        event.get("rule"), None if missed else event.get("exe"),
                        event.get("ppid"), missed)  # fmt: skip
                    listed_event = _fold(refused_execs, key, event, _MORE_EXECS)
                    if listed_event is not None:
                        execs.append((order, listed_event))
                    continue
                pid = int(event["pid"])
                last_exec[pid] = event
                if listed < MAX_LISTED_PROCESSES:
                    listed += 1
                    execs.append((order, event))
                elif held.pop(pid, None) is not None:
                    observed.processes_unlisted += 1  # (its program replaced: it ended so)
                    held[pid] = (order, event)
                else:
                    held[pid] = (order, event)
            elif kind == "exec_recheck":
                # What the process ran differs from what was judged at its exec (its argv
                # changed in memory meanwhile, or its program renamed itself), and was
                # allowed as it is: listed as it ran, saying what was judged.
                target = last_exec.get(int(event["pid"]))
                if target is not None and target.get("decision") == "allow":
                    judged = target.get("argv")
                    shown = shlex.join(judged) if isinstance(judged, list) else "(unreadable)"
                    target["argv"] = event.get("argv")
                    target["exe"] = event.get("exe")
                    target["rule"] = (
                        f"{event.get('rule') or '(default)'} (what ran differs from what was "
                        f"judged at its exec: {shown})"
                    )
            elif kind == "exec_unverified":
                # The process ended before any call of it or of what it started showed what
                # its exec ran: what was judged is listed, saying so.
                target = last_exec.get(int(event["pid"]))
                if target is not None and target.get("decision") == "allow":
                    target["rule"] = (
                        f"{target.get('rule') or '(default)'} (ended before what it ran could "
                        "be checked against what was judged)"
                    )
            elif kind in ("exit", "killed"):
                pid = int(event["pid"])
                signum = event.get("signal") if kind == "killed" else None
                observed.ends[pid] = (
                    event.get("code") if kind == "exit" else None,  # type: ignore[assignment]
                    signum if isinstance(signum, int) else None,
                )
                target = last_exec.get(pid)
                if target is not None:
                    target["exit_code"] = event.get("code") if kind == "exit" else None
                    target["signal"] = event.get("signal") if kind == "killed" else None
                    target["killed"] = kind == "killed"
                ended = held.pop(pid, None)
                if ended is not None:
                    if kind == "exit" and event.get("code") == 0:
                        observed.processes_unlisted += 1
                    else:
                        execs.append(ended)
            elif kind == "write":
                if event["decision"] == "allow":
                    if allowed_writes >= MAX_LISTED_WRITES:
                        observed.writes_unlisted += 1
                        continue
                    allowed_writes += 1
                else:
                    # (the reason too: a real path named like a label is not the label)
                    key = (event["path"], event["op"], event["decision"], event.get("pid"),
                           event.get("reason"))  # fmt: skip
                    event = _fold(refused_writes, key, event, _MORE_WRITES)
                    if event is None:
                        continue
                writes.append(event)
            elif kind == "escalation":
                # A decision point is one entry however often it came up (record.decision_points)
                point = (event["kind"], event["value"], event["decision"])
                if point in points_seen or (
                    len(points_seen) >= MAX_LISTED_REFUSALS and event["decision"] == "pending"
                ):  # (past so many, an undecided one is in the refusals' count)
                    continue
                points_seen.add(point)
                observed.escalations.append(Escalation(
                    kind=event["kind"], value=event["value"], decision=event["decision"],
                    time=event.get("time"), id=escalation_id(event["kind"], event["value"]),
                ))  # fmt: skip
            elif kind == "connect":
                key = (event.get("host"), event.get("port"), event.get("via"))
                listed_event = _fold(connects, key, event, _MORE_CONNECTS)
                if listed_event is not None:
                    observed.connects.append(listed_event)
            elif kind == "secret":
                if event.get("path") not in secrets_seen:  # the first lookup of each
                    secrets_seen.add(event.get("path"))
                    observed.secrets.append(event)
            elif kind == "error":
                observed.errors.append(str(event.get("message")))
    observed.writes = WRITES.validate_python([
        {"path": w["path"], "op": w["op"], "decision": w["decision"], "pid": w.get("pid"),
         "time": w.get("time"), "count": w.get("count"), "last_time": w.get("last_time"),
         "reason": w.get("reason")}
        for w in writes
    ])  # fmt: skip
    execs += held.values()  # still running at the end
    execs.sort(key=lambda item: item[0])
    processes = []
    for _, event in execs:
        argv = event.get("argv")
        processes.append({
            "pid": int(event["pid"]), "ppid": int(event.get("ppid") or 0),  # type: ignore[call-overload]
            "argv": list(argv) if isinstance(argv, list) else ["(unreadable)"],
            "cwd": str(event.get("cwd") or ""), "decision": str(event["decision"]),
            "exit_code": event.get("exit_code"), "signal": event.get("signal"),
            "signal_name": signal_name(event.get("signal")),  # type: ignore[arg-type]
            "exe": event.get("exe"), "time": event.get("time"),
            "killed": bool(event.get("killed")), "rule": event.get("rule"),
            "count": event.get("count"), "last_time": event.get("last_time"),
        })  # fmt: skip
    observed.processes += PROCESSES.validate_python(processes)
    return observed


def _fold(
    seen: dict[object, dict[str, object]],
    key: object,
    event: dict[str, object],
    more: Mapping[str, object],
) -> dict[str, object] | None:
    """The event to list for a refusal, or None when it was counted onto one listed before
    (count and time of the last on that one). Past MAX_LISTED_REFUSALS distinct ones, a new
    one is counted onto the one entry of the rest (`more`'s fields over its own)."""
    first = seen.get(key)
    if first is None and len(seen) >= MAX_LISTED_REFUSALS:
        key, first, event = None, seen.get(None), {**event, **more}
    if first is None:
        seen[key] = event
        return event
    first["count"] = int(first.get("count") or 1) + 1  # type: ignore[call-overload]
    first["last_time"] = event.get("time")
    return None
