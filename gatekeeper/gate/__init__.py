"""Gate: recompute the diff from git objects and judge it against signed receipts.

`judge` is the entry point: history and diff from git, receipts matched to commits
(`coverage`), claims compared with the diff (`compare`), the target's policy applied
(`policy_check`). `hooks` and `install` are the git hooks that call it and their installer.

May import `receipt`, `policy` and the helpers; never `run`, `sandbox`, `report` or the CLI.

The judgement and its result are loaded when first asked for: the modules that read git
(`notes`, `later`) load without pydantic and the models, so a `check` starts reading
before those are in.
"""

from __future__ import annotations

import importlib

from gatekeeper.gate.findings import RULES, Finding, Kind, Rule

TYPE_CHECKING = False  # typing is not imported for this: the names below load when first used
if TYPE_CHECKING:
    from gatekeeper.gate.judgement import judge
    from gatekeeper.gate.result import GateResult, ReceiptView, Verdict

__all__ = ["RULES", "Finding", "GateResult", "Kind", "ReceiptView", "Rule", "Verdict", "judge"]

_LOADED_LATER = {
    "GateResult": "gatekeeper.gate.result",
    "ReceiptView": "gatekeeper.gate.result",
    "Verdict": "gatekeeper.gate.result",
    "judge": "gatekeeper.gate.judgement",
}


def __getattr__(name: str) -> object:
    module = _LOADED_LATER.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
