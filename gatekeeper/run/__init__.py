"""Run: one agent run, from worktree to signed receipt.

`runner` drives the steps (prepare, sandbox, checks, commit, sign, clean up); `worktree`
creates and commits the run's worktree and branch; `agentgit` is the private git directory
the agent sees; `grants` parses what the person approves for one run.

May import `sandbox`, `receipt`, `policy` and the helpers; never `gate`, `report` or the CLI.
"""
