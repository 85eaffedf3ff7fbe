"""Every report format lists each receipt's decision points with their decisions and approvers,
its denied writes, commands, destinations and secret lookups, and shows long commands short.

The receipt is genuine (signed, attached as a note, verified by the real gate); the signed
decisions are put on the gate's ReceiptView as the gate does once it has judged them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.gate_receipts import git_dir_of, receipted_commit

from gatekeeper.gate import GateResult, judge
from gatekeeper.receipt.models import escalation_id
from gatekeeper.report import Report, ReportFormat
from gatekeeper.report.decisions import SHORT_WIDTH

from conftest import git

LONG = "python3 -c 'print(1)'  # " + "y" * 200 + "\nsecond line of the script"
ESCALATIONS = [
    ("write", "README.md", "pending"),
    ("command", "rm -rf build", "pending"),
    ("network", "registry.test:443", "denied"),
    ("secret", "/home/agent/.netrc", "pending"),
    ("external-write", "git push origin main", "pending"),
    ("command", LONG, "granted"),
]
APPROVALS = (
    {"id": escalation_id("write", "README.md"), "kind": "write", "value": "README.md",
     "decision": "approved", "signer": "SHA256:abc Alice <alice@example.test>",
     "status": "honoured"},
    {"id": escalation_id("command", "rm -rf build"), "kind": "command", "value": "rm -rf build",
     "decision": "denied", "signer": "SHA256:def Mallory", "status": "ignored: untrusted key"},
    {"id": "write-0000000000", "kind": "write", "value": "elsewhere.md", "decision": "approved",
     "signer": "SHA256:abc Alice <alice@example.test>", "status": "ignored: another run"},
)  # fmt: skip


def _mutate(data: dict[str, Any]) -> None:
    p = data["predicate"]
    p["command"]["argv"] = ["sh", "-c", LONG]
    p["escalations"] = [{"id": escalation_id(k, v), "kind": k, "value": v, "decision": d,
                         "time": "2024-01-01T00:00:01Z"} for k, v, d in ESCALATIONS]  # fmt: skip
    p["writes"] = [{"path": "README.md", "op": "truncate", "decision": "deny"},
                   {"path": "README.md", "op": "truncate", "decision": "deny"},
                   {"path": "src/ok.py", "op": "create", "decision": "allow"}]  # fmt: skip
    p["processes"].append({"pid": 3, "ppid": 2, "argv": ["rm", "-rf", "build"], "cwd": "/w",
                           "decision": "deny", "exit_code": None, "rule": "rm -rf"})  # fmt: skip
    p["network"] = [{"host": "registry.test", "port": 443, "decision": "deny",
                     "category": "package_registry", "count": 3}]  # fmt: skip
    p["secret_lookups"] = ["/home/agent/.netrc"]


@pytest.fixture
def result(repo: Path) -> GateResult:
    receipted_commit(repo, {"src/feature.py": "x = 1\n"}, mutate=_mutate)
    git_dir = git_dir_of(repo)
    target = git(repo, "rev-parse", "main").strip()
    head = git(repo, "rev-parse", "agent/1").strip()
    judged = judge(git_dir, target, head, target_name="main", head_name="agent/1")
    assert judged.receipts_verified == 1, judged.findings
    judged.receipts = [dataclasses.replace(v, approvals=APPROVALS) for v in judged.receipts]
    return judged


def render(result: GateResult, fmt: ReportFormat) -> str:
    return fmt.reporter().render(Report(result))


def test_text(result: GateResult) -> None:
    out = render(result, ReportFormat.text)
    for kind, value, decision in ESCALATIONS[:-1]:
        assert f"escalation {kind} `{value}` [{escalation_id(kind, value)}]: {decision}" in out
    assert "approved, decided by SHA256:abc Alice <alice@example.test> (honoured)" in out
    assert "denied, decided by SHA256:def Mallory (ignored: untrusted key)" in out
    assert "approval for no decision point of this run: write-0000000000" in out
    assert out.count("denied write README.md") == 1
    assert "denied command `rm -rf build` (rule `rm -rf`)" in out
    assert "denied network registry.test:443 (package_registry, deny, 3 times)" in out
    assert "secret lookup /home/agent/.netrc" in out
    assert "y" * 200 not in out and "second line" not in out  # long commands cut


def test_json_and_sarif(result: GateResult) -> None:
    for fmt in (ReportFormat.json, ReportFormat.sarif):
        data = json.loads(render(result, fmt))
        receipt = (data["receipts"] if fmt is ReportFormat.json
                   else data["runs"][0]["properties"]["receipts"])[0]  # fmt: skip
        shown = {(e["kind"], e["value"], e["decision"]) for e in receipt["escalations"]}
        assert shown == set(ESCALATIONS)
        write = next(e for e in receipt["escalations"] if e["kind"] == "write")
        assert [a["signer"] for a in write["approvals"]] == [APPROVALS[0]["signer"]]
        assert receipt["denied_writes"] == ["README.md"]
        assert receipt["denied_commands"] == [{"command": "rm -rf build", "rule": "rm -rf"}]
        assert receipt["denied_destinations"] == [
            "registry.test:443 (package_registry, deny, 3 times)"
        ]
        assert receipt["secret_lookups"] == ["/home/agent/.netrc"]
        assert [a["id"] for a in receipt["unmatched_approvals"]] == ["write-0000000000"]


def test_markdown(result: GateResult) -> None:
    out = render(result, ReportFormat.md)
    assert out.startswith("<!-- gatekeeper-report -->\n")
    assert "decision points and refusals" in out
    row = next(line for line in out.splitlines() if line.startswith("| write |"))
    assert "README.md" in row and "**pending**" in row
    assert "approved, decided by SHA256:abc Alice &lt;alice@example.test&gt; (honoured)" in row
    assert f"`{escalation_id('write', 'README.md')}`" in row
    assert "**Denied writes:** README.md" in out
    assert "- rm -rf build (rule rm -rf)" in out
    assert "**Denied destinations:** registry.test:443" in out
    assert "**Secret lookups:** /home/agent/.netrc" in out
    # The long command: its first line cut in the summary, the whole text in the fold.
    fold = next(line for line in out.splitlines() if "<details><summary>python3" in line)
    summary = fold.split("<summary>", 1)[1].split("</summary>", 1)[0]
    assert len(summary) <= SHORT_WIDTH + 20 and "…" in summary
    assert "second line of the script" in fold.split("</summary>", 1)[1]


def test_html(result: GateResult) -> None:
    out = render(result, ReportFormat.html)
    write_id = escalation_id("write", "README.md")
    assert f'data-id="{write_id}" data-kind="write" data-decision="pending"' in out
    assert 'decided by <span class="mono">SHA256:abc Alice &lt;alice@example.test&gt;' in out
    assert 'data-status="ignored: untrusted key"' in out
    assert '<ul class="denied-writes"><li><code>README.md</code></li></ul>' in out
    assert "registry.test:443 (package_registry, deny, 3 times)" in out
    assert "/home/agent/.netrc" in out
    assert '<details class="fold"><summary><code>sh -c &#39;python3' in out
    assert "second line of the script</pre></details>" in out
