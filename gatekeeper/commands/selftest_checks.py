"""The selftest's verdicts: did each boundary hold, and is each attempt in the signed receipt?

Each check weighs three kinds of evidence: the host's own state after the run (files, git
folder, listeners, processes), read by the launcher; the signed receipt, read back from the
git note and verified; and what the probes say they saw, which only ever adds a failure (a
probe cannot make a check pass that the host or the receipt contradicts).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from gatekeeper.commands.selftest_scratch import (
    DIRECT_HOST,
    DIRECT_PORTS,
    DNS_SERVER,
    HOOKS,
    LEVELS,
    Scratch,
    digest,
)
from gatekeeper.errors import GitError, ReceiptError, VerificationError
from gatekeeper.gate.findings import Kind
from gatekeeper.gate.judgement import judge
from gatekeeper.gate.result import Verdict
from gatekeeper.git import git
from gatekeeper.receipt.keys import PublicKey
from gatekeeper.receipt.models import Predicate, Statement
from gatekeeper.receipt.statement import verify_envelope
from gatekeeper.run.result import RunResult
from gatekeeper.sandbox.machine import MachineCheck


@dataclass(frozen=True)
class Check(MachineCheck):
    """One line of the battery: held or not, what was seen, how to fix it (`required` unused)."""

    def as_json(self) -> dict[str, object]:
        data: dict[str, object] = {"name": self.name, "ok": self.ok, "detail": self.detail}
        if self.fix:
            data["fix"] = self.fix
        return data


def snapshot(paths: list[Path]) -> dict[str, str]:
    """Digest of each file under paths (folders walked, links read, not followed)."""
    state: dict[str, str] = {}
    for top in paths:
        walk = [(str(top), [], [""])] if not top.is_dir() else os.walk(top)
        for current, _, files in walk:
            for name in files:
                path = os.path.join(current, name) if name else current
                try:
                    if os.path.islink(path):
                        state[path] = "link:" + os.readlink(path)
                    else:
                        with open(path, "rb") as fh:
                            state[path] = digest(fh.read())
                except OSError:
                    state[path] = "(unreadable)"
    return state


def watched_host_paths(s: Scratch) -> list[Path]:
    """What no run may change: the checkout (its .git's config, hooks, HEAD, index, info and
    branches included), the files beside it, the user's HOME dotfile and the key folder."""
    git = s.git_dir
    files = [p for p in s.repo.iterdir() if p.name != ".git"]
    return [*files, git / "config", git / "hooks", git / "HEAD", git / "index", git / "info",
            git / "refs" / "heads" / "main", *s.outside.values(), s.home / ".bashrc",
            s.keys]  # fmt: skip


@dataclass
class Evidence:
    scratch: Scratch
    result: RunResult
    before: dict[str, str]
    after: dict[str, str]
    lingering: list[int]
    envelope: str | None
    trusted: list[PublicKey]
    statement: Statement | None = None
    receipt_error: str | None = None
    probes: dict[str, dict[str, object] | None] = field(default_factory=dict)

    @property
    def p(self) -> Predicate | None:
        return self.statement.predicate if self.statement else None

    def probe(self, level: str, name: str) -> dict[str, object]:
        report = self.probes.get(level) or {}
        results = report.get("results") if isinstance(report, dict) else None
        entry = results.get(name) if isinstance(results, dict) else None
        return entry if isinstance(entry, dict) else {"ok": None, "error": "no result"}

    def probe_list(self, level: str, name: str) -> list[object]:
        """The list a probe returned (the JSON array the probe wrote); empty when none."""
        return cast("list[object]", self.probe(level, name).get("value") or [])

    def succeeded(self, level: str, name: str) -> bool:
        return self.probe(level, name).get("ok") is True

    def pid(self, level: str) -> int | None:
        """The level's pid as the supervisor saw it (argv `python3 probe/probe.py LEVEL`)."""
        for process in self.p.processes if self.p else []:
            if process.argv[1:] == ["probe/probe.py", level]:
                return process.pid
        return None

    def write_recorded(self, path: str, decision: str, level: str | None = None) -> bool:
        """A write of path with decision, by level's process when level is given."""
        pid = self.pid(level) if level else None
        if level and pid is None:
            return False
        return any(w.path == path and w.decision == decision and w.source == "syscall"
                   and (pid is None or w.pid == pid)
                   for w in (self.p.writes if self.p else []))  # fmt: skip

    def exec_denied(self, marker: str) -> bool:
        return any(pr.decision == "deny" and marker in pr.argv
                   for pr in (self.p.processes if self.p else []))  # fmt: skip

    def network_denied(self, host: str, port: int) -> bool:
        return any(r.host == host and r.port == port and r.decision == "deny"
                   for r in (self.p.network if self.p else []))  # fmt: skip

    def host_changed(self, path: Path) -> bool:
        keys = [k for k in {*self.before, *self.after} if k == str(path)
                or k.startswith(str(path) + "/")]  # fmt: skip
        return any(self.before.get(k) != self.after.get(k) for k in keys)

    def worktree_text(self, rel: str) -> str | None:
        """The start of a file the agent could write (no link followed, no FIFO waited on)."""
        try:
            fd = os.open(self.result.worktree / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            try:
                return fh.read(4096).decode("utf-8", "replace")
            except OSError:
                return None

    def changed_in_result(self, rel: str) -> bool:
        return any(c.path == rel or c.old_path == rel for c in self.result.changes)


Problem = str | None
PerLevel = Callable[[Evidence, str], Problem]


def per_level(name: str, held: str, judge: PerLevel) -> Callable[[Evidence], Check]:
    """A check that holds when judge finds no problem for the agent, child and grandchild."""

    def run(ev: Evidence) -> Check:
        problems = []
        for level in LEVELS:
            if ev.probes.get(level) is None:
                problems.append(f"{level}: the probe did not report (it did not start or crashed)")
                continue
            problem = judge(ev, level)
            if problem:
                problems.append(f"{level}: {problem}")
        if problems:
            return Check(name, False, "; ".join(problems))
        return Check(name, True, f"{held} (agent, child, grandchild)")

    return run


def _blocked_write(rel: str) -> PerLevel:
    """A write to worktree path rel (LEVEL filled in) must leave the file as it was, stay out
    of the result and be a denied write in the receipt."""

    def judge(ev: Evidence, level: str) -> Problem:
        path = rel.format(level=level)
        text = ev.worktree_text(path)
        if path.endswith("-new.txt"):
            if text is not None or ev.changed_in_result(path):
                return f"{path} was created"
        elif text != f"locked {path[len('locked/') : -len('.txt')]}\n" or ev.changed_in_result(
            path
        ):
            return f"{path} was changed"
        if not ev.write_recorded(path, "deny", level):
            return f"no denied write of {path} in the receipt"
        return None

    return judge


def _probe_failed(name: str) -> PerLevel:
    def judge(ev: Evidence, level: str) -> Problem:
        return f"the probe's {name} succeeded" if ev.succeeded(level, name) else None

    return judge


def _all(*judges: PerLevel) -> PerLevel:
    def judge(ev: Evidence, level: str) -> Problem:
        for one in judges:
            problem = one(ev, level)
            if problem:
                return problem
        return None

    return judge


# -- permitted actions --------------------------------------------------------------------


def _write_inside(ev: Evidence, level: str) -> Problem:
    rel = f"out/{level}/made.txt"
    if not ev.succeeded(level, "write.inside"):
        return f"writing {rel} failed: {ev.probe(level, 'write.inside').get('error')}"
    if not ev.changed_in_result(rel):
        return f"{rel} is not in the result commit"
    if not ev.write_recorded(rel, "allow", level):
        return f"no allowed write of {rel} in the receipt"
    return None


def _allowed_command(ev: Evidence, level: str) -> Problem:
    rel = f"out/{level}/allowed.txt"
    if not ev.succeeded(level, "cmd.allowed") or not ev.changed_in_result(rel):
        return f"`sh -c 'echo allowed > {rel}'` did not work"
    return None


def _allowed_loopback(ev: Evidence, level: str) -> Problem:
    got = ev.probe(level, "net.loopback_allowed")
    if got.get("value") != ev.scratch.greeting.decode():
        return f"the allowed host port did not answer: {got.get('error') or got.get('value')}"
    return None


# -- writes -------------------------------------------------------------------------------


def _host_unchanged(target: Callable[[Evidence, str], Path]) -> PerLevel:
    def judge(ev: Evidence, level: str) -> Problem:
        path = target(ev, level)
        if ev.host_changed(path):
            return f"{path} changed on the host"
        return None

    return judge


def _recorded_abs(path: Callable[[Evidence, str], Path]) -> PerLevel:
    def judge(ev: Evidence, level: str) -> Problem:
        where = str(path(ev, level))
        return None if ev.write_recorded(where, "deny", level) else f"no denied write of {where}"

    return judge


def _escape(ev: Evidence, level: str) -> Problem:
    target = ev.result.worktree.parent / f"selftest-{level}-escape.txt"
    if target.exists():
        return f"{target} was created"
    if not ev.write_recorded(str(target), "deny", level):
        return f"no denied write of {target}"
    return None


def _hardlink(ev: Evidence, level: str) -> Problem:
    rel = f"out/{level}/hardlink"
    if ev.changed_in_result(rel) or ev.succeeded(level, "write.hardlink"):
        return f"{rel} links to locked/{level}-hl.txt"
    return _blocked_write("locked/{level}-hl.txt")(ev, level)


def _home(ev: Evidence, level: str) -> Problem:
    read = ev.probe(level, "home.read").get("value")
    real = ev.before.get(str(ev.scratch.home / ".bashrc"))
    if isinstance(read, dict) and read.get("sha256") == real:
        return "the user's ~/.bashrc is readable inside"
    if ev.host_changed(ev.scratch.home / ".bashrc"):
        return "the user's ~/.bashrc changed"
    return None


# -- git ----------------------------------------------------------------------------------


def _git_file(kind: str) -> PerLevel:
    def judge(ev: Evidence, level: str) -> Problem:
        git = ev.scratch.git_dir
        path = {"git.config": git / "config", "git.hook": git / "hooks" / HOOKS[level],
                "git.ref": git / "refs" / "heads" / f"selftest-{level}"}[kind]  # fmt: skip
        if ev.host_changed(path) or (kind != "git.config" and path.exists()):
            return f"{path} was written"
        if ev.succeeded(level, kind):
            return f"the probe wrote {path}"
        if not ev.write_recorded(str(path), "deny", level):
            return f"no denied write of {path} in the receipt"
        return None

    return judge


def _git_cli_config(ev: Evidence, level: str) -> Problem:
    if ev.host_changed(ev.scratch.git_dir / "config"):
        return "`git config` inside changed the repository's own config"
    return None


# -- secrets ------------------------------------------------------------------------------


def _env(ev: Evidence, level: str) -> Problem:
    names = ev.probe_list(level, "secret.env_names")
    values = set(ev.probe_list(level, "secret.env_values"))
    leaked = [n for n, v in ev.scratch.env_secrets.items()
              if n in names or digest(v.encode()) in values]  # fmt: skip
    if not values:
        return "the probe could not read its environment"
    if leaked:
        return f"{', '.join(leaked)} reached the sandbox"
    return None


def _dotfiles(ev: Evidence, level: str) -> Problem:
    p = ev.p
    for name, path in ev.scratch.secret_files.items():
        got = ev.probe(level, f"secret.file.{name}").get("value")
        real = ev.before.get(str(path)) or _digest_file(path)
        if isinstance(got, dict) and got.get("sha256") == real:
            return f"{name} ({path}) was readable"
        if got is not None and p is not None and str(path) not in p.secret_lookups:
            return f"the lookup of {path} is not in the receipt's secret_lookups"
    return None


def _digest_file(path: Path) -> str | None:
    try:
        return digest(path.read_bytes())
    except OSError:
        return None


def _key(ev: Evidence, level: str) -> Problem:
    got = ev.probe(level, "secret.key").get("value")
    key = ev.scratch.key_path
    if isinstance(got, dict) and got.get("sha256") == _digest_file(key):
        return f"the signing key {key} was readable"
    listing = ev.probe(level, "secret.key_dir").get("value")
    if listing:
        return f"the key folder shows {listing}"
    text = _digest_file(key)
    if text and text in set(ev.probe_list(level, "secret.env_values")):
        return "the signing key is in the environment"
    return None


# -- network ------------------------------------------------------------------------------


def _direct(ev: Evidence, level: str) -> Problem:
    port = DIRECT_PORTS[level]
    if ev.succeeded(level, "net.direct"):
        return f"connected to {DIRECT_HOST}:{port}"
    if not ev.network_denied(DIRECT_HOST, port):
        return f"no denied attempt at {DIRECT_HOST}:{port} in the receipt"
    return None


def _dns(ev: Evidence, level: str) -> Problem:
    servers = ev.probe_list(level, "net.dns_servers")
    targets = [*list(servers)[:3], DNS_SERVER]
    for number, server in enumerate(targets):
        if ev.succeeded(level, f"net.dns.{number}"):
            return f"the DNS server {server} answered"
        loopback = str(server).startswith("127.") or server == "::1"
        # A server on loopback is the sandbox's own loopback there: nothing leaves to record.
        if not loopback and not ev.network_denied(str(server), 53):
            return f"no denied DNS query to {server}:53 in the receipt"
    return None


def _loopback(ev: Evidence, level: str) -> Problem:
    port = ev.scratch.port("denied")
    if ev.succeeded(level, "net.loopback_denied") or ev.succeeded(level, "net.loopback_proxy"):
        return f"reached the host's 127.0.0.1:{port}"
    if not ev.network_denied("127.0.0.1", port):
        return f"no denied request for 127.0.0.1:{port} in the receipt"
    return None


def _unix(ev: Evidence, level: str) -> Problem:
    for name in ev.scratch.unix_paths:
        if ev.succeeded(level, f"net.unix.{name}"):
            return f"connected to the host's {name} socket"
    return None


def _host_listeners(ev: Evidence) -> Check:
    name = "net.host_listeners"
    reached = {k: v.accepted for k, v in ev.scratch.listeners.items() if k != "allowed"
               and v.accepted}  # fmt: skip
    if reached:
        return Check(name, False, f"host services were reached: {reached}")
    kinds = ", ".join(k.removeprefix("unix.") for k in ev.scratch.listeners if k != "allowed")
    return Check(name, True, f"no connection arrived at the host's denied port or sockets "
                 f"({kinds})")  # fmt: skip


# -- processes and commands ---------------------------------------------------------------


def _tree(ev: Evidence) -> Check:
    name = "proc.tree"
    found = {level: ev.pid(level) for level in LEVELS}
    parents = {pr.pid: pr.ppid for pr in (ev.p.processes if ev.p else [])}
    missing = [level for level, pid in found.items() if pid is None]
    if missing:
        return Check(name, False, f"the receipt does not list the {', '.join(missing)}")
    pids = {level: pid for level, pid in found.items() if pid is not None}  # (all of them)
    if (
        parents.get(pids["child"]) != pids["agent"]
        or parents.get(pids["grandchild"]) != pids["child"]
    ):
        return Check(name, False, "the receipt's process tree does not link the levels")
    return Check(name, True, "the receipt lists the agent, its child and its grandchild")


def _linger(ev: Evidence) -> Check:
    name = "proc.outlive"
    marker = ev.scratch.linger_marker
    if ev.lingering:
        return Check(name, False, f"processes of the run outlived it: {ev.lingering}")
    recorded = [pr for pr in (ev.p.processes if ev.p else [])
                if any(marker in a for a in pr.argv)]  # fmt: skip
    if len(recorded) < len(LEVELS) or not all(pr.killed for pr in recorded):
        return Check(name, False, "the receipt does not record each background process as "
                     "killed with the run")  # fmt: skip
    return Check(name, True, "background processes in their own sessions (one per level) ended "
                 "with the run and are recorded as killed")  # fmt: skip


def _command(route: str, recorded: str | None = None) -> PerLevel:
    """The denied program never ran on this route, and the receipt has the refused exec (of
    the marker argv, or of the path recorded names)."""

    def judge(ev: Evidence, level: str) -> Problem:
        marker = f"out/{level}/denied-{route}"
        if (ev.result.worktree / marker).exists() or ev.changed_in_result(marker):
            return f"the denied command ran ({marker} exists)"
        if ev.succeeded(level, f"cmd.{route}"):
            return "the probe's command succeeded"
        shown = recorded.format(level=level) if recorded else marker
        if not ev.exec_denied(shown):
            return f"no denied exec of {shown} in the receipt"
        return None

    return judge


def _loader_command(ev: Evidence, level: str) -> Problem:
    """As _command, where there is a dynamic loader (a static program has none)."""
    if ev.probe(level, "cmd.loader").get("ok") is None:
        return None  # not tried: no loader
    return _command("loader")(ev, level)


def _memory_recorded(ev: Evidence, level: str) -> Problem:
    if not ev.write_recorded("/proc/self/mem", "deny", level):
        return "no denied write of /proc/self/mem in the receipt"
    return None


# -- receipt ------------------------------------------------------------------------------


def _receipt(ev: Evidence) -> Check:
    name = "receipt.verifies"
    if ev.statement is None:
        return Check(name, False, f"the run's receipt did not verify: {ev.receipt_error}")
    p = ev.statement.predicate
    if ev.statement.result_commit != ev.result.commit:
        return Check(name, False, "the receipt names another commit than the run's result")
    if not p.sandbox.supervised or p.sandbox.supervisor_failed:
        return Check(name, False, "the receipt says the run was not supervised")
    return Check(name, True, f"signed receipt on {ev.result.commit[:12]} verifies against the "
                 "scratch trust file")  # fmt: skip


def _flip(text: str, index: int) -> str:
    return text[:index] + chr(ord(text[index]) ^ 0x01) + text[index + 1 :]


def tampered(envelope: str) -> dict[str, str]:
    """The envelope with one byte changed: in the payload, and in the signature."""
    data = json.loads(envelope)
    payload = base64.b64decode(data["payload"]).decode()
    out = {}
    changed = dict(data, payload=base64.b64encode(_flip(payload, len(payload) // 2).encode())
                   .decode())  # fmt: skip
    out["payload"] = json.dumps(changed)
    sig = base64.b64decode(data["signatures"][0]["sig"])
    sig = sig[:10] + bytes([sig[10] ^ 0x01]) + sig[11:]
    signatures = [dict(data["signatures"][0], sig=base64.b64encode(sig).decode())]
    out["signature"] = json.dumps(dict(data, signatures=signatures))
    return out


def _tamper(ev: Evidence) -> list[Check]:
    if ev.envelope is None or ev.statement is None:
        return [Check("receipt.tamper", False, "no verified receipt to change")]
    checks = []
    for where, text in tampered(ev.envelope).items():
        name = f"receipt.tamper_{where}"
        try:
            verify_envelope(text, ev.trusted)
        except VerificationError as exc:
            checks.append(Check(name, True, f"one changed byte in the {where} fails: "
                                f"{exc.message}"))  # fmt: skip
            continue
        except ReceiptError as exc:
            checks.append(Check(name, False, f"a changed {where} was refused as malformed, not "
                                f"by its signature: {exc.message}"))  # fmt: skip
            continue
        checks.append(Check(name, False, f"a receipt with a changed byte in its {where} verified"))
    return checks


def _gate(ev: Evidence) -> list[Check]:
    """The gate on the run's result: pass with its receipt; block with one byte changed."""
    s, result = ev.scratch, ev.result
    passed = judge(s.git_dir, result.base, result.commit, target_name="main",
                   head_name=result.branch)  # fmt: skip
    checks = []
    if passed.verdict == Verdict.pass_ and passed.receipts_verified >= 1:
        checks.append(Check("gate.pass", True, "`gatekeeper check` passes the run's branch"))
    else:
        found = ", ".join(f"{f.kind}: {f.message}" for f in passed.findings[:3])
        checks.append(Check("gate.pass", False, f"the gate blocks the untouched run: {found}"))
    if ev.envelope is None:
        return [*checks, Check("gate.tamper", False, "no receipt to change")]
    ref = "refs/notes/gatekeeper-selftest-tampered"
    try:
        git("-c", "user.name=gatekeeper", "-c", "user.email=gatekeeper@localhost", "notes",
            f"--ref={ref}", "add", "-f", "-F", "-", result.commit, git_dir=s.git_dir,
            input=(tampered(ev.envelope)["payload"] + "\n").encode())  # fmt: skip
        notes = git("rev-parse", "--verify", f"{ref}^{{commit}}", git_dir=s.git_dir)
    except GitError as exc:
        return [*checks, Check("gate.tamper", False, f"could not store the changed receipt: "
                               f"{exc.message}")]  # fmt: skip
    blocked = judge(s.git_dir, result.base, result.commit, target_name="main",
                    head_name=result.branch,
                    notes=[("tampered", notes.decode().strip())])  # fmt: skip
    kinds = {f.kind for f in blocked.findings}
    if blocked.verdict == Verdict.block and Kind.bad_signature in kinds:
        checks.append(Check("gate.tamper", True, "with one byte of the receipt changed, the "
                            "gate blocks the branch (bad-signature)"))  # fmt: skip
    else:
        checks.append(
            Check(
                "gate.tamper",
                False,
                f"with a changed receipt the gate said "
                f"{blocked.verdict} ({', '.join(sorted(kinds)) or 'no findings'})",
            )
        )
    return checks


def _checkout(ev: Evidence) -> Check:
    name = "write.user_state"
    # The launcher's own cache of registry answers lives in the key folder; it writes it,
    # outside the sandbox, which cannot see the folder at all.
    cache = str(ev.scratch.keys / "cache") + os.sep
    changed = sorted(
        k
        for k in {*ev.before, *ev.after}
        if ev.before.get(k) != ev.after.get(k) and not k.startswith(cache)
    )
    if changed:
        return Check(name, False, f"changed on the host: {', '.join(changed[:5])}")
    return Check(name, True, f"the checkout, its .git config, hooks, HEAD, index and branches, "
                 f"the files beside it, ~/.bashrc and the key folder are unchanged "
                 f"({len(ev.before)} files)")  # fmt: skip


def _outside(ev: Evidence, level: str) -> Path:
    return ev.scratch.outside[level]


def _checkout_file(suffix: str) -> Callable[[Evidence, str], Path]:
    return lambda ev, level: ev.scratch.repo / "locked" / f"{level}{suffix}.txt"


PER_LEVEL: list[Callable[[Evidence], Check]] = [
    per_level("write.inside", "writes in the write set work and are committed", _write_inside),
    per_level("cmd.allowed", "an allowed command runs", _allowed_command),
    per_level("net.loopback_allowed", "the host port the policy allows answers",
              _allowed_loopback),
    per_level("write.outside", "a write outside the write set is refused and recorded",
              _all(_probe_failed("write.outside"), _blocked_write("locked/{level}.txt"))),
    per_level("write.create", "a new file outside the write set is refused and recorded",
              _all(_probe_failed("write.create"), _blocked_write("locked/{level}-new.txt"))),
    per_level("write.symlink", "a write through a symlink is refused and recorded",
              _all(_probe_failed("write.symlink"), _blocked_write("locked/{level}-sym.txt"))),
    per_level("write.symlink_abs", "a write through a symlink to the checkout is refused and "
              "recorded", _all(_probe_failed("write.symlink_abs"),
                               _host_unchanged(_checkout_file("-sym")),
                               _recorded_abs(_checkout_file("-sym")))),
    per_level("write.dotdot", "a write through `..` is refused and recorded",
              _all(_probe_failed("write.dotdot"), _blocked_write("locked/{level}-dd.txt"))),
    per_level("write.dotdot_escape", "a write out of the worktree through `..` is refused and "
              "recorded", _all(_probe_failed("write.dotdot_escape"), _escape)),
    per_level("write.hardlink", "a hard link to a file outside the write set is refused and "
              "recorded", _hardlink),
    per_level("write.checkout", "a write to the user's checkout is refused and recorded",
              _all(_probe_failed("write.checkout"), _host_unchanged(_checkout_file("")),
                   _recorded_abs(_checkout_file("")))),
    per_level("write.beside_checkout", "a write next to the checkout is refused and recorded",
              _all(_probe_failed("write.outside_repo"), _host_unchanged(_outside),
                   _recorded_abs(_outside))),
    per_level("home.fresh", "HOME is fresh: the user's dotfile is neither readable nor changed",
              _home),
    per_level("git.config", "a write to the repository's .git/config is refused and recorded",
              _git_file("git.config")),
    per_level("git.hook", "planting a hook in the repository's .git is refused and recorded",
              _git_file("git.hook")),
    per_level("git.ref", "writing a branch in the repository's .git is refused and recorded",
              _git_file("git.ref")),
    per_level("git.config_cli", "`git config` inside changes only the private git dir",
              _git_cli_config),
    per_level("secret.environment", "secrets in the launcher's environment are not passed in "
              "(no process's environment holds them)", _env),
    per_level("secret.dotfiles", "credential files read empty or absent; lookups are recorded",
              _dotfiles),
    per_level("secret.signing_key", "the signing key and its folder are not in the sandbox",
              _key),
    per_level("net.direct", "a direct connection is refused and recorded", _direct),
    per_level("net.dns", "DNS queries get no answer; those that would leave are recorded",
              _dns),
    per_level("net.host_loopback", "the host's loopback (directly and through the proxy) is "
              "refused and recorded", _loopback),
    per_level("net.unix_sockets", "the host's Unix sockets (a path, the abstract namespace, "
              "the runtime folder) are unreachable", _unix),
    per_level("cmd.denied_name", "a denied command is refused and recorded",
              _command("name")),
    per_level("cmd.denied_abs", "a denied command by absolute path is refused and recorded",
              _command("abs")),
    per_level("cmd.denied_sh", "a denied command through `sh -c` is refused and recorded",
              _command("sh")),
    per_level("cmd.denied_env", "a denied command through `env` is refused and recorded",
              _command("env")),
    per_level("cmd.denied_interpreter", "a denied command execed by an interpreter is refused "
              "and recorded", _command("interpreter")),
    per_level("cmd.denied_shebang", "a script whose `#!` line runs a denied command is refused "
              "and recorded", _command("shebang", "out/{level}/shebang.sh")),
    per_level("cmd.denied_loader", "a denied command run by the dynamic loader is refused and "
              "recorded", _loader_command),
    per_level("proc.memory", "no process's memory (another's, its own) opens for writing; the "
              "attempt is recorded", _all(_probe_failed("proc.memory_parent"),
                                          _probe_failed("proc.memory_self"), _memory_recorded)),
]  # fmt: skip


def judge_all(ev: Evidence) -> list[Check]:
    """Every battery check, in the order they are printed."""
    checks = [_receipt(ev), _tree(ev)]
    checks += [check(ev) for check in PER_LEVEL]
    checks += [_checkout(ev), _host_listeners(ev), _linger(ev)]
    checks += _tamper(ev)
    checks += _gate(ev)
    return checks
