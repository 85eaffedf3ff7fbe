"""Benchmark the syscall supervisor. Prints ratios against baselines measured in the same run.

    python bench/bench_supervise.py [--execs 1000] [--repeat 1]

The realistic workload takes about two minutes a variant, so one round takes about eight.

1. N sequential `/bin/true` execs: bare, in bubblewrap without supervision, and supervised.
2. A realistic workload (this project's own tests of policies, keys, the gate and its
   reports, run with pytest in a clone of this repository, against real git repositories) in
   bubblewrap without and with supervision, and under `gatekeeper run`, against the same
   workload bare. Target: at most 1.15 times bare.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gatekeeper.policy.model import builtin_policy  # noqa: E402
from gatekeeper.run.worktree import create_worktree, new_run_id, remove_worktree  # noqa: E402
from gatekeeper.sandbox.launch import Sandbox  # noqa: E402
from gatekeeper.sandbox.limits import ProcessLimit  # noqa: E402
from gatekeeper.sandbox.mounts import bwrap_path, plan_sandbox  # noqa: E402
from gatekeeper.sandbox.supervise.setup import write_config  # noqa: E402

# The project's own tests that need no sandbox of their own (nested sandboxes are refused):
# policies, keys, the gate and its reports, against real git repositories.
WORKLOAD = ["sh", "-c", "PYTHONPATH=$PWD exec " + sys.executable + " -m pytest -q -x "
            "-p no:cacheprovider -m 'not sandbox and not slow' tests/test_policy.py "
            "tests/test_keys.py tests/test_gate.py tests/test_report.py"]  # fmt: skip


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--execs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gk-bench-"))
    env = dict(os.environ, GATEKEEPER_HOME=str(work / "home"), XDG_DATA_HOME=str(work / "data"),
               GIT_CONFIG_NOSYSTEM="1")  # fmt: skip
    # The interpreter that runs the workload must be on PATH to be visible in the sandbox.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    os.environ.update(env)
    try:
        repo = work / "repo"
        git("clone", "-q", "--no-hardlinks", str(ROOT), str(repo), cwd=work)
        subprocess.run([sys.executable, "-m", "gatekeeper", "keys", "generate"], env=env,
                       check=True, capture_output=True)  # fmt: skip
        loop = ["sh", "-c", f"i=0; while [ $i -lt {args.execs} ]; do /bin/true; i=$((i+1)); done"]

        bare = best(lambda: subprocess.run(loop, check=True), args.repeat)
        policy = builtin_policy("default")
        git_dir = repo / ".git"
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        run_id = new_run_id()
        wt = create_worktree(git_dir, head, f"bench/{run_id}", run_id)
        scratch = work / "scratch"
        scratch.mkdir()
        plan = plan_sandbox(worktree=wt.path, git_common_dir=git_dir, policy=policy.policy,
                            run_id=run_id, scratch=scratch,
                            private_dirs=[work / "home"])  # fmt: skip
        limit = ProcessLimit(run_id, 1024)
        plain = Sandbox(plan, max_file_size=1 << 30, process_limit=limit)
        config = scratch / "supervisor.json"
        write_config(config, events=scratch / "events.jsonl", policy=policy.policy,
                     worktree=wt.path, scratch=["/tmp", "/var/tmp", plan.env["HOME"]],
                     granted_commands=[], ask="never", hidden=plan.hidden,
                     bwrap=bwrap_path(), watches=plan.watches)  # fmt: skip
        supervised = Sandbox(plan, max_file_size=1 << 30, process_limit=limit,
                             supervisor_config=config)  # fmt: skip

        def in_sandbox(sandbox: Sandbox) -> None:
            outcome = sandbox.run(loop, deadline=time.monotonic() + 600)
            assert outcome.exit_code == 0, outcome

        unsupervised_t = best(lambda: in_sandbox(plain), args.repeat)
        supervised_t = best(lambda: in_sandbox(supervised), args.repeat)

        workload = WORKLOAD

        def workload_in(sandbox: Sandbox) -> None:
            outcome = sandbox.run(workload, deadline=time.monotonic() + 600,
                                  stdout=subprocess.DEVNULL)  # fmt: skip
            assert outcome.exit_code == 0, outcome

        plan.env["PYTHONDONTWRITEBYTECODE"] = "1"
        workload_plain = best(lambda: workload_in(plain), args.repeat)
        workload_supervised = best(lambda: workload_in(supervised), args.repeat)
        limit.remove()
        remove_worktree(git_dir, run_id, wt.path, f"bench/{run_id}")

        n = args.execs
        print(f"{n} sequential /bin/true execs (best of {args.repeat}):")
        print(f"  bare                     {bare:8.3f} s   ({bare / n * 1e6:7.1f} us/exec)")
        print(
            f"  bwrap, no supervision    {unsupervised_t:8.3f} s   ratio to bare "
            f"{unsupervised_t / bare:5.2f}"
        )
        print(
            f"  bwrap + supervisor       {supervised_t:8.3f} s   ratio to bare "
            f"{supervised_t / bare:5.2f}, to bwrap {supervised_t / unsupervised_t:5.2f}"
        )
        print(f"  supervision cost per exec: {(supervised_t - unsupervised_t) / n * 1e6:.1f} us")

        run_env = dict(env, PYTHONDONTWRITEBYTECODE="1")
        bare_w = best(lambda: subprocess.run(workload, cwd=repo, env=run_env, check=True,
                                             capture_output=True), args.repeat)  # fmt: skip

        def gated() -> None:
            proc = subprocess.run(
                [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--policy",
                 str(ROOT / "policies" / "default.yaml"), "--", *workload],
                env=run_env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"workload failed under gatekeeper run:\n{proc.stderr[-2000:]}")

        gated_w = best(gated, args.repeat)
        print("realistic workload: this project's tests of policies, keys, the gate and reports")
        print(f"  bare                     {bare_w:8.3f} s")
        print(
            f"  bwrap, no supervision    {workload_plain:8.3f} s   ratio "
            f"{workload_plain / bare_w:5.2f}"
        )
        print(
            f"  bwrap + supervisor       {workload_supervised:8.3f} s   ratio "
            f"{workload_supervised / bare_w:5.2f}"
        )
        print(
            f"  gatekeeper run           {gated_w:8.3f} s   ratio {gated_w / bare_w:5.2f} "
            f"(target <= 1.15; includes worktree, proxy, commit and signing)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
