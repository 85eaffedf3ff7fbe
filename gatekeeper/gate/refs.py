"""Which refs are protected, and the ref updates a hook is told about."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import GitError
from gatekeeper.git import ZERO_OID, git, is_ancestor, resolve_object

PROTECT_KEY = "gatekeeper.protect"
# Protected refs (patterns) that may be rewound: a non-fast-forward update is refused otherwise.
ALLOW_REWIND_KEY = "gatekeeper.allowRewind"


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


def configured_patterns(git_dir: Path, key: str, cwd: Path | None = None) -> list[str]:
    """Ref patterns from `git config KEY` (repeatable), as full ref names."""
    if cwd is not None:
        out = git("config", "--get-all", key, cwd=cwd, check=False)
    else:
        out = git("config", "--get-all", key, git_dir=git_dir, check=False)
    return [full_ref(v) for v in out.decode("utf-8", "surrogateescape").split() if v]


def set_patterns(git_dir: Path, key: str, patterns: list[str]) -> None:
    """Replace every value of KEY with the patterns, as full ref names."""
    git("config", "--unset-all", key, git_dir=git_dir, check=False)
    for pattern in patterns:
        git("config", "--add", key, full_ref(pattern), git_dir=git_dir)


def configured_protect(git_dir: Path, cwd: Path | None = None) -> list[str]:
    """Patterns from `git config gatekeeper.protect` (repeatable), as full ref names."""
    return configured_patterns(git_dir, PROTECT_KEY, cwd)


def set_protect(git_dir: Path, patterns: list[str]) -> None:
    set_patterns(git_dir, PROTECT_KEY, patterns)


def rewind_allowed(ref: str, git_dir: Path, cwd: Path | None = None) -> bool:
    """True when `gatekeeper.allowRewind` names ref (or a pattern matching it)."""
    return is_protected(ref, configured_patterns(git_dir, ALLOW_REWIND_KEY, cwd))


def rewind_problem(git_dir: Path, ref: str, old: str, new: str) -> str | None:
    """Why moving ref from old to new is refused: new does not contain old (a rewind).

    None for a fast-forward. The count of commits that would be dropped is in the message.
    """
    if is_ancestor(git_dir, old, new):
        return None
    out = git("rev-list", "--count", old, "--not", new, "--", git_dir=git_dir, check=False)
    dropped = out.decode().strip() or "some"
    return (
        f"{ref}: {new[:12]} does not contain the current {old[:12]}, so this update would drop "
        f"{dropped} commit(s) from a protected ref (a force-push or rewind); protected refs only "
        f"move forward. Fetch {ref}, merge or rebase onto it and push again; if the rewind is "
        f"intended, the repository's administrator allows it with "
        f"`git config --add {ALLOW_REWIND_KEY} {ref}` in the server repository"
    )


def symbolic_head(git_dir: Path) -> str | None:
    """The branch HEAD names in a (bare) repository (it may not exist)."""
    out = git("symbolic-ref", "--quiet", "HEAD", git_dir=git_dir, check=False)
    return out.decode("utf-8", "surrogateescape").strip() or None


DEFAULT_BRANCH_KEY = "gatekeeper.defaultBranch"
MAIN, MASTER = "refs/heads/main", "refs/heads/master"
PROTECT_DEFAULT_KEY = "gatekeeper.protectDefault"


def branches(git_dir: Path) -> dict[str, str]:
    """Every branch (full name) and its commit."""
    out = git("for-each-ref", "--format=%(objectname) %(refname)", "refs/heads/", git_dir=git_dir)
    pairs = (line.partition(" ") for line in out.decode("utf-8", "surrogateescape").splitlines())
    return {name: oid for oid, _, name in pairs}


def detect_default_branch(git_dir: Path) -> tuple[str, str]:
    """(full ref name, why) of the real default branch of a (bare) repository.

    HEAD's target if that branch exists (a bare repository's HEAD may still say master while
    only main exists), else main, else master, else the only branch, else HEAD's target.
    """
    head = symbolic_head(git_dir)
    existing = branches(git_dir)
    if head and head in existing:
        return head, "the branch HEAD names"
    for name in (MAIN, MASTER):
        if name in existing:
            why = f"HEAD names {head}, which does not exist" if head else "HEAD is detached"
            return name, f"{why}; {name} does"
    if len(existing) == 1:
        return next(iter(existing)), "the only branch"
    if head:
        return head, "the branch HEAD names (it does not exist yet)"
    return "refs/heads/main", "no branch and no symbolic HEAD"


def default_branch(git_dir: Path) -> str:
    """`gatekeeper.defaultBranch` as stored while that branch exists, else the default branch
    detected now (an empty repository's first push may create another than HEAD names)."""
    stored = _stored_default(git_dir)
    if stored and stored in branches(git_dir):
        return stored
    return detect_default_branch(git_dir)[0]


def _stored_default(git_dir: Path) -> str | None:
    out = git("config", "--get", DEFAULT_BRANCH_KEY, git_dir=git_dir, check=False)
    return full_ref(out.decode("utf-8", "surrogateescape").strip()) if out.strip() else None


def server_defaults(git_dir: Path) -> tuple[list[str], bool]:
    """A server's default branch, as its hooks protect it: ([it], True) once it exists, stored
    (`gatekeeper.defaultBranch`) so that it stays the default; before that (installed on an
    empty repository), every name it may take, ([stored, HEAD's, main, master], False), so
    that the first of them pushed is judged as the default is and becomes it.

    Detection alone moved the default: once someone pushed the branch HEAD names (master,
    while the team pushed main), that became the default and main lost its protection. Nor
    does any other branch become it (the only one, as detection would take): whoever pushed
    first would choose which branch is protected. Raises GitError when the setting cannot be
    written (the push is refused)."""
    stored = _stored_default(git_dir)
    existing = branches(git_dir)
    if stored and stored in existing:
        return [stored], True
    head = symbolic_head(git_dir)
    names = list(dict.fromkeys(n for n in (stored, head, MAIN, MASTER) if n))
    found = next((n for n in names if n in existing), None)
    if found is None and stored is None and existing:
        found = detect_default_branch(git_dir)[0]  # installed before the setting was stored
    if found is None:
        return names, False
    try:
        git("config", DEFAULT_BRANCH_KEY, found, git_dir=git_dir)
    except GitError as exc:
        raise GitError(
            f"cannot store {found} as this repository's default branch: {exc.message}",
            hint="let the user the hooks run as write the repository's config, or run "
            f"`git config {DEFAULT_BRANCH_KEY} {found}` there",
        ) from exc
    return [found], True


def protects_default(git_dir: Path) -> bool:
    """False only when `gatekeeper.protectDefault` is set to false."""
    out = git("config", "--type=bool", "--get", PROTECT_DEFAULT_KEY, git_dir=git_dir, check=False)
    return out.decode().strip() != "false"


def is_protected(ref: str, patterns: list[str]) -> bool:
    return any(ref == p or fnmatch.fnmatchcase(ref, p) for p in patterns)


def resolve_oid(git_dir: Path, rev: str) -> str | None:
    """The commit rev names, or None (missing ref, unknown object)."""
    return resolve_object(git_dir, rev)


def has_commit(git_dir: Path, oid: str) -> bool:
    return resolve_oid(git_dir, oid) is not None
