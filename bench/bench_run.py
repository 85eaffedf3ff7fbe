"""Benchmark the fixed cost of `gatekeeper run`. Prints the cost against a baseline measured in
the same run.

    python bench/bench_run.py [--files 10000] [--rounds 9]

`gatekeeper run -- true` on a repository of FILES files (worktree, mount plan, supervisor and
proxy start-up, commit, signing) against a bare `true`, run in turn, medians of ROUNDS rounds.
Target: at most 0.5 s above bare. `gatekeeper --help` (the interpreter and the command line
alone) and a run in a plain checkout (GATEKEEPER_OVERLAY=0: what a user who may not mount
gets; as root a worktree is layered) are shown for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchlib import gatekeeper, interleaved, run, scratch_repo, verdict


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with scratch_repo("gk-bench-run-", args.files) as scratch:
        env, repo = scratch.env, scratch.repo
        gated = gatekeeper("run", "--repo", str(repo), "--json", "--", "true")
        out = json.loads(run(gated, env=env))  # warm up (and check that it works)
        if out.get("exit_code") != 0:
            raise SystemExit(f"gatekeeper run -- true did not exit 0: {out}")
        plain_env = {**env, "GATEKEEPER_OVERLAY": "0"}  # a plain checkout per run, for reference
        medians = interleaved(
            {
                "bare": lambda: subprocess.run(["true"], check=True),
                "help": lambda: run(gatekeeper("--help"), env=env),
                "run": lambda: run(gated, env=env),
                "plain": lambda: run(gated, env=plain_env),
            },
            args.rounds,
        )
        print(f"bench_run: `gatekeeper run -- true` on {args.files} files, "
              f"median of {args.rounds} interleaved rounds")  # fmt: skip
        print(f"  bare true                {medians['bare']:7.3f} s")
        print(f"  gatekeeper --help        {medians['help']:7.3f} s")
        print(f"  gatekeeper run -- true   {medians['run']:7.3f} s"
              + ("  (a layered worktree)" if os.geteuid() == 0 else ""))  # fmt: skip
        print(f"    with a plain checkout  {medians['plain']:7.3f} s  (GATEKEEPER_OVERLAY=0, as "
              "any user who may not mount)")  # fmt: skip
        ok = verdict("fixed cost above bare", medians["run"] - medians["bare"], 0.5, unit=" s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
