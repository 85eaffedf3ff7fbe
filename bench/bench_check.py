"""Benchmark `gatekeeper check` on a large change. Prints the ratio against a baseline measured
in the same run.

    python bench/bench_check.py [--files 10000] [--rounds 9]

An agent run (under `gatekeeper run`) changes every one of FILES files of a repository; then
`gatekeeper check` judges the agent branch against main, against the baseline of
`gatekeeper --help` (the interpreter and the command line) plus `git diff --raw -M` on the
same range, run in turn, medians of ROUNDS rounds. Target: at most twice the baseline.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchlib import gatekeeper, git, interleaved, run, scratch_repo, verdict

CHANGE = 'for f in d*/*.txt; do echo changed >> "$f"; done'


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with scratch_repo("gk-bench-check-", args.files) as scratch:
        env, repo = scratch.env, scratch.repo
        out = json.loads(run(gatekeeper("run", "--repo", str(repo), "--json", "--", "sh", "-c",
                                        CHANGE), env=env))  # fmt: skip
        branch = out["branch"]
        base = git("rev-parse", "refs/heads/main", cwd=repo, env=env).strip()
        head = git("rev-parse", f"refs/heads/{branch}", cwd=repo, env=env).strip()
        changed = git("diff", "--raw", "-M", base, head, cwd=repo, env=env).count("\n")
        if changed < args.files:
            raise SystemExit(f"the agent changed {changed} files, expected {args.files}")
        check = gatekeeper("check", "--repo", str(repo), "--base", "main", "--format", "json",
                           branch)  # fmt: skip
        result = json.loads(run(check, env=env))
        if result["verdict"] != "pass":
            raise SystemExit(f"check did not pass: {result['findings'][:3]}")
        medians = interleaved(
            {
                "help": lambda: run(gatekeeper("--help"), env=env),
                "diff": lambda: git("diff", "--raw", "-M", base, head, cwd=repo, env=env),
                "check": lambda: run(check, env=env),
            },
            args.rounds,
        )
        baseline = medians["help"] + medians["diff"]
        print(f"bench_check: `gatekeeper check` on a change of {changed} files, "
              f"median of {args.rounds} interleaved rounds")  # fmt: skip
        print(f"  gatekeeper --help        {medians['help']:7.3f} s")
        print(f"  git diff --raw -M        {medians['diff']:7.3f} s")
        print(f"  gatekeeper check         {medians['check']:7.3f} s")
        ok = verdict("check / (help + diff)", medians["check"] / baseline, 2.0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
