"""Check each changed path against the target branch's policy write set and protected paths."""

from __future__ import annotations

from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.policy.model import LoadedPolicy
from gatekeeper.policy.patterns import (
    explicit_rule,
    has_git_segment,
    is_protected,
    matches_any,
    write_rule,
)
from gatekeeper.receipt.changes import Change


def path_findings(policy: LoadedPolicy, path: str, commit: str | None) -> list[Finding]:
    """The finding for one changed path, if the target policy does not allow changing it."""
    paths = policy.policy.paths
    where = f"{policy.path} at {(policy.source_commit or '')[:12]}"
    if has_git_segment(path):
        return [
            Finding(
                Kind.protected_path,
                f"{path!r} has a '.git' segment: a checkout would take it for a git directory",
                path=path,
                commit=commit,
            )
        ]
    if is_protected(paths.protected_patterns, path):
        if not explicit_rule(tuple(paths.write), tuple(paths.protected_patterns))(path):
            return [
                Finding(
                    Kind.protected_path,
                    f"{path!r} is a protected path; the target policy ({where}) does not name it "
                    "in paths.write",
                    path=path,
                    commit=commit,
                )
            ]
        return []
    if not matches_any(paths.write, path):
        return [
            Finding(
                Kind.unapproved_write,
                f"{path!r} is outside the target policy's paths.write ({where}: "
                f"{', '.join(paths.write) or 'nothing'})",
                path=path,
                commit=commit,
            )
        ]
    return []


def check_paths(
    policy: LoadedPolicy,
    changes: list[Change],
    commits: dict[str, str] | None = None,
    unlisted: str | None = None,
) -> list[Finding]:
    """Findings for every path the changes touch (both sides of a rename), each naming the
    commit commits gives for its path (unlisted for a path it does not list)."""
    findings: list[Finding] = []
    commits = commits or {}
    paths = policy.policy.paths
    # The policy allows exactly the paths path_findings finds nothing on; asking that first
    # spares most paths of a large change the findings' own work.
    is_allowed = write_rule(tuple(paths.write), tuple(paths.protected_patterns))
    for change in changes:
        for path in (change.old_path, change.path) if change.old_path else (change.path,):
            if not is_allowed(path):
                findings.extend(path_findings(policy, path, commits.get(path, unlisted)))
    return findings
