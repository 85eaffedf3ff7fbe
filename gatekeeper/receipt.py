"""The receipt: an in-toto Statement v1 about a run, in a DSSE envelope, kept as a git note."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gatekeeper import dsse
from gatekeeper.changes import Change
from gatekeeper.errors import GitError, ReceiptError
from gatekeeper.git import git
from gatekeeper.keys import PublicKey, SigningKey, parse_trust
from gatekeeper.policy import TRUST_PATH

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "urn:gatekeeper:receipt:v1"
NOTES_REF = "refs/notes/gatekeeper"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PolicyRef(_Model):
    path: str
    sha256: str
    source_commit: str | None


class Base(_Model):
    commit: str
    tree: str


class CommandResult(_Model):
    argv: list[str]
    exit_code: int | None  # None: did not finish (timeout, killed)


class Process(_Model):
    pid: int
    ppid: int
    argv: list[str]
    cwd: str
    decision: str
    exit_code: int | None
    signal: int | None = None
    exe: str | None = None
    time: str | None = None
    killed: bool = False
    rule: str | None = None


class Write(_Model):
    path: str
    op: str
    decision: str
    pid: int | None = None
    time: str | None = None
    source: str = "syscall"  # "syscall": seen by the supervisor; "commit": found in the result


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


class Escalation(_Model):
    kind: str
    value: str
    decision: str
    time: str | None = None


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
    supervised: bool = False
    supervisor_failed: bool = False
    limits: dict[str, int] = Field(default_factory=dict)


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
    agent_commits: list[str] = Field(default_factory=list)
    secret_lookups: list[str] = Field(default_factory=list)


class Subject(_Model):
    name: str
    digest: dict[str, str]


class Statement(_Model):
    type_: str = Field(alias="_type")
    subject: list[Subject]
    predicateType: str  # noqa: N815 (in-toto field name)
    predicate: Predicate

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @property
    def result_commit(self) -> str:
        return self.subject[0].digest["gitCommit"]

    @property
    def result_tree(self) -> str:
        return self.subject[0].digest["gitTree"]

    def to_bytes(self) -> bytes:
        data = self.model_dump(by_alias=True, mode="json")
        # ASCII escapes keep paths that are not valid UTF-8 (surrogate escapes) representable.
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def make_statement(predicate: Predicate, commit: str, tree: str) -> Statement:
    return Statement(
        _type=STATEMENT_TYPE,
        subject=[Subject(name=predicate.branch, digest={"gitCommit": commit, "gitTree": tree})],
        predicateType=PREDICATE_TYPE,
        predicate=predicate,
    )


def parse_statement(payload: bytes) -> Statement:
    """Parse verified payload bytes; raise ReceiptError naming the first bad field."""
    try:
        # json.loads keeps escaped surrogates (paths that are not UTF-8) that a strict parser
        # would reject.
        statement = Statement.model_validate(json.loads(payload))
    except (ValidationError, ValueError) as exc:
        if not isinstance(exc, ValidationError):
            raise ReceiptError(f"malformed in-toto statement: not JSON ({exc})") from exc
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ReceiptError(f"malformed in-toto statement: {where}: {first['msg']}") from exc
    if statement.type_ != STATEMENT_TYPE:
        raise ReceiptError(f"malformed in-toto statement: _type is {statement.type_!r}")
    if statement.predicateType != PREDICATE_TYPE:
        raise ReceiptError(f"not a gatekeeper receipt: predicateType {statement.predicateType!r}")
    digest = statement.subject[0].digest if statement.subject else {}
    if "gitCommit" not in digest or "gitTree" not in digest:
        raise ReceiptError("malformed in-toto statement: subject lacks gitCommit/gitTree")
    return statement


def sign_statement(statement: Statement, key: SigningKey) -> dsse.Envelope:
    return dsse.sign(statement.to_bytes(), key)


# --- notes -----------------------------------------------------------------------------------
# A note holds one envelope per line, so `git notes merge -s cat_sort_uniq` unions receipts.


def add_receipt_note(git_dir: Path, commit: str, envelope: dsse.Envelope) -> None:
    """Append the envelope to commit's gatekeeper note, keeping receipts already there.

    The notes ref is updated compare-and-swap by git; a concurrent writer makes the update
    fail, so it is read and tried again rather than overwritten.
    """
    line = envelope.to_json()
    last: GitError | None = None
    for attempt in range(8):
        existing = read_note(git_dir, commit, NOTES_REF) or ""
        lines = [x for x in existing.splitlines() if x.strip()]
        if line not in lines:
            lines.append(line)
        try:
            git(
                "-c", "user.name=gatekeeper", "-c", "user.email=gatekeeper@localhost",
                "notes", f"--ref={NOTES_REF}", "add", "-f", "-F", "-", commit,
                git_dir=git_dir, input=("\n".join(lines) + "\n").encode(),
            )  # fmt: skip
        except GitError as exc:
            last = exc
            time.sleep(0.05 * (attempt + 1))
            continue
        if line in (read_note(git_dir, commit, NOTES_REF) or "").splitlines():
            return
    raise GitError(f"could not store the receipt note on {commit[:12]}: {last}")


def read_note(git_dir: Path, commit: str, ref: str = NOTES_REF) -> str | None:
    try:
        return git("notes", f"--ref={ref}", "show", commit, git_dir=git_dir).decode()
    except GitError:
        return None


def notes_refs(git_dir: Path) -> list[str]:
    """The local receipts ref and any remote-tracking copies fetched beside it."""
    out = git("for-each-ref", "--format=%(refname)", "refs/notes/", git_dir=git_dir).decode()
    refs = [r for r in out.splitlines() if r == NOTES_REF or r.endswith("/gatekeeper")]
    return sorted(set(refs), key=lambda r: (r != NOTES_REF, r))


def envelopes_for(git_dir: Path, commit: str) -> list[tuple[str, str]]:
    """Every (notes ref, envelope line) attached to commit across the receipt refs."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for ref in notes_refs(git_dir):
        text = read_note(git_dir, commit, ref)
        for line in (text or "").splitlines():
            if line.strip() and line not in seen:
                seen.add(line)
                found.append((ref, line))
    return found


def trusted_keys_at(git_dir: Path, commit: str) -> list[PublicKey]:
    """The trust file committed at commit; raise ReceiptError when there is none."""
    from gatekeeper.git import read_blob_at

    data = read_blob_at(git_dir, commit, TRUST_PATH)
    if data is None:
        raise ReceiptError(
            f"no trust file ({TRUST_PATH}) at {commit[:12]}",
            hint="run `gatekeeper init` and commit .gatekeeper/ on the target branch",
        )
    return parse_trust(data.decode("utf-8", "replace"), f"{TRUST_PATH} at {commit[:12]}")


def trusted_keys_file(path: Path) -> list[PublicKey]:
    try:
        return parse_trust(path.read_text(), str(path))
    except FileNotFoundError:
        raise ReceiptError(f"no trust file at {path}") from None


def verify_envelope(line: str, trusted: list[PublicKey]) -> tuple[Statement, PublicKey]:
    """Parse, verify and then parse the payload of one envelope line; raise on any failure."""
    envelope = dsse.parse_envelope(line)
    payload, signer = dsse.verify(envelope, trusted)
    return parse_statement(payload), signer
