"""Benchmark the syscall supervisor. Prints ratios against baselines measured in the same run.

    python bench/bench_supervise.py [--execs 1000] [--rounds 7] [--workload-rounds 1]
                                    [--no-workload]

The realistic workload takes about a minute a variant, so one round of it takes about four.

1. The cost of one exec: N sequential `/bin/true` execs bare, in bubblewrap without
   supervision, and supervised; in the sandbox the same loop with no exec at all is timed too
   and taken off (bubblewrap's and the supervisor's start-up are not per exec). The variants
   run in turn in each of ROUNDS rounds; medians are compared. Target: a supervised exec at
   most 1.5 times a bare one.
2. A realistic workload (this project's own tests of policies, keys, the gate and its
   reports, run with pytest in a clone of this repository, against real git repositories) in
   bubblewrap without and with supervision, and under `gatekeeper run`, against the same
   workload bare. Target: at most 1.15 times bare.

It runs from any clone: the launcher runs as `python -m gatekeeper` from this clone, and the
interpreter's folder is put on PATH, which the sandbox shows (its installation only).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import PYTHON, interleaved, launcher_env, remove_work, verdict  # noqa: E402

from gatekeeper.policy.model import builtin_policy  # noqa: E402
from gatekeeper.run.worktree import create_worktree, new_run_id, remove_worktree  # noqa: E402
from gatekeeper.sandbox.launch import Sandbox  # noqa: E402
from gatekeeper.sandbox.limits import ProcessLimit  # noqa: E402
from gatekeeper.sandbox.mounts import bwrap_path, plan_sandbox  # noqa: E402
from gatekeeper.sandbox.supervise.setup import write_config  # noqa: E402

# The project's own tests that need no sandbox of their own (nested sandboxes are refused):
# policies, keys, the gate and its reports, against real git repositories.
WORKLOAD = ["sh", "-c", "PYTHONPATH=$PWD exec " + PYTHON + " -m pytest -q -x "
            "-p no:cacheprovider -m 'not sandbox and not slow' tests/test_policy.py "
            "tests/test_keys.py tests/test_gate.py tests/test_report.py"]  # fmt: skip


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def loop(n: int) -> list[str]:
    return ["sh", "-c", f"i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--execs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workload-rounds", type=int, default=1)
    parser.add_argument("--no-workload", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gk-bench-"))
    env = launcher_env(work)
    os.environ.update(env)
    ok = True
    try:
        repo = work / "repo"
        git("clone", "-q", "--no-hardlinks", str(ROOT), str(repo), cwd=work)
        subprocess.run([PYTHON, "-m", "gatekeeper", "keys", "generate"], env=env,
                       check=True, capture_output=True)  # fmt: skip
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

        def in_sandbox(sandbox: Sandbox, argv: list[str], **kw: object) -> None:
            outcome = sandbox.run(argv, deadline=time.monotonic() + 600, **kw)  # type: ignore[arg-type]
            assert outcome.exit_code == 0, outcome

        n = args.execs
        m = interleaved(
            {
                "bare": lambda: subprocess.run(loop(n), check=True),
                "plain0": lambda: in_sandbox(plain, loop(0)),
                "plain": lambda: in_sandbox(plain, loop(n)),
                "supervised0": lambda: in_sandbox(supervised, loop(0)),
                "supervised": lambda: in_sandbox(supervised, loop(n)),
            },
            args.rounds,
        )
        bare = m["bare"] / n
        unsupervised = (m["plain"] - m["plain0"]) / n
        per_exec = (m["supervised"] - m["supervised0"]) / n
        print(f"bench_supervise: {n} sequential /bin/true execs, median of {args.rounds} "
              "interleaved rounds, per exec (sandbox start-up taken off)")  # fmt: skip
        print(f"  bare                     {bare * 1e6:7.1f} us")
        print(f"  bwrap, no supervision    {unsupervised * 1e6:7.1f} us   "
              f"ratio to bare {unsupervised / bare:5.2f}")  # fmt: skip
        print(f"  bwrap + supervisor       {per_exec * 1e6:7.1f} us   ratio to bare "
              f"{per_exec / bare:5.2f}, to bwrap {per_exec / unsupervised:5.2f}")  # fmt: skip
        print(f"  supervision cost per exec: {(per_exec - unsupervised) * 1e6:.1f} us")
        ok &= verdict("supervised exec, to bare", per_exec / bare, 1.5)

        if not args.no_workload:
            plan.env["PYTHONDONTWRITEBYTECODE"] = "1"
            quiet = {"stdout": subprocess.DEVNULL}

            def gated() -> None:
                proc = subprocess.run(
                    [PYTHON, "-m", "gatekeeper", "run", "--repo", str(repo), "--policy",
                     str(ROOT / "policies" / "default.yaml"), "--", *WORKLOAD],
                    env=env, capture_output=True, text=True, check=False,
                )  # fmt: skip
                if proc.returncode != 0:
                    raise SystemExit(
                        f"workload failed under gatekeeper run:\n{proc.stderr[-2000:]}"
                    )

            w = interleaved(
                {
                    # As in the sandbox (plan.env): no bytecode written, in every variant.
                    "bare": lambda: subprocess.run(
                        WORKLOAD,
                        cwd=repo,
                        env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
                        check=True,
                        capture_output=True,
                    ),  # fmt: skip
                    "plain": lambda: in_sandbox(plain, WORKLOAD, **quiet),
                    "supervised": lambda: in_sandbox(supervised, WORKLOAD, **quiet),
                    "gated": gated,
                },
                args.workload_rounds,
            )
            print("realistic workload: this project's tests of policies, keys, the gate and "
                  f"reports (median of {args.workload_rounds})")  # fmt: skip
            print(f"  bare                     {w['bare']:8.3f} s")
            for label, name in (("bwrap, no supervision", "plain"),
                                ("bwrap + supervisor", "supervised"),
                                ("gatekeeper run", "gated")):  # fmt: skip
                print(f"  {label:24s} {w[name]:8.3f} s   ratio {w[name] / w['bare']:5.2f}")
            ok &= verdict("gatekeeper run of the workload, to bare (with worktree, proxy, commit "
                          "and signing)", w["gated"] / w["bare"], 1.15)  # fmt: skip
        limit.remove()
        remove_worktree(git_dir, run_id, wt.path, f"bench/{run_id}")
    finally:
        remove_work(work)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
