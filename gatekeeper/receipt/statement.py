"""Make, sign, verify and parse receipt statements (sign bytes, verify bytes, then parse)."""

from __future__ import annotations

import json

from pydantic import ValidationError

from gatekeeper.errors import ReceiptError
from gatekeeper.receipt import dsse
from gatekeeper.receipt.keys import PublicKey, SigningKey
from gatekeeper.receipt.models import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Predicate,
    Statement,
    Subject,
)


def make_statement(predicate: Predicate, commit: str, tree: str) -> Statement:
    return Statement(
        _type=STATEMENT_TYPE,
        subject=[Subject(name=predicate.branch, digest={"gitCommit": commit, "gitTree": tree})],
        predicateType=PREDICATE_TYPE,
        predicate=predicate,
    )


def parse_statement(payload: bytes) -> Statement:
    """Parse verified payload bytes; raise ReceiptError naming the first bad field."""
    try:
        # json.loads keeps escaped surrogates (paths that are not UTF-8) that a strict parser
        # would reject.
        statement = Statement.model_validate(json.loads(payload))
    except RecursionError as exc:
        # json.loads recurses once per level of nesting: deep enough, it exhausts the stack.
        raise ReceiptError("malformed in-toto statement: nested too deeply") from exc
    except (ValidationError, ValueError) as exc:
        if not isinstance(exc, ValidationError):
            raise ReceiptError(f"malformed in-toto statement: not JSON ({exc})") from exc
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ReceiptError(f"malformed in-toto statement: {where}: {first['msg']}") from exc
    if statement.type_ != STATEMENT_TYPE:
        raise ReceiptError(f"malformed in-toto statement: _type is {statement.type_!r}")
    if statement.predicateType != PREDICATE_TYPE:
        raise ReceiptError(f"not a gatekeeper receipt: predicateType {statement.predicateType!r}")
    digest = statement.subject[0].digest if statement.subject else {}
    if "gitCommit" not in digest or "gitTree" not in digest:
        raise ReceiptError("malformed in-toto statement: subject lacks gitCommit/gitTree")
    return statement


def sign_statement(statement: Statement, key: SigningKey) -> dsse.Envelope:
    return dsse.sign(statement.to_bytes(), key)


def verify_envelope(line: str, trusted: list[PublicKey]) -> tuple[Statement, PublicKey]:
    """Parse, verify and then parse the payload of one envelope line; raise on any failure."""
    envelope = dsse.parse_envelope(line)
    payload, signer = dsse.verify(envelope, trusted)
    return parse_statement(payload), signer
