"""Decisions on what a supervised process asks for: which writes are inside the boundary."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from gatekeeper.policy.patterns import is_write_allowed, matches_any

# Where a write is nobody's business: the sandbox's own scratch space (kernel-enforced anyway).
PSEUDO_ROOTS = ("/proc", "/dev")


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

    def classify(self, path: str) -> tuple[str, str]:
        """(verdict, shown path) for a write to an absolute path inside the sandbox.

        verdict is "scratch" (allowed, not recorded), "allow" or "deny" (recorded).
        """
        if path == "/proc/(other)":
            return "deny", "another process's /proc links"
        if any(is_within(path, r) for r in PSEUDO_ROOTS):
            return "scratch", path
        if is_within(path, self.worktree):
            rel = os.path.relpath(path, self.worktree)
            if rel == ".":
                return "deny", rel
            if rel == ".git" or rel.startswith(".git/"):
                return "deny", rel
            return ("allow" if is_write_allowed(self.write, self.protected, rel) else "deny"), rel
        if os.path.dirname(path) in self.scaffold or any(is_within(path, r) for r in self.readonly):
            return "deny", path
        if any(is_within(path, r) for r in self.scratch):
            return "scratch", path
        return "deny", path

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
