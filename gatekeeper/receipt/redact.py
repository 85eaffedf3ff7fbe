"""Keep secrets out of the record: passed-in secret values and credential-looking options.

Applied by the launcher to everything it records from a run (argv of every process, the
command, the checks, the commit message, the run's summary and JSON), so a key the person
passed in never reaches the receipt, the branch or a report, even when the agent puts it on
a command line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[REDACTED]"
MIN_SECRET = 6  # shorter values would redact ordinary words

# Options whose value is a credential: --api-key X, --openai-api-key=X, --token X, ...
_CRED_WORD = r"(?:[a-z0-9]+[-_])*(?:api[-_]?key|token|secret|password|passwd|credentials?|auth)"
_OPTION = re.compile(rf"^(--?{_CRED_WORD})(=(.*))?$", re.I)
# Header lines and URL user-info: Authorization: Bearer X, https://user:pass@host
_TOKEN = re.compile(r"\S{1,512}")  # what a credential looks like: one word
# The credential after a header's name is its scheme, if any, and one word: only that goes
# (the rest of the line may be a script that ran, which the record must show).
# The word may be quoted, or made by a command (`$(...)`, backquotes): that goes whole.
_HEADER = re.compile(
    r"((?:proxy-)?authorization[ \t]*:[ \t]*|x-api-key[ \t]*:[ \t]*|api-key[ \t]*:[ \t]*)"
    r"(?:[a-z][a-z0-9-]{0,31}[ \t]+)?[\"']?"
    r"(?:\$\([^()\n]{0,4096}\)|`[^`\n]{0,4096}`|[^\s\"'`;|&<>()]+)",
    re.I,
)
# A scheme is tried only where one can start (not inside a longer word), so a long word is
# not tried again at each of its letters: linear, where the plain pattern took quadratic time
# (minutes on the 100 KiB script of an `sh -c`). User-info is what RFC 3986 allows there,
# less what ends a word of code or a shell command (quotes, brackets, `;`, `&`, `|`), at most
# 512 characters: never the code between a `://` and a later `@`.
_USERINFO = re.compile(r"(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)[a-z0-9._~%!$*+,=:-]{1,512}@", re.I)
# Well-known key shapes, wherever they stand.
_KEY_SHAPES = re.compile(
    r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{20})\b"
)


class Redactor:
    """Replaces known secret values and credential-shaped text with a marker."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if s and len(s) >= MIN_SECRET}
        self._values = sorted(values, key=len, reverse=True)
        self._pattern = (
            re.compile("|".join(re.escape(v) for v in self._values), re.I) if self._values else None
        )

    def text(self, value: str) -> str:
        """value with every secret, header credential, URL password and key shape removed."""
        if self._pattern is not None:
            value = self._pattern.sub(REDACTED, value)
        value = _HEADER.sub(lambda m: m.group(1) + REDACTED, value)
        value = _USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", value)
        return _KEY_SHAPES.sub(REDACTED, value)

    @property
    def values(self) -> list[str]:
        return list(self._values)

    def data(self, value: object, keep: frozenset[str] = frozenset()) -> object:
        """value (JSON-shaped) with every string redacted, except under the keys in keep."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.data(v, keep) for v in value]
        if isinstance(value, dict):
            return {k: v if k in keep else self.data(v, keep) for k, v in value.items()}
        return value

    def argv(self, argv: list[str]) -> list[str]:
        """argv with secret values and the values of credential options removed.

        Only a value shaped like a credential (one word, no spaces) is removed after a
        credential-like option: anything else (a script passed as `-auth '...'`) stays, so an
        agent cannot hide what it ran behind an option name.
        """
        out: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next:
                hide_next = False
                if _TOKEN.fullmatch(arg):
                    out.append(REDACTED)
                    continue
            match = _OPTION.match(arg)
            if match and match.group(2) is not None and _TOKEN.fullmatch(match.group(3)):
                out.append(f"{match.group(1)}={REDACTED}")
                continue
            if match and match.group(2) is None:
                hide_next = True
                out.append(arg)
                continue
            out.append(self.text(arg))
        return out
