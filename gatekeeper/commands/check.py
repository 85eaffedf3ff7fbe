"""`gatekeeper check`: judge REV against the target branch and write a report."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from gatekeeper.commands import outcome
from gatekeeper.commands.check_early import Early, locate
from gatekeeper.commands.plain import end_process, pacify_closed_pipe
from gatekeeper.errors import Error, UsageError
from gatekeeper.gate import GateResult, judge
from gatekeeper.gate.history import EMPTY_TREE
from gatekeeper.gate.shown import visible
from gatekeeper.git import judging_offline
from gatekeeper.report import Report, ReportFormat, summary_line


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off meanwhile (and back on after, if it was on).

    A large receipt is hundreds of thousands of objects that live until the report is
    written; each pass of the collector over them frees nothing, and the passes took over
    half the time of parsing a receipt of 10,000 changes. What the judgement leaves in cycles
    is collected once the collector is back on.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def render(result: GateResult, fmt: ReportFormat, git_dir: Path) -> str:
    """The report text in fmt; the HTML report also reads the real diff's hunks."""
    reporter = fmt.reporter()
    report = Report(result)
    if reporter.needs_diff and result.changes:
        from gatekeeper.gate.diff import file_diffs  # only the HTML report reads the hunks

        try:
            report.diffs = file_diffs(git_dir, result.merge_base or EMPTY_TREE, result.head)
        except Error as exc:  # the verdict stands; only the hunks are missing
            print(
                f"warning: the diff could not be read for the report: {exc.message}",
                file=sys.stderr,
            )
    return reporter.render(report)


def run_plain(kwargs: dict[str, Any], early: Early | None = None) -> NoReturn:
    """Run `check` with kwargs (plain_arguments), ending the process, without loading the
    command line at all (typer and its type adapters, which a check does not need); early:
    what was started for it (check_early.start)."""
    kept: list[object] = []
    try:
        code = outcome(check, **kwargs, keep=kept, early=early)
    except BrokenPipeError:  # as the command line ends on a closed pipe
        pacify_closed_pipe()
        end_process(1)
    end_process(code)


def write_report(text: str, output: Path | None) -> None:
    data = text.encode("utf-8", "replace")
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        output.write_bytes(data)
    except OSError as exc:
        raise UsageError(f"cannot write the report to {output}: {exc.strerror}") from exc


def check(
    *,
    repo: Path,
    base: str | None,
    rev: str,
    fmt: str,
    output: Path | None,
    keep: list[object] | None = None,
    early: Early | None = None,
) -> int:
    """Judge rev against base and write the report; 0 pass, 1 block (raises UsageError/GitError).

    The judgement is appended to keep when given: a caller that ends the process right after
    (end_process) spares freeing its objects one by one. early: the same repo, base and rev
    located, and the notes on head read, already (check_early.start).
    """
    try:
        report_format = ReportFormat(fmt)
    except ValueError:
        raise UsageError(
            f"unknown report format {fmt!r}",
            hint="use one of: " + ", ".join(f.value for f in ReportFormat),
        ) from None

    with judging_offline():  # (the plain entry set it already, for what it started early)
        if early is not None:
            paths, (target_name, target), head = early.located()
        else:
            paths, (target_name, target), head = locate(repo, base, rev)
        with collector_paused():
            result = judge(paths.git_dir, target, head, target_name=target_name, head_name=rev,
                           head_notes=None if early is None else early.head_notes,
                           range_ahead=None if early is None else early.range_ahead,
                           reads=None if early is None else early.reads)  # fmt: skip
            text = render(result, report_format, paths.git_dir)
    if keep is not None:
        keep.append(result)
    write_report(text, output)
    print(summary_line(result), file=sys.stderr)
    if report_format is ReportFormat.text and output is None:
        return 0 if result.passed else 1
    for finding in result.findings[:20]:
        print(visible(f"  [{finding.kind.value}] {finding.message}"), file=sys.stderr)
    if len(result.findings) > 20:
        print(f"  ... and {len(result.findings) - 20} more", file=sys.stderr)
    return 0 if result.passed else 1
