"""What the gate shows a person: repository text made visible, and findings capped per kind.

Commit subjects, ref names, paths, key comments and any other text read from a repository go to
a terminal (a text report, a hook's `remote:` lines) only through visible(), so nothing pushed
can clear the screen, print a fake verdict or hide what follows. A text output shows at most
SHOWN_PER_KIND findings of each kind (capped()); the JSON report lists them all.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator

from gatekeeper.gate.findings import Finding, Kind

SHOWN_PER_KIND = 20  # findings of one kind a text report or a hook shows; the rest are counted


def visible(text: str) -> str:
    """text with every character that does not print as itself (controls, ESC, bidi
    overrides, other format characters, spaces other than the plain one, bytes that are not
    UTF-8) as a visible escape, for a terminal: nothing a run or a repository recorded may
    steer it, or pass for another name (`README.md` followed by a no-break space)."""
    if text.isprintable():  # (every character escaped below is one str.isprintable refuses)
        return text
    out = []
    for ch in text:
        if 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte that is not UTF-8 (surrogate escape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") or (
            ch != " " and unicodedata.category(ch) == "Zs"
        ):
            out.append(f"\\u{ord(ch):04x}" if ord(ch) > 0xFF else f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def visible_text(text: str) -> str:
    """visible(), keeping line ends and tabs: for a report's blocks of text (a diff's lines
    in a page, a Markdown comment), where they lay the text out and steer nothing."""
    if text.isprintable():
        return text
    return "\n".join(
        "\t".join(visible(piece) for piece in line.split("\t")) for line in text.split("\n")
    )


def visible_lines(text: str) -> str:
    """visible() of each line of text (the gate's own multi-line messages keep their lines)."""
    if text.isprintable():
        return text
    return "\n".join(visible(line) for line in text.split("\n"))


def capped(
    findings: Iterable[Finding], per_kind: int = SHOWN_PER_KIND
) -> Iterator[Finding | tuple[Kind, int]]:
    """The findings, at most per_kind of each kind, in their order; after the last one shown
    of a kind with more, (kind, how many more)."""
    findings = list(findings)
    total = Counter(f.kind for f in findings)
    seen: Counter[Kind] = Counter()
    for f in findings:
        seen[f.kind] += 1
        if seen[f.kind] <= per_kind:
            yield f
            if seen[f.kind] == per_kind and total[f.kind] > per_kind:
                yield f.kind, total[f.kind] - per_kind
