"""The built-in demo: a small repository, an agent run in the sandbox, its receipt, the gate."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from gatekeeper.run import layers

MARKER = ".gatekeeper-demo"

FILES = {
    "README.md": "# calc\n\nA tiny calculator.\n",
    "src/calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/test_calc.py": textwrap.dedent("""\
        import sys
        import unittest

        sys.path.insert(0, "src")
        from calc import add, mul


        class CalcTest(unittest.TestCase):
            def test_add(self):
                self.assertEqual(add(2, 3), 5)

            def test_mul(self):
                self.assertEqual(mul(2, 3), 6)


        if __name__ == "__main__":
            unittest.main()
        """),
    ".gitignore": ".env\n__pycache__/\n",
}

# What the demo agent does: fix the bug, add a note, then try things the policy does not allow.
AGENT = textwrap.dedent("""\
    import os, pathlib, socket, subprocess
    p = pathlib.Path("src/calc.py")
    p.write_text(p.read_text().replace("return a - b", "return a + b"))
    pathlib.Path("docs").mkdir(exist_ok=True)
    pathlib.Path("docs/CHANGES.md").write_text("- add() adds again\\n")
    print("agent: fixed src/calc.py and wrote docs/CHANGES.md")
    def attempt(what, fn):
        try:
            fn()
            print(f"agent: {what}: SUCCEEDED")
        except OSError as exc:
            print(f"agent: {what}: refused ({exc.strerror})")
    def steal(what, path):
        try:
            print(f"agent: {what}: got {len(open(path).read())} bytes")
        except OSError as exc:
            print(f"agent: {what}: refused ({exc.strerror})")
    steal("read the checkout's .env", "{checkout}/.env")
    steal("read ~/.ssh/id_ed25519", os.path.expanduser("~/.ssh/id_ed25519"))
    attempt("write the user's checkout", lambda: open("{checkout}/README.md", "a").write("x"))
    attempt("install a git hook", lambda: open("{git}/hooks/pre-commit", "w").write("x"))
    attempt("loosen the policy", lambda: open(".gatekeeper/policy.yaml", "a").write("x"))
    attempt("open a network connection", lambda: socket.create_connection(("127.0.0.1", 80), 1))
    print("agent: SECRET_TOKEN is", repr(os.environ.get("SECRET_TOKEN")))
    """)


def _step(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


def _sh(argv: list[str], env: dict[str, str], cwd: Path, check: bool = True) -> int:
    shown = ["gatekeeper", *argv[3:]] if argv[:3] == [sys.executable, "-m", "gatekeeper"] else argv
    print(f"$ {shlex.join(shown)}", flush=True)
    proc = subprocess.run(argv, env=env, cwd=cwd, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"demo: the step above failed with exit {proc.returncode}")
    return proc.returncode


def run_demo(out: Path) -> int:
    """Build the demo under out (replacing an earlier demo there) and walk through it."""
    out = out.resolve()
    if out.exists():
        if not (out / MARKER).exists():
            print(
                f"demo: {out} exists and is not a demo folder; pick another --out", file=sys.stderr
            )
            return 2
        layers.unmount_below(out)  # an earlier demo's layered worktrees
        shutil.rmtree(out)
    home = out / "home"
    repo = out / "repo"
    (home / "config").mkdir(parents=True)
    out.joinpath(MARKER).write_text("")
    gitconfig = home / "gitconfig"
    gitconfig.write_text("[user]\n\tname = Demo User\n\temail = demo@example.invalid\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GATEKEEPER_HOME=str(home / "config"), GATEKEEPER_WORKTREES=str(home / "worktrees"),
        GIT_CONFIG_GLOBAL=str(gitconfig), GIT_CONFIG_NOSYSTEM="1",
        SECRET_TOKEN="demo-secret-do-not-leak",
    )  # fmt: skip
    gk = [sys.executable, "-m", "gatekeeper"]

    _step("A repository with a bug, and a secret the agent must not see")
    for name, text in FILES.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (repo / ".env").write_text("DATABASE_PASSWORD=hunter2\n")
    _sh(["git", "init", "-q", "-b", "main", str(repo)], env, out)
    _sh([*gk, "keys", "generate"], env, repo)
    _sh([*gk, "init", "--no-hooks"], env, repo)
    _sh(["git", "add", "-A"], env, repo)
    _sh(["git", "commit", "-q", "-m", "calc with a bug"], env, repo)

    _step("An agent run in the sandbox (its own worktree and branch)")
    script = AGENT.replace("{checkout}", str(repo)).replace("{git}", str(repo / ".git"))
    rc = _sh([*gk, "run", "--branch", "agent/demo", "--check", "python3 tests/test_calc.py",
              "--", "python3", "-c", script], env, repo)  # fmt: skip

    _step("Its signed receipt")
    _sh([*gk, "receipt", "show", "agent/demo"], env, repo)

    _step("The gate: the agent branch against main")
    reports = out / "reports"
    reports.mkdir()
    _sh([*gk, "check", "--base", "main", "agent/demo"], env, repo, check=False)
    for fmt in ("md", "html", "json", "sarif"):
        _sh([*gk, "check", "--base", "main", "--format", fmt, "-o",
             str(reports / f"pass.{fmt}"), "agent/demo"], env, repo, check=False)  # fmt: skip

    _step("A human edit after the run is not covered by any receipt: the gate blocks it")
    _sh(["git", "branch", "-q", "agent/edited", "agent/demo"], env, repo)
    _sh(["git", "worktree", "add", "-q", str(out / "edit"), "agent/edited"], env, repo)
    (out / "edit" / "src" / "calc.py").write_text("def add(a, b):\n    return 42\n")
    _sh(["git", "commit", "-q", "-am", "sneaky edit"], env, out / "edit")
    _sh([*gk, "check", "--base", "main", "agent/edited"], env, repo, check=False)
    for fmt in ("md", "html"):
        _sh([*gk, "check", "--base", "main", "--format", fmt, "-o",
             str(reports / f"block.{fmt}"), "agent/edited"], env, repo, check=False)  # fmt: skip

    # The run's worktree is not part of what the demo leaves (as root it is a mount); its
    # branch and receipt are.
    subprocess.run([*gk, "discard"], env=env, cwd=repo, capture_output=True, check=False)
    _step("Done")
    print(f"agent exit code: {rc}")
    print(f"repository:      {repo}")
    print(f"reports:         {reports} (open pass.html and block.html in a browser)")
    return 0
