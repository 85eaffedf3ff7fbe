"""Report: the gate's result in five formats behind one seam: text, json, md, html, sarif.

May import `gate`, `receipt`, `policy` and the helpers; never `run`, `sandbox` or the CLI.
"""

from __future__ import annotations

from enum import StrEnum
from typing import assert_never

from gatekeeper.report.interface import Report, Reporter, summary_line


class ReportFormat(StrEnum):
    text = "text"
    json = "json"
    md = "md"
    html = "html"
    sarif = "sarif"

    def reporter(self) -> Reporter:
        """The Reporter for this format (imported lazily: HTML and Markdown load Jinja2)."""
        if self is ReportFormat.text:
            from gatekeeper.report.text import TextReporter

            return TextReporter()
        if self is ReportFormat.json:
            from gatekeeper.report.json import JsonReporter

            return JsonReporter()
        if self is ReportFormat.md:
            from gatekeeper.report.markdown import MarkdownReporter

            return MarkdownReporter()
        if self is ReportFormat.html:
            from gatekeeper.report.html import HtmlReporter

            return HtmlReporter()
        if self is ReportFormat.sarif:
            from gatekeeper.report.sarif import SarifReporter

            return SarifReporter()
        assert_never(self)


__all__ = ["Report", "ReportFormat", "Reporter", "summary_line"]
