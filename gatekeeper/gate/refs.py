"""Which refs are protected, and the ref updates a hook is told about."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.git import ZERO_OID, git, resolve_object

PROTECT_KEY = "gatekeeper.protect"


@dataclass(frozen=True)
class RefUpdate:
    """One line of a pre-receive hook's input: `<old> <new> <ref>`."""

    old: str
    new: str
    ref: str

    @property
    def is_create(self) -> bool:
        return self.old == ZERO_OID

    @property
    def is_delete(self) -> bool:
        return self.new == ZERO_OID


def parse_updates(data: bytes) -> list[RefUpdate]:
    updates = []
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            updates.append(RefUpdate(*parts))
    return updates


def full_ref(name: str) -> str:
    return name if name.startswith("refs/") else f"refs/heads/{name}"


def configured_protect(git_dir: Path, cwd: Path | None = None) -> list[str]:
    """Patterns from `git config gatekeeper.protect` (repeatable), as full ref names."""
    if cwd is not None:
        out = git("config", "--get-all", PROTECT_KEY, cwd=cwd, check=False)
    else:
        out = git("config", "--get-all", PROTECT_KEY, git_dir=git_dir, check=False)
    return [full_ref(v) for v in out.decode().split() if v]


def set_protect(git_dir: Path, patterns: list[str]) -> None:
    git("config", "--unset-all", PROTECT_KEY, git_dir=git_dir, check=False)
    for pattern in patterns:
        git("config", "--add", PROTECT_KEY, full_ref(pattern), git_dir=git_dir)


def symbolic_head(git_dir: Path) -> str | None:
    """The branch HEAD names in a (bare) repository: its default branch."""
    out = git("symbolic-ref", "--quiet", "HEAD", git_dir=git_dir, check=False).decode().strip()
    return out or None


def is_protected(ref: str, patterns: list[str]) -> bool:
    return any(ref == p or fnmatch.fnmatchcase(ref, p) for p in patterns)


def resolve_oid(git_dir: Path, rev: str) -> str | None:
    """The commit rev names, or None (missing ref, unknown object)."""
    return resolve_object(git_dir, rev)


def has_commit(git_dir: Path, oid: str) -> bool:
    return resolve_oid(git_dir, oid) is not None
