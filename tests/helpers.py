"""Helpers for run tests: snapshots of a checkout and process listings."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from conftest import git, gk

if TYPE_CHECKING:
    from gatekeeper.policy.model import Policy
    from gatekeeper.run.worktree import Worktree
    from gatekeeper.sandbox.mounts import MountPlan


@contextlib.contextmanager
def small_tmpfs(where: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs mounted at where (root only: it is a mount), unmounted afterwards."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0755", "tmpfs", str(where)],
                   check=True)  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def snapshot(root: Path) -> dict[str, str]:
    """Every file and link under root (the .git folder included) with its content digest."""
    state: dict[str, str] = {}
    for current, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(current, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                state[rel] = "link:" + os.readlink(path)
            elif path.is_file():
                st = path.stat()
                state[rel] = f"{oct(st.st_mode)}:" + hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                state[rel] = f"dir:{oct(path.stat().st_mode)}"
    return state


def user_visible_state(repo: Path) -> dict[str, str]:
    """The checkout and the parts of .git a run must never change: index, HEAD, config, hooks,
    and every ref except the agent branches and the receipts."""
    state = {k: v for k, v in snapshot(repo).items()
             if not k.startswith(".git/") or k in (".git/index", ".git/HEAD", ".git/config")
             or k.startswith(".git/hooks/") or k.startswith(".git/info/")}  # fmt: skip
    state.update({f"ref {line}": "" for line in _refs(repo)})
    return state


def _refs(repo: Path) -> list[str]:
    from conftest import git

    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    return [
        line for line in out.splitlines()
        if not line.startswith(("refs/heads/agent/", "refs/notes/gatekeeper"))
    ]  # fmt: skip


def run_json(
    repo: Path,
    *argv: str,
    policy: Path | None = None,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
):  # type: ignore[no-untyped-def]
    """`gatekeeper run --json` in repo; returns (process, parsed JSON or None)."""
    args = ["run", "--repo", str(repo), "--json"]
    if policy is not None:
        args += ["--policy", str(policy)]
    args += list(extra or [])
    proc = gk(*args, "--", *argv, env=env, timeout=timeout)
    data = None
    if proc.stdout.strip():
        data = json.loads(proc.stdout)
    return proc, data


def pids_with(marker: str) -> list[int]:
    """Processes whose command line starts with marker (so not the shell that started them)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if cmdline.startswith(marker.encode()) and int(entry) != os.getpid():
            found.append(int(entry))
    return found


# The start of an agent program that races the supervisor: a copy of touch named git, and a
# thread body that flips the word `status` in memory to `push` and back, so that an argv
# built on it changes between the supervisor's read and the kernel's.
ARGV_FLIPPER = """
import ctypes, os, shutil, threading, time
os.makedirs('/tmp/w', exist_ok=True); os.chdir('/tmp/w')
shutil.copy('/usr/bin/touch', '/tmp/git')
libc = ctypes.CDLL(None, use_errno=True)
word = ctypes.create_string_buffer(b'status', 8)
def flip():
    while True:
        ctypes.memmove(word, b'push\\0\\0\\0', 7); ctypes.memmove(word, b'status\\0', 7)
"""


def sandbox_plan(repo: Path, policy: Policy, scratch: Path) -> tuple[str, Worktree, MountPlan]:
    """A run's worktree of repo's HEAD and its mount plan (scratch: made here), as the runner
    makes them: (run id, worktree, plan)."""
    from gatekeeper.run.worktree import create_worktree, new_run_id
    from gatekeeper.sandbox.mounts import plan_sandbox

    head = git(repo, "rev-parse", "HEAD").strip()
    run_id = new_run_id()
    wt = create_worktree(repo / ".git", head, f"agent/{run_id}", run_id)
    scratch.mkdir()
    plan = plan_sandbox(worktree=wt.path, git_common_dir=repo / ".git", policy=policy,
                        run_id=run_id, scratch=scratch, private_dirs=[], user_checkout=repo)  # fmt: skip
    return run_id, wt, plan
