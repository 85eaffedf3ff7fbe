"""Plain text for terminals: the verdict, each finding, then the receipts and commits."""

from __future__ import annotations

from gatekeeper.report.interface import Report, Reporter


class TextReporter(Reporter):
    def render(self, report: Report) -> str:
        r = report.result
        out = [
            f"verdict: {r.verdict.value.upper()}",
            f"range:   {r.target_name} ({r.target[:12]}) .. {r.head_name} ({r.head[:12]}), "
            f"merge-base {(r.merge_base or 'none')[:12]}",
            f"receipts verified: {r.receipts_verified}",
            "",
        ]
        if r.findings:
            out.append(f"findings ({len(r.findings)}):")
            for f in r.findings:
                where = " ".join(
                    x for x in (f.path and repr(f.path), f.commit and f.commit[:12]) if x
                )
                out.append(f"  [{f.kind.value}] {f.message}" + (f"  ({where})" if where else ""))
        else:
            out.append("findings: none")
        if r.receipts:
            out += ["", "receipts:"]
            for v in r.receipts:
                p = v.statement.predicate
                covers = ", ".join(c[:12] for c in v.covers) or "nothing in the range"
                out.append(
                    f"  {p.run_id}: `{' '.join(p.command.argv)}` exit {p.command.exit_code}, "
                    f"{len(p.changes)} change(s), covers {covers}; signed by {v.signer}"
                )
        if r.commits:
            out += ["", "commits:"]
            for c in r.commits:
                by = r.covered_by.get(c.oid)
                person = r.signed_by.get(c.oid)
                what = f"receipt {by}" if by else f"person: {person}" if person else "no receipt"
                out.append(f"  {c.short} {c.subject}  [{what}]")
        return "\n".join(out) + "\n"
