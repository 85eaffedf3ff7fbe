"""One self-contained HTML page: verdict, findings, each receipt beside the real diff, commands.

Rendered from templates/report.html.j2 with autoescaping; no scripts, fonts or other
external assets, so the file can be attached to a CI run and opened anywhere.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from gatekeeper.gate.diff import FileDiff
from gatekeeper.gate.findings import Finding
from gatekeeper.receipt.changes import Change
from gatekeeper.report.decisions import command_text, refusals
from gatekeeper.report.interface import Report, Reporter
from gatekeeper.report.templating import environment


@dataclass
class FileView:
    """One path: the real change, what receipts claim about it, its hunks and findings."""

    path: str
    real: Change | None = None
    claims: list[tuple[str, Change]] = field(default_factory=list)  # (run id, claimed change)
    diff: FileDiff | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        digest = hashlib.sha256(self.path.encode("utf-8", "surrogateescape")).hexdigest()
        return "file-" + digest[:16]


def file_views(report: Report) -> list[FileView]:
    """Real changes and claimed changes side by side, in path order."""
    result = report.result
    views: dict[str, FileView] = {}
    for change in result.changes:
        views[change.path] = FileView(change.path, real=change, diff=report.diffs.get(change.path))
    for receipt in result.receipts:
        for claim in receipt.statement.predicate.changes:
            view = views.setdefault(claim.path, FileView(claim.path))
            view.claims.append((receipt.run_id, claim))
    for finding in result.findings:
        if finding.path is None:
            continue
        flagged: FileView | None = views.get(finding.path) or next(
            # The old side of a rename, say: show the finding on the change that names it.
            (v for v in views.values() if v.real and finding.path in v.real.paths),
            None,
        )
        if flagged is None:
            flagged = views.setdefault(finding.path, FileView(finding.path))
        flagged.findings.append(finding)
    return sorted(views.values(), key=lambda v: v.path.encode("utf-8", "surrogateescape"))


class HtmlReporter(Reporter):
    needs_diff = True

    def render(self, report: Report) -> str:
        return (
            environment(markup=True)
            .get_template("report.html.j2")
            .render(
                result=report.result,
                files=file_views(report),
                version=report.tool_version,
                refusals=[refusals(v) for v in report.result.receipts],
                command_text=command_text,
            )
        )
