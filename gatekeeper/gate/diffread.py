"""git's output read with a bound, from a pipe as git writes it, and git ended once past it.

A diff (`git diff-tree -r -z -M` between two trees) stops once it names more than
MAX_DIFF_PATHS paths or takes more than MAX_DIFF_BYTES, so a small push of one commit that adds
hundreds of thousands of files (a megabyte of pack: one blob, many tree entries, or deep
folders of long names, each path kilobytes long) cannot make the gate hold them all; the
judgement then blocks with a `change-too-large` finding. Every other listing of a tree whose
size a pusher chooses (a merge's own paths, a notes tree) is read with the same bound.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import subprocess
from pathlib import Path

from gatekeeper.errors import Error, GitError
from gatekeeper.git import SAFE_CONFIG, clean_env

# Paths one diff may name (a rename names two). A legitimate change of 10,000 files is judged
# in a fraction of a second; one of 100,000 in about two seconds and a few hundred MB.
MAX_DIFF_PATHS = 100_000
# Paths all diffs of one judgement may name together (the range's own, each commit's, each
# receipt's base to result): many commits each changing many paths cost as one huge change.
MAX_DIFF_PATHS_IN_ALL = 1_000_000
# Bytes one diff's output may take: a path may be thousands of bytes long (deep trees of long
# names, a few KB of pack), so a bound on paths alone would let 100,000 of them take gigabytes.
# A real change of 100,000 files takes some 15 MB.
MAX_DIFF_BYTES = 64 << 20

# Memory git itself may take for one listing (RLIMIT_DATA: its heap; the packs it maps read-only
# are not counted). git holds a whole diff before it writes the first line of it, about twice
# the bytes it lists: whatever reaches the bounds above fits with room to spare, while a push
# of a few megabytes (a million files under folders of long names) would otherwise make it
# take gigabytes before a byte is read.
MAX_GIT_MEMORY = 512 << 20
# How git says it ran out of memory (xmalloc, xmmap, and the C library's strerror).
_OUT_OF_MEMORY = (b"Out of memory", b"Cannot allocate memory")

_CHUNK = 1 << 20  # bytes read at once (and the pipe's size, where the system allows it)


# What to do about a diff that is too large.
IN_PARTS = (
    "The gate blocks: land the change in parts: the diff of each push (or range checked) "
    f"and of each of its commits may name at most {MAX_DIFF_PATHS:,} paths "
    f"({MAX_DIFF_BYTES >> 20} MiB), and all of them together at most {MAX_DIFF_PATHS_IN_ALL:,}"
)


class DiffTooLarge(Error):
    """A diff (or another listing git makes of a tree) names more paths, or takes more bytes,
    than the gate reads; nothing past the bound was read."""

    def __init__(
        self,
        what: str,
        limit: int,
        commit: str | None = None,
        *,
        in_bytes: bool = False,
        in_memory: bool = False,
        hint: str = IN_PARTS,
    ) -> None:
        verb = "name" if what.startswith("the diffs ") else "names"
        if in_memory:
            size = f"takes git more than {_size(limit)} of memory to list"
        elif in_bytes:
            size = f"takes more than {_size(limit)}"
        else:
            size = f"{verb} more than {limit:,} paths"
        super().__init__(
            f"{what} {size}: too large for the gate to read, so it reads no further "
            f"(docs/gate.md, Limits on what is read). {hint}"
        )
        self.what, self.limit, self.commit, self.in_bytes = what, limit, commit, in_bytes
        self.in_memory, self.advice = in_memory, hint  # (in the message: no separate hint)

    def naming(self, what: str, commit: str | None) -> DiffTooLarge:
        """The same, saying which diff it is."""
        return DiffTooLarge(what, self.limit, commit, in_bytes=self.in_bytes,
                            in_memory=self.in_memory, hint=self.advice)  # fmt: skip


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count:,} bytes"


class _PathCount:
    """The paths named by `--raw -z` output fed in pieces: each record is a header field
    (`:mode mode blob blob STATUS`) and one path, or two for a rename or copy."""

    def __init__(self) -> None:
        self.paths = 0
        self.wanted = 0  # paths still to come in the current record
        self.tail = b""  # a field not yet ended

    def feed(self, data: bytes) -> None:
        fields = (self.tail + data).split(b"\0")
        self.tail = fields.pop()
        for field in fields:
            if self.wanted:
                self.wanted -= 1
                self.paths += 1
            elif field:  # a header; its status letter says how many paths follow
                status = field.rpartition(b" ")[2][:1]
                self.wanted = 2 if status in (b"R", b"C") else 1


def read_diff(
    git_dir: Path,
    base: str,
    result: str,
    limit: int = MAX_DIFF_PATHS,
    env: dict[str, str] | None = None,
) -> bytes:
    """diff_tree's output (`git diff-tree -r -z -M` from base to result, commits or trees),
    read from a pipe as git writes it; raises DiffTooLarge as soon as it names more than
    limit paths or takes more than MAX_DIFF_BYTES (git is ended then), GitError when git
    fails."""
    return read_git(
        git_dir,
        [
            "diff-tree",
            "-r",
            "-z",
            "-M",
            "--no-abbrev",
            "--no-ext-diff",
            "--no-textconv",
            f"{base}^{{tree}}",
            f"{result}^{{tree}}",
        ],  # fmt: skip
        f"the diff from {base[:12]} to {result[:12]}",
        limit=limit,
        raw=True,
        env=env,
    )


def read_git(
    git_dir: Path,
    args: list[str],
    what: str,
    *,
    limit: int | None = MAX_DIFF_PATHS,
    raw: bool = False,
    hint: str = IN_PARTS,
    env: dict[str, str] | None = None,
) -> bytes:
    """The output of `git args` (-z output: NUL-ended fields), read from a pipe as git writes
    it. Raises DiffTooLarge (saying what it is, and hint) as soon as it takes more than
    MAX_DIFF_BYTES or names more than limit paths (None: no bound but the bytes), and git is
    ended then; GitError when git fails. raw: `--raw` records (a header field, then one path,
    or two for a rename or copy); else each field is one path."""
    argv = ["git", *SAFE_CONFIG, f"--git-dir={os.fspath(git_dir)}", *args]
    errors = os.memfd_create("gatekeeper-git-errors", os.MFD_CLOEXEC)
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
            env=clean_env(env),
        )  # fmt: skip
        assert proc.stdout is not None
        whole = False
        try:
            _limit_memory(proc.pid)
            chunks = _read_bounded(proc.stdout.fileno(), what, limit, raw, hint)
            whole = True
        finally:
            proc.stdout.close()
            if not whole:  # stopped early: git is not needed any more
                proc.kill()
            code = proc.wait()
        if code != 0:
            os.lseek(errors, 0, os.SEEK_SET)
            said = os.read(errors, 1 << 16)
            if any(words in said for words in _OUT_OF_MEMORY):
                raise DiffTooLarge(what, MAX_GIT_MEMORY, in_memory=True, hint=hint)
            message = said.decode("utf-8", "replace").strip()
            raise GitError(
                f"command failed: git {' '.join(args)}\nreturn code: {code}\n"
                f"stderr: {message or '(none)'}"
            )
    finally:
        os.close(errors)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _limit_memory(pid: int) -> None:
    """Bound git's heap (MAX_GIT_MEMORY), set as it starts: each allocation past the bound
    fails from then on, however much it took before (a few milliseconds of start-up)."""
    with contextlib.suppress(OSError, ValueError):  # (ended already: nothing to bound)
        resource.prlimit(pid, resource.RLIMIT_DATA, (MAX_GIT_MEMORY, MAX_GIT_MEMORY))


def _read_bounded(fd: int, what: str, limit: int | None, raw: bool, hint: str) -> list[bytes]:
    """What fd gives until its end, in pieces; raises DiffTooLarge past the bounds."""
    with contextlib.suppress(OSError):  # fewer, larger reads (each waits for the GIL)
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _CHUNK)
    chunks: list[bytes] = []
    fields = taken = 0
    counted: _PathCount | None = None
    while chunk := os.read(fd, _CHUNK):
        chunks.append(chunk)
        taken += len(chunk)
        if taken > MAX_DIFF_BYTES:
            raise DiffTooLarge(what, MAX_DIFF_BYTES, in_bytes=True, hint=hint)
        if limit is None:
            continue
        if counted is None:
            # A raw record is a header and one or two paths: at most 2/3 of its fields are
            # paths, so the paths are counted one by one only once there could be too many.
            fields += chunk.count(b"\0")
            if (2 * fields <= 3 * limit) if raw else (fields <= limit):
                continue
            if not raw:
                raise DiffTooLarge(what, limit, hint=hint)
            counted = _PathCount()
            counted.feed(b"".join(chunks))
        else:
            counted.feed(chunk)
        if counted.paths > limit:
            raise DiffTooLarge(what, limit, hint=hint)
    return chunks
