"""The agent's worktree and branch: made by git (a plain checkout by libgit2), committed from git
objects afterwards."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import GitError, UsageError
from gatekeeper.git import ZERO_OID, git, open_repository, rev_parse
from gatekeeper.receipt.keys import config_dir
from gatekeeper.run import layers
from gatekeeper.sandbox.mounts import SYSTEM_DIRS

LAUNCHER_NAME = "gatekeeper"
LAUNCHER_EMAIL = "gatekeeper@localhost"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def worktrees_root() -> Path:
    """Where run worktrees live, outside every checkout: $GATEKEEPER_WORKTREES or XDG data."""
    if os.environ.get("GATEKEEPER_WORKTREES"):
        return Path(os.environ["GATEKEEPER_WORKTREES"]).expanduser().resolve()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser().resolve() / "gatekeeper" / "worktrees"


@dataclass(frozen=True)
class Worktree:
    run_id: str
    branch: str
    path: Path
    admin_dir: Path  # <common git dir>/worktrees/<run id>
    base: str
    layered: bool = False  # an overlay of the base's shared checkout (see layers.py)
    # Where the walk of the base's files is kept (a layered worktree's, as it starts).
    walk_cache: Path | None = None
    base_tree: str | None = None  # the base commit's tree, when it was read on the way


def check_branch_name(git_dir: Path, branch: str) -> None:
    """Raise UsageError unless branch is a new name git takes as a branch (not HEAD, not -x)."""
    if not git_ok_ref(git_dir, f"refs/heads/{branch}") or not _is_branch_name(git_dir, branch):
        raise UsageError(f"{branch!r} is not a valid branch name")
    try:
        git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", git_dir=git_dir)
    except GitError:
        return
    raise UsageError(
        f"branch {branch!r} already exists",
        hint="pick another name with --branch, or leave it out for agent/<run-id>",
    )


def git_ok_ref(git_dir: Path, ref: str) -> bool:
    try:
        git("check-ref-format", ref, git_dir=git_dir)
    except GitError:
        return False
    return True


def _is_branch_name(git_dir: Path, branch: str) -> bool:
    # `git worktree add` checks a name out as a branch only when git takes it as one.
    try:
        out = git("check-ref-format", "--branch", branch, git_dir=git_dir)
    except GitError:
        return False
    return out.decode("utf-8", "surrogateescape").strip() == branch


def _nested(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or b in a.parents or a in b.parents


def _shown_system_folder(root: Path) -> Path | None:
    """The system folder every sandbox shows that holds root, or None."""
    real = Path(os.path.realpath(root))
    for name in SYSTEM_DIRS:
        folder = Path(os.path.realpath(Path("/") / name))  # /bin may lead to /usr/bin
        if folder != Path("/") and (real == folder or folder in real.parents):
            return folder
    return None


def repository_folder(git_dir: Path) -> Path:
    """Where the worktrees (and layered worktrees' base checkouts) of git_dir's runs live."""
    digest = hashlib.sha256(str(git_dir).encode()).hexdigest()[:10]
    return worktrees_root() / f"{git_dir.parent.name}-{digest}"


def create_worktree(
    git_dir: Path, base: str, branch: str, run_id: str, existing: bool = False
) -> Worktree:
    """Create branch at base (with existing, take the branch that is there) and check it out
    in a new worktree outside the user's checkout."""
    root = repository_folder(git_dir)
    if _nested(root, config_dir()):
        raise UsageError(
            f"the worktree folder {root} and the key folder {config_dir()} overlap",
            hint="keep GATEKEEPER_WORKTREES (or XDG_DATA_HOME) apart from GATEKEEPER_HOME",
        )
    shown = _shown_system_folder(root)
    if shown is not None:
        raise UsageError(
            f"the worktree folder {root} lies in {shown}, which every sandbox shows (read-only): "
            "a run would see the other runs' worktrees and the shared base checkouts",
            hint="set GATEKEEPER_WORKTREES (or XDG_DATA_HOME) to a folder outside "
            + ", ".join(f"/{name}" for name in SYSTEM_DIRS),
        )
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:  # a folder on the way this user may not enter or write
        raise UsageError(f"cannot create the worktree folder {root}: {exc.strerror}",
                         hint="set GATEKEEPER_WORKTREES (or XDG_DATA_HOME, or HOME) to a folder "
                         "of your own") from None  # fmt: skip
    path = root / run_id
    admin = git_dir / "worktrees" / run_id
    if not existing:
        _create_branch(git_dir, branch, base)
    try:
        base_dir = _layered(git_dir, root, path, admin, branch, base) if layers.wanted(
            root) else None  # fmt: skip
        if base_dir is None:
            _checkout(git_dir, run_id, path, branch)
    except (GitError, ValueError, OSError) as exc:
        if not existing:
            # Only the branch made above, still where it was made.
            git("update-ref", "-d", f"refs/heads/{branch}", base, git_dir=git_dir, check=False)
        message = exc.message if isinstance(exc, GitError) else str(exc)
        raise GitError(f"could not create the worktree at {path}: {message}") from exc
    if base_dir is None:
        return Worktree(run_id, branch, path, admin, base)
    return Worktree(run_id, branch, path, admin, base, True, base_dir / "walk.json",
                    base_dir.name)  # fmt: skip


def _create_branch(git_dir: Path, branch: str, commit: str) -> None:
    """Create branch at commit; raise GitError when it exists (it is never moved)."""
    try:
        git("update-ref", "-m", f"branch: Created from {commit}", f"refs/heads/{branch}", commit,
            ZERO_OID, git_dir=git_dir)  # fmt: skip
    except GitError as exc:
        raise GitError(f"could not create branch {branch!r}: {exc.message}",
                       hint="pick another name with --branch") from exc  # fmt: skip


@contextmanager
def _adding(git_dir: Path) -> Iterator[None]:
    """Held while a worktree is added: adding one reads every other worktree's admin files,
    which another one being added writes meanwhile (read empty, git fails: "failed to read
    .../commondir"), so the runs of one repository add theirs one at a time."""
    folder = git_dir / "gatekeeper"
    folder.mkdir(exist_ok=True)
    fd = os.open(folder / "worktrees.flock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _checkout(git_dir: Path, run_id: str, path: Path, branch: str) -> None:
    """A plain worktree of branch at path, checked out by libgit2 (no filter program runs)."""
    import pygit2  # only here: a layered worktree's run never loads libgit2

    repo = open_repository(git_dir)
    try:
        with _adding(git_dir):
            repo.add_worktree(run_id, str(path), repo.branches.local[branch])
    except (pygit2.GitError, KeyError) as exc:
        raise GitError(str(exc)) from exc


def _layered(
    git_dir: Path, root: Path, path: Path, admin: Path, branch: str, commit: str
) -> Path | None:
    """Make path an overlay of the shared checkout of commit's tree (see layers.py) and return
    that checkout's folder; None when this machine cannot mount one (nothing is left behind
    then). Raise GitError."""
    tree = rev_parse(git_dir, commit, "tree")
    base = layers.base_checkout(git_dir, root, tree)
    try:
        # The worktree's admin folder and `.git` file as git makes them, with no checkout.
        with _adding(git_dir):
            git("worktree", "add", "--no-checkout", str(path), branch, git_dir=git_dir)
        try:
            layers.mount(base, path, path / ".git")
        except layers.NoOverlay:
            shutil.rmtree(admin, ignore_errors=True)
            shutil.rmtree(path, ignore_errors=True)
            return None
        try:
            # The index of the base's checkout: its stat data is the mounted files' own.
            shutil.copyfile(base.index, admin / "index")
        except OSError:
            layers.unmount(path)
            raise
    finally:
        base.release()
    layers.collect_unused(root, keep=tree)
    return base.files.parent


# At most this many files a run may add or change; beyond it files are left out, reported.
MAX_ADDED_FILES = 1_000_000


def over_budget(
    worktree: Path, paths: list[str], max_bytes: int, max_files: int = MAX_ADDED_FILES
) -> dict[str, str]:
    """The paths beyond the run's byte or file budget: {path: why}.

    Sizes are apparent sizes (st_size): a sparse file counts what git would have to read.
    Nothing is read; paths are taken in byte order until the budget is spent.
    """
    over: dict[str, str] = {}
    spent = count = 0
    for path in sorted(paths, key=lambda p: p.encode("utf-8", "surrogateescape")):
        try:
            st = os.lstat(worktree / path)
        except OSError:
            continue  # gone: staged as a deletion, costs nothing
        size = st.st_size if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) else 0
        if count + 1 > max_files:
            over[path] = f"over the run's budget of {max_files} files"
        elif spent + size > max_bytes:
            over[path] = (f"over the run's budget of {max_bytes} bytes added "
                          f"(limits.max_added_bytes; this file is {size} bytes)")  # fmt: skip
        else:
            spent += size
            count += 1
    return over


@dataclass
class Collected:
    """What the agent left in the worktree: changes, the index to commit from, what is over
    the byte budget, and the new paths .gitignore covers (folders end with '/')."""

    changes: list[tuple[str, str]]
    index: Path
    over: dict[str, str]
    ignored: list[str]


MAX_IGNORED_LISTED = 1000


def collect_changes(
    wt: Worktree, git_dir: Path, start: str | None = None, max_bytes: int | None = None,
    commit_ignored: bool = False, layer: list[str] | None = None,
) -> Collected:  # fmt: skip
    """What the agent left in the worktree against start (default base): [(letter, path)].

    Untracked files count; ignored ones count only with commit_ignored, and are listed either
    way (a `.gitignore` the agent wrote must not hide its work from a reviewer). The changed
    paths beyond the byte budget (max_bytes) are never read by git.
    The index starts from the worktree's own (written at checkout, beyond the agent's reach),
    so git hashes only files whose stat data changed, not the whole checkout. In a layered
    worktree git looks only where the run's own layer says it wrote (layer, as layers.touched
    gives it; None: everywhere).
    The index to commit from is made in the worktree's admin folder (beyond the agent's reach,
    and removed with the worktree should the launcher be killed); the caller removes it.
    """
    where = wt.admin_dir if wt.admin_dir.is_dir() else None
    fd, name = tempfile.mkstemp(prefix="gatekeeper-index-", dir=where)
    os.close(fd)
    index = Path(name)
    try:
        return _collect(wt, git_dir, index, start, max_bytes, commit_ignored, layer)
    except BaseException:
        index.unlink(missing_ok=True)
        raise


def _collect(
    wt: Worktree, git_dir: Path, index: Path, start: str | None, max_bytes: int | None,
    commit_ignored: bool, layer: list[str] | None,
) -> Collected:  # fmt: skip
    env = {"GIT_INDEX_FILE": str(index), "GIT_LITERAL_PATHSPECS": "1"}
    where = {"git_dir": git_dir, "work_tree": wt.path, "cwd": wt.path, "env": env}
    only = _touched(wt, git_dir, start, layer)
    limit = ["--", *only] if only is not None else []

    def listed(*args: str) -> list[str]:
        if only == []:
            return []  # the run's layer holds nothing: nothing of the worktree changed
        return _paths_z(git(*args, *limit, **where))  # type: ignore[arg-type]

    try:
        shutil.copyfile(wt.admin_dir / "index", index)
        # With the index's own time: git takes an entry whose file is as new as its index
        # (to the second) for possibly changed, and compares its content. A copy made now
        # would vouch for every entry, and a same-size rewrite in the second of the checkout
        # (whose stat data then matches, to the second) would look unchanged.
        made = os.stat(wt.admin_dir / "index")
        os.utime(index, ns=(made.st_atime_ns, made.st_mtime_ns))
        if not wt.layered or (start or wt.base) != wt.base:
            # One tree with -m keeps the stat data of entries that match the tree. (A layered
            # worktree's index is its base's, made for exactly that tree by the launcher.)
            git("read-tree", "-m", start or wt.base, **where)  # type: ignore[arg-type]
        has_stat_data = True
    except (OSError, GitError):
        index.unlink(missing_ok=True)
        git("read-tree", start or wt.base, **where)  # type: ignore[arg-type]
        has_stat_data = False  # every tracked file looks changed until it is hashed
    # Before anything is hashed: what changed by its stat data, and what is new.
    dirty = listed("diff-files", "-z", "--name-only", "--ignore-submodules=all")
    untracked = [p.rstrip("/") for p in listed("ls-files", "-z", "--others", "--exclude-standard")]
    ignored = listed("ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory")
    if commit_ignored and ignored:
        untracked += listed("ls-files", "-z", "--others", "--ignored", "--exclude-standard")
    candidates = [*dirty, *untracked] if has_stat_data else untracked
    over = over_budget(wt.path, candidates, max_bytes) if max_bytes is not None else {}
    held_back = [p for p in dirty if p in over]
    if held_back:
        # Refreshing would hash them: mark them unchanged in this index, they are left out.
        data = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in held_back)
        git("update-index", "--assume-unchanged", "-z", "--stdin", input=data, **where)  # type: ignore[arg-type]
    if dirty or not has_stat_data:
        git("update-index", "-q", "--refresh", check=False, **where)  # type: ignore[arg-type]
    tracked = b"" if only == [] or not dirty and has_stat_data else git(
        "diff-files", "-z", "--name-status", "--no-renames", "--ignore-submodules=all", *limit,
        **where)  # type: ignore[arg-type]  # fmt: skip
    fields = tracked.split(b"\0")
    changes: list[tuple[str, str]] = []
    for status, raw in zip(fields[0::2], fields[1::2], strict=False):
        if status:
            changes.append((status.decode()[0], raw.decode("utf-8", "surrogateescape")))
    changes += [("M", p) for p in held_back]
    changes += [("A", p) for p in untracked]
    return Collected(changes, index, over, ignored)


def _touched(
    wt: Worktree, git_dir: Path, start: str | None, layer: list[str] | None
) -> list[str] | None:
    """Where the run may have changed wt against start: what its layer holds (layer, as
    layers.touched gave it), and what its own commits changed (the worktree shows the base
    there unless the run wrote it again); None when everything is to be compared."""
    only = list(layer) if layer is not None else None
    if only is not None and start and start != wt.base:
        changed = git("diff-tree", "-r", "-z", "--name-only", "--no-renames", wt.base, start,
                      git_dir=git_dir)  # fmt: skip
        only += _paths_z(changed)
        if len(only) > 2 * layers.TOUCHED_LIMIT:
            return None
    # git takes them as arguments: past what one command line holds, git compares everything.
    if only is not None and sum(len(os.fsencode(p)) + 1 for p in only) > PATHSPEC_BYTES:
        return None
    if only is not None and any(len(os.fsencode(p)) > PATHSPEC_MAX_PATH for p in only):
        return None
    return only


# At most this many bytes of paths on git's command line (the kernel takes about 2 MB of
# arguments and environment together, and one argument of at most 128 KB).
PATHSPEC_BYTES = 512 * 1024
PATHSPEC_MAX_PATH = 64 * 1024


def _paths_z(out: bytes) -> list[str]:
    return [raw.decode("utf-8", "surrogateescape") for raw in out.split(b"\0") if raw]


def _chmod_at(parent: int, name: str, add: int) -> os.stat_result | None:
    """Add permission bits to name in parent (never through a symlink); its lstat, or None."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode) or st.st_mode & add == add:
            return st
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            return st
        # An O_PATH descriptor cannot be chmod'ed itself; its /proc link names the same inode.
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | add)
        return os.fstat(fd)
    finally:
        os.close(fd)


_SPECIAL = {
    stat.S_IFIFO: "a fifo",
    stat.S_IFSOCK: "a Unix socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def restore_access(
    root: Path, skip_top: frozenset[str] = frozenset({".git"}), only: list[str] | None = None
) -> dict[str, str]:
    """Give the owner back read access to what the agent left under root.

    The agent may leave folders without x or r and files without r (its own files, so the
    launcher, their owner, may change that). Folders get u+rwx, files u+r; no symlink is
    followed. With only (paths below root, as layers.touched gives them), just those and all
    below them are looked at. Returns {relative path: reason} for what stays unreadable, and
    for each special file (fifo, socket, device node): git can hold none, and its lists of
    changed and new files never name one, so this is where a run's record learns of them.
    """
    problems: dict[str, str] = {}
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return {".": f"unreadable ({exc.strerror})"}
    pending: list[str] = [""]
    picked: dict[str, list[str]] = {}  # folder: the only names in it to look at
    if only is not None:
        for path in only:
            parent, _, name = path.rpartition("/")
            picked.setdefault(parent, []).append(name)
        pending = list(picked)
    try:
        while pending:
            rel = pending.pop()
            try:
                fd = (os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=top) if rel else os.dup(top))  # fmt: skip
            except OSError as exc:
                problems[rel] = f"a folder the launcher cannot read ({exc.strerror})"
                continue
            try:
                names = picked.pop(rel) if rel in picked else os.listdir(fd)
                for name in names:
                    if not rel and name in skip_top:
                        continue
                    path = f"{rel}/{name}" if rel else name
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            if st.st_mode & 0o700 != 0o700:
                                _chmod_at(fd, name, 0o700)
                            pending.append(path)
                        elif stat.S_ISREG(st.st_mode):
                            if not st.st_mode & 0o400:
                                _chmod_at(fd, name, 0o400)
                        elif kind := _SPECIAL.get(stat.S_IFMT(st.st_mode)):
                            problems[path] = f"{kind}: git cannot hold it (left in the worktree)"
                    except FileNotFoundError:
                        continue  # a path the run removed
                    except OSError as exc:
                        problems[path] = f"permissions could not be restored ({exc.strerror})"
            except OSError as exc:
                problems[rel or "."] = f"a folder the launcher cannot list ({exc.strerror})"
            finally:
                os.close(fd)
    finally:
        os.close(top)
    return problems


def remove_tree(path: Path) -> None:
    """Remove a folder the agent wrote into, read-only folders inside it included."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    restore_access(path, skip_top=frozenset())
    shutil.rmtree(path, ignore_errors=True)


def unsafe_reason(worktree: Path, path: str, gitlinks: set[str]) -> str | None:
    """Why the launcher must not stage path, or None.

    A path beyond a symlink would be read through it; a nested repository or a submodule
    would make git consult the agent's own git configuration (filters run on the host).
    """
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        rel = "/".join(parts[:depth])
        here = worktree / rel
        if rel in gitlinks:
            return "a submodule (gitlink)"
        if depth < len(parts) and here.is_symlink():
            return "beyond a symbolic link"
        if here.is_dir() and not here.is_symlink() and (here / ".git").exists():
            return "inside a nested git repository"
    return None


def gitlinks_at(git_dir: Path, rev: str) -> set[str]:
    out = git("ls-tree", "-r", "-z", rev, git_dir=git_dir)
    links = set()
    for record in out.split(b"\0"):
        if record.startswith(b"160000 "):
            links.add(record.split(b"\t", 1)[1].decode("utf-8", "surrogateescape"))
    return links


def _stage(wt: Worktree, git_dir: Path, env: dict[str, str], paths: list[str]) -> dict[str, str]:
    """Stage paths as they are in the worktree (deleted ones removed); {path: why not}.

    One `git update-index` for all paths: each is named exactly, so the work is linear in
    their number (pathspecs, as `git add` takes them, are matched path by path). A batch git
    refuses is split in halves until the paths it refuses are found.
    """
    refused: dict[str, str] = {}
    batches = [paths] if paths else []
    while batches:
        batch = batches.pop()
        data = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in batch)
        try:
            git("update-index", "--add", "--remove", "--replace", "-z", "--stdin",
                git_dir=git_dir, work_tree=wt.path, cwd=wt.path, env=env, input=data)  # fmt: skip
        except GitError as exc:
            if len(batch) == 1:
                lines = [ln for ln in exc.message.splitlines() if ln.startswith("stderr:")]
                refused[batch[0]] = "git could not stage it" + (
                    f" ({lines[0].removeprefix('stderr:').strip()[:200]})" if lines else ""
                )
            else:
                half = len(batch) // 2
                batches += [batch[:half], batch[half:]]
    # update-index passes over some paths with only a warning (a `.GIT` part, say): whatever
    # is in the worktree but not in the index was not taken, and is reported.
    if paths:
        listed = git("ls-files", "-z", "--cached", git_dir=git_dir, env=env)
        present = {raw.decode("utf-8", "surrogateescape") for raw in listed.split(b"\0") if raw}
        for path in paths:
            if path not in present and path not in refused and os.path.lexists(wt.path / path):
                refused[path] = "git would not stage it (a path git refuses to track)"
    return refused


def commit_result(
    wt: Worktree,
    git_dir: Path,
    index: Path,
    allowed: list[str],
    message: str,
    parent: str | None = None,
    plain_index: bool = False,
) -> tuple[str, str, dict[str, str]]:
    """Stage the allowed paths over base and commit on the agent branch.

    plain_index: index holds no entry marked unchanged (nothing was held back), so it becomes
    the worktree's own as it is. Returns (commit, tree, {path git refused to stage: why}); a
    refusal never stops the commit.
    """
    env = {"GIT_INDEX_FILE": str(index)}
    skipped = _stage(wt, git_dir, env, allowed)
    tree = git("write-tree", git_dir=git_dir, env=env).decode().strip()
    commit = commit_tree(wt, git_dir, tree, message, parent)
    # The worktree's own index now matches its branch, so `git status` there shows only leftovers:
    # the index the tree was written from (with its stat data, so git hashes nothing again),
    # or else the commit read anew.
    if not (plain_index and _install_index(index, wt.admin_dir)):
        git("read-tree", commit, git_dir=wt.admin_dir, work_tree=wt.path)
    return commit, tree, skipped


def _install_index(index: Path, admin: Path) -> bool:
    """Copy index over admin's as git writes one (under index.lock, renamed into place);
    False when another git holds the lock or the copy failed (nothing changed then)."""
    lock = admin / "index.lock"
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError:
        return False
    try:
        with open(index, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(lock, admin / "index")
    except OSError:
        lock.unlink(missing_ok=True)
        return False
    return True


def commit_tree(wt: Worktree, git_dir: Path, tree: str, message: str, parent: str | None) -> str:
    """Commit tree on the agent branch (whose ref must still be at base); raise GitError."""
    identity = {
        "GIT_AUTHOR_NAME": LAUNCHER_NAME, "GIT_AUTHOR_EMAIL": LAUNCHER_EMAIL,
        "GIT_COMMITTER_NAME": LAUNCHER_NAME, "GIT_COMMITTER_EMAIL": LAUNCHER_EMAIL,
    }  # fmt: skip
    commit = git("commit-tree", tree, "-p", parent or wt.base, git_dir=git_dir, env=identity,
                 input=message.encode()).decode().strip()  # fmt: skip
    git("update-ref", "-m", f"gatekeeper run {wt.run_id}", f"refs/heads/{wt.branch}", commit,
        wt.base, git_dir=git_dir)  # fmt: skip
    return commit


def remove_worktree(git_dir: Path, run_id: str, path: Path | None, branch: str | None) -> list[str]:
    """Remove a run's worktree folder, its admin folder and (if given) its branch."""
    removed: list[str] = []
    if path is not None and layers.unmount(path):
        removed.append(f"the overlay mounted at {path}")
    if path is not None and os.path.lexists(path):
        remove_tree(path)
        removed.append(str(path))
    if path is not None and os.path.lexists(layers.layers_dir(path)):
        remove_tree(layers.layers_dir(path))
        removed.append(str(layers.layers_dir(path)))
    admin = git_dir / "worktrees" / run_id
    if admin.exists():
        shutil.rmtree(admin, ignore_errors=True)
        removed.append(str(admin))
    if branch:
        try:
            git("update-ref", "-d", f"refs/heads/{branch}", git_dir=git_dir)
            removed.append(f"branch {branch}")
        except GitError:
            pass
    return removed
