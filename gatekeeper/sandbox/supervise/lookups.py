"""Secret lookups: inotify on the empty stand-ins that hide secrets inside the sandbox.

An inotify watch follows the inode, so an open through any bind mount of a stand-in is seen
here, without stopping the process that opened it.
"""

from __future__ import annotations

import ctypes
import os
import struct

IN_OPEN = 0x00000020
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
EVENT = struct.Struct("iIII")

_libc = ctypes.CDLL(None, use_errno=True)


class LookupWatch:
    """Watches stand-in files and folders; `read()` returns the hidden paths that were opened."""

    def __init__(self, watches: dict[str, str]) -> None:
        self.fd = -1
        self.by_wd: dict[int, str] = {}
        if not watches:
            return
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return
        self.fd = int(fd)
        for stand_in, shown in watches.items():
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(stand_in), IN_OPEN)
            if wd >= 0:
                self.by_wd[int(wd)] = shown

    def read(self) -> list[str]:
        """The hidden paths opened since the last call (in order, repeats kept)."""
        opened: list[str] = []
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return opened
            except OSError:
                return opened
            offset = 0
            while offset + EVENT.size <= len(data):
                wd, mask, _cookie, length = EVENT.unpack_from(data, offset)
                offset += EVENT.size + length
                if mask & IN_OPEN and wd in self.by_wd:
                    opened.append(self.by_wd[wd])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
