"""`gatekeeper stats`: the nine numbers across a repository's runs, as text, JSON or a
self-contained HTML dashboard.

Receipt figures are summed from receipts that verify against the default branch's trust file
(as the gate would judge them); a receipt that does not verify counts nowhere and is reported
as such. Each run's branch is judged by the real gate against the default branch, and a
receipt/diff mismatch finding makes it one of the `mismatches`.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from gatekeeper.commands.check import write_report
from gatekeeper.commands.check_early import default_branch
from gatekeeper.commands.runs import RunRow, list_runs
from gatekeeper.errors import GitError, ReceiptError, UsageError
from gatekeeper.gate import judge
from gatekeeper.gate.notes import local_sources, read_notes
from gatekeeper.git import discover, exact_refs, is_ancestor, rev_parse
from gatekeeper.receipt import dsse
from gatekeeper.receipt.keys import PublicKey
from gatekeeper.receipt.models import PREDICATE_TYPE, Predicate
from gatekeeper.receipt.statement import verify_envelope
from gatekeeper.receipt.trust import trusted_keys_at
from gatekeeper.report.dashboard import render_dashboard
from gatekeeper.report.stats import FIGURES, MISMATCH_KINDS, RunStats, Stats
from gatekeeper.run.records import all_records, is_run_id

# Where the dashboard looks for each run's report, relative to the dashboard file's folder
# (write one with `gatekeeper check --format html -o reports/<run-id>.html agent/<run-id>`).
REPORTS_DIR = "reports"


def _verified(git_dir: Path, trusted: list[PublicKey]) -> tuple[dict[str, Predicate], int]:
    """run id -> predicate of each receipt that verifies and describes the commit it is on;
    and how many receipt lines did not verify. Lines that are not receipts (approvals) are
    neither."""
    found: dict[str, Predicate] = {}
    bad = 0
    for commit, lines in read_notes(git_dir, local_sources(git_dir)).items():
        for note in lines:
            if note.problem:
                bad += 1
                continue
            if not _is_receipt(note.line):
                continue  # an approval or another statement: not counted, not a failure
            try:
                statement, _ = verify_envelope(note.line, trusted)
            except ReceiptError:  # a bad signature, an untrusted key, a malformed receipt
                bad += 1
                continue
            if statement.result_commit != commit:
                bad += 1
                continue
            found[statement.predicate.run_id] = statement.predicate
    return found, bad


def _is_receipt(line: str) -> bool:
    """True unless the line is an envelope whose (unverified) statement is not a receipt."""
    try:
        payload = json.loads(dsse.parse_envelope(line).payload_bytes())
    except (ReceiptError, ValueError):
        return True  # malformed: verification says so, and it counts as not verified
    return not isinstance(payload, dict) or payload.get("predicateType") == PREDICATE_TYPE


def _since(text: str | None) -> str | None:
    """--since as an ISO date or time (UTC); raise UsageError for anything else."""
    if text is None:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since {text!r}: expected a date such as 2026-01-31 "
                         "or a time such as 2026-01-31T12:00") from None  # fmt: skip
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).isoformat(timespec="seconds")


def _started(row: RunRow, predicate: Predicate | None) -> str | None:
    when = row.started_at or (predicate.started_at if predicate else None)
    if not when:
        return None
    try:
        return datetime.fromisoformat(when).astimezone(UTC).isoformat(timespec="seconds")
    except ValueError:
        return None


def _mismatch(git_dir: Path, target: str, row: RunRow) -> list[str]:
    """The gate's receipt/diff mismatch kinds on the run's branch (or result) against target."""
    ref = f"refs/heads/{row.branch}"
    head = exact_refs([ref], git_dir).get(ref) if row.branch else None
    head = head or row.commit
    if not head:
        return []
    result = judge(git_dir, target, head, target_name="default", head_name=row.branch)
    return sorted({f.kind.value for f in result.findings if f.kind.value in MISMATCH_KINDS})


def gather(repo: Path, since: str | None, report_dir: Path | None) -> Stats:
    """Every run of repo (started at or after since), with its verified receipt and verdict."""
    paths = discover(repo)
    git_dir = paths.git_dir
    try:
        target_ref: str | None = default_branch(repo)
    except UsageError:
        target_ref = None
    target = rev_parse(git_dir, target_ref) if target_ref else None
    trusted: list[PublicKey] = []
    if target is not None:
        try:
            trusted = trusted_keys_at(git_dir, target)
        except ReceiptError:
            trusted = []  # no trust file: no receipt verifies, and the page says so
    predicates, bad = _verified(git_dir, trusted)
    recorded = {r.run_id for r in all_records(git_dir)}
    rows = []
    for row in list_runs(git_dir, repo):
        predicate = predicates.get(row.run_id)
        if predicate is None and row.run_id not in recorded:
            continue  # known only from a receipt that does not verify: counted as such
        started = _started(row, predicate)
        if since is not None and (started is None or started < since):
            continue
        accepted = False
        if row.commit and target is not None and row.state != "running":
            try:
                accepted = is_ancestor(git_dir, row.commit, target)
            except GitError:
                accepted = False
        mismatch = []
        if target is not None and row.state not in ("running",) and not accepted:
            mismatch = _mismatch(git_dir, target, row)
        report = None
        if (report_dir is not None and is_run_id(row.run_id)
                and (report_dir / REPORTS_DIR / f"{row.run_id}.html").is_file()):  # fmt: skip
            report = f"{REPORTS_DIR}/{row.run_id}.html"
        rows.append(RunStats(row.run_id, row.branch, row.commit, row.state, started, accepted,
                             row.state == "discarded", mismatch, predicate, report))  # fmt: skip
    shown_target = target_ref.removeprefix("refs/heads/") if target_ref else None
    return Stats(str(paths.work_tree or git_dir), shown_target, since, rows, bad)


def _text(stats: Stats) -> str:
    totals = stats.totals
    lines = [f"runs              {totals['runs']}"]
    lines += [f"{name:<17} {totals[name]}" for name in FIGURES]
    if stats.unverified_receipts:
        lines.append(f"({stats.unverified_receipts} receipt(s) did not verify: not counted)")
    heads = [name.split("_")[0][:8] for name in FIGURES]
    if stats.by_day:
        lines += ["", "day         runs  " + "  ".join(heads)]
        for day in stats.by_day:
            cells = "  ".join(f"{day[n]:>{len(h)}}" for n, h in zip(FIGURES, heads, strict=True))
            lines.append(f"{day['day']:<11} {day['runs']:>4}  {cells}")
    return "\n".join(lines) + "\n"


def stats(*, repo: Path, since: str | None = None, json_out: bool = False, html: bool = False,
          output: Path | None = None) -> int:  # fmt: skip
    """Print (or write) the figures; 0, or raise UsageError/GitError."""
    if html and output is None:
        raise UsageError("--html needs -o FILE", hint="e.g. gatekeeper stats --html -o stats.html")
    report_dir = output.resolve().parent if output is not None else None
    gathered = gather(repo, _since(since), report_dir)
    if html:
        text = render_dashboard(gathered)
    elif json_out:
        text = json.dumps(gathered.to_json(), indent=2, ensure_ascii=True) + "\n"
    else:
        text = _text(gathered)
    write_report(text, output)
    if output is not None:
        print(f"gatekeeper: stats of {gathered.totals['runs']} run(s) written to {output}",
              file=sys.stderr)  # fmt: skip
    return 0
