"""The dynamic loader run as a program: `ld.so [OPTIONS] PROGRAM [ARGS...]`.

The kernel runs the loader; the loader maps PROGRAM and jumps to it with no exec of its own.
A rule naming PROGRAM must hold however it is started, so such an exec is judged as PROGRAM
with its arguments too, as a script is judged with its `#!` interpreter. The loaders are
known by their files (device and inode): those the system's programs name as their
interpreter (PT_INTERP), and any file of a loader's name. A copy of the loader
under another name is a program of the agent's, as a copy of any program is; one of the
usual names is a loader wherever it lies.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import sys

# glibc's and musl's options (`ld.so --help`) that take a value (the next word, or after `=`
# in musl's spelling), and those that take none. `--` ends them; the first other word is the
# program. An option not named here may take a value: its program cannot be told.
_WITH_VALUE = frozenset({
    "--library-path", "--glibc-hwcaps-prepend", "--glibc-hwcaps-mask", "--inhibit-rpath",
    "--audit", "--preload", "--argv0",
})  # fmt: skip
_FLAGS = frozenset({
    "--list", "--verify", "--inhibit-cache", "--list-tunables", "--list-diagnostics", "--help",
    "--version",
})  # fmt: skip
_PT_INTERP = 3
# A loader's own file name, wherever it lies (a toolchain's or a store's own glibc or musl).
_NAME = re.compile(
    r"ld-linux[-\w.]*\.so(\.\d+)*|ld64\.so(\.\d+)*|ld-musl-[\w.]+\.so(\.\d+)*|ld\.so(\.\d+)*"
    r"|ld-\d+(\.\d+)*\.so"
)


class UnknownOption(ValueError):
    """The loader was given an option this module does not know."""


def loaded_program(argv: list[str]) -> tuple[str, list[str]] | None:
    """(the program's path as given, the argv it runs with) for the loader's argv; None when
    it names no program (`--help`, `--version`, nothing). Raises UnknownOption for an option
    not known here (it may take the next word as its value)."""
    index, argv0 = 1, None
    while index < len(argv):
        word = argv[index]
        if word == "--":
            index += 1
            break
        if not word.startswith("--"):
            break
        name, equals, value = word.partition("=")
        if name in _WITH_VALUE and equals:
            argv0 = value if name == "--argv0" else argv0
            index += 1
        elif word in _WITH_VALUE:
            if index + 1 >= len(argv):
                return None
            argv0 = argv[index + 1] if word == "--argv0" else argv0
            index += 2
        elif word in _FLAGS:
            index += 1
        else:
            raise UnknownOption(word)
    if index >= len(argv):
        return None
    return argv[index], [argv0 if argv0 is not None else argv[index], *argv[index + 1 :]]


def interpreter_of(path: str) -> str | None:
    """The PT_INTERP path of an ELF program, None for none (or for no ELF file)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] not in (1, 2):
                return None
            order = "<" if head[5] == 1 else ">"
            if head[4] == 2:
                (phoff,) = struct.unpack_from(order + "Q", head, 32)
                size, count = struct.unpack_from(order + "HH", head, 54)
                layout = order + "IIQQQQ"  # type, flags, offset, vaddr, paddr, filesz
            else:
                (phoff,) = struct.unpack_from(order + "I", head, 28)
                size, count = struct.unpack_from(order + "HH", head, 42)
                layout = order + "IIIII"  # type, offset, vaddr, paddr, filesz
            if not 0 < count <= 256 or size < struct.calcsize(layout):
                return None
            fh.seek(phoff)
            table = fh.read(size * count)
            for index in range(min(count, len(table) // size)):
                fields = struct.unpack_from(layout, table, index * size)
                if fields[0] != _PT_INTERP:
                    continue
                offset, length = (fields[2], fields[5]) if head[4] == 2 else (fields[1], fields[4])
                if not 0 < length <= 4096:
                    return None
                fh.seek(offset)
                name = fh.read(length).split(b"\0", 1)[0]
                return os.fsdecode(name) if name.startswith(b"/") else None
    except (OSError, struct.error):
        return None
    return None


def identities(programs: tuple[str, ...] = ()) -> frozenset[tuple[int, int]]:
    """(device, inode) of the loaders the system's programs name (programs, this Python,
    /bin/sh, /usr/bin/env): under any other name (a link), still a loader. Loaders elsewhere
    are known by their names (is_loader_name)."""
    found = set()
    for program in (*programs, sys.executable, "/bin/sh", "/usr/bin/env"):
        interpreter = interpreter_of(program)
        if interpreter is None:
            continue
        with contextlib.suppress(OSError):
            st = os.stat(interpreter)
            found.add((st.st_dev, st.st_ino))
    return frozenset(found)


def is_loader_name(path: str | None) -> bool:
    """Is path named as a dynamic loader is (`ld-linux-x86-64.so.2`, `ld-musl-x86_64.so.1`)?"""
    return path is not None and _NAME.fullmatch(os.path.basename(path)) is not None
