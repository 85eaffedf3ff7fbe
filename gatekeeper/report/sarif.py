"""SARIF 2.1.0, one rule per finding kind with stable ids, for code-scanning UIs."""

from __future__ import annotations

import hashlib
import json
from typing import Any
from urllib.parse import quote

from gatekeeper.gate.findings import RULES, Finding, Kind
from gatekeeper.policy.model import POLICY_PATH
from gatekeeper.report.decisions import refusals
from gatekeeper.report.interface import Report, Reporter

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def rule_index(kind: Kind) -> int:
    return list(RULES).index(kind)


def artifact_uri(path: str) -> str:
    """A relative URI for a repository path (spaces, newlines and non-ASCII percent-encoded)."""
    return quote(path.encode("utf-8", "surrogateescape"), safe="/")


def _rules() -> list[dict[str, Any]]:
    return [
        {
            "id": rule.id,
            "name": kind.value,
            "shortDescription": {"text": rule.title},
            "fullDescription": {"text": rule.help},
            "help": {"text": rule.help},
            "defaultConfiguration": {"level": "error"},
            "properties": {"kind": kind.value, "tags": ["security", "gatekeeper"]},
        }
        for kind, rule in RULES.items()
    ]


def _result(finding: Finding, head: str) -> dict[str, Any]:
    # Code-scanning UIs want a location; a finding about no path points at the policy file.
    path = finding.path or POLICY_PATH
    fingerprint = hashlib.sha256(
        "\0".join([finding.kind.value, finding.path or "", finding.commit or ""]).encode(
            "utf-8", "surrogateescape"
        )
    ).hexdigest()
    return {
        "ruleId": finding.rule.id,
        "ruleIndex": rule_index(finding.kind),
        "kind": "fail",
        "level": "error",
        "message": {"text": f"[{finding.kind.value}] {finding.message}"},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": {"uri": artifact_uri(path), "uriBaseId": "%SRCROOT%"}
                },
            }
        ],
        "partialFingerprints": {"gatekeeperFinding/v1": fingerprint},
        "properties": {
            "kind": finding.kind.value,
            "commit": finding.commit or head,
            "path": finding.path,
        },
    }


class SarifReporter(Reporter):
    def render(self, report: Report) -> str:
        r = report.result
        log = {
            "$schema": SCHEMA,
            "version": "2.1.0",
            "runs": [
                {
                    "tool": {
                        "driver": {
                            "name": "gatekeeper",
                            "version": report.tool_version,
                            "semanticVersion": report.tool_version,
                            "rules": _rules(),
                        }
                    },
                    "automationDetails": {"id": f"gatekeeper/{r.target_name}/"},
                    "invocations": [
                        {
                            "executionSuccessful": True,
                            "properties": {
                                "verdict": r.verdict.value,
                                "receipts_verified": r.receipts_verified,
                            },
                        }
                    ],
                    "results": [_result(f, r.head) for f in r.findings],
                    "properties": {
                        "verdict": r.verdict.value,
                        "target": r.target,
                        "head": r.head,
                        "merge_base": r.merge_base,
                        # Each verified receipt's decision points, with their decisions and
                        # approvers, and what its boundary refused.
                        "receipts": [
                            {"run_id": v.run_id, "signer": v.signer, **refusals(v).to_json()}
                            for v in r.receipts
                        ],
                    },
                }
            ],
        }
        return json.dumps(log, indent=2, ensure_ascii=True) + "\n"
