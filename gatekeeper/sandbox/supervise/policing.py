"""Decisions on what a supervised process asks for: which writes are inside the boundary."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from gatekeeper.policy.patterns import is_write_allowed, matches_any

# Where a write is nobody's business: the sandbox's own scratch space (kernel-enforced anyway).
PSEUDO_ROOTS = ("/proc", "/dev")

# Refused writes no approval could allow are recorded with why (`reason`), and are not decision
# points: a path that cannot be named is recorded under a label, and approving a label would
# grant a path of that name (one a repository may hold); the worktree's own folder and its
# `.git` are outside every write set.
UNREADABLE = "(unreadable path)"
TOO_LONG = "(a path too long to follow)"
OTHER_PROC = "another process's /proc links"
UNREADABLE_REASON = "its path could not be read"
TOO_LONG_REASON = "its path, with the links in it followed, is longer than the kernel takes"
_OTHER_PROC_REASON = "a path through another process's /proc links is never written"
_ROOT_REASON = "the worktree's own folder is never written"
_GIT_REASON = "the worktree's .git is never written"
_MEMORY_REASON = "a process's memory is never written (the sandbox's /proc is read-only)"


def is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass
class WritePolicy:
    worktree: str
    write: list[str]
    protected: list[str]
    scratch: list[str]  # fresh HOME, /tmp, /var/tmp, the agent's private git dir, sockets
    secret_names: list[str]
    secret_paths: list[str]  # repo-relative patterns and absolute paths hidden in the sandbox
    scaffold: list[str] = field(default_factory=list)  # folders holding mount points
    readonly: list[str] = field(default_factory=list)  # bound read-only (git dir, checkout, tools)

    def classify(self, path: str) -> tuple[str, str, str | None]:
        """(verdict, shown path, reason) for a write to an absolute path inside the sandbox.

        verdict is "scratch" (allowed, not recorded), "allow" or "deny" (recorded); reason is
        set for a refusal no approval could lift.
        """
        if path == "/proc/(other)":
            return "deny", OTHER_PROC, _OTHER_PROC_REASON
        if is_within(path, "/proc") and path.rsplit("/", 1)[-1] == "mem":
            return "deny", path, _MEMORY_REASON  # the kernel refuses it too: recorded
        if any(is_within(path, r) for r in PSEUDO_ROOTS):
            return "scratch", path, None
        if is_within(path, self.worktree):
            rel = os.path.relpath(path, self.worktree)
            if rel == ".":
                return "deny", rel, _ROOT_REASON
            if rel == ".git" or rel.startswith(".git/"):
                return "deny", rel, _GIT_REASON
            allowed = is_write_allowed(self.write, self.protected, rel)
            return ("allow" if allowed else "deny"), rel, None
        if os.path.dirname(path) in self.scaffold or any(is_within(path, r) for r in self.readonly):
            return "deny", path, None
        if any(is_within(path, r) for r in self.scratch):
            return "scratch", path, None
        return "deny", path, None

    def is_kept(self, path: str) -> bool:
        """True for a path in a place of the user's or the repository's (the worktree, the
        checkout and git dir, toolchains, the folders that hold their mount points, hidden
        paths): an attempt to write there is recorded even where nothing is there to write."""
        return (
            is_within(path, self.worktree)
            or any(is_within(path, r) for r in (*self.readonly, *self.scaffold))
            or any(is_within(path, p) for p in self.secret_paths if p.startswith("/"))
        )

    def may_be_secret(self, raw: str) -> bool:
        """A cheap first look at the raw path a process passed, before resolving it."""
        name = raw.rsplit("/", 1)[-1]
        if any(fnmatchcase(name, p) for p in self.secret_names):
            return True
        if any(part.startswith(".") and fnmatchcase(part, p) for part in raw.split("/")[:-1]
               for p in self.secret_names):  # fmt: skip
            return True
        return any(p.rsplit("/", 1)[-1] in raw for p in self.secret_paths)

    def is_secret(self, path: str) -> bool:
        """True when a read of path is a lookup of something that may hold credentials."""
        name = os.path.basename(path)
        if name in (".env.example", ".env.sample", ".env.template"):
            return False
        if any(fnmatchcase(part, p) for part in path.split("/") for p in self.secret_names):
            return True
        if is_within(path, self.worktree):
            rel = os.path.relpath(path, self.worktree)
            return matches_any([p for p in self.secret_paths if not p.startswith("/")], rel)
        return any(is_within(path, p) for p in self.secret_paths if p.startswith("/"))
