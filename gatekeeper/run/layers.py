"""A run's worktree as layers: the base's checkout, shared and never written, under the run's own.

Checking out a large tree costs a write per file, which on a slow disk is seconds. As root
(who may mount), a run's worktree is an overlay mount: its lower layer is one checkout of the
base tree kept beside the worktrees (`.bases/<tree>/files`, with a git index of it), shared by
every run from that tree; its upper layer (`.layers/<run id>/upper`) takes everything the run
writes. The folder, the files and the index look exactly like a checkout to the agent, the
sandbox, git and the launcher, and the lower layer never changes: a write copies the file up.

The mount stays until the run's worktree is removed (`discard`); a base checkout goes when no
mounted worktree uses it and no run is about to. Without the right to mount (not root, a
container without CAP_SYS_ADMIN, no overlay in the kernel) or with GATEKEEPER_OVERLAY=0, a
worktree is a plain checkout, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import GitError
from gatekeeper.git import git, open_repository

OFF_ENV = "GATEKEEPER_OVERLAY"
MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
# Characters the overlay's option string cannot carry in a layer's path.
_UNSAFE = frozenset(",:\\\n")

_libc = ctypes.CDLL(None, use_errno=True)
_unavailable: list[str] = []  # why mounting failed once in this process: not tried again


class NoOverlay(Exception):
    """The overlay could not be mounted here; the caller checks the tree out instead."""


def wanted(root: Path) -> bool:
    """Whether to try an overlay for worktrees under root."""
    if os.environ.get(OFF_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return False
    if _unavailable or os.geteuid() != 0:
        return False
    return not (_UNSAFE & set(str(root)))


def bases_dir(root: Path) -> Path:
    return root / ".bases"


def layers_dir(worktree: Path) -> Path:
    """The run's own layer and the overlay's work folder, beside the worktrees."""
    return worktree.parent / ".layers" / worktree.name


@dataclass
class Base:
    """A checkout of one tree and its index; lock_fd holds a shared lock until released."""

    files: Path
    index: Path
    lock_fd: int

    def release(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def base_checkout(git_dir: Path, root: Path, tree: str) -> Base:
    """The shared checkout of tree under root, made now if there is none; raise GitError.

    Built in a private folder and renamed into place whole, so a half-made checkout is never
    used (a launcher killed while making it leaves a `.tmp-*` folder that the next clean-up
    removes). The shared lock keeps `collect_unused` from removing it before it is mounted.
    """
    bases = bases_dir(root)
    bases.mkdir(mode=0o700, exist_ok=True)
    lock_fd = os.open(bases / f"{tree}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_SH)
        final = bases / tree
        if not (final / "index").is_file():
            _build(git_dir, bases, final, tree)
        os.utime(lock_fd)  # when it was last used: the newest is kept
    except BaseException:
        os.close(lock_fd)
        raise
    return Base(final / "files", final / "index", lock_fd)


def _build(git_dir: Path, bases: Path, final: Path, tree: str) -> None:
    import pygit2  # only here: a run whose base is checked out already never loads libgit2

    # Named after its tree: clean-up knows it is half-made once no maker holds the tree's lock.
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{tree}-", dir=bases))
    try:
        files = tmp / "files"
        files.mkdir()
        # libgit2's checkout: the repository's own settings (eol, symlinks, file modes), no
        # filter program from its configuration, and the repository's index left alone.
        strategy = pygit2.enums.CheckoutStrategy
        try:
            repo = open_repository(git_dir)
            repo.checkout_tree(repo[tree], directory=str(files),
                               strategy=strategy.FORCE | strategy.DONT_UPDATE_INDEX)  # fmt: skip
        except (pygit2.GitError, KeyError, ValueError) as exc:
            raise GitError(f"could not check out tree {tree[:12]}: {exc}") from exc
        # The index of that checkout, stat data included, so git compares by stat data only.
        env = {"GIT_INDEX_FILE": str(tmp / "index.new")}
        git("read-tree", tree, git_dir=git_dir, env=env)
        git("update-index", "-q", "--refresh", git_dir=git_dir, work_tree=files, cwd=files,
            env=env, check=False)  # fmt: skip
        os.rename(tmp / "index.new", tmp / "index")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "index").is_file():  # not another launcher's finished one
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def mount(base: Base, worktree: Path, dotgit: Path) -> None:
    """Mount the overlay of base at worktree, with the run's `.git` file in its own layer.

    dotgit is the `.git` file git wrote into the (empty) worktree folder; it moves into the
    upper layer. Raise NoOverlay (with everything undone) when the kernel refuses.
    """
    layers = layers_dir(worktree)
    upper, work = layers / "upper", layers / "work"
    if _UNSAFE & set(f"{base.files}{upper}{work}"):
        raise NoOverlay("a layer's path holds a character the overlay options cannot carry")
    layers.mkdir(parents=True, mode=0o700)
    upper.mkdir()  # its mode is the worktree's root's: made as a checkout's would be
    work.mkdir(mode=0o700)
    # Which base the layer sits on, for clean-up: a mount in another mount namespace (a
    # launcher with private mounts) is not in this one's table.
    (layers / "base").write_text(base.files.parent.name)
    os.rename(dotgit, upper / ".git")
    options = f"lowerdir={base.files},upperdir={upper},workdir={work},redirect_dir=on"
    if _libc.mount(b"overlay", os.fsencode(worktree), b"overlay", MS_NOSUID | MS_NODEV,
                   options.encode()) != 0:  # fmt: skip
        err = ctypes.get_errno()
        os.rename(upper / ".git", dotgit)
        shutil.rmtree(layers, ignore_errors=True)
        _unavailable.append(os.strerror(err))
        raise NoOverlay(f"mount: {os.strerror(err)}")


def unmount(worktree: Path) -> bool:
    """Detach whatever is mounted at worktree (a run's overlay); True if something was."""
    detached = False
    for _ in range(8):  # mounts stacked on one folder, each detached in turn
        if not os.path.ismount(worktree):
            break
        if _libc.umount2(os.fsencode(worktree), MNT_DETACH) != 0:
            break
        detached = True
    return detached


def _unescape(field: bytes) -> str:
    # The kernel writes a space, tab, newline, backslash (and in options a comma) as \ooo.
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8) & 0xFF]), field))


def _overlays() -> list[tuple[str, dict[str, str]]]:
    """Every overlay mounted in this mount namespace: (mount point, options), in mount order.

    Paths come unescaped, as the file system names them (a repository folder may hold a
    space or bytes that are not UTF-8)."""
    found: list[tuple[str, dict[str, str]]] = []
    try:
        text = Path("/proc/self/mountinfo").read_bytes()
    except OSError:
        return found
    for line in text.splitlines():
        fields = line.split(b" ")
        _, _, after = line.partition(b" - ")
        parts = after.split(b" ")
        if len(fields) > 4 and len(parts) >= 3 and parts[0] == b"overlay":
            options: dict[str, str] = {}
            for option in parts[2].split(b","):
                key, _, value = option.partition(b"=")
                options[_unescape(key)] = _unescape(value)
            found.append((_unescape(fields[4]), options))
    return found


def overlay_points() -> list[str]:
    """The mount points of every overlay mounted in this mount namespace, in mount order."""
    return [point for point, _ in _overlays()]


def unmount_below(folder: Path) -> list[str]:
    """Detach every overlay mounted below folder (worktrees of runs made there); their points."""
    prefix = str(folder).rstrip("/") + "/"
    points = [point for point, _ in _overlays() if point.startswith(prefix)]
    for point in reversed(points):
        unmount(Path(point))
    return points


def _mounted_lowers() -> set[str]:
    """The lower folders of every overlay mounted in this mount namespace."""
    return {low for _, opts in _overlays() for low in opts.get("lowerdir", "").split(":") if low}


def _layered_bases(root: Path) -> set[str]:
    """The trees of the base checkouts the run layers under root sit on, mounted or not."""
    used: set[str] = set()
    with contextlib.suppress(OSError):
        for layer in (root / ".layers").iterdir():
            with contextlib.suppress(OSError):
                used.add((layer / "base").read_text()[:64])
    return used


def collect_unused(root: Path, keep: str | None = None) -> list[Path]:
    """Remove the base checkouts under root no run's layer (mounted or not) uses and no run
    is about to use (except keep, a tree id); return what was removed. Half-made ones go too,
    once no launcher is making them (one killed while making it left them)."""
    bases = bases_dir(root)
    if not bases.is_dir():
        return []
    removed: list[Path] = []
    mounted = _mounted_lowers()
    layered = _layered_bases(root)
    for entry in sorted(bases.iterdir()):
        name = entry.name
        if name.endswith(".lock") or name == keep:
            continue
        # A half-made one goes once no maker holds its tree's lock (one killed while making
        # it), a half-removed one at once; one named after no tree goes when stale.
        lock_name = None if name.startswith((".tmp-", ".trash-")) else f"{name}.lock"
        made = name.split("-")[1] if name.startswith(".tmp-") and name.count("-") == 2 else ""
        if len(made) in (40, 64) and all(c in "0123456789abcdef" for c in made):
            lock_name = f"{made}.lock"
        lock_fd = -1
        try:
            if name.startswith(".trash-"):
                pass
            elif lock_name is not None:
                lock_fd = os.open(bases / lock_name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif not _stale(entry):
                continue
            if str(entry / "files") in mounted or name in layered:
                continue
            trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=bases))
            os.rename(entry, trash / "x")
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(entry)
        except OSError:
            continue  # in use: a run holds its lock
        finally:
            if lock_fd >= 0:
                os.close(lock_fd)
    return removed


def _stale(tmp: Path, age: float = 3600.0) -> bool:
    # A half-made checkout older than an hour has no live maker: building one takes seconds.
    with contextlib.suppress(OSError):
        return time.time() - tmp.stat().st_mtime > age
    return False


def _layers_of(worktree: Path) -> tuple[str, str] | None:
    """(lower, upper) of the overlay mounted last at worktree, or None."""
    found = None
    for point, options in _overlays():
        if point == str(worktree):
            found = (options.get("lowerdir", ""), options.get("upperdir", ""))
    return found


# Beyond this many paths git compares the whole worktree: as many pathspecs cost more.
TOUCHED_LIMIT = 2000
_OPAQUE = "trusted.overlay.opaque"
_REDIRECT = "trusted.overlay.redirect"


def _has_xattr(path: str, name: str) -> bool:
    try:
        os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return False
    return True


def touched(
    worktree: Path, limit: int | None = None, max_bytes: int = 256 * 1024
) -> list[str] | None:
    """The paths of worktree the run may have changed, from its own layer; None when worktree
    is no mounted overlay of ours, or the layer holds more than limit paths (or max_bytes of
    names): then everything is to be compared.

    Everything the run wrote, removed, renamed or changed the mode or times of is in its
    layer (the lower one is never written): files, symlinks, deletion marks, and folders. A
    folder that exists only there, was emptied whole (opaque) or renamed (redirected) is given
    as itself, which as a git pathspec covers all below it; any other folder is looked into.
    The worktree's own `.git` file is not the run's.
    """
    limit = TOUCHED_LIMIT if limit is None else limit
    worktree = Path(os.path.realpath(worktree))
    upper = layers_dir(worktree) / "upper"
    mounted = _layers_of(worktree)
    if mounted is None or mounted[1] != str(upper) or ":" in mounted[0]:
        return None
    lower_root = mounted[0]
    paths: list[str] = []
    size = 0
    pending = [""]
    while pending:
        rel = pending.pop()
        try:
            entries = list(os.scandir(upper / rel if rel else upper))
        except OSError:
            return None
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if path == ".git":
                continue
            if entry.is_dir(follow_symlinks=False) and not (
                _has_xattr(entry.path, _OPAQUE) or _has_xattr(entry.path, _REDIRECT)
                or not os.path.isdir(os.path.join(lower_root, path))
                or os.path.islink(os.path.join(lower_root, path))
            ):  # fmt: skip
                pending.append(path)
                continue
            paths.append(path)
            size += len(path) + 1
            if len(paths) > limit or size > max_bytes:
                return None
    return paths
