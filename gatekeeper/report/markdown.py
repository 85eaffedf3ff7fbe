"""Markdown sized for a pull-request comment: verdict, findings table, receipts in <details>.

The first line is a hidden marker, `<!-- gatekeeper-report -->`, so a bot can find and update
its own comment in place.
"""

from __future__ import annotations

from gatekeeper.report.decisions import command_text, refusals
from gatekeeper.report.interface import Report, Reporter
from gatekeeper.report.templating import environment

MARKER = "<!-- gatekeeper-report -->"


class MarkdownReporter(Reporter):
    def render(self, report: Report) -> str:
        return (
            environment(markup=False)
            .get_template("report.md.j2")
            .render(
                result=report.result,
                version=report.tool_version,
                refusals=[refusals(v) for v in report.result.receipts],
                command_text=command_text,
            )
        )
