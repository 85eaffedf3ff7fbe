"""`gatekeeper check`: judge REV against the target branch and write a report."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

from gatekeeper.commands import outcome
from gatekeeper.errors import Error, UsageError
from gatekeeper.gate import GateResult, judge
from gatekeeper.gate.history import EMPTY_TREE
from gatekeeper.git import discover, exact_refs, git, rev_parse
from gatekeeper.report import Report, ReportFormat, summary_line


def resolve(repo: Path, rev: str) -> str:
    """The commit rev names, resolved in repo's own worktree (so HEAD is that worktree's HEAD).

    Names are resolved unambiguously (see gatekeeper.git.resolve_object); raises GitError.
    """
    return rev_parse(None, rev, cwd=repo)


def default_branch(repo: Path) -> str:
    """The target when --base is not given, as a full ref name: origin's default branch, else
    main or master. A full name, so that a tag called `origin/main` cannot stand in for it."""
    out = git("symbolic-ref", "--quiet", "refs/remotes/origin/HEAD", cwd=repo, check=False)
    candidates = [out.decode().strip()] if out.strip() else []
    configured = (
        git("config", "--get", "init.defaultBranch", cwd=repo, check=False).decode().strip()
    )
    candidates += [f"refs/heads/{n}" for n in (configured, "main", "master") if n]
    found = exact_refs(candidates, cwd=repo)
    for ref in candidates:
        if ref in found:
            return ref
    raise UsageError(
        "cannot tell which branch is the target",
        hint="pass --base with the branch the change would merge into, e.g. --base origin/main",
    )


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """What each call returns, in order; they run at the same time, each on a thread of its
    own (each mostly waits on a git of its own). Raises what the first of them to fail (in
    order, not in time) raised, so errors come as if they had run one after the other."""
    outcomes: list[tuple[bool, Any]] = [(False, None)] * len(calls)

    def run(index: int) -> None:
        try:
            outcomes[index] = (True, calls[index]())
        except BaseException as exc:  # noqa: BLE001 - raised again below, in order
            outcomes[index] = (False, exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(1, len(calls))]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    for ok, value in outcomes:
        if not ok:
            raise value
    return [value for _, value in outcomes]


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


# check's options in the plain form, each with the keyword argument it sets.
_OPTIONS = {"--repo": "repo", "--base": "base", "--format": "fmt", "-o": "output",
            "--output": "output"}  # fmt: skip


def plain_arguments(argv: list[str], environ: Mapping[str, str]) -> dict[str, Any] | None:
    """check's keyword arguments from argv (what follows `check`) when it holds only the plain
    forms the command line reads the same way: each option at most once, as `--opt VALUE`
    (`--format` one of the report formats), at most one revision, no value empty or starting
    with `-`; None for anything else (`--help`, `--opt=VALUE`, a repeated option, `--`, shell
    completion), which the command line then parses itself, with its own help and errors.

    The command line builds a pydantic type adapter for each parameter it converts (tens of
    milliseconds for a command that judges in a few hundred); these forms need none.
    """
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in environ):
        return None
    found: dict[str, Any] = {}
    revs: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg or "\0" in arg:
            return None
        if not arg.startswith("-"):
            revs.append(arg)
            i += 1
            continue
        key = _OPTIONS.get(arg)
        if key is None or key in found or i + 1 == len(argv):
            return None
        value = argv[i + 1]
        if not value or value.startswith("-") or "\0" in value:
            return None
        found[key] = value
        i += 2
    if len(revs) > 1 or found.get("fmt", "text") not in {f.value for f in ReportFormat}:
        return None
    return {
        "repo": Path(found.get("repo", ".")),
        "base": found.get("base"),
        "rev": revs[0] if revs else "HEAD",
        "fmt": found.get("fmt", "text"),
        "output": Path(found["output"]) if "output" in found else None,
    }


def run_plain(argv: list[str]) -> None:
    """Run `check` at once, ending the process, when argv (what follows `check`) holds only
    its plain forms (plain_arguments), without loading the command line at all (typer and
    its type adapters, which a check does not need); return when argv needs its parse."""
    kwargs = plain_arguments(argv, os.environ)
    if kwargs is None:
        return
    kept: list[object] = []
    try:
        code = outcome(check, **kwargs, keep=kept)
    except BrokenPipeError:  # as the command line ends on a closed pipe
        pacify_closed_pipe()
        end_process(1)
    end_process(code)


class _PacifiedStream:
    """A stream whose flush says nothing of a closed pipe (nobody is left to read it)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def pacify_closed_pipe() -> None:
    """stdout and stderr flushed quietly from now on: after a reader closed the pipe, the
    interpreter's last flush would otherwise print a traceback (as the command line does)."""
    sys.stdout = _PacifiedStream(sys.stdout)
    sys.stderr = _PacifiedStream(sys.stderr)


def end_process(code: int) -> NoReturn:
    """End the process with code now, its output flushed: without the interpreter's own end,
    which frees every object still alive one by one (a large receipt's hundreds of
    thousands, tens of milliseconds) and has nothing else to do after a check."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass  # nobody is left to read it
    os._exit(code)


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
) -> int:
    """Judge rev against base and write the report; 0 pass, 1 block (raises UsageError/GitError).

    The judgement is appended to keep when given: a caller that ends the process right after
    (end_process) spares freeing its objects one by one.
    """
    try:
        report_format = ReportFormat(fmt)
    except ValueError:
        raise UsageError(
            f"unknown report format {fmt!r}",
            hint="use one of: " + ", ".join(f.value for f in ReportFormat),
        ) from None

    def target_of() -> tuple[str, str]:
        if base is not None:
            return base, resolve(repo, base)
        # Resolved by its full name; shown by its short one, as before.
        full = default_branch(repo)
        return full.removeprefix("refs/heads/").removeprefix("refs/remotes/"), resolve(repo, full)

    paths, (target_name, target), head = at_once(
        lambda: discover(repo), target_of, lambda: resolve(repo, rev)
    )
    with collector_paused():
        result = judge(paths.git_dir, target, head, target_name=target_name, head_name=rev)
        text = render(result, report_format, paths.git_dir)
    if keep is not None:
        keep.append(result)
    write_report(text, output)
    print(summary_line(result), file=sys.stderr)
    if report_format is ReportFormat.text and output is None:
        return 0 if result.passed else 1
    for finding in result.findings[:20]:
        print(f"  [{finding.kind.value}] {finding.message}", file=sys.stderr)
    if len(result.findings) > 20:
        print(f"  ... and {len(result.findings) - 20} more", file=sys.stderr)
    return 0 if result.passed else 1
