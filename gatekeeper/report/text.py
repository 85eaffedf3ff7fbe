"""Plain text for terminals: the verdict, the findings (at most SHOWN_PER_KIND of each kind),
then the receipts and commits; all text from the repository through visible()."""

from __future__ import annotations

from gatekeeper.gate.shown import capped, visible
from gatekeeper.report.decisions import Refusals, command_text, refusals
from gatekeeper.report.interface import Report, Reporter


def _refusal_lines(found: Refusals) -> list[str]:
    """A receipt's decision points (with who decided them) and refusals, indented."""
    out = []
    for e in found.escalations:
        out.append(visible(f"    escalation {e.kind} `{e.value.short}` [{e.id}]: {e.decision}"))
        for a in e.approvals:
            decided = f"{a.get('decision', '?')}, decided by {a.get('signer', '?')}"
            out.append(f"      {visible(decided)} ({visible(a.get('status', '?'))})")
    for a in found.unmatched:
        out.append(f"    approval for no decision point of this run: {visible(a.get('id', '?'))} "
                   f"{visible(a.get('decision', '?'))} by {visible(a.get('signer', '?'))} "
                   f"({visible(a.get('status', '?'))})")  # fmt: skip
    out += [f"    denied write {visible(path)}" for path in found.denied_writes]
    for d in found.denied_commands:
        rule = f" (rule `{visible(d.rule)}`)" if d.rule else ""
        out.append(f"    denied command `{visible(d.command.short)}`{rule}")
    out += [f"    denied network {visible(d)}" for d in found.denied_destinations]
    out += [f"    secret lookup {visible(path)}" for path in found.secret_lookups]
    return out


class TextReporter(Reporter):
    def render(self, report: Report) -> str:
        r = report.result
        out = [
            f"verdict: {r.verdict.value.upper()}",
            f"range:   {visible(r.target_name)} ({r.target[:12]}) .. {visible(r.head_name)} "
            f"({r.head[:12]}), "
            f"merge-base {(r.merge_base or 'none')[:12]}",
            f"receipts verified: {r.receipts_verified}",
            "",
        ]
        if r.findings:
            out.append(f"findings ({len(r.findings)}):")
            for f in capped(r.findings):
                if isinstance(f, tuple):
                    kind, more = f
                    out.append(f"  ... and {more} more [{kind.value}] (the JSON report lists all)")
                    continue
                where = " ".join(
                    x for x in (f.path and repr(f.path), f.commit and f.commit[:12]) if x
                )
                line = f"  [{f.kind.value}] {f.message}" + (f"  ({where})" if where else "")
                out.append(visible(line))
        else:
            out.append("findings: none")
        if r.ignored_notes:
            out.append(
                f"note lines ignored ({len(r.ignored_notes)}): on commits a verified receipt "
                "or a trusted person accounts for, they do not speak for them"
            )
            for f in capped(r.ignored_notes):
                if isinstance(f, tuple):
                    out.append(f"  ... and {f[1]} more (the JSON report lists all)")
                    continue
                out.append(visible(f"  [{f.kind.value}] {f.message}  ({(f.commit or '')[:12]})"))
        if r.receipts:
            out += ["", "receipts:"]
            for v in r.receipts:
                p = v.statement.predicate
                covers = ", ".join(c[:12] for c in v.covers) or "nothing in the range"
                out.append(
                    f"  {visible(p.run_id)}: `{visible(command_text(p.command.argv).short)}` "
                    f"{p.command.ending(p.sandbox)}, {len(p.changes)} change(s), covers {covers}; "
                    f"signed by {visible(v.signer)}"
                )
                out += _refusal_lines(refusals(v))
        if r.commits:
            out += ["", "commits:"]
            for c in r.commits:
                by = r.covered_by.get(c.oid)
                person = r.signed_by.get(c.oid)
                what = f"receipt {by}" if by else f"person: {person}" if person else "no receipt"
                out.append(f"  {c.short} {visible(c.subject)}  [{visible(what)}]")
        return "\n".join(out) + "\n"
