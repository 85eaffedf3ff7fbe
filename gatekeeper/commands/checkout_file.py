"""Reading and writing gatekeeper's own files in a checkout, never through a symbolic link.

A branch can commit `.gatekeeper` or `.gatekeeper/policy.yaml` as a symlink pointing anywhere
(or as a folder, or a fifo); `init` and `trust add` must then neither write through it
(creating or appending to a file outside the checkout) nor read what it points to as if it
were the repository's file. Each folder on the way is opened relative to the one before with
O_NOFOLLOW, so a link swapped in while this runs is refused too. Whatever goes wrong is a
UsageError naming the path, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from gatekeeper.errors import UsageError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A fifo or a device is opened without waiting, then refused by its type.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def _refuse(top: Path, rel: str, what: str) -> UsageError:
    return UsageError(
        f"{rel} in {top} is {what}; gatekeeper reads and writes its files there only as "
        "regular files inside the checkout, never through a link",
        hint=f"look at what put it there (`git log -- {rel}`), remove it, then run the "
        "command again",
    )


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


@contextlib.contextmanager
def _plain_errors(top: Path, rel: str, doing: str) -> Iterator[None]:
    """An OSError (permissions, a full disk, a path changed meanwhile) as a UsageError."""
    try:
        yield
    except OSError as exc:
        raise UsageError(
            f"cannot {doing} {top / rel}: {exc.strerror or exc}",
            hint="check that path's permissions and that nothing else changes it meanwhile",
        ) from None


def _folder(top: Path, parts: list[str], *, create: bool) -> int | None:
    """A descriptor of top/parts (made when create), or None when a part is missing."""
    fd = os.open(top, _DIR)
    try:
        for n, part in enumerate(parts):
            try:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
                child = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                rel = "/".join(parts[: n + 1])
                try:
                    what = _kind(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                except OSError:
                    what = "a path that changed while gatekeeper opened it"
                if what == "a folder":  # (a folder when looked at again: it was not, before)
                    what = "a path that changed while gatekeeper opened it"
                raise _refuse(top, rel, what) from None
            os.close(fd)
            fd = child
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _open_file(top: Path, rel: str, folder: int, name: str) -> int | None:
    """A read descriptor of the regular file name in folder, None when there is none."""
    try:
        fd = os.open(name, _FILE, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise _refuse(top, rel, "a symbolic link") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refuse(top, rel, _kind(mode))
    return fd


@contextlib.contextmanager
def _parent(top: Path, rel: str, doing: str) -> Iterator[tuple[int | None, str]]:
    """(a descriptor of rel's folder, or None when that is missing; rel's last name), with
    errors as UsageError."""
    *parents, name = rel.split("/")
    with _plain_errors(top, rel, doing):
        folder = _folder(top, parents, create=False)
        try:
            yield folder, name
        finally:
            if folder is not None:
                os.close(folder)


def checkout_file_exists(top: Path, rel: str) -> bool:
    """Whether top/rel is a regular file (it need not be readable); UsageError when a link
    or something other than a regular file is there."""
    with _parent(top, rel, "look at") as (folder, name):
        if folder is None:
            return False
        try:
            mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(mode):
            raise _refuse(top, rel, _kind(mode))
        return True


def read_checkout_file(top: Path, rel: str) -> bytes | None:
    """The bytes of top/rel, None when it does not exist; UsageError when a link or something
    other than a regular file is on the way."""
    with _parent(top, rel, "read") as (folder, name):
        fd = None if folder is None else _open_file(top, rel, folder, name)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as file:
            return file.read()


def write_checkout_file(top: Path, rel: str, data: bytes) -> None:
    """Put data at top/rel (folders made as needed): a new file replaces a regular one there at
    once, keeping its permission bits (not set-id ones) and, where allowed, its owner."""
    *parents, name = rel.split("/")
    with _plain_errors(top, rel, "write"):
        folder = _folder(top, parents, create=True)
        assert folder is not None
        try:
            _replace(top, rel, folder, name, data)
        finally:
            os.close(folder)


def _replace(top: Path, rel: str, folder: int, name: str, data: bytes) -> None:
    try:
        old: os.stat_result | None = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        raise _refuse(top, rel, _kind(old.st_mode))
    # A name of its own each time: nothing a branch committed can stand there.
    tmp = f".{name}.{secrets.token_hex(6)}.gatekeeper-tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o666, dir_fd=folder)
    except PermissionError:
        if old is None:
            raise
        _overwrite(top, rel, folder, name, data)  # a folder this user may not add names to
        return
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            if old is not None:
                os.fchmod(file.fileno(), stat.S_IMODE(old.st_mode) & 0o777)
                with contextlib.suppress(OSError):  # (only root may give a file away)
                    os.fchown(file.fileno(), old.st_uid, old.st_gid)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


def _overwrite(top: Path, rel: str, folder: int, name: str, data: bytes) -> None:
    """Write data over the regular file name in folder, in place."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=folder)  # fmt: skip
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise _refuse(top, rel, "a symbolic link") from None
    with os.fdopen(fd, "wb") as file:
        mode = os.fstat(file.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(top, rel, _kind(mode))
        file.truncate(0)
        file.write(data)
