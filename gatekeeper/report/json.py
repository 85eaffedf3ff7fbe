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
        return pretty_json(data) + "\n"


# One line per container that holds no container: json's C encoder writes those, whereas
# indent= takes its pure-Python encoder, several times slower on 10,000 changes.
_FLAT = json.JSONEncoder(ensure_ascii=True, default=str, separators=(", ", ": "))


def _key(key: object) -> str:
    """A key as json.dumps turns it into a string (true, null, 1.5)."""
    if isinstance(key, str):
        return key
    return _FLAT.encode(key) if key is None or isinstance(key, bool) else str(key)


def pretty_json(value: object, depth: int = 0) -> str:
    """value as indented JSON, each container of plain values (a change, say) on one line."""
    if isinstance(value, dict):
        items = value.items()
        if not any(isinstance(v, dict | list | tuple) for v in value.values()):
            return _FLAT.encode(value)
        pad = "  " * (depth + 1)
        body = ",\n".join(
            f"{pad}{_FLAT.encode(_key(k))}: {pretty_json(v, depth + 1)}" for k, v in items
        )
        return "{\n" + body + "\n" + "  " * depth + "}"
    if isinstance(value, list | tuple):
        if not any(isinstance(v, dict | list | tuple) for v in value):
            return _FLAT.encode(value)
        pad = "  " * (depth + 1)
        if all(type(v) is dict for v in value) and not any(
            issubclass(t, dict | list | tuple) for t in {type(x) for v in value for x in v.values()}
        ):
            # Plain records (10,000 changes, say): each on its line, without the checks below.
            body = pad + f",\n{pad}".join(map(_FLAT.encode, value))
        else:
            body = ",\n".join(f"{pad}{pretty_json(v, depth + 1)}" for v in value)
        return "[\n" + body + "\n" + "  " * depth + "]"
    return _FLAT.encode(value)
