"""One seam for every report format: a Reporter turns a Report into text."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gatekeeper import __version__
from gatekeeper.gate.result import GateResult
from gatekeeper.gate.shown import visible

if TYPE_CHECKING:  # the diff's hunks are read (and their module loaded) for HTML only
    from gatekeeper.gate.diff import FileDiff


@dataclass
class Report:
    """A gate result and what some formats show beside it (the real diff for HTML)."""

    result: GateResult
    diffs: dict[str, FileDiff] = field(default_factory=dict)
    tool_version: str = __version__


class Reporter(ABC):
    """A report format."""

    #: whether render() shows the diff, so the caller should compute Report.diffs
    needs_diff: bool = False

    @abstractmethod
    def render(self, report: Report) -> str:
        """The whole report as text (ending in a newline)."""


def summary_line(result: GateResult) -> str:
    """One human line for stderr: verdict, counts and the range (its names made visible)."""
    n = len(result.findings)
    kinds = f": {', '.join(result.kinds())}" if n else ""
    return (
        f"gatekeeper: {result.verdict.value.upper()} {visible(result.head_name)} into "
        f"{visible(result.target_name)} "
        f"({result.receipts_verified} receipt(s) verified, {n} finding(s){kinds}"
        f"{result.ignored_text})"
    )
