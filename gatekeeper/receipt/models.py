"""The receipt's data: an in-toto Statement v1 whose predicate says what a run did.

Frozen pydantic models with `extra="forbid"` (the records a run has thousands of, Process,
Write and Change, are frozen dataclasses that pydantic validates as strictly): a receipt read
back is parsed as strictly as it was written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Annotated, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

from gatekeeper.defaults import empty_dict, empty_list
from gatekeeper.errors import ReceiptError
from gatekeeper.receipt.changes import Change

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "urn:gatekeeper:receipt:v1"


def _unset(value: object) -> bool:
    return value is None


class _Model(BaseModel):
    # Each model's validator is built when it is first used, not when the class is defined:
    # a check validates Statements only, whose validator holds all the others', and would
    # otherwise build each of theirs on its own first (and the approval models' too).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class PolicyRef(_Model):
    path: str
    sha256: str
    source_commit: str | None


class Base(_Model):
    commit: str
    tree: str


class CommandResult(_Model):
    argv: list[str]
    exit_code: int | None  # None: did not finish (the launcher stopped it: timeout, interrupt)
    # The signal that ended the command (`exit_code` is then 128 + signal, as a shell says;
    # SIGKILL with no exit code for one the launcher stopped); both keys are left out when it
    # exited by itself.
    signal: int | None = None
    signal_name: str | None = None

    def ending(self, sandbox: Sandbox | None = None) -> str:
        """How it ended, in words: `exit 0`, `exit 139 (killed by SIGSEGV, signal 11)`, or
        `did not finish (timed out; killed by SIGKILL, signal 9)` (why, from sandbox)."""
        notes = []
        if self.exit_code is None and sandbox is not None and sandbox.timed_out:
            notes.append("timed out")
        elif self.exit_code is None and sandbox is not None and sandbox.interrupted:
            notes.append(f"interrupted by {sandbox.interrupted_by or 'a signal'}")
        if self.signal is not None:
            notes.append(f"killed by {self.signal_name or 'a signal'}, signal {self.signal}")
        said = "did not finish" if self.exit_code is None else f"exit {self.exit_code}"
        return f"{said} ({'; '.join(notes)})" if notes else said

    @model_serializer(mode="wrap")
    def _without_unset_signal(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        if self.signal is None and self.signal_name is None:
            data.pop("signal", None)
            data.pop("signal_name", None)
        return data


@dataclass(frozen=True, kw_only=True)
class Process:
    # A frozen dataclass, as Change is: a receipt may hold thousands, which pydantic validates
    # without making a model instance for each. Its constructor checks no types; a predicate
    # made with one validates it again.
    __pydantic_config__ = ConfigDict(extra="forbid", revalidate_instances="always")

    pid: int
    ppid: int
    argv: list[str]
    cwd: str
    decision: str
    exit_code: int | None
    signal: int | None = None
    signal_name: str | None = None  # SIGKILL, SIGTERM, ... for a process a signal ended
    exe: str | None = None
    time: str | None = None
    killed: bool = False
    rule: str | None = None
    # A refusal repeated (the same program, arguments, folder and rule, started by the same
    # parent) is one entry: how many there were and when the last was (`time` and `pid` are
    # the first's). Unset for one, and then left out of the receipt.
    count: Annotated[int | None, Field(exclude_if=_unset)] = None
    last_time: Annotated[str | None, Field(exclude_if=_unset)] = None


@dataclass(frozen=True, kw_only=True)
class Write:
    # A frozen dataclass, as Process is.
    __pydantic_config__ = ConfigDict(extra="forbid", revalidate_instances="always")

    path: str
    op: str
    decision: str
    pid: int | None = None
    time: str | None = None
    source: str = "syscall"  # "syscall": seen by the supervisor; "commit": found in the result
    reason: str | None = None  # why a write found in the result was not taken
    # A refused write repeated (the same path, operation and decision, by the same process) is
    # one entry, as for Process.
    count: Annotated[int | None, Field(exclude_if=_unset)] = None
    last_time: Annotated[str | None, Field(exclude_if=_unset)] = None


# Processes and writes from the supervisor's log, validated (their constructors check no
# types).
PROCESSES = TypeAdapter(list[Process], config=ConfigDict(defer_build=True))
WRITES = TypeAdapter(list[Write], config=ConfigDict(defer_build=True))


class NetworkRequest(_Model):
    host: str
    port: int | None
    decision: str
    category: str | None = None
    method: str | None = None
    path: str | None = None
    time: str | None = None
    bytes_up: int | None = None
    bytes_down: int | None = None
    # Repeated refused attempts are one entry: how many there were and when the last was
    # (`time` is the first). Unset for a single attempt.
    count: int | None = None
    last_time: str | None = None


class NotCommitted(_Model):
    """A path the agent left in its worktree that the launcher did not commit, and why.

    Not a policy decision: the path may be inside the write set (unreadable, over the run's
    byte or file budget, refused by git).
    """

    path: str
    reason: str


ESCALATION_KINDS = ("write", "command", "network", "secret", "external-write")
DECISIONS = ("pending", "granted", "approved", "denied")


def escalation_id(kind: str, value: str) -> str:
    """A decision point's id: stable within a run (and across a resume) for one kind and value;
    96 bits, so an agent cannot make two of its own values share one."""
    digest = hashlib.sha256(f"{kind}\0{value}".encode("utf-8", "surrogateescape")).hexdigest()
    return f"{kind}-{digest[:24]}"


class Escalation(_Model):
    """A decision point: the run needed authority its policy did not give it.

    kind is one of ESCALATION_KINDS, decision one of DECISIONS; id is escalation_id(kind,
    value) (empty in receipts made before ids existed).
    """

    kind: str
    value: str
    decision: str
    time: str | None = None
    id: str = ""


class Counts(_Model):
    files_touched: int
    denied_writes: int
    escalations: int
    commands_run: int
    failed_commands: int
    network_requests: int


class Sandbox(_Model):
    """How the boundary was built, for a reader of the receipt."""

    tool: str
    version: str
    network: str
    timed_out: bool = False
    # Stopped by a signal the launcher got (Ctrl-C, SIGTERM, SIGHUP), and which.
    interrupted: bool = False
    interrupted_by: str | None = None
    supervised: bool = False
    supervisor_failed: bool = False
    limits: dict[str, int] = Field(default_factory=empty_dict)
    # Package registries found for the run, one line per source (`pip: HOST:80/443, ...`).
    registries: list[str] = Field(default_factory=empty_list)
    # Whether the run's processes were held in a cgroup of their own (an unprivileged user
    # has none where cgroups are not delegated), why not, and what capped the process count
    # (`cgroup`, `rlimit` or `none`); whether the launcher ran as root.
    cgroup: bool | None = None
    cgroup_reason: str | None = None
    process_limit: str | None = None
    launcher_root: bool | None = None


class ProfileRef(_Model):
    name: str
    source: str
    sha256: str
    env: list[str] = Field(default_factory=empty_list)  # names set inside
    pass_env: list[str] = Field(default_factory=empty_list)  # names passed through
    secrets: list[str] = Field(default_factory=empty_list)  # API keys passed in by name
    home_files: list[str] = Field(default_factory=empty_list)
    state_files: list[str] = Field(default_factory=empty_list)


class UsedApproval(_Model):
    """A signed decision a resumed run was granted by: which run and escalation, who signed."""

    run_id: str
    id: str
    kind: str
    value: str
    signer: str  # key id
    envelope_sha256: str


class Predicate(_Model):
    run_id: str
    branch: str
    started_at: str
    finished_at: str
    launcher: str
    policy: PolicyRef
    base: Base
    command: CommandResult
    checks: list[CommandResult]
    processes: list[Process]
    writes: list[Write]
    network: list[NetworkRequest]
    escalations: list[Escalation]
    changes: list[Change]
    counts: Counts
    sandbox: Sandbox
    # Commits the agent made with git inside the sandbox, imported onto the branch, oldest first.
    agent_commits: list[str] = Field(default_factory=empty_list)
    secret_lookups: list[str] = Field(default_factory=empty_list)
    # Why the agent's own commits were not imported (its worktree was still committed).
    agent_commits_refused: str | None = None
    # Paths left out of the result commit for a reason other than the policy.
    not_committed: list[NotCommitted] = Field(default_factory=empty_list)
    # What went wrong in the launcher after the sandbox (the receipt is signed all the same).
    launcher_errors: list[str] = Field(default_factory=empty_list)
    # The agent profile the run used: where from, its digest, and the names it set or passed.
    profile: ProfileRef | None = None
    # New paths the agent made that .gitignore covers (folders end with '/'), at most 1,000,
    # and how many there were: a reviewer sees what did not come along (or, with
    # paths.commit_ignored, what came along although ignored).
    ignored: list[str] = Field(default_factory=empty_list)
    ignored_count: int = 0
    # Allowed processes that ended with exit code 0 and allowed writes (the supervisor's,
    # then those found in the result), beyond the first 10,000 of each: counted here, not
    # listed (every refused one, failed one and process still running at the end is
    # listed). `counts` count them all.
    processes_unlisted: int = 0
    writes_unlisted: int = 0
    # `run --resume`: the run this one continues (its result is this run's base), and the
    # approvals of its escalations this run was granted. The gate re-verifies the approvals
    # themselves; these fields say what the launcher used.
    resumed_from: str | None = None
    approvals: list[UsedApproval] = Field(default_factory=empty_list)


class Subject(_Model):
    name: str
    digest: dict[str, str]


M = TypeVar("M", bound=BaseModel)


class InTotoStatement(_Model):
    """An in-toto Statement: what every signed gatekeeper document is, receipts and approvals."""

    type_: str = Field(alias="_type")
    subject: list[Subject]
    predicateType: str  # noqa: N815 (in-toto field name)

    # Of the JSON strings, only keys are looked up in pydantic's cache of strings: the values
    # of a large receipt (paths, blob ids, times) are nearly all different, so caching each of
    # them costs more than the few repeats it saves.
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, cache_strings="keys"
    )

    @property
    def result_commit(self) -> str:
        return self.subject[0].digest["gitCommit"]

    def to_bytes(self) -> bytes:
        data = self.model_dump(by_alias=True, mode="json")
        # ASCII escapes keep paths that are not valid UTF-8 (surrogate escapes) representable.
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def load_validated(model: type[M], payload: bytes, what: str) -> M:
    """payload parsed by json.loads (which keeps escaped surrogates, paths that are not UTF-8),
    then validated as model; raise ReceiptError saying `malformed {what}: ...`."""
    try:
        return model.model_validate(json.loads(payload))
    except RecursionError as exc:
        # json.loads recurses once per level of nesting: deep enough, it exhausts the stack.
        raise ReceiptError(f"malformed {what}: nested too deeply") from exc
    except (ValidationError, ValueError) as exc:
        if not isinstance(exc, ValidationError):
            raise ReceiptError(f"malformed {what}: not JSON ({exc})") from exc
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ReceiptError(f"malformed {what}: {where}: {first['msg']}") from exc


class Statement(InTotoStatement):
    """A receipt: the in-toto Statement of one run."""

    predicate: Predicate

    @property
    def result_tree(self) -> str:
        return self.subject[0].digest["gitTree"]


def build_validators() -> None:
    """Build every receipt model's validator now (each is built at its first use otherwise):
    a run does it on a thread of its own while the agent runs, so that its receipt is
    made without waiting for them."""
    from gatekeeper.receipt.changes import _CHANGE_LIST

    pending: list[type[_Model]] = [_Model]
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        if model is not _Model:
            model.model_rebuild()
    for adapter in (PROCESSES, WRITES, _CHANGE_LIST):
        adapter.rebuild()
