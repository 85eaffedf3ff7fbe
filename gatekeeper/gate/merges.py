"""Merge commits' own content: what a merge's tree holds that none of its parents does.

A merge needs no receipt, and the range's diff is compared with the runs' claims only at its
ends, so a merge that brings in a file (an "evil merge") and a later merge that drops it again
would leave the ends clean while the history holds content no run made. A merge is therefore
judged on its own as well: at every path its tree must hold the state of one of its parents,
or be git's own clean merge of its two parents (both sides' edits to one file, combined).
"""

from __future__ import annotations

from pathlib import Path

from gatekeeper.errors import GitError
from gatekeeper.gate.diffread import DiffTooLarge, read_git
from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.gate.history import CommitInfo

MAX_NAMED = 5  # paths named in a finding's message


def own_paths(git_dir: Path, commit: CommitInfo) -> list[str]:
    """Paths where merge commit's tree differs from every parent (none for git's clean
    automatic merge of two parents). Raises GitError when git cannot read the commit, and
    DiffTooLarge past the bounds of gate.diffread (a merge adding hundreds of thousands of
    files, or paths kilobytes long, is a few kilobytes of pack)."""
    what = f"the paths merge {commit.short} changes from every parent"
    out = read_git(
        git_dir,
        ["diff-tree", "-r", "-c", "--no-commit-id", "--name-only", "-z", commit.oid],
        what,
    )
    paths = [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
    if not paths or len(commit.parents) != 2:
        return paths
    # Both sides edited the same file and git combined them: the merge adds nothing of its own.
    # (A conflicted merge lists its conflicts: bounded in bytes as well.)
    try:
        merged = read_git(
            git_dir, ["merge-tree", "--write-tree", "--no-messages", *commit.parents],
            f"git's merge of the parents of {commit.short}", limit=None,
        )  # fmt: skip
    except GitError:  # a conflict is exit status 1: its tree is not the merge's
        return paths
    # A clean merge prints its tree alone; a conflicted one also lists the conflicted files (its
    # tree holds conflict markers, which no run wrote either).
    lines = merged.decode("utf-8", "replace").splitlines()
    return [] if lines == [commit.tree] else paths


def merge_findings(git_dir: Path, commits: list[CommitInfo]) -> list[Finding]:
    """`uncovered-commit` for each merge of commits that holds content of its own (a merge
    the agent made inside a run is the run's: leave it out of commits). Raises GitError."""
    findings = []
    for commit in commits:
        if not commit.is_merge:
            continue
        try:
            paths = own_paths(git_dir, commit)
        except DiffTooLarge as exc:
            raise exc.naming(exc.what, commit.oid) from None
        if not paths:
            continue
        named = ", ".join(repr(p) for p in paths[:MAX_NAMED])
        more = f" and {len(paths) - MAX_NAMED} more" if len(paths) > MAX_NAMED else ""
        findings.append(
            Finding(
                Kind.uncovered_commit,
                f"merge {commit.short} ({commit.subject!r}) holds content none of its parents "
                f"has, at {named}{more}, and is not git's clean merge of them: a hand edit or "
                "conflict resolution in a merge is no run's work (merge without editing, and "
                "let a run or a person's signed commit make the change)",
                path=paths[0],
                commit=commit.oid,
            )
        )
    return findings
