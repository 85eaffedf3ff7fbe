"""What a plain `check` needs before its judgement loads: its arguments read without the
command line, and the git it reads first (the repository, the names, the notes on head)
started at once, on threads of its own.

Loading the judgement (pydantic, the receipt and policy models, cryptography, yaml) takes
about as long as the judgement itself on a large change; meanwhile the interpreter is
busy, but git, in processes of its own, is not. This module loads only what reading git
takes, so that `python -m gatekeeper check` starts those reads first.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.commands.plain import plain_options
from gatekeeper.errors import UsageError
from gatekeeper.gate.ahead import EarlyReads, RangeNotes, read_early
from gatekeeper.gate.history import CommitInfo, RangeAhead, merge_base, range_commits
from gatekeeper.gate.later import later
from gatekeeper.gate.notes import ReadAhead, read_ahead, read_notes
from gatekeeper.git import RepoPaths, discover, exact_refs, git, rev_parse

# The report formats (gatekeeper.report.ReportFormat, which loads the reports).
FORMATS = ("text", "json", "md", "html", "sarif")


def resolve(repo: Path, rev: str) -> str:
    """The commit rev names, resolved in repo's own worktree (so HEAD is that worktree's HEAD).

    Names are resolved unambiguously (see gatekeeper.git.resolve_object); raises GitError.
    """
    return rev_parse(None, rev, cwd=repo)


def default_branch(repo: Path) -> str:
    """The target when --base is not given, as a full ref name: origin's default branch, else
    main or master. A full name, so that a tag called `origin/main` cannot stand in for it."""
    # Ref names and config values are bytes, not always UTF-8: kept as they are (as exact_refs
    # reads them), never a traceback.
    out = git("symbolic-ref", "--quiet", "refs/remotes/origin/HEAD", cwd=repo, check=False)
    candidates = [out.decode("utf-8", "surrogateescape").strip()] if out.strip() else []
    configured = (
        git("config", "--get", "init.defaultBranch", cwd=repo, check=False)
        .decode("utf-8", "surrogateescape")
        .strip()
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
    started = [later(call) for call in calls]
    return [result() for result in started]


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
    plain = plain_options(argv, environ, _OPTIONS)
    if plain is None:
        return None
    found, revs = plain
    if len(revs) > 1 or found.get("fmt", "text") not in FORMATS:
        return None
    return {
        "repo": Path(str(found.get("repo", "."))),
        "base": found.get("base"),
        "rev": revs[0] if revs else "HEAD",
        "fmt": found.get("fmt", "text"),
        "output": Path(str(found["output"])) if "output" in found else None,
    }


@dataclass(frozen=True)
class Early:
    """Reads started before the judgement loads; each waits for its thread and gives what it
    read, or raises what it raised (as if it had been read then)."""

    located: Callable[[], tuple[RepoPaths, tuple[str, str], str]]  # paths, target, head
    head_notes: Callable[[], ReadAhead]  # the note blobs on head; {} when reading failed
    range_ahead: RangeAhead | None = None  # the merge-base and the range, once located
    reads: EarlyReads | None = None  # the target's trust file and policy, the notes refs


def locate(repo: Path, base: str | None, rev: str) -> tuple[RepoPaths, tuple[str, str], str]:
    """The repository, the target (its name as shown, its commit) and rev's commit, found at
    once; errors as if found in that order.

    repo is resolved to a path without links first: the three reads run in parallel, and a
    link swapped between them must not give the head of one repository and the target of
    another."""
    repo = Path(os.path.realpath(repo))

    def target_of() -> tuple[str, str]:
        if base is not None:
            return base, resolve(repo, base)
        # Resolved by its full name; shown by its short one, as before.
        full = default_branch(repo)
        return full.removeprefix("refs/heads/").removeprefix("refs/remotes/"), resolve(repo, full)

    paths, target, head = at_once(lambda: discover(repo), target_of, lambda: resolve(repo, rev))
    return paths, target, head


def start(repo: Path, base: str | None, rev: str) -> Early:
    """Start locating the repository and the names, then reading the notes on head, finding
    the range (the merge-base, the commits after it) and reading what the judgement reads
    of the target (gate.ahead)."""
    located = later(locate, repo, base, rev)

    def rules_at() -> tuple[Path, str]:
        paths, (_, target), _ = located()
        return paths.git_dir, target

    reads = read_early(rules_at)

    def head_notes() -> ReadAhead:
        try:
            paths, _, head = located()
            return read_ahead(paths.git_dir, reads.sources(), head)
        except Exception:  # noqa: BLE001 - the judgement reads them again, and reports that
            return {}

    def merge_base_of() -> str | None:
        paths, (_, target), head = located()
        return merge_base(paths.git_dir, target, head)

    base_found = later(merge_base_of)

    def commits() -> list[CommitInfo]:
        paths, _, head = located()
        return range_commits(paths.git_dir, base_found(), head)

    commits_found, head_notes_read = later(commits), later(head_notes)

    def range_notes() -> RangeNotes:
        # As the judgement reads them (judgement._range_notes), with the notes on head read
        # above when head is in the range.
        paths, _, head = located()
        wanted = {c.oid for c in commits_found()}
        ahead = head_notes_read() if head in wanted else {}
        return wanted, read_notes(paths.git_dir, reads.sources(), wanted=wanted, ahead=ahead)

    reads = dataclasses.replace(reads, range_notes=later(range_notes))
    return Early(located, head_notes_read, RangeAhead(base_found, commits_found), reads)
