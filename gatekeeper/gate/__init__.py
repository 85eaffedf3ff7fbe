"""Gate: recompute the diff from git objects and judge it against signed receipts.

`judge` is the entry point: history and diff from git, receipts matched to commits
(`coverage`), claims compared with the diff (`compare`), the target's policy applied
(`policy_check`). `hooks` and `install` are the git hooks that call it and their installer.

May import `receipt`, `policy` and the helpers; never `run`, `sandbox`, `report` or the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gatekeeper.gate.findings import RULES, Finding, Kind, Rule
    from gatekeeper.gate.judge import judge
    from gatekeeper.gate.result import GateResult, ReceiptView, Verdict

# Imported when first named: a command that needs one gate module (`run` reads a constant of
# approvals.py) does not pay for loading the whole gate.
_LAZY = {
    "RULES": "findings", "Finding": "findings", "Kind": "findings", "Rule": "findings",
    "judge": "judge", "GateResult": "result", "ReceiptView": "result", "Verdict": "result",
}  # fmt: skip


def __getattr__(name: str) -> object:
    """The named export, its module imported on first use; raises AttributeError otherwise."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    # Importing gate.judge binds the name `judge` here to the module: the function wins.
    globals()[name] = value
    return value


__all__ = ["RULES", "Finding", "GateResult", "Kind", "ReceiptView", "Rule", "Verdict", "judge"]
