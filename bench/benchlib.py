"""What the benchmarks share: interleaved rounds, medians, a verdict line, scratch repositories.

Timings on a shared machine are noisy, so every benchmark runs its baseline and its measured
variant in alternation, many times, and compares medians. Nothing here depends on where the
clone lives: the launcher is run as `python -m gatekeeper` with this clone first on
PYTHONPATH, and scratch folders are made with tempfile.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# This interpreter by a path without `..` (`../.venv/bin/python` from bench/ is
# /clone/bench/../.venv/...): inside a sandbox, which shows the interpreter's installation but
# not every folder around it, such a path does not resolve.
PYTHON = os.path.abspath(sys.executable)


def launcher_env(work: Path) -> dict[str, str]:
    """An environment for `python -m gatekeeper` with its key, state and worktrees in work."""
    env = dict(os.environ)
    env.update(
        GATEKEEPER_HOME=str(work / "home"),
        XDG_DATA_HOME=str(work / "data"),
        GIT_CONFIG_NOSYSTEM="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
    )
    # Compiled bytecode is kept, as an installed package has it (pip compiles on install).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # The interpreter must be on PATH to be shown inside the sandbox (its installation only).
    env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


def remove_work(work: Path) -> None:
    """Remove a benchmark's scratch folder, detaching first the runs' layered worktrees in it
    (as root a run's worktree is an overlay mount, which stays until `discard`)."""
    from gatekeeper.run.layers import overlay_points

    for point in reversed(overlay_points()):
        if point.startswith(f"{work}/"):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    shutil.rmtree(work, ignore_errors=True)


def gatekeeper(*args: str) -> list[str]:
    """The command line of this clone's launcher."""
    return [PYTHON, "-m", "gatekeeper", *args]


def run(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """argv's stdout; raises SystemExit with its stderr when it fails."""
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds of each variant over rounds, the variants run in turn in each round
    (so that load from elsewhere hits them alike)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(timed(fn))
    return {name: statistics.median(values) for name, values in times.items()}


def verdict(label: str, figure: float, target: float, *, higher_is_better: bool = False,
            unit: str = "x") -> bool:  # fmt: skip
    ok = figure >= target if higher_is_better else figure <= target
    sign = ">=" if higher_is_better else "<="
    print(f"  {label}: {figure:.2f}{unit} (target {sign} {target:g}{unit})  "
          f"{'PASS' if ok else 'MISS'}")  # fmt: skip
    return ok


def interpreter_binds(hidden: tuple[str, ...] = ("/tmp", "/run")) -> list[str]:
    """bwrap arguments that show this interpreter's installation and this clone read-only
    again where a fresh tmpfs (on /tmp, /run) would hide them: a clone, or its virtual
    environment, may live anywhere."""
    places = {ROOT, Path(sys.prefix), Path(sys.base_prefix),
              Path(os.path.realpath(sys.executable)).parent.parent}  # fmt: skip
    args: list[str] = []
    for place in sorted({Path(os.path.realpath(p)) for p in places}):
        if any(place == Path(h) or Path(h) in place.parents for h in hidden):
            args += ["--ro-bind", str(place), str(place)]
    return args


def git(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    return run(["git", *args], cwd=cwd, env=env)


def make_repo(path: Path, files: int, env: dict[str, str]) -> None:
    """A repository of `files` small files in folders of 100, with gatekeeper initialised
    (the default policy: the agent may write everywhere but the protected paths), committed."""
    path.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(path), cwd=path.parent, env=env)
    for i in range(files):
        folder = path / f"d{i // 100:03d}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{i % 100:02d}.txt").write_text(f"file {i}\n")
    run(gatekeeper("init", "--repo", str(path), "--no-hooks"), env=env, cwd=path)
    git("add", "-A", cwd=path, env=env)
    git("-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "init",
        cwd=path, env=env)  # fmt: skip


@dataclass(frozen=True)
class Scratch:
    """A benchmark's scratch folder: the launcher's environment and a repository in it."""

    work: Path
    env: dict[str, str]
    repo: Path


@contextlib.contextmanager
def scratch_repo(prefix: str, files: int) -> Iterator[Scratch]:
    """A scratch folder with a signing key and a repository of `files` files (make_repo),
    removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        env = launcher_env(work)
        run(gatekeeper("keys", "generate"), env=env)
        repo = work / "repo"
        make_repo(repo, files, env)
        yield Scratch(work, env, repo)
    finally:
        remove_work(work)
