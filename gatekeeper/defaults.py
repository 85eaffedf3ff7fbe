"""Empty defaults for pydantic model fields: `Field(default_factory=empty_list)`.

pydantic asks every default factory for its signature (whether it takes the data validated
so far). For a builtin such as `list` that means parsing its text signature with the
tokenizer: about a millisecond for the first and a tenth of one for each other, paid by every
command that loads the models. The signature of these plain functions is read at once.
"""

from __future__ import annotations

from typing import Any


def empty_list() -> list[Any]:
    return []


def empty_dict() -> dict[Any, Any]:
    return {}
