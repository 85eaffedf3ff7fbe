"""A diff read with a bound: `git diff-tree -r -z -M` between two trees, stopped (and git
ended) once it names more than MAX_DIFF_PATHS paths, so a small push of one commit that adds
hundreds of thousands of files (a megabyte of pack: one blob, many tree entries) cannot make
the gate hold them all; the judgement then blocks with a `change-too-large` finding."""

from __future__ import annotations

import contextlib
import fcntl
import os
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

_CHUNK = 1 << 20  # bytes read at once (and the pipe's size, where the system allows it)


class DiffTooLarge(Error):
    """A diff names more paths than the gate reads; nothing past the bound was read."""

    def __init__(
        self, what: str, limit: int, commit: str | None = None, *, in_bytes: bool = False
    ) -> None:
        verb = "name" if what.startswith("the diffs ") else "names"
        size = (
            f"takes more than {_size(limit)}" if in_bytes else f"{verb} more than {limit:,} paths"
        )
        super().__init__(
            f"{what} {size}: too large for the gate to judge, so it "
            "blocks, reading no further (docs/gate.md, Limits on what is read). Land the "
            f"change in parts: the diff of each push (or range checked) and of each of its "
            f"commits may name at most {MAX_DIFF_PATHS:,} paths ({_size(MAX_DIFF_BYTES)}), "
            f"and all of them together at most {MAX_DIFF_PATHS_IN_ALL:,}"
        )
        self.what, self.limit, self.commit, self.in_bytes = what, limit, commit, in_bytes

    def naming(self, what: str, commit: str | None) -> DiffTooLarge:
        """The same, saying which diff it is."""
        return DiffTooLarge(what, self.limit, commit, in_bytes=self.in_bytes)


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
    limit paths (git is ended then), GitError when git fails."""
    argv = [
        "git", *SAFE_CONFIG, f"--git-dir={os.fspath(git_dir)}",
        "diff-tree", "-r", "-z", "-M", "--no-abbrev", "--no-ext-diff", "--no-textconv",
        f"{base}^{{tree}}", f"{result}^{{tree}}",
    ]  # fmt: skip
    errors = os.memfd_create("gatekeeper-diff-errors", os.MFD_CLOEXEC)
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
            env=clean_env(env),
        )  # fmt: skip
        assert proc.stdout is not None
        whole = False
        try:
            chunks = _read_bounded(proc.stdout.fileno(), base, result, limit)
            whole = True
        finally:
            proc.stdout.close()
            if not whole:  # stopped early: git is not needed any more
                proc.kill()
            code = proc.wait()
        if code != 0:
            os.lseek(errors, 0, os.SEEK_SET)
            message = os.read(errors, 1 << 16).decode("utf-8", "replace").strip()
            raise GitError(
                f"command failed: git diff-tree {base} {result}\nreturn code: {code}\n"
                f"stderr: {message or '(none)'}"
            )
    finally:
        os.close(errors)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _read_bounded(fd: int, base: str, result: str, limit: int) -> list[bytes]:
    """What fd gives until its end, in pieces; raises DiffTooLarge past limit paths."""
    with contextlib.suppress(OSError):  # fewer, larger reads (each waits for the GIL)
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _CHUNK)
    chunks: list[bytes] = []
    fields = taken = 0
    counted: _PathCount | None = None
    while chunk := os.read(fd, _CHUNK):
        chunks.append(chunk)
        taken += len(chunk)
        if taken > MAX_DIFF_BYTES:
            raise DiffTooLarge(
                f"the diff from {base[:12]} to {result[:12]}", MAX_DIFF_BYTES, in_bytes=True
            )
        if counted is None:
            # A record is a header and one or two paths: at most 2/3 of its fields are paths,
            # so the paths are counted one by one only once there could be too many.
            fields += chunk.count(b"\0")
            if 2 * fields <= 3 * limit:
                continue
            counted = _PathCount()
            counted.feed(b"".join(chunks))
        else:
            counted.feed(chunk)
        if counted.paths > limit:
            raise DiffTooLarge(f"the diff from {base[:12]} to {result[:12]}", limit)
    return chunks
