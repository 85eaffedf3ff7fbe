"""Gate: recompute the diff from git objects and judge it against signed receipts.

`judge` is the entry point: history and diff from git, receipts matched to commits
(`coverage`), claims compared with the diff (`compare`), the target's policy applied
(`policy_check`). `hooks` and `install` are the git hooks that call it and their installer.

May import `receipt`, `policy` and the helpers; never `run`, `sandbox`, `report` or the CLI.
"""

from __future__ import annotations

from gatekeeper.gate.findings import RULES, Finding, Kind, Rule
from gatekeeper.gate.judge import judge
from gatekeeper.gate.result import GateResult, ReceiptView, Verdict

__all__ = ["RULES", "Finding", "GateResult", "Kind", "ReceiptView", "Rule", "Verdict", "judge"]
