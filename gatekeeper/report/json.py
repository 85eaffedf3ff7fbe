"""JSON in the DESIGN.md shape: {"verdict", "receipts_verified", "findings": [...]} and more."""

from __future__ import annotations

import json

from gatekeeper.report.interface import Report, Reporter


class JsonReporter(Reporter):
    def render(self, report: Report) -> str:
        data = report.result.to_json()
        data["tool"] = {"name": "gatekeeper", "version": report.tool_version}
        return json.dumps(data, indent=2, ensure_ascii=True, default=str) + "\n"
