"""The pre-merge gate: recompute the diff from git objects and judge it against signed receipts."""

from __future__ import annotations

from gatekeeper.gate.findings import RULES, Finding, Kind, Rule
from gatekeeper.gate.judge import judge
from gatekeeper.gate.result import GateResult, ReceiptView, Verdict

__all__ = ["RULES", "Finding", "GateResult", "Kind", "ReceiptView", "Rule", "Verdict", "judge"]
