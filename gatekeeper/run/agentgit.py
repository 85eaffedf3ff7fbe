"""Git inside the sandbox: a private git directory over the real objects, imported afterwards.

The agent sees its own git directory (index, HEAD, refs, an object folder of its own with the
repository's objects as a read-only alternate), so status, add, commit, branch and log work.
The launcher never runs git with that directory's config or hooks: after the run it reads the
agent branch's ref as a file, checks the commits against the policy, and copies their objects
with the real repository's git.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import GitError
from gatekeeper.git import git
from gatekeeper.receipt.changes import Change, changes_between
from gatekeeper.sandbox.mounts import agent_git_config

SANDBOX_GIT_DIR = "/run/gatekeeper-git"
OID = re.compile(r"^[0-9a-f]{40}$")

CONFIG = """\
[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
\thooksPath = /dev/null
[user]
\tname = gatekeeper agent
\temail = agent@gatekeeper.invalid
[gc]
\tauto = 0
"""


@dataclass(frozen=True)
class PrivateGit:
    path: Path  # on the host, launcher-private
    dotgit: Path  # a file `gitdir: /run/gatekeeper-git` bound over the worktree's .git
    branch: str


def prepare(git_dir: Path, worktree: Path, base: str, branch: str, scratch: Path) -> PrivateGit:
    """Create the agent's git directory for a worktree checked out at base on branch.

    All the agent sees of git: HEAD, its own branch at base, the local branches and tags that
    point at base (so `git log main` answers), an index, objects of its own over the
    repository's (a read-only alternate), and a config written here: the launcher's settings
    plus the repository's remotes without credentials. No hooks, info/, logs/, other refs or
    anything else of the repository's git dir.
    """
    path = scratch / "git"
    (path / "objects" / "info").mkdir(parents=True)
    (path / "objects" / "pack").mkdir()
    (path / "refs" / "heads").mkdir(parents=True)
    (path / "refs" / "tags").mkdir()
    (path / "objects" / "info" / "alternates").write_text(str(git_dir / "objects") + "\n")
    (path / "HEAD").write_text(f"ref: refs/heads/{branch}\n")
    extra = agent_git_config(git_dir / "config")
    config = CONFIG
    if "objectformat" in extra:
        config = config.replace("repositoryformatversion = 0", "repositoryformatversion = 1")
    (path / "config").write_text(config + extra)
    ref = path / "refs" / "heads" / branch
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(base + "\n")
    refs = git("for-each-ref", "--format=%(objectname) %(*objectname) %(refname)",
               "refs/heads", "refs/tags", git_dir=git_dir).decode()  # fmt: skip
    lines = []
    for line in refs.splitlines():
        oid, peeled, name = line.split(" ", 2) if line.count(" ") >= 2 else (line, "", "")
        if name and name != f"refs/heads/{branch}" and base in (oid, peeled):
            lines.append(f"{oid} {name}\n" + (f"^{peeled}\n" if peeled else ""))
    (path / "packed-refs").write_text("# pack-refs with: peeled\n" + "".join(lines))
    env = {"GIT_INDEX_FILE": str(path / "index")}
    git("read-tree", base, git_dir=git_dir, env=env)
    git("update-index", "-q", "--refresh", git_dir=git_dir, work_tree=worktree, cwd=worktree,
        env=env, check=False)  # fmt: skip
    dotgit = scratch / "dotgit"
    dotgit.write_text(f"gitdir: {SANDBOX_GIT_DIR}\n")
    return PrivateGit(path, dotgit, branch)


def _read_plain(path: Path, limit: int) -> str | None:
    """A regular file's text, at most limit bytes; None for anything else the agent left there.

    No symlink is followed and no FIFO is waited on: the agent wrote this folder.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("ascii", "replace")
    finally:
        os.close(fd)


def _inside(private: PrivateGit, path: Path) -> bool:
    """True when no folder between the private git dir and path is a symlink."""
    here = private.path
    for part in path.relative_to(private.path).parts[:-1]:
        here = here / part
        if here.is_symlink() or not here.is_dir():
            return False
    return True


def read_ref(private: PrivateGit) -> str | None:
    """The agent branch's commit, read as a file (never through git with the agent's config)."""
    loose = private.path / "refs" / "heads" / private.branch
    value = _read_plain(loose, 100) if _inside(private, loose) else None
    if value is not None and OID.match(value.strip()):
        return value.strip()
    packed = _read_plain(private.path / "packed-refs", 16 << 20) or ""
    for line in packed.splitlines():
        oid, _, name = line.partition(" ")
        if name == f"refs/heads/{private.branch}" and OID.match(oid):
            return oid
    return None


def _reset_object_store(git_dir: Path, private: PrivateGit) -> bool:
    """Point the agent's object folder back at the repository's objects only.

    The agent could have added alternates (another repository's objects on the host) or
    swapped folders for symlinks; neither may reach the import. False when unusable.
    """
    objects = private.path / "objects"
    info = objects / "info"
    if objects.is_symlink() or not objects.is_dir() or info.is_symlink():
        return False
    info.mkdir(exist_ok=True)
    for name in ("alternates", "http-alternates"):
        target = info / name
        if target.is_symlink() or target.exists():
            target.unlink()
    (info / "alternates").write_text(str(git_dir / "objects") + "\n")
    return True


@dataclass
class Imported:
    tip: str  # the commit the launcher builds on (base when nothing was imported)
    commits: list[str]
    refused: str | None = None  # why the agent's commits were not taken
    refused_changes: list[Change] | None = None


def import_commits(git_dir: Path, private: PrivateGit, base: str, is_allowed) -> Imported:  # type: ignore[no-untyped-def]
    """Take the agent's commits on its branch into the repository when the policy allows them."""
    tip = read_ref(private)
    if tip is None or tip == base:
        return Imported(base, [])
    if not _reset_object_store(git_dir, private):
        return Imported(base, [], refused="the agent replaced its object folder")
    alt = {"GIT_ALTERNATE_OBJECT_DIRECTORIES": str(private.path / "objects")}
    try:
        git("cat-file", "-e", f"{tip}^{{commit}}", git_dir=git_dir, env=alt)
        git("merge-base", "--is-ancestor", base, tip, git_dir=git_dir, env=alt)
    except GitError:
        return Imported(
            base, [], refused=f"the agent branch ({tip[:12]}) does not build on the base"
        )
    commits = (
        git("rev-list", "--reverse", f"{base}..{tip}", git_dir=git_dir, env=alt).decode().split()
    )
    changes = changes_between(git_dir, base, tip, env=alt)
    outside = [c for c in changes if not all(is_allowed(p) for p in c.paths)
               or "160000" in (c.old_mode, c.new_mode)]  # fmt: skip
    if outside:
        return Imported(base, [], refused="the agent's commits change paths outside the policy "
                        "(or submodules)",
                        refused_changes=outside)  # fmt: skip
    pack = git("pack-objects", "--revs", "--stdout", "-q", git_dir=git_dir, env=alt,
               input=f"{tip}\n^{base}\n".encode())  # fmt: skip
    git("index-pack", "--stdin", "--fix-thin", git_dir=git_dir, input=pack)
    git("cat-file", "-e", f"{tip}^{{commit}}", git_dir=git_dir)
    return Imported(tip, commits)


def sandbox_binds(private: PrivateGit, worktree: Path) -> list[str]:
    """bwrap arguments that show the private git dir and point the worktree's .git at it."""
    return ["--bind", str(private.path), SANDBOX_GIT_DIR,
            "--ro-bind", str(private.dotgit), os.fspath(worktree / ".git")]  # fmt: skip
