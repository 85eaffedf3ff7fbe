"""Property-based tests of receipt, approval and trust-file parsing and verification.

Random bytes and near-valid envelopes (mutations of a genuine signed receipt or approval)
must come back as a `malformed-receipt`, `bad-signature` or `untrusted-key` finding (an
approval: a ReceiptError of one of those kinds): never another exception, and never accepted
unless the payload is one the trusted key really signed. Trust files parse or raise
KeyFileError.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixtures.gate_receipts import attach, git_dir_of, receipted_commit
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gatekeeper.errors import KeyFileError, ReceiptError
from gatekeeper.gate import judge
from gatekeeper.gate.approvals import _peek as peek_approval
from gatekeeper.gate.approvals import split_approvals
from gatekeeper.gate.coverage import VerifiedReceipt, change_signature, verify_note
from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.gate.notes import NoteLine
from gatekeeper.gate.rewrites import peek_line as _peek
from gatekeeper.receipt import dsse
from gatekeeper.receipt.approval import (
    APPROVAL_PAYLOAD_TYPE,
    ApprovedEscalation,
    decisions_of,
    is_approval_line,
    latest,
    make_approval,
    verify_approval,
)
from gatekeeper.receipt.changes import Change
from gatekeeper.receipt.keys import generate_key
from gatekeeper.receipt.models import (
    Base,
    CommandResult,
    Counts,
    PolicyRef,
    Predicate,
    Process,
    Sandbox,
    escalation_id,
)
from gatekeeper.receipt.notes import split_note
from gatekeeper.receipt.statement import make_statement, parse_statement, sign_statement
from gatekeeper.receipt.trust import parse_trust_file

from conftest import git, gk, make_repo

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FAILURES = {Kind.malformed_receipt, Kind.bad_signature, Kind.untrusted_key}
COMMIT = "c" * 40

_keys: dict[str, Any] = {}


def keys(tmp: Path | None = None) -> tuple[Any, Any]:
    """(trusted key, other key), made once per session in a folder of their own."""
    if not _keys:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="gk-fuzz-keys-"))
        atexit.register(shutil.rmtree, folder, True)  # removed when the session ends
        _keys["trusted"] = generate_key(folder / "trusted.pem")
        _keys["other"] = generate_key(folder / "other.pem")
    return _keys["trusted"], _keys["other"]


def genuine_statement_data() -> dict[str, Any]:
    change = Change(
        status="M", path="src/app.py", old_mode="100644", new_mode="100644",
        old_blob="a" * 40, new_blob="b" * 40,
    )  # fmt: skip
    predicate = Predicate(
        run_id="run-1", branch="agent/1", started_at="2024-01-01T00:00:00Z",
        finished_at="2024-01-01T00:00:05Z", launcher="test",
        policy=PolicyRef(path=".gatekeeper/policy.yaml", sha256="0" * 64, source_commit="d" * 40),
        base=Base(commit="d" * 40, tree="e" * 40),
        command=CommandResult(argv=["sh", "-c", "edit"], exit_code=0), checks=[],
        processes=[Process(pid=2, ppid=1, argv=["sh"], cwd="/w", decision="allow", exit_code=0)],
        writes=[], network=[], escalations=[], changes=[change],
        counts=Counts(files_touched=1, denied_writes=0, escalations=0, commands_run=1,
                      failed_commands=0, network_requests=0),
        sandbox=Sandbox(tool="bwrap", version="test", network="proxy"),
    )  # fmt: skip
    statement = make_statement(predicate, COMMIT, "f" * 40)
    return statement.model_dump(by_alias=True, mode="json")


def sign_payload(payload: bytes, key: Any) -> str:
    return dsse.sign(payload, key).to_json()


def genuine_line() -> tuple[str, bytes]:
    trusted, _ = keys()
    data = genuine_statement_data()
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return sign_payload(payload, trusted), payload


def judge_line(line: str) -> VerifiedReceipt | Finding:
    trusted, _ = keys()
    outcome = verify_note(NoteLine(COMMIT, line, "fuzz"), [trusted.public])
    if isinstance(outcome, Finding):
        assert outcome.kind in FAILURES, outcome
        assert outcome.message
    else:
        # Whatever verifies must be usable by the gate's matching code.
        _ = outcome.statement.result_commit, outcome.statement.result_tree, outcome.run_id
        change_signature(list(outcome.statement.predicate.changes))
    _peek(line)  # the unverified index of receipts elsewhere must not crash either
    return outcome


def genuine_approval() -> tuple[str, bytes]:
    trusted, _ = keys()
    envelope = make_approval(
        run_id="run-1", branch="agent/1", commit=COMMIT, tree="f" * 40,
        escalations=[ApprovedEscalation(id=escalation_id("write", "src/x"), kind="write",
                                        value="src/x")],
        decision="approved", time="2024-01-01T00:00:00+00:00", key=trusted,
    )  # fmt: skip
    return envelope.to_json(), envelope.payload_bytes()


def judge_approval(line: str) -> bool:
    """True when line verifies as an approval by the trusted key; raises on anything but the
    documented errors."""
    trusted, _ = keys()
    is_approval_line(line)
    peek_approval(line)
    split_approvals({COMMIT: [NoteLine(COMMIT, line, "fuzz")]})
    try:
        statement, signer = verify_approval(line, [trusted.public])
    except ReceiptError as exc:  # BadSignatureError and UntrustedKeyError among them
        assert exc.message
        return False
    latest(decisions_of(statement, signer, line))
    return True


def signed_payload_of(line: str) -> bytes | None:
    try:
        return dsse.parse_envelope(line).payload_bytes()
    except ReceiptError:
        return None


# --- random input ---------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_are_never_accepted(data: bytes) -> None:
    line = data.decode("utf-8", "replace")
    assert isinstance(judge_line(line), Finding)
    try:
        parse_statement(data)
    except ReceiptError:
        pass


@FUZZ
@given(
    value=st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(
                st.sampled_from(["payload", "payloadType", "signatures", "keyid", "sig", "x"]),
                inner,
                max_size=4,
            ),
        ),
        max_leaves=12,
    )
)
def test_random_json_is_never_accepted(value: Any) -> None:
    assert isinstance(judge_line(json.dumps(value)), Finding)


@FUZZ
@given(
    payload=st.one_of(
        st.text(max_size=12),
        st.text("AQgw+/=-_ \n\u00e9", max_size=12),
        st.binary(max_size=9).map(lambda b: base64.b64encode(b).decode()),
    )
)
@example(payload="QUJD=")
@example(payload="QR==")
@example(payload="\udcff")
def test_payloads_decode_exactly_as_strict_base64(payload: str) -> None:
    """The payload is decoded without an ASCII copy of it first: the same bytes, and the same
    refusals, as base64.b64decode(validate=True)."""
    envelope = dsse.Envelope(payload=payload, payloadType=dsse.PAYLOAD_TYPE, signatures=[])
    try:
        expected: bytes | None = base64.b64decode(payload, validate=True)
    except ValueError:
        expected = None
    if expected is None:
        with pytest.raises(ReceiptError, match="payload is not base64"):
            envelope.payload_bytes()
    else:
        assert envelope.payload_bytes() == expected


@FUZZ
@given(text=st.text(max_size=12), pad=st.integers(0, 3))
def test_an_envelope_over_the_limit_is_counted_in_utf8_bytes(
    text: str, pad: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size limit counts UTF-8 bytes (surrogate escapes as one byte each), also where the
    count skips encoding ASCII text."""
    line = json.dumps({"payload": text}, ensure_ascii=False) + " " * pad
    size = len(line.encode("utf-8", "surrogateescape"))
    with monkeypatch.context() as patch:
        patch.setattr(dsse, "MAX_ENVELOPE_BYTES", size - 1)
        with pytest.raises(ReceiptError, match=f"{size} bytes, over the limit"):
            dsse.parse_envelope(line)
        patch.setattr(dsse, "MAX_ENVELOPE_BYTES", size)
        with pytest.raises(ReceiptError) as refused:
            dsse.parse_envelope(line)  # within the limit: refused for its shape, not its size
        assert "over the limit" not in str(refused.value)


@FUZZ
@given(data=st.binary(max_size=400))
def test_notes_split_within_limits(data: bytes) -> None:
    text = split_note(data)
    assert all(line and "\n" not in line for line in text.lines)


def _parse_trust(text: str) -> None:
    try:
        trust = parse_trust_file(text, "fuzz")
    except KeyFileError as exc:
        assert exc.message.startswith("fuzz")
        return
    for person in trust.people:
        _ = person.label, person.line  # fingerprints are computed from the key bytes
    trust.lines()


@FUZZ
@given(text=st.text(max_size=200))
def test_trust_files_parse_or_fail_cleanly(text: str) -> None:
    _parse_trust(text)


KEY_TYPES = ["ed25519", "openpgp", "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "x"]


@FUZZ
@given(
    role=st.sampled_from(["", "approver ", "person ", "signer "]),
    key_type=st.sampled_from(KEY_TYPES),
    key=st.binary(max_size=80),
    comment=st.text(max_size=10),
)
def test_trust_lines_with_random_keys_parse_or_fail_cleanly(
    role: str, key_type: str, key: bytes, comment: str
) -> None:
    _parse_trust(f"{role}{key_type} {base64.b64encode(key).decode()} {comment}")


@st.composite
def openpgp_packets(draw: st.DrawFn) -> bytes:
    """A sequence of OpenPGP packets with random tags, lengths (any header form) and bodies."""
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        tag = draw(st.sampled_from([6, 5, 7, 13, 2, 14, 1, 63]))
        body = bytes([draw(st.sampled_from([4, 5, 6, 3]))]) + draw(st.binary(max_size=40))
        if draw(st.booleans()):
            body += b"x" * draw(st.sampled_from([0, 200, 70_000]))
        n = len(body) + draw(st.sampled_from([0, 0, 0, -1, 1, 1 << 20]))
        form = draw(st.sampled_from(["new1", "new2", "new5", "partial", "old1", "old2", "old4",
                                     "old-indeterminate"]))  # fmt: skip
        n = max(n, 0)
        if form == "new1":
            head = bytes([0xC0 | tag, min(n, 191)])
        elif form == "new2":
            n = min(max(n, 192), 8383) - 192
            head = bytes([0xC0 | tag, 192 + (n >> 8), n & 0xFF])
        elif form == "new5":
            head = bytes([0xC0 | tag, 255]) + n.to_bytes(4, "big")
        elif form == "partial":
            head = bytes([0xC0 | tag, 224])
        else:
            size = {"old1": 1, "old2": 2, "old4": 4, "old-indeterminate": 0}[form]
            kind = {1: 0, 2: 1, 4: 2, 0: 3}[size]
            head = bytes([0x80 | (tag & 0x0F) << 2 | kind]) + min(n, (1 << 8 * size) - 1).to_bytes(
                size, "big"
            )
        out += head + body
    return out


@FUZZ
@given(data=openpgp_packets())
@example(data=bytes([0xC6, 255]) + (70_001).to_bytes(4, "big") + b"\x04" + b"x" * 70_000)
def test_openpgp_person_keys_parse_or_fail_cleanly(data: bytes) -> None:
    """A version 4 key over 65535 bytes raised struct.error while computing its fingerprint."""
    _parse_trust(f"person openpgp {base64.b64encode(data).decode()} someone")


# --- mutations of a genuine envelope --------------------------------------------------------

ODD_VALUES: list[Any] = [None, True, 0, -1, 10**400, 1.5, "", "x", [], {}, ["x"], {"a": 1},
                         "\u202e", "a\x00b", "DSSEv1", "\ud800"]  # fmt: skip


@st.composite
def envelope_mutation(draw: st.DrawFn, approval: bool = False) -> tuple[str, bytes | None]:
    """(a mutated envelope line, the payload it carries if a trusted key signed it anew)."""
    line, payload = genuine_approval() if approval else genuine_line()
    trusted, other = keys()
    kind_of = APPROVAL_PAYLOAD_TYPE if approval else dsse.PAYLOAD_TYPE

    def sign_payload(payload: bytes, key: Any) -> str:
        return dsse.sign(payload, key, kind_of).to_json()

    env = json.loads(line)
    kind = draw(
        st.sampled_from(
            ["flip", "drop", "extra", "type", "duplicate", "unicode", "payload", "resign-other",
             "resign-trusted", "signatures", "truncate", "whitespace"]
        )
    )  # fmt: skip
    if kind == "flip":
        raw = bytearray(line.encode())
        index = draw(st.integers(0, len(raw) - 1))
        raw[index] ^= draw(st.integers(1, 255))
        return raw.decode("utf-8", "replace"), None
    if kind == "truncate":
        return line[: draw(st.integers(0, len(line) - 1))], None
    if kind == "whitespace":
        return json.dumps(env, indent=draw(st.integers(0, 3))).replace("\n", " "), None
    target = draw(st.sampled_from(["top", "signature"]))
    holder = env if target == "top" else env["signatures"][0]
    name = draw(st.sampled_from(sorted(holder)))
    if kind == "drop":
        del holder[name]
    elif kind == "extra":
        holder[draw(st.sampled_from(["x", "payloadtype", "Payload", "sig ", "keyId"]))] = "x"
    elif kind == "type":
        holder[name] = draw(st.sampled_from(ODD_VALUES))
    elif kind == "duplicate":
        # A second value for one key, in front of or after the real one.
        value = json.dumps(draw(st.sampled_from(ODD_VALUES)))
        text = json.dumps(env, separators=(",", ":"))
        needle = json.dumps(name) + ":"
        before = draw(st.booleans())
        dup = f"{needle}{value},"
        at = text.find(needle)
        if before:
            return text[:at] + dup + text[at:], None
        return text[:-1] + "," + dup[:-1] + "}", None
    elif kind == "unicode":
        trick = draw(st.sampled_from(["\u0430", "\u200b", "\ufeff", "\u2028", "\x00", "\u0301"]))
        if isinstance(holder[name], str):
            at = draw(st.integers(0, len(holder[name])))
            holder[name] = holder[name][:at] + trick + holder[name][at:]
        else:
            holder[name + trick] = holder.pop(name)
    elif kind in ("payload", "resign-other", "resign-trusted"):
        data = json.loads(payload)
        mutate_statement(draw, data)
        new = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        if kind == "payload":
            env["payload"] = base64.b64encode(new).decode()
        else:
            key = trusted if kind == "resign-trusted" else other
            return sign_payload(new, key), new if key is trusted else None
    elif kind == "signatures":
        sig = env["signatures"][0]
        env["signatures"] = draw(
            st.sampled_from(
                [[], [sig, sig], [dict(sig, keyid="")], [dict(sig, sig="")], [sig] * 17,
                 [dict(sig, sig=sig["sig"].rstrip("=")), sig], [{"sig": sig["sig"]}]]
            )
        )  # fmt: skip
    return json.dumps(env), None


def mutate_statement(draw: st.DrawFn, data: dict[str, Any]) -> None:
    """Change one field somewhere in a statement: drop it, add one, change its type."""
    holder: Any = data
    while True:
        keys_ = list(holder) if isinstance(holder, dict) else list(range(len(holder)))
        if not keys_:
            break
        key = draw(st.sampled_from(keys_))
        child = holder[key]
        if isinstance(child, dict | list) and child and draw(st.booleans()):
            holder = child
            continue
        action = draw(st.sampled_from(["drop", "type", "extra"]))
        if action == "drop" and isinstance(holder, dict):
            del holder[key]
        elif action == "extra" and isinstance(holder, dict):
            holder["unexpected"] = 1
        else:
            holder[key] = draw(st.sampled_from(ODD_VALUES[:-1]))
        return


@FUZZ
@given(mutation=envelope_mutation())
@example(mutation=("{}", None))
def test_mutated_envelopes_are_never_wrongly_accepted(mutation: tuple[str, bytes | None]) -> None:
    line, resigned = mutation
    _, original = genuine_line()
    outcome = judge_line(line)
    if isinstance(outcome, VerifiedReceipt):
        carried = signed_payload_of(line)
        # Accepted only when the payload is one the trusted key signed (base64 that decodes
        # to the same bytes, or a statement the trusted key signed anew).
        assert carried in (original, resigned), line[:200]


@FUZZ
@given(mutation=envelope_mutation(approval=True))
def test_mutated_approvals_are_never_wrongly_accepted(mutation: tuple[str, bytes | None]) -> None:
    line, resigned = mutation
    _, original = genuine_approval()
    if judge_approval(line):
        assert signed_payload_of(line) in (original, resigned), line[:200]


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_are_never_approvals(data: bytes) -> None:
    assert not judge_approval(data.decode("utf-8", "replace"))


def test_genuine_approval_verifies() -> None:
    line, _ = genuine_approval()
    assert is_approval_line(line) and judge_approval(line)


DEEP_APPROVAL = "[" * 100_000 + json.dumps(APPROVAL_PAYLOAD_TYPE) + "]" * 100_000


def test_a_deeply_nested_approval_line_is_no_approval_and_no_crash() -> None:
    """is_approval_line runs on every note line of the range, unverified: json.loads raised
    RecursionError, and the gate ended in internal-error for anyone who may push notes."""
    assert not is_approval_line(DEEP_APPROVAL)
    assert peek_approval(DEEP_APPROVAL) == ([{}], "", "")
    trusted, _ = keys()
    deep_payload = dsse.sign(("[" * 100_000).encode(), trusted, APPROVAL_PAYLOAD_TYPE).to_json()
    assert not judge_approval(deep_payload)


def test_genuine_envelope_verifies() -> None:
    line, _ = genuine_line()
    assert isinstance(judge_line(line), VerifiedReceipt)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "line",
    [DEEP, json.dumps({"payload": base64.b64encode(DEEP.encode()).decode(),
                       "payloadType": dsse.PAYLOAD_TYPE, "signatures": []})],
)  # fmt: skip
def test_deeply_nested_lines_are_malformed_not_a_crash(line: str) -> None:
    """The unverified peek at receipts on other commits raised RecursionError."""
    assert _peek(line) is None
    assert isinstance(judge_line(line), Finding)


def test_deeply_nested_signed_payload_is_malformed() -> None:
    trusted, _ = keys()
    outcome = judge_line(sign_payload(DEEP.encode(), trusted))
    assert isinstance(outcome, Finding) and outcome.kind == Kind.malformed_receipt


def test_a_deeply_nested_note_elsewhere_does_not_break_the_gate(tmp_path: Path, key: Path) -> None:
    """Anyone who may push notes could put such a note on any commit; every later check that
    looked for receipts elsewhere (a rebased or uncovered commit) ended in internal-error."""
    repo = make_repo(tmp_path / "repo")
    main = git(repo, "rev-parse", "HEAD").strip()
    attach(repo, main, json.dumps({"payload": base64.b64encode(DEEP.encode()).decode()}))
    attach(repo, main, DEEP)
    receipted_commit(repo, {"a.txt": "a\n"})
    git(repo, "commit", "-q", "--allow-empty", "-m", "uncovered: looks elsewhere")
    result = judge(git_dir_of(repo), main, git(repo, "rev-parse", "HEAD").strip())
    kinds = {f.kind for f in result.findings}
    assert Kind.internal_error not in kinds, [f.message for f in result.findings]
    assert kinds == {Kind.uncovered_commit}


def test_a_deeply_nested_approval_line_on_the_range_is_malformed(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    main = git(repo, "rev-parse", "HEAD").strip()
    commit = receipted_commit(repo, {"a.txt": "a\n"})
    attach(repo, commit, DEEP_APPROVAL)
    result = judge(git_dir_of(repo), main, commit)
    # Beside the genuine receipt of its commit it is shown as ignored, never a finding.
    assert not result.findings, [f.message for f in result.findings]
    assert {f.kind for f in result.ignored_notes} == {Kind.malformed_receipt}


def test_statement_with_empty_subject_is_malformed() -> None:
    trusted, _ = keys()
    data = genuine_statement_data()
    data["subject"] = []
    payload = json.dumps(data).encode()
    outcome = judge_line(sign_payload(payload, trusted))
    assert isinstance(outcome, Finding) and outcome.kind == Kind.malformed_receipt


def test_statement_signed_by_trusted_key_round_trips() -> None:
    trusted, _ = keys()
    statement = parse_statement(json.dumps(genuine_statement_data()).encode())
    line = sign_statement(statement, trusted).to_json()
    outcome = judge_line(line)
    assert isinstance(outcome, VerifiedReceipt)
    assert outcome.statement == statement


@pytest.fixture
def receipted_repo(tmp_path_factory: pytest.TempPathFactory, key: Path) -> tuple[Path, str, str]:
    repo = make_repo(tmp_path_factory.mktemp("notes") / "repo")
    main = git(repo, "rev-parse", "HEAD").strip()
    return repo, main, receipted_commit(repo, {"a.txt": "a\n"})


@settings(FUZZ, max_examples=15)
@given(junk=st.binary(min_size=1, max_size=300))
def test_junk_in_a_note_blocks_as_malformed_and_never_crashes(
    receipted_repo: tuple[Path, str, str], junk: bytes
) -> None:
    """Whatever bytes anyone pushes into the note of a receipted commit: the genuine receipt
    still verifies, each junk line is shown as a malformed (or unverified) receipt beside it,
    never a finding there, and nothing crashes."""
    repo, main, commit = receipted_repo
    ref = "refs/notes/gatekeeper"
    before = git(repo, "rev-parse", ref).strip()
    note = subprocess.run(["git", "notes", f"--ref={ref}", "show", commit], cwd=repo,
                          capture_output=True, check=True).stdout  # fmt: skip
    git(repo, "notes", f"--ref={ref}", "add", "-f", "-F", "-", commit, input=note + junk)
    try:
        result = judge(git_dir_of(repo), main, commit)
    finally:
        git(repo, "update-ref", ref, before)
    assert result.receipts_verified == 1, [f.message for f in result.findings]
    assert not result.findings, [f.message for f in result.findings]
    assert {f.kind for f in result.ignored_notes} <= FAILURES, result.ignored_notes


def test_runs_lists_runs_beside_a_deeply_nested_note(tmp_path: Path, key: Path) -> None:
    """`gatekeeper runs` reads every note of the receipts ref: a deeply nested line (anyone
    who may push notes can add one) ended it in a RecursionError traceback."""
    repo = make_repo(tmp_path / "repo")
    commit = receipted_commit(repo, {"a.txt": "a\n"})
    attach(repo, commit, json.dumps({"payload": base64.b64encode(DEEP.encode()).decode()}))
    attach(repo, commit, DEEP)
    proc = gk("runs", "--repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"run-{commit[:8]}" in proc.stdout
