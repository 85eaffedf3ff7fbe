"""Signed approvals of escalations: `escalations`, `approve`, `deny`, `run --resume`, and the
gate honouring only approvals by the target's approvers, on real repositories and real runs."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.errors import ReceiptError, VerificationError
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
from gatekeeper.receipt.keys import generate_key, load_key
from gatekeeper.receipt.notes import NOTES_REF
from gatekeeper.receipt.statement import verify_envelope

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = needs_bwrap

POLICY = """\
version: 1
paths: {read: ["**"], write: ["src/**"]}
commands: {allow: [], ask: ["pnpm install"], deny: ["git push"], default: allow}
network: {localhost: deny, package_registry: ask, arbitrary_web: deny, internal_services: deny}
"""
PNPM = (
    "mkdir -p /tmp/b && printf '#!/bin/sh\\necho pnpm-ran\\n' > /tmp/b/pnpm && chmod +x /tmp/b/pnpm"
)


@pytest.fixture
def repo(tmp_path: Path, key: Path) -> Path:
    return make_repo(tmp_path / "repo", policy=POLICY)


def run(repo: Path, script: str, *extra: str) -> dict[str, Any]:
    proc, data = run_json(repo, "sh", "-c", script, extra=list(extra))
    assert proc.returncode == 0 and data is not None, proc.stderr
    return data


def resume(repo: Path, run_id: str, script: str, *extra: str) -> dict[str, Any]:
    return run(repo, script, "--resume", run_id, *extra)


def gk_json(*args: str, env: dict[str, str] | None = None) -> Any:
    proc = gk(*args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def escalations(repo: Path, run_id: str) -> dict[str, dict[str, Any]]:
    data = gk_json("escalations", "--repo", str(repo), run_id)
    return {f"{e['kind']}={e['value']}": e for e in data["escalations"]}


def decide(repo: Path, verb: str, run_id: str, *selectors: str, home: Path | None = None) -> Any:
    env = {"GATEKEEPER_HOME": str(home)} if home is not None else None
    return gk_json(verb, "--repo", str(repo), run_id, *selectors, env=env)


def check(repo: Path, rev: str) -> dict[str, Any]:
    proc = gk("check", "--repo", str(repo), "--base", "main", "--format", "json", rev)
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    assert (proc.returncode == 0) == (data["verdict"] == "pass")
    return data


def unapproved(result: dict[str, Any]) -> list[str]:
    return sorted(f["path"] for f in result["findings"] if f["kind"] == "unapproved-write")


def approvals_of(result: dict[str, Any], run_id: str) -> list[dict[str, str]]:
    return [a for r in result["receipts"] if r["run_id"] == run_id for a in r["approvals"]]


def predicate(repo: Path, commit: str) -> dict[str, Any]:
    shown = gk_json("receipt", "show", "--repo", str(repo), commit)
    assert len(shown) == 1
    return shown[0]["statement"]["predicate"]


def other_key(tmp_path: Path, name: str) -> tuple[Path, str]:
    """A second person's key folder, and its public line."""
    home = tmp_path / name
    proc = gk("keys", "generate", env={"GATEKEEPER_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    line = gk("keys", "show", env={"GATEKEEPER_HOME": str(home)}).stdout.strip()
    return home, line


def trust_on_main(repo: Path, *args: str) -> None:
    proc = gk("trust", "add", "--repo", str(repo), *args)
    assert proc.returncode == 0, proc.stderr
    git(repo, "commit", "-q", "-am", "trust")


def note_lines(repo: Path, commit: str) -> list[str]:
    return git(repo, "notes", f"--ref={NOTES_REF}", "show", commit).splitlines()


def set_note(repo: Path, commit: str, lines: list[str]) -> None:
    git(repo, "notes", f"--ref={NOTES_REF}", "add", "-f", "-F", "-", commit,
        input=("\n".join(lines) + "\n").encode())  # fmt: skip


# --- approvals and the command line -------------------------------------------------------------


def test_ask_escalation_approved_by_id_and_resumed(repo: Path) -> None:
    first = run(repo, f"{PNPM}; /tmp/b/pnpm install; echo a > src/a.py")
    pending = escalations(repo, first["run_id"])["command=/tmp/b/pnpm install"]
    assert (pending["decision"], pending["decided_by"]) == ("pending", None)
    assert pending["id"].startswith("command-")

    decided = decide(repo, "approve", first["run_id"], pending["id"])
    assert decided["decision"] == "approved"
    assert [e["id"] for e in decided["escalations"]] == [pending["id"]]
    now = escalations(repo, first["run_id"])["command=/tmp/b/pnpm install"]
    mine = load_key().public.keyid
    assert now["decision"] == "approved" and now["decided_by"].startswith(mine)
    assert now["recorded"] == "pending"

    # The approval shares the note with the receipt; every reader of notes tells them apart.
    assert len(note_lines(repo, first["commit"])) == 2
    shown = gk("receipt", "show", "--repo", str(repo), first["commit"])
    assert shown.returncode == 0, shown.stderr
    assert "approval  approved command `/tmp/b/pnpm install`" in shown.stdout
    runs = gk_json("runs", "--repo", str(repo))
    assert [r["run_id"] for r in runs] == [first["run_id"]]

    second = resume(repo, first["run_id"], f"{PNPM}; /tmp/b/pnpm install > src/out.txt")
    assert second["branch"] == first["branch"]
    assert git(repo, "rev-parse", f"{second['commit']}^") == first["commit"] + "\n"
    assert git(repo, "show", f"{second['commit']}:src/out.txt") == "pnpm-ran\n"
    p = predicate(repo, second["commit"])
    assert p["resumed_from"] == first["run_id"]
    assert [(a["run_id"], a["id"], a["kind"], a["signer"]) for a in p["approvals"]] == [
        (first["run_id"], pending["id"], "command", mine)
    ]
    assert p["approvals"][0]["envelope_sha256"] == now["approval"]
    result = check(repo, first["branch"])
    assert result["verdict"] == "pass", result["findings"]
    honoured = approvals_of(result, first["run_id"])
    assert [(a["kind"], a["decision"], a["status"]) for a in honoured] == [
        ("command", "approved", "honoured")
    ]


def test_deny_by_kind_value_and_the_later_decision_wins(repo: Path) -> None:
    first = run(repo, f"{PNPM}; /tmp/b/pnpm install; true")
    name = "command=/tmp/b/pnpm install"
    assert decide(repo, "deny", first["run_id"], name)["decision"] == "denied"
    assert escalations(repo, first["run_id"])[name]["decision"] == "denied"
    # With no selector only what is still pending is decided: nothing is.
    nothing = decide(repo, "approve", first["run_id"])
    assert nothing["escalations"] == []
    assert decide(repo, "approve", first["run_id"], name)["decision"] == "approved"
    assert escalations(repo, first["run_id"])[name]["decision"] == "approved"
    eid = escalations(repo, first["run_id"])[name]["id"]
    assert decide(repo, "deny", first["run_id"], eid)["escalations"][0]["id"] == eid
    assert escalations(repo, first["run_id"])[name]["decision"] == "denied"
    bad = gk("approve", "--repo", str(repo), first["run_id"], "command=rm -rf /")
    assert bad.returncode == 2 and "has no escalation" in bad.stderr


def test_a_tie_in_time_is_a_denial(tmp_path: Path) -> None:
    key = generate_key(tmp_path / "k.pem")
    lines = []
    for decision in ("approved", "denied", "approved"):
        envelope = make_approval(
            run_id="r", branch="b", commit="c" * 40, tree="d" * 40,
            escalations=[ApprovedEscalation(id="x", kind="write", value="docs/a.md")],
            decision=decision, time="2026-01-01T00:00:00+00:00", key=key,
        )  # fmt: skip
        lines.append(envelope.to_json())
    decisions = []
    for line in lines:
        statement, signer = verify_approval(line, [key.public])
        decisions += decisions_of(statement, signer, line)
    assert [d.decision for d in latest(decisions).values()] == ["denied"]


def test_an_approval_the_gate_would_not_read_is_never_signed(tmp_path: Path) -> None:
    """The gate reads no approval of more than 1,000 escalations: signed, a denial of 1,001
    would leave every approval before it in force. One of 1,000 verifies."""
    key = generate_key(tmp_path / "k.pem")

    def of(count: int) -> str:
        return make_approval(
            run_id="r", branch="b", commit="c" * 40, tree="d" * 40,
            escalations=[ApprovedEscalation(id=f"x{i}", kind="write", value=f"docs/{i}.md")
                         for i in range(count)],
            decision="denied", time="2026-01-01T00:00:00+00:00", key=key,
        ).to_json()  # fmt: skip

    statement, _ = verify_approval(of(1000), [key.public])
    assert len(statement.predicate.escalations) == 1000
    with pytest.raises(ReceiptError, match="1 to 1000 escalations, not 1001"):
        of(1001)
    with pytest.raises(ReceiptError, match="not 0"):
        of(0)


def test_receipts_and_approvals_never_pass_for_each_other(repo: Path, tmp_path: Path) -> None:
    first = run(repo, "echo a > src/a.py")
    receipt_line = note_lines(repo, first["commit"])[0]
    key = load_key()
    assert not is_approval_line(receipt_line)
    with pytest.raises(ReceiptError, match="not an approval"):
        verify_approval(receipt_line, [key.public])
    # A receipt statement signed under the approval payload type is not an approval either.
    payload = base64.b64decode(json.loads(receipt_line)["payload"])
    disguised = dsse.sign(payload, key, APPROVAL_PAYLOAD_TYPE).to_json()
    assert is_approval_line(disguised)
    with pytest.raises(ReceiptError, match="predicateType"):
        verify_approval(disguised, [key.public])
    approval = make_approval(
        run_id=first["run_id"], branch=first["branch"], commit=first["commit"], tree="d" * 40,
        escalations=[ApprovedEscalation(id="x", kind="write", value="docs/a.md")],
        decision="approved", time="2026-01-01T00:00:00+00:00", key=key,
    ).to_json()  # fmt: skip
    with pytest.raises(VerificationError, match="payload type"):
        verify_envelope(approval, [key.public])
    # In a note, the disguised line is an approval that does not verify (ignored), never a
    # receipt; the gate still passes the branch on its real receipt.
    set_note(repo, first["commit"], [receipt_line, approval, disguised])
    result = check(repo, first["branch"])
    assert result["verdict"] == "pass", result["findings"]
    statuses = [a["status"] for a in approvals_of(result, first["run_id"])]
    assert "honoured" in statuses
    assert any("predicateType" in s for s in statuses if s.startswith("ignored"))


# --- the gate -----------------------------------------------------------------------------------


def test_a_launch_grant_alone_blocks_and_only_an_approval_of_that_path_lifts_it(
    repo: Path,
) -> None:
    granted = run(repo, "mkdir -p docs && echo x > docs/x.md",
                  "--grant", "write=docs/x.md", "--grant", "write=docs/y.md")  # fmt: skip
    assert git(repo, "show", f"{granted['commit']}:docs/x.md") == "x\n"
    assert unapproved(check(repo, granted["branch"])) == ["docs/x.md"]
    # An approval of another path changes nothing.
    decide(repo, "approve", granted["run_id"], "write=docs/y.md")
    result = check(repo, granted["branch"])
    assert unapproved(result) == ["docs/x.md"]
    assert [a["value"] for a in approvals_of(result, granted["run_id"])] == ["docs/y.md"]
    decide(repo, "approve", granted["run_id"], "write=docs/x.md")
    assert check(repo, granted["branch"])["verdict"] == "pass"
    # A later denial takes the approval back.
    decide(repo, "deny", granted["run_id"], "write=docs/x.md")
    assert unapproved(check(repo, granted["branch"])) == ["docs/x.md"]


def _granted_then_resumed(repo: Path, home: Path | None = None) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """Run A is granted docs/x.md and docs/y.md at launch but writes only src; with home, that
    key approves docs/x.md for A; run B resumes A and writes docs/x.md (with a launch grant
    too, so the write happens whatever the approval is worth)."""
    first = run(repo, "echo a > src/a.py",
                "--grant", "write=docs/x.md", "--grant", "write=docs/y.md")  # fmt: skip
    if home is not None:
        decide(repo, "approve", first["run_id"], "write=docs/x.md", home=home)
    second = resume(repo, first["run_id"], "mkdir -p docs && echo x > docs/x.md",
                    "--grant", "write=docs/x.md")  # fmt: skip
    assert git(repo, "show", f"{second['commit']}:docs/x.md") == "x\n"
    return first, second


def test_resumed_run_gets_the_approved_write_and_the_gate_honours_it(repo: Path) -> None:
    first = run(repo, "echo a > src/a.py", "--grant", "write=docs/x.md")
    decide(repo, "approve", first["run_id"], "write=docs/x.md")
    # No launch grant here: the write is allowed by the approval alone.
    second = resume(repo, first["run_id"], "mkdir -p docs && echo x > docs/x.md")
    assert git(repo, "show", f"{second['commit']}:docs/x.md") == "x\n"
    p = predicate(repo, second["commit"])
    assert p["resumed_from"] == first["run_id"]
    assert [(a["run_id"], a["kind"], a["value"]) for a in p["approvals"]] == [
        (first["run_id"], "write", "docs/x.md")
    ]
    assert {"kind": "write", "value": "docs/x.md", "decision": "granted"}.items() <= next(
        e for e in p["escalations"] if e["kind"] == "write"
    ).items()
    result = check(repo, second["branch"])
    assert result["verdict"] == "pass", result["findings"]


def test_a_launch_grant_on_a_resumed_run_without_approval_blocks(repo: Path) -> None:
    _, second = _granted_then_resumed(repo)
    result = check(repo, second["branch"])
    assert unapproved(result) == ["docs/x.md"]
    assert "a grant at launch is not an approval" in result["findings"][0]["message"]


def test_an_approval_by_a_signer_only_or_unknown_key_is_ignored(repo: Path, tmp_path: Path) -> None:
    home, line = other_key(tmp_path, "colleague")
    first, second = _granted_then_resumed(repo, home)
    listed = gk_json("escalations", "--repo", str(repo), first["run_id"])
    [ignored] = listed["ignored_approvals"]
    assert ignored["status"].startswith("ignored: not signed by an approver")
    assert escalations(repo, first["run_id"])["write=docs/x.md"]["decision"] == "granted"
    # Not in the target's trust file at all.
    result = check(repo, second["branch"])
    assert unapproved(result) == ["docs/x.md"]
    [seen] = approvals_of(result, first["run_id"])
    assert seen["status"].startswith("ignored: signed by a key that is not an approver")
    # A plain line trusts the key to sign receipts, not to approve.
    trust_on_main(repo, line)
    result = check(repo, second["branch"])
    assert unapproved(result) == ["docs/x.md"]
    [seen] = approvals_of(result, first["run_id"])
    assert "only as a receipt signer" in seen["status"]
    # An approver line on the target makes the same signature count.
    trust_on_main(repo, "--approver", line)
    result = check(repo, second["branch"])
    assert result["verdict"] == "pass", result["findings"]
    [seen] = approvals_of(result, first["run_id"])
    assert seen["status"] == "honoured"


def test_a_tampered_approval_is_ignored(repo: Path) -> None:
    first, second = _granted_then_resumed(repo)
    decide(repo, "approve", first["run_id"], "write=docs/y.md")
    lines = note_lines(repo, first["commit"])
    [approval] = [x for x in lines if is_approval_line(x)]
    envelope = json.loads(approval)
    payload = base64.b64decode(envelope["payload"]).replace(b"docs/y.md", b"docs/x.md")
    envelope["payload"] = base64.b64encode(payload).decode()
    set_note(repo, first["commit"], [x if x != approval else json.dumps(envelope) for x in lines])
    result = check(repo, second["branch"])
    assert unapproved(result) == ["docs/x.md"]
    [seen] = approvals_of(result, first["run_id"])
    assert seen["status"].startswith("ignored: bad signature")


def test_an_approval_moved_to_another_run_is_ignored(repo: Path) -> None:
    approved = run(repo, "echo a > src/a.py", "--grant", "write=docs/x.md")
    decide(repo, "approve", approved["run_id"], "write=docs/x.md")
    [line] = [x for x in note_lines(repo, approved["commit"]) if is_approval_line(x)]
    other = run(repo, "mkdir -p docs && echo x > docs/x.md", "--grant", "write=docs/x.md")
    set_note(repo, other["commit"], [*note_lines(repo, other["commit"]), line])
    result = check(repo, other["branch"])
    assert unapproved(result) == ["docs/x.md"]
    [seen] = approvals_of(result, other["run_id"])
    assert seen["status"].startswith(f"ignored: for another run ({approved['run_id']})")


def test_approvals_travel_with_receipt_sync_and_the_server_hook_honours_them(
    repo: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    assert gk("hooks", "install", "--server", str(bare)).returncode == 0
    git(repo, "remote", "add", "origin", str(bare))
    granted = run(repo, "mkdir -p docs && echo x > docs/x.md", "--grant", "write=docs/x.md")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"], GIT_CONFIG_NOSYSTEM="1")

    def push(*refs: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "push", "origin", *refs], cwd=repo, env=env,
                              capture_output=True, text=True, check=False)  # fmt: skip

    refused = push(f"{granted['commit']}:refs/heads/main", NOTES_REF)
    assert refused.returncode != 0 and "unapproved-write" in refused.stderr, refused.stderr
    decide(repo, "approve", granted["run_id"], "write=docs/x.md")
    synced = gk("receipt", "sync", "--repo", str(repo))
    assert synced.returncode == 0, synced.stderr
    server_note = git(bare, "notes", f"--ref={NOTES_REF}", "show", granted["commit"])
    assert any(is_approval_line(x) for x in server_note.splitlines())
    accepted = push(f"{granted['commit']}:refs/heads/main")
    assert accepted.returncode == 0, accepted.stderr


def test_discarding_a_resumed_run_puts_the_branch_back_at_the_run_it_resumed(repo: Path) -> None:
    first = run(repo, "echo a > src/a.py")
    second = resume(repo, first["run_id"], "echo b > src/b.py")
    assert git(repo, "rev-parse", first["branch"]).strip() == second["commit"]
    proc = gk("discard", "--repo", str(repo), second["run_id"])
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "rev-parse", first["branch"]).strip() == first["commit"]
    assert f"back at run {first['run_id']}'s result" in proc.stderr
    # The branch is the first run's again: it can be resumed once more; without a command,
    # the first run's command runs again.
    proc = gk("run", "--repo", str(repo), "--json", "--resume", first["branch"])
    assert proc.returncode == 0, proc.stderr
    third = json.loads(proc.stdout)
    assert git(repo, "rev-parse", f"{third['commit']}^").strip() == first["commit"]
    assert predicate(repo, third["commit"])["command"]["argv"] == ["sh", "-c", "echo a > src/a.py"]


def test_the_resume_chain_is_followed_through_verified_receipts_only(repo: Path) -> None:
    first = run(repo, "echo a > src/a.py", "--grant", "write=docs/x.md")
    decide(repo, "approve", first["run_id"], "write=docs/x.md")
    second = resume(repo, first["run_id"], "mkdir -p docs && echo x > docs/x.md")
    # The first run is merged already: only the resumed run is under review.
    git(repo, "merge", "-q", "--ff-only", first["commit"])
    assert check(repo, second["branch"])["verdict"] == "pass"
    # Without a verified receipt of the first run on the resumed run's base, its approvals
    # are nobody's: the chain stops there.
    lines = note_lines(repo, first["commit"])
    set_note(repo, first["commit"], [x for x in lines if is_approval_line(x)])
    result = check(repo, second["branch"])
    assert unapproved(result) == ["docs/x.md"]
    [finding] = [f for f in result["findings"] if f["kind"] == "unapproved-write"]
    assert f"no verified receipt of {first['run_id']}" in finding["message"]


def test_a_refused_write_approved_then_resumed_lands_and_passes(repo: Path) -> None:
    # The whole loop on a real refusal: the sandbox refuses a write outside the write set and
    # records it as a pending decision point; a trusted approver approves it by its id; the
    # resumed run is granted that path, writes it, and the gate passes the branch.
    first = run(repo, "echo notes > NOTES.md || true")
    point = escalations(repo, first["run_id"])["write=NOTES.md"]
    assert point["decision"] == "pending" and "NOTES.md" in first["denied_writes"]
    assert unapproved(check(repo, first["branch"])) == []  # nothing was written yet
    decide(repo, "approve", first["run_id"], point["id"])
    assert escalations(repo, first["run_id"])["write=NOTES.md"]["decision"] == "approved"
    second = resume(repo, first["run_id"], "echo notes > NOTES.md")
    assert git(repo, "show", f"{second['commit']}:NOTES.md") == "notes\n"
    used = predicate(repo, second["commit"])["approvals"]
    assert [(a["run_id"], a["id"]) for a in used] == [(first["run_id"], point["id"])]
    result = check(repo, second["branch"])
    assert result["verdict"] == "pass", result["findings"]
    # Denied afterwards, the same branch blocks again.
    decide(repo, "deny", first["run_id"], point["id"])
    assert unapproved(check(repo, second["branch"])) == ["NOTES.md"]


def test_an_approved_write_the_agent_commits_itself_passes_and_a_denial_blocks_it(
    repo: Path,
) -> None:
    """Agents commit their own work (Claude Code, Codex): the resumed run's agent commits the
    approved file with git. Its commit is judged with the run's approvals, as the launcher's
    commit is: approved, it passes; denied afterwards, it blocks."""
    first = run(repo, "echo notes > NOTES.md || true")
    point = escalations(repo, first["run_id"])["write=NOTES.md"]
    decide(repo, "approve", first["run_id"], point["id"])
    second = resume(repo, first["run_id"],
                    "echo notes > NOTES.md && git add NOTES.md && git commit -qm 'add notes'")  # fmt: skip
    assert second["agent_commits"], second
    result = check(repo, second["branch"])
    assert result["verdict"] == "pass", result["findings"]
    decide(repo, "deny", first["run_id"], point["id"])
    result = check(repo, second["branch"])
    assert result["verdict"] == "block" and "NOTES.md" in unapproved(result), result["findings"]


def test_approving_a_folder_the_agent_made_says_it_covers_what_is_below(repo: Path) -> None:
    first = run(repo, "mkdir reports; echo x > notes.txt; echo y > .github/ci.yml; true")
    proc = gk("approve", "--repo", str(repo), first["run_id"])
    assert proc.returncode == 0, proc.stderr
    assert "write `reports`\n    (a folder the agent made: the approval covers everything below " \
        "`reports` too)" in proc.stderr  # fmt: skip
    assert "notes.txt`\n    (a" not in proc.stderr
    # A protected path: the approval is signed, and the gate still blocks it.
    assert "write `.github/ci.yml`\n    (a protected path: the gate still blocks a change to " \
        "`.github/ci.yml` as protected-path" in proc.stderr  # fmt: skip


def test_an_approved_file_is_a_file_in_the_resumed_run_and_covers_nothing_below(
    repo: Path,
) -> None:
    """The agent wrote a file `tools` and made a folder `kit`, both refused, both approved.
    Resumed, `tools` is there to be written as a file (never made a folder, so nothing can be
    put below it), `kit` is a folder; at the gate the approval of the file covers that file
    only, the folder's what lies below it."""
    from gatekeeper.receipt.approval import names_literally

    first = run(repo, "echo v1 > tools; mkdir kit; true")
    decide(repo, "approve", first["run_id"])
    second = resume(repo, first["run_id"],
                    "echo v2 > tools && echo x > kit/a.sh && (echo y > tools/run.sh || true)")  # fmt: skip
    assert git(repo, "show", f"{second['commit']}:tools") == "v2\n"
    assert git(repo, "show", f"{second['commit']}:kit/a.sh") == "x\n"
    assert "tools/run.sh" not in git(repo, "ls-tree", "-r", "--name-only", second["commit"])
    result = check(repo, second["branch"])
    assert result["verdict"] == "pass", result["findings"]
    assert names_literally("tools", "tools", folder=False)
    assert not names_literally("tools", "tools/run.sh", folder=False)
    assert names_literally("kit", "kit/a.sh", folder=True)


def test_an_approved_file_with_an_approved_path_below_it_opens_no_folder(repo: Path) -> None:
    """The agent tries `a/b`, then `a` as a file: both approved. The resumed run makes `a` a
    folder for `a/b`; the file approval of `a` must not open that whole folder (`a/evil`)."""
    first = run(repo, "echo x > a/b; echo y > a; true")
    decide(repo, "approve", first["run_id"])
    proc, second = run_json(repo, "sh", "-c", "echo z > a/b; echo e > a/evil; true",
                            extra=["--resume", first["run_id"]])  # fmt: skip
    assert proc.returncode == 0 and second is not None, proc.stderr
    assert "approval of write `a` (a file) grants nothing inside a run" in proc.stderr
    assert git(repo, "show", f"{second['commit']}:a/b") == "z\n"
    assert "a/evil" in second["denied_writes"]
    assert "a/evil" not in git(repo, "ls-tree", "-r", "--name-only", second["commit"])


def test_the_denials_an_approval_covers_are_found_as_each_pattern_matches() -> None:
    """On resume, an approved write that covers a denied path no pattern can name grants
    nothing inside the run. Which denials an approval covers is looked up in a table of their
    folders (a chain may hold thousands of each); it agrees with matching path by path."""
    import random

    from gatekeeper.commands.run import _covered_by
    from gatekeeper.policy.patterns import is_write_allowed

    rnd = random.Random(20261203)
    words = ["a", "b", "a b", "a*", "[x]", ".git", ".GIT", "c ", " ", "."]
    for _ in range(400):
        denied = ["/".join(rnd.choices(words, k=rnd.randint(1, 3))) for _ in range(4)]
        covered = _covered_by(denied)
        for _ in range(8):
            pattern = "/".join(rnd.choices([*words, "**", "*"], k=rnd.randint(1, 3)))
            expected = [v for v in denied if is_write_allowed((pattern,), (), v)]
            assert covered(pattern) == expected, (denied, pattern)
