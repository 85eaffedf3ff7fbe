"""Run records: what the launcher knows of each run of a repository, and whether it is alive.

Each run has `<git common dir>/gatekeeper/runs/<run id>.json`, written atomically by the
launcher (never inside the sandbox), and `<run id>.lock`, which the launcher holds with flock
for as long as it lives. The kernel drops the lock when the launcher dies, even by kill -9, so
"is this run live?" never depends on a pid that may have been reused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RUN_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6,16}$")
MAX_RECORD = 1 << 20  # bytes; a record is a few hundred


@dataclass
class RunRecord:
    run_id: str
    branch: str
    base: str
    worktree: str
    started_at: float
    state: str = "running"  # running | finished | failed | killed | discarded
    pid: int = 0
    finished_at: float | None = None
    commit: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    resumed_from: str | None = None  # `run --resume`: the branch was that run's before this one


def records_dir(git_dir: Path) -> Path:
    return git_dir / "gatekeeper" / "runs"


def is_run_id(text: str) -> bool:
    return bool(RUN_ID.match(text))


# Records are padded to this size, so that when the disk is full the launcher can still say
# how the run ended by writing over the record in place (no new blocks needed).
RECORD_ROOM = 4096


def _write(directory: Path, record: RunRecord) -> None:
    """Write record atomically (a temporary file renamed over it); on a full disk, over the
    existing record in place. Raises OSError when neither works."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = (json.dumps(asdict(record), sort_keys=True, indent=1) + "\n").encode()
    text = text.ljust(RECORD_ROOM - 1) + b"\n" if len(text) < RECORD_ROOM else text
    final = directory / f"{record.run_id}.json"
    tmp = directory / f".{record.run_id}.{os.getpid()}.tmp"
    try:
        tmp.write_bytes(text)
        os.replace(tmp, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()  # never a half-written file left behind
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not _overwrite(final, text):
            raise


def _overwrite(path: Path, text: bytes) -> bool:
    """Write text over path's existing bytes when it fits in them; False when it does not."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        if len(text) > size:
            return False
        os.pwrite(fd, text[:-1].ljust(size - 1) + b"\n", 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class LiveRun:
    """The launcher's hold on one run: its record and the lock that says it is alive."""

    def __init__(self, git_dir: Path, record: RunRecord) -> None:
        self.directory = records_dir(git_dir)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.record = record
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        self._lock = os.open(self.directory / f"{record.run_id}.lock", flags, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        record.pid = os.getpid()
        _write(self.directory, record)

    def update(self, **fields: object) -> None:
        for name, value in fields.items():
            setattr(self.record, name, value)
        _write(self.directory, self.record)

    def finish(self, *, state: str, commit: str | None = None, exit_code: int | None = None,
               reason: str | None = None) -> None:  # fmt: skip
        """Record how the run ended (the lock is kept until `release`)."""
        self.record.state = state
        self.record.finished_at = time.time()
        self.record.commit = commit
        self.record.exit_code = exit_code
        self.record.reason = reason
        _write(self.directory, self.record)

    def forget(self) -> None:
        """The run never started: nothing of it is kept, its record neither."""
        with contextlib.suppress(OSError):
            (self.directory / f"{self.record.run_id}.json").unlink()
        self.release()

    def release(self) -> None:
        if self._lock >= 0:
            with contextlib.suppress(OSError):
                (self.directory / f"{self.record.run_id}.lock").unlink()
            os.close(self._lock)
            self._lock = -1


def is_live(git_dir: Path, run_id: str) -> bool:
    """True while the launcher of run_id holds its lock."""
    path = records_dir(git_dir) / f"{run_id}.lock"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


KILLED_REASON = "the launcher ended before the run finished (killed, or it crashed)"


def settle(git_dir: Path, record: RunRecord) -> RunRecord:
    """A record left `running` by a launcher that is gone (kill -9, a crash, a power cut) is
    marked `killed` with the reason, in the record itself, and its lock file removed.

    The lock is taken first: while the launcher lives it holds it, so a live run is never
    touched. Returns the record as it is now.
    """
    if record.state != "running":
        return record
    path = records_dir(git_dir) / f"{record.run_id}.lock"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = -1
    except OSError:
        return record
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return record  # live
        current = read_record(git_dir, record.run_id) or record
        if current.state != "running":
            return current  # it finished in between
        current.state, current.reason = "killed", current.reason or KILLED_REASON
        with contextlib.suppress(OSError):
            _write(records_dir(git_dir), current)
        if fd >= 0:
            with contextlib.suppress(OSError):
                path.unlink()
        return current
    finally:
        if fd >= 0:
            os.close(fd)


def read_record(git_dir: Path, run_id: str) -> RunRecord | None:
    """The record of run_id, or None when there is none or it cannot be parsed."""
    if not is_run_id(run_id):
        return None
    path = records_dir(git_dir) / f"{run_id}.json"
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_RECORD))
        known = {k: v for k, v in data.items() if k in RunRecord.__dataclass_fields__}
        return RunRecord(**known)
    except (OSError, ValueError, TypeError):
        return None


def all_records(git_dir: Path) -> list[RunRecord]:
    directory = records_dir(git_dir)
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("*.json")):
        record = read_record(git_dir, path.stem)
        if record is not None:
            found.append(record)
    return found


def save_state(git_dir: Path, record: RunRecord, state: str, reason: str | None = None) -> None:
    """Mark a run that is not live (discarded, killed) in its record."""
    record.state = state
    if reason:
        record.reason = reason
    _write(records_dir(git_dir), record)
