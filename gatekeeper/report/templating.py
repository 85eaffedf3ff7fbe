"""The Jinja2 environments for templates shipped in `gatekeeper.templates`."""

from __future__ import annotations

import html
import re
from functools import lru_cache

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from gatekeeper.gate.shown import visible_text
from gatekeeper.resources import resource_path

_MD_SPECIAL = re.compile(r"([\\`*_\[\]~|#])")


def md_cell(value: object) -> str:
    """Text safe inside a Markdown table cell: HTML-escaped, Markdown punctuation escaped."""
    text = html.escape(str(value).encode("utf-8", "replace").decode("utf-8"), quote=False)
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return text.replace("\r", "").replace("\n", "<br>")


def short(value: object, n: int = 12) -> str:
    return str(value or "")[:n]


def printable(value: object) -> str:
    """A path or message as readable text: lone surrogates (non-UTF-8 bytes) shown as U+FFFD."""
    return str(value).encode("utf-8", "replace").decode("utf-8")


def _shown(value: object) -> object:
    """Every value a template prints, with what would steer a terminal or pass for another
    name (controls, ESC, bidi overrides) as visible escapes: a report is read in terminals,
    CI logs and pull-request comments as well as in a browser."""
    if isinstance(value, Markup):
        return Markup(visible_text(str(value)))
    if isinstance(value, str):
        return visible_text(value)
    return value


@lru_cache(maxsize=2)
def environment(markup: bool) -> Environment:
    """One Environment per kind: autoescaped for HTML, plain with trimmed blocks for Markdown."""
    env = Environment(
        finalize=_shown,
        loader=FileSystemLoader(str(resource_path("templates"))),
        autoescape=select_autoescape(["html", "html.j2"]) if markup else False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=StrictUndefined,
    )
    env.filters.update(md_cell=md_cell, short=short, printable=printable)
    return env
