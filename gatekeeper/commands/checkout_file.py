"""Reading and writing gatekeeper's own files in a checkout, never through a symbolic link.

A branch can commit `.gatekeeper` or `.gatekeeper/policy.yaml` as a symlink pointing anywhere;
`init` and `trust add` must then neither write through it (creating or appending to a file
outside the checkout) nor read what it points to as if it were the repository's file. Each
folder on the way is opened relative to the one before with O_NOFOLLOW, so a link swapped in
while this runs is refused too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from gatekeeper.errors import UsageError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _refuse(top: Path, rel: str, what: str) -> UsageError:
    return UsageError(
        f"{rel} in {top} is {what}; gatekeeper reads and writes its files there only as "
        "regular files inside the checkout, never through a link",
        hint=f"look at what put it there (`git log -- {rel}`), remove it, then run the "
        "command again",
    )


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
                kind = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
                raise _refuse(top, rel, _kind(kind)) from None
            os.close(fd)
            fd = child
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file" if not stat.S_ISREG(mode) else "a file"


def read_checkout_file(top: Path, rel: str) -> bytes | None:
    """The bytes of top/rel, None when it does not exist; UsageError when a link is on the way."""
    *parents, name = rel.split("/")
    folder = _folder(top, parents, create=False)
    if folder is None:
        return None
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=folder)  # fmt: skip
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise _refuse(top, rel, "a symbolic link") from None
        with os.fdopen(fd, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise _refuse(top, rel, _kind(mode))
            return file.read()
    finally:
        os.close(folder)


def write_checkout_file(top: Path, rel: str, data: bytes) -> None:
    """Put data at top/rel (folders made as needed), replacing a regular file there at once."""
    *parents, name = rel.split("/")
    folder = _folder(top, parents, create=True)
    assert folder is not None
    tmp = f".{name}.gatekeeper-tmp"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666, dir_fd=folder)  # fmt: skip
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                try:
                    mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
                except FileNotFoundError:
                    mode = 0
                if mode and not stat.S_ISREG(mode):
                    raise _refuse(top, rel, _kind(mode))
                if mode:
                    os.fchmod(file.fileno(), stat.S_IMODE(mode))
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=folder)
            raise
    finally:
        os.close(folder)
