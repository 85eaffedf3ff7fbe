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
import contextvars
import fcntl
import os
import resource
import signal
import subprocess
import threading
from collections.abc import Iterator
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

# Processor time git may take for one listing, and all of one judgement's listings together
# (RLIMIT_CPU, set as each starts: past it, git is ended). Finding renames compares every
# deleted file with every added one: a push of a megabyte (thousands of near-alike files a
# merge renames on one side and edits on the other) took git's merge of the parents minutes,
# and a hook judging a branch of such merges, without end. A real merge or diff of 100,000
# files takes git a few seconds.
MAX_GIT_SECONDS = 30
MAX_GIT_SECONDS_IN_ALL = 60
LISTINGS = "the listings git made for this judgement"


class GitTime:
    """The processor time the git listings of one judgement (or of all a hook's judgements of
    one push) took so far: each may take what is left of MAX_GIT_SECONDS_IN_ALL, up to
    MAX_GIT_SECONDS."""

    def __init__(self, what: str = LISTINGS, limit: float | None = None) -> None:
        self.what = what
        self.limit = MAX_GIT_SECONDS_IN_ALL if limit is None else limit
        self.spent = 0.0
        self.lock = threading.Lock()
        # When the verifiers of signatures must be done, on the clock, for the same judgement
        # or push (set by the first that runs: gate.people).
        self.verify_deadline: float | None = None

    def left(self) -> float:
        with self.lock:
            return self.limit - self.spent

    def add(self, seconds: float) -> None:
        with self.lock:
            self.spent += seconds


# The judgement under way in this context (threads the judgement starts copy it: gate.later).
GIT_TIME: contextvars.ContextVar[GitTime | None] = contextvars.ContextVar(
    "gatekeeper_git_time", default=None
)


@contextlib.contextmanager
def git_time(what: str = LISTINGS) -> Iterator[GitTime]:
    """The bound on git's processor time for the listings made within (a judgement's; a
    hook's, for all the judgements of one push, which then share it)."""
    budget = GIT_TIME.get()
    if budget is not None:  # (within a wider one: that one bounds this)
        yield budget
        return
    budget = GitTime(what)
    token = GIT_TIME.set(budget)
    try:
        yield budget
    finally:
        GIT_TIME.reset(token)


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
        in_time: bool = False,
        in_all: bool = False,
        hint: str = IN_PARTS,
    ) -> None:
        verb = "name" if what.startswith("the diffs ") else "names"
        if in_time:
            spent = f"more than {limit:,} s of processor time"
            size = f"take git {spent} in all" if in_all else f"takes git {spent} to work out"
        elif in_memory:
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
        self.in_memory, self.in_time, self.in_all = in_memory, in_time, in_all
        self.advice = hint  # (in the message: no separate hint)

    def naming(self, what: str, commit: str | None) -> DiffTooLarge:
        """The same, saying which diff it is (a bound on all listings together names them)."""
        return DiffTooLarge(self.what if self.in_all else what, self.limit, commit,
                            in_bytes=self.in_bytes, in_memory=self.in_memory,
                            in_time=self.in_time, in_all=self.in_all,
                            hint=self.advice)  # fmt: skip


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
    budget = GIT_TIME.get()
    seconds = MAX_GIT_SECONDS if budget is None else min(MAX_GIT_SECONDS, budget.left())
    if budget is not None and seconds < 1:  # (RLIMIT_CPU counts whole seconds)
        raise DiffTooLarge(budget.what, int(budget.limit), in_time=True, in_all=True, hint=hint)
    errors = os.memfd_create("gatekeeper-git-errors", os.MFD_CLOEXEC)
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
            env=clean_env(env),
        )  # fmt: skip
        assert proc.stdout is not None
        whole = False
        try:
            _limit(proc.pid, int(seconds))
            chunks = _read_bounded(proc.stdout.fileno(), what, limit, raw, hint)
            whole = True
        finally:
            proc.stdout.close()
            if not whole:  # stopped early: git is not needed any more
                proc.kill()
            code, used = _wait(proc)
            if budget is not None:
                budget.add(used)
        if code in (-signal.SIGXCPU, -signal.SIGKILL) and used >= int(seconds) - 0.5:
            if budget is not None and int(seconds) < MAX_GIT_SECONDS:
                raise DiffTooLarge(budget.what, int(budget.limit), in_time=True, in_all=True,
                                   hint=hint)  # fmt: skip
            raise DiffTooLarge(what, MAX_GIT_SECONDS, in_time=True, hint=hint)
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


def _limit(pid: int, seconds: int) -> None:
    """Bound git's heap (MAX_GIT_MEMORY) and its processor time (seconds; then SIGXCPU, a
    second later SIGKILL, and no core file), set as it starts: each allocation past the bound
    fails from then on, however much it took before (a few milliseconds of start-up)."""
    with contextlib.suppress(OSError, ValueError):  # (ended already: nothing to bound)
        resource.prlimit(pid, resource.RLIMIT_DATA, (MAX_GIT_MEMORY, MAX_GIT_MEMORY))
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
        resource.prlimit(pid, resource.RLIMIT_CPU, (seconds, seconds + 1))


def _wait(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """(git's exit status as Popen gives it, the processor time it took)."""
    while True:
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:  # (reaped already)
            return proc.wait(), 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


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
