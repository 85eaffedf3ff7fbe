"""parse_statement takes pydantic's JSON parser first and json.loads after it: both ways must
accept and refuse the same receipts."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError
from test_fuzz_receipt import genuine_statement_data

from gatekeeper.errors import ReceiptError
from gatekeeper.receipt.models import Predicate, Statement, Write
from gatekeeper.receipt.statement import parse_statement


def _both(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


def test_a_path_that_is_not_utf8_still_parses() -> None:
    # An escaped lone surrogate (git's bytes that are not UTF-8) is refused by pydantic's
    # parser; the json.loads way must still take it, unchanged.
    data = genuine_statement_data()
    data["predicate"]["changes"][0]["path"] = "src/\udcff.py"
    statement = parse_statement(_both(data))
    assert statement.predicate.changes[0].path == "src/\udcff.py"


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (("predicate", "changes", 0, "sneaky"), "x", "changes.0.sneaky"),
        (("predicate", "changes", 0, "old_blob"), 7, "changes.0.old_blob"),
        (("predicate", "changes", 0, "__dict__"), {}, "changes.0.__dict__"),
        (("predicate", "changes", 0), ["M", "a"], "changes.0"),
        (("predicate", "processes", 0, "__slots__"), [], "processes.0.__slots__"),
        (("predicate", "processes", 0, "pid"), "two", "processes.0.pid"),
        (("predicate", "writes"), [{"path": "a", "op": "create"}], "writes.0.decision"),
        (
            ("predicate", "writes"),
            [{"path": "a", "op": "x", "decision": "deny", "n": 1}],
            "writes.0.n",
        ),  # fmt: skip
        (("predicate", "run_id"), None, "run_id"),
    ],
)
def test_a_bad_field_is_refused_and_named(where: tuple[Any, ...], value: Any, message: str) -> None:
    data = copy.deepcopy(genuine_statement_data())
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(ReceiptError, match=message):
        parse_statement(_both(data))
    # The same receipt by the other way alone is refused too.
    with pytest.raises(ValueError):
        Statement.model_validate(json.loads(_both(data)))


def test_the_fast_way_gives_the_same_statement() -> None:
    payload = _both(genuine_statement_data())
    assert parse_statement(payload) == Statement.model_validate(json.loads(payload))


def test_records_made_in_code_are_validated_when_a_receipt_is_made() -> None:
    """Process, Write and Change are dataclasses whose constructors check nothing: a predicate
    made with one of the wrong type is refused, not signed."""
    data = genuine_statement_data()["predicate"]
    good = Predicate.model_validate(data)
    bad = [
        {"writes": [Write(path=5, op="create", decision="deny")]},  # type: ignore[arg-type]
        {"processes": [replace(good.processes[0], pid="two")]},  # type: ignore[arg-type]
        {"changes": [replace(good.changes[0], score="high")]},  # type: ignore[arg-type]
    ]
    for update in bad:
        with pytest.raises(ValidationError):
            Predicate(**{**{k: getattr(good, k) for k in Predicate.model_fields}, **update})
    # Numbers given as text are taken as a model took them: as numbers.
    made = Predicate(**{**{k: getattr(good, k) for k in Predicate.model_fields},
                        "processes": [replace(good.processes[0], pid="7")]})  # fmt: skip
    assert made.processes[0].pid == 7
