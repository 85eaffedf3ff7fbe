"""What a plain `run` reads of git before the launcher loads: the repository, the base commit
and the policy committed there, read on a thread of its own while the interpreter loads the
rest (git runs in processes of its own; loading keeps the interpreter busy meanwhile).

Only the standard library and the git helpers: `python -m gatekeeper run` starts these reads
before it loads the launcher. prepare() takes them, and each error is raised there, in the
order the reads would have met it.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.git import RepoPaths, discover, read_blob_at, rev_parse
from gatekeeper.policy import POLICY_PATH


@dataclass(frozen=True)
class Located:
    """The repository, the base commit, and the policy file's bytes at it (None: there is
    none; not read when the run was given a policy file)."""

    paths: RepoPaths
    base_commit: str
    policy: bytes | None


def locate(repo: Path, base: str, read_policy: bool) -> Located:
    """Find the repository, resolve base in it, and read its committed policy (read_policy);
    raise GitError."""
    paths = discover(repo)
    base_commit = rev_parse(paths.git_dir, base)
    policy = read_blob_at(paths.git_dir, base_commit, POLICY_PATH) if read_policy else None
    return Located(paths, base_commit, policy)


_started: dict[tuple[Path, str, Path | None], Future[Located]] = {}


def start(repo: Path, base: str, policy_file: Path | None) -> None:
    """Start reading for a run of repo at base (with policy_file, or the committed policy)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gatekeeper-early")
    try:
        _started[(repo, base, policy_file)] = pool.submit(locate, repo, base, policy_file is None)
    except RuntimeError:  # no thread to spare: prepare() reads them itself
        pass
    pool.shutdown(wait=False)


def take(repo: Path, base: str, policy_file: Path | None) -> Future[Located] | None:
    """The reads started for a run of these arguments, or None."""
    return _started.pop((repo, base, policy_file), None)


def start_plain(kwargs: Mapping[str, object]) -> None:
    """start() for a plain run's keyword arguments (commands.plain.run_arguments)."""
    repo, base, policy_file = kwargs["repo"], kwargs["base"], kwargs["policy_file"]
    if (isinstance(repo, Path) and isinstance(base, str)
            and (policy_file is None or isinstance(policy_file, Path))):  # fmt: skip
        start(repo, base, policy_file)
