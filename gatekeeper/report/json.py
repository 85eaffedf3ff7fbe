"""JSON in the DESIGN.md shape: {"verdict", "receipts_verified", "findings": [...]} and more."""

from __future__ import annotations

import json

from gatekeeper.report.decisions import refusals
from gatekeeper.report.interface import Report, Reporter


class JsonReporter(Reporter):
    def render(self, report: Report) -> str:
        data = report.result.to_json()
        for shown, view in zip(data["receipts"], report.result.receipts, strict=True):
            # Each receipt's decision points (with the signed decisions on them) and refusals.
            shown.update(refusals(view).to_json())
            shown.setdefault("approvals", [dict(a) for a in view.approvals])
        data["tool"] = {"name": "gatekeeper", "version": report.tool_version}
        return json.dumps(data, indent=2, ensure_ascii=True, default=str) + "\n"
