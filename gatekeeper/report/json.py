"""JSON in the DESIGN.md shape: {"verdict", "receipts_verified", "findings": [...]} and more."""

from __future__ import annotations

import json
from itertools import chain

from pydantic_core import PydanticSerializationError, to_json

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


# One line per container that holds no container, compact: json's C encoder writes those,
# whereas indent= takes its pure-Python encoder, several times slower on 10,000 changes.
_FLAT = json.JSONEncoder(ensure_ascii=True, default=str, separators=(",", ":"))
# The same, but with a bare newline between items: no string it writes holds one (ASCII
# escapes: a newline in a string is `\n`), so each newline is a separator.
_SPLIT = json.JSONEncoder(ensure_ascii=True, default=str, separators=("\n", ":"))
# Values pydantic's serializer writes as json does (when no string needs an escape): floats
# (their spelling) and subclasses (an enum's value) are left to json.
_SAME_TYPES = frozenset({str, int, bool, type(None)})


def _key(key: object) -> str:
    """A key as json.dumps turns it into a string (true, null, 1.5)."""
    if isinstance(key, str):
        return key
    return _FLAT.encode(key) if key is None or isinstance(key, bool) else str(key)


def _small_ints(records: list[dict[object, object]] | tuple[dict[object, object], ...]) -> bool:
    """Whether every int of records is one json writes: it refuses one of more digits than
    int's string limit (4,300), which pydantic's serializer would write."""
    values = chain.from_iterable(map(dict.values, records))
    return all(v.bit_length() < 4096 for v in values if type(v) is int)  # (1,234 digits)


def _records(records: list[dict[object, object]] | tuple[dict[object, object], ...],
             pad: str, value_types: set[type]) -> str:  # fmt: skip
    """Records whose values (of value_types) hold no container, one a line, each as _FLAT
    writes it."""
    if (
        value_types <= _SAME_TYPES
        and set(map(type, chain.from_iterable(records))) <= {str}
        and (int not in value_types or _small_ints(records))
    ):
        # pydantic's serializer (Rust) writes each in a quarter of the time. Its strings are
        # json's as long as none needs an escape: it does not escape DEL or non-ASCII, and
        # spells some escapes otherwise. Any backslash (an escape, or one in a string), or a
        # string it cannot write (a surrogate), takes the way below.
        try:
            lines = (b",\n" + pad.encode()).join(map(to_json, records))
        except PydanticSerializationError:
            lines = b"\\"
        if lines.isascii() and b"\\" not in lines and b"\x7f" not in lines:
            return pad + lines.decode("ascii")
    # One encoder call writes them all: a newline there is a separator (see _SPLIT), and one
    # between `}` and `{` is the one between two records (no value of a record ends in `}`).
    # NUL, like a newline, never appears bare in the encoder's output, so it marks those while
    # the rest become `,`.
    text = _SPLIT.encode(records)[1:-1]
    return pad + text.replace("}\n{", "}\0{").replace("\n", ",").replace("\0", ",\n" + pad)


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
        records = set(map(type, value)) == {dict}
        value_types = (
            set(map(type, chain.from_iterable(map(dict.values, value)))) if records else set()
        )
        if records and not any(issubclass(t, dict | list | tuple) for t in value_types):
            # Plain records (10,000 changes, say): each on its line, written in one call.
            body = _records(value, pad, value_types)
        else:
            body = ",\n".join(f"{pad}{pretty_json(v, depth + 1)}" for v in value)
        return "[\n" + body + "\n" + "  " * depth + "]"
    return _FLAT.encode(value)
