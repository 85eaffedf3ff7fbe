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
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import GitError
from gatekeeper.git import git
from gatekeeper.receipt.changes import Change, parse_raw_z
from gatekeeper.run.worktree import remove_tree
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


def prepare(
    git_dir: Path, worktree: Path, base: str, branch: str, scratch: Path, exact: bool = False
) -> PrivateGit:
    """Create the agent's git directory for a worktree checked out at base on branch.

    All the agent sees of git: HEAD, its own branch at base, the local branches and tags that
    point at base (so `git log main` answers), an index, objects of its own over the
    repository's (a read-only alternate), and a config written here: the launcher's settings
    plus the repository's remotes without credentials. No hooks, info/, logs/, other refs or
    anything else of the repository's git dir. exact: the worktree's index holds the stat data
    of its files as they are (a layered worktree's, see layers.py), so it is not refreshed.
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
    seed = _checkout_index(git_dir, worktree)
    if seed is not None:
        # The index the launcher's checkout of base just wrote, with every file's stat data:
        # refreshing it only compares those, where an index read from the tree hashes every
        # file of the worktree again.
        shutil.copyfile(seed, path / "index")
    else:
        git("read-tree", base, git_dir=git_dir, env=env)
    if seed is None or not exact:
        git("update-index", "-q", "--refresh", git_dir=git_dir, work_tree=worktree, cwd=worktree,
            env=env, check=False)  # fmt: skip
    dotgit = scratch / "dotgit"
    dotgit.write_text(f"gitdir: {SANDBOX_GIT_DIR}\n")
    return PrivateGit(path, dotgit, branch)


def _checkout_index(git_dir: Path, worktree: Path) -> Path | None:
    """The index of worktree when it is the repository's linked worktree of that name (as
    create_worktree makes them, checked out at the base just before), else None.

    Only for the agent's own worktree, before it runs: a check's tree is no linked worktree.
    """
    admin = git_dir / "worktrees" / worktree.name
    link = _read_plain(worktree / ".git", 4096)
    if link is None or not link.startswith("gitdir: "):
        return None
    named = link[len("gitdir: ") :].strip()
    if os.path.realpath(named) != os.path.realpath(admin):
        return None
    index = admin / "index"
    try:
        if not stat.S_ISREG(os.lstat(index).st_mode):
            return None
    except OSError:
        return None
    return index


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
    """True when no folder between the private git dir and path is a symlink.

    A missing folder (or a file in its place) is fine: path is then simply not there.
    """
    here = private.path
    for part in path.relative_to(private.path).parts[:-1]:
        here = here / part
        if here.is_symlink():
            return False
        if not here.is_dir():
            return True
    return True


def read_ref(private: PrivateGit) -> str | None:
    """The agent branch's commit, read as a file (never through git with the agent's config).

    Raises ValueError when the branch is there but is no plain ref (a folder, a symlink, a
    FIFO, a file that holds no object id): the agent's commits are then refused, not lost.
    """
    loose = private.path / "refs" / "heads" / private.branch
    if not _inside(private, loose):
        raise ValueError("a folder on the way to the agent's branch ref was replaced")
    if os.path.lexists(loose):
        value = _read_plain(loose, 100)
        if value is None or not OID.match(value.strip()):
            raise ValueError("the agent's branch ref is not a plain file naming a commit")
        return value.strip()
    packed = _read_plain(private.path / "packed-refs", 16 << 20) or ""
    for line in packed.splitlines():
        oid, _, name = line.partition(" ")
        if name == f"refs/heads/{private.branch}" and OID.match(oid):
            return oid
    return None


MAX_OBJECT_ENTRIES = 500_000  # files and folders in the agent's own object store


def _only_plain_entries(root: Path) -> bool:
    """True when everything below root is a plain file or folder, none of them a symlink.

    A symlink anywhere in the agent's object store (`objects/pack -> another repository's
    packs`) would let the launcher's git read objects from elsewhere on the host.
    """
    seen = 0
    pending = [root]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                seen += 1
                if seen > MAX_OBJECT_ENTRIES or entry.is_symlink():
                    return False
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif not entry.is_file(follow_symlinks=False):
                    return False  # FIFO, socket or device
    return True


def _reset_object_store(git_dir: Path, private: PrivateGit) -> bool:
    """Point the agent's object folder back at the repository's objects only.

    The agent could have added alternates (another repository's objects on the host) or
    swapped folders for symlinks, FIFOs or folders; none may reach the import. False when
    the folder is unusable (nothing is followed or waited on to find out).
    """
    objects = private.path / "objects"
    info = objects / "info"
    try:
        if not stat.S_ISDIR(os.lstat(objects).st_mode) or not _inside(private, info):
            return False
        if not _only_plain_entries(objects):
            return False
        try:
            mode = os.lstat(info).st_mode
        except FileNotFoundError:
            os.mkdir(info, 0o755)
            mode = os.lstat(info).st_mode
        if not stat.S_ISDIR(mode):
            return False
        os.chmod(info, 0o755, follow_symlinks=False)
        for name in ("alternates", "http-alternates"):
            target = info / name
            try:
                st = os.lstat(target)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                remove_tree(target)
            else:
                os.unlink(target)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(info / "alternates", flags, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(str(git_dir / "objects") + "\n")
    except (OSError, NotImplementedError):
        return False
    return True


@dataclass
class Imported:
    tip: str  # the commit the launcher builds on (base when nothing was imported)
    commits: list[str]
    refused: str | None = None  # why the agent's commits were not taken
    refused_changes: list[Change] | None = None


# The most commits of its own an agent may hand over; beyond it they are refused as a whole.
MAX_AGENT_COMMITS = 10_000
MAX_RECORDED_CHANGES = 1000  # paths of a refused history recorded in the receipt

# Git reads only plain objects while judging: no replacement objects, no commit-graph, bitmap
# or multi-pack index (files the agent can forge in its object folder), objects checked as
# `git fsck` would check them when they come in.
_SAFE_READ = (
    "-c", "core.commitGraph=false", "-c", "core.multiPackIndex=false",
    "-c", "pack.useBitmaps=false", "-c", "pack.writeBitmapHashCache=false",
    "-c", "fetch.fsckObjects=true", "-c", "transfer.fsckObjects=true",
)  # fmt: skip
_NO_REPLACE = {"GIT_NO_REPLACE_OBJECTS": "1"}


def _refusal(base: str, reason: str, changes: list[Change] | None = None) -> Imported:
    return Imported(base, [], refused=reason, refused_changes=changes or [])


def import_commits(
    git_dir: Path,
    private: PrivateGit,
    base: str,
    is_allowed: Callable[[str], bool],
    max_bytes: int | None = None,
) -> Imported:
    """Take the agent's commits on its branch into the repository when every one is allowed.

    Each commit is judged on its own (its diff against each parent, against the policy), and
    every parent must be the base or another commit of the agent: history from elsewhere is
    refused. Objects arrive in a quarantine folder first and move into the repository only
    when the whole branch passes. Blobs beyond max_bytes in all are refused before any is
    copied. Never raises: whatever the agent left in its git dir, the answer is an import or
    a refusal with its reason.
    """
    try:
        tip = read_ref(private)
    except OSError as exc:
        return _refusal(base, f"the agent's branch could not be read ({exc.strerror})")
    except ValueError as exc:
        return _refusal(base, str(exc))
    if tip is None or tip == base:
        return Imported(base, [])
    if not _reset_object_store(git_dir, private):
        return _refusal(
            base, "the agent replaced its object folder, or put a symlink or a special file in it"
        )
    try:
        quarantine = Path(tempfile.mkdtemp(prefix="incoming-gatekeeper-", dir=git_dir / "objects"))
    except OSError as exc:
        return _refusal(base, f"no quarantine folder for the agent's objects ({exc.strerror})")
    try:
        return _import_via(git_dir, private, base, tip, quarantine, is_allowed, max_bytes)
    except (GitError, OSError, ValueError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[:6]
        return _refusal(base, f"the agent's commits could not be read: {' / '.join(first)}")
    finally:
        shutil.rmtree(quarantine, ignore_errors=True)


def _import_via(
    git_dir: Path, private: PrivateGit, base: str, tip: str, quarantine: Path,
    is_allowed: Callable[[str], bool], max_bytes: int | None,
) -> Imported:  # fmt: skip
    agent = {**_NO_REPLACE, "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(private.path / "objects")}
    if max_bytes is not None:
        size = _new_blob_bytes(git_dir, agent, tip, base)
        if size > max_bytes:
            return _refusal(base, f"the agent's commits add {size} bytes of files, over the "
                            f"run's budget of {max_bytes} (limits.max_added_bytes)")  # fmt: skip
    (quarantine / "pack").mkdir()
    # What the agent's branch holds beyond the base, copied out of its object folder.
    pack = git(*_SAFE_READ, "pack-objects", "--revs", "--stdout", "-q", git_dir=git_dir,
               env=agent, input=f"{tip}\n^{base}\n".encode())  # fmt: skip
    held = {**_NO_REPLACE, "GIT_OBJECT_DIRECTORY": str(quarantine),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(git_dir / "objects")}  # fmt: skip
    # --strict: every object is checked as fsck would (no `.git` entries, no bad names).
    git(*_SAFE_READ, "index-pack", "--stdin", "--fix-thin", "--strict", git_dir=git_dir,
        env=held, input=pack)  # fmt: skip
    # From here on git reads the copied objects (named by their real hash) and the repository's.
    git(*_SAFE_READ, "cat-file", "-e", f"{tip}^{{commit}}", git_dir=git_dir, env=held)
    listing = git(*_SAFE_READ, "rev-list", "--parents", "--reverse", tip, "--not", base,
                  git_dir=git_dir, env=held).decode()  # fmt: skip
    graph = [line.split() for line in listing.splitlines() if line.strip()]
    commits = [entry[0] for entry in graph]
    if len(commits) > MAX_AGENT_COMMITS:
        return _refusal(base, f"the agent made {len(commits)} commits (at most "
                        f"{MAX_AGENT_COMMITS} are taken)")  # fmt: skip
    reason = _foreign_history(git_dir, graph, base)
    # Connectivity: every object the branch needs is really there.
    git(*_SAFE_READ, "rev-list", "--objects", "--quiet", tip, "--not", base, git_dir=git_dir,
        env=held)  # fmt: skip
    # Judged whatever the reason: what a refused history would have brought is recorded too.
    outside = _judge_each_commit(git_dir, graph, held, is_allowed)
    if reason is None and outside:
        reason = "the agent's commits change paths outside the policy (or submodules)"
    if reason is not None:
        return _refusal(base, reason, outside[:MAX_RECORDED_CHANGES])
    _migrate(quarantine, git_dir / "objects")
    git("cat-file", "-e", f"{tip}^{{commit}}", git_dir=git_dir, env=_NO_REPLACE)
    return Imported(tip, commits)


def _new_blob_bytes(git_dir: Path, env: dict[str, str], tip: str, base: str) -> int:
    """The size of the file contents the branch brings beyond the base, as git would read them
    (sizes only: object headers, nothing inflated in full)."""
    listing = git(*_SAFE_READ, "rev-list", "--objects", "--no-object-names", tip, "--not", base,
                  git_dir=git_dir, env=env)  # fmt: skip
    out = git(*_SAFE_READ, "cat-file", "--batch-check=%(objecttype) %(objectsize)",
              git_dir=git_dir, env=env, input=listing)  # fmt: skip
    return sum(int(size) for kind, _, size in (line.partition(" ") for line in
               out.decode().splitlines()) if kind == "blob")  # fmt: skip


def _foreign_history(git_dir: Path, graph: list[list[str]], base: str) -> str | None:
    """Why the branch holds history the agent did not make in this run, or None.

    Every commit must be new to the repository, and every parent the base or another of them.
    """
    ours = {entry[0] for entry in graph}
    known = _already_known(git_dir, list(ours))
    if known:
        example = sorted(known)[0][:12]
        return (f"the agent's branch holds {len(known)} commit(s) it did not make in this run "
                f"(e.g. {example}): history from other branches is not taken")  # fmt: skip
    for oid, *parents in graph:
        if not parents:
            return f"the agent's commit {oid[:12]} has no parent (a new root)"
        foreign = [p for p in parents if p != base and p not in ours]
        if foreign:
            return (f"the agent's commit {oid[:12]} merges {foreign[0][:12]}, which is neither "
                    "the base nor a commit the agent made")  # fmt: skip
    return None


def _already_known(git_dir: Path, commits: list[str]) -> set[str]:
    """The commits the repository already held before the run (not made by the agent)."""
    if not commits:
        return set()
    out = git(*_SAFE_READ, "cat-file", "--batch-check=%(objectname) %(objecttype)",
              git_dir=git_dir, env=_NO_REPLACE,
              input="".join(f"{c}\n" for c in commits).encode())  # fmt: skip
    return {line.split()[0] for line in out.decode().splitlines()
            if line.endswith(" commit")}  # fmt: skip


def _judge_each_commit(
    git_dir: Path, graph: list[list[str]], env: dict[str, str],
    is_allowed: Callable[[str], bool],
) -> list[Change]:  # fmt: skip
    """Every change any commit makes against any of its parents that the policy refuses."""
    # One git for all: a line `commit parent` compares parent with commit; a lone commit (a
    # root) is compared with the empty tree.
    lines = [f"{oid} {parent}\n" for oid, *parents in graph for parent in parents]
    lines += [f"{oid}\n" for oid, *parents in graph if not parents]
    out = git(*_SAFE_READ, "diff-tree", "--stdin", "--root", "-r", "-z", "--no-renames",
              "--no-abbrev", "--no-ext-diff", "--no-textconv", git_dir=git_dir, env=env,
              input="".join(lines).encode())  # fmt: skip
    outside: dict[str, Change] = {}
    for change in parse_raw_z(_records_only(out)):
        gitlink = "160000" in (change.old_mode, change.new_mode)
        if gitlink or not all(is_allowed(p) for p in change.paths):
            outside.setdefault(change.path, change)
    return [outside[p] for p in sorted(outside)]


def _records_only(out: bytes) -> bytes:
    """`diff-tree --stdin -z` output without its commit lines: each record is a `:` field
    followed by one path (no renames); anything else in a record's place is a commit id."""
    fields = out.split(b"\0")
    kept: list[bytes] = []
    i = 0
    while i < len(fields):
        if fields[i].startswith(b":") and i + 1 < len(fields):
            kept += fields[i : i + 2]
            i += 2
        else:
            i += 1
    return b"\0".join(kept)


def _migrate(quarantine: Path, objects: Path) -> None:
    """Move the checked packs into the repository: each pack before its index, as git does."""
    packs = sorted((quarantine / "pack").iterdir())
    for suffix in (".pack", ".rev", ".idx"):
        for item in packs:
            if item.name.endswith(suffix):
                os.replace(item, objects / "pack" / item.name)


def sandbox_binds(private: PrivateGit, worktree: Path) -> list[str]:
    """bwrap arguments that show the private git dir and point the worktree's .git at it."""
    return ["--bind", str(private.path), SANDBOX_GIT_DIR,
            "--ro-bind", str(private.dotgit), os.fspath(worktree / ".git")]  # fmt: skip
