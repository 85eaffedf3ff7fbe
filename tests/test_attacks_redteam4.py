"""Attacks on the launcher's shortcuts: what a run's commit and receipt say it changed.

Every test runs the real `gatekeeper run` (real bubblewrap, a real repository) and fails when
the hole it names is open.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

# Rewrites a tracked file in place with content of the same size and puts its times back: only
# the change time (which no process can set) still tells it changed.
SAME_SIZE_REWRITE = (
    "import os\n"
    "path = 'a/one.txt'\n"
    "before = os.stat(path)\n"
    "with open(path, 'r+') as f:\n"
    "    f.write('2\\n')\n"
    "os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))\n"
)


@pytest.mark.parametrize("overlay", ["1", "0"])
@pytest.mark.parametrize("setting", [("core.trustctime", "false"), ("core.checkStat", "minimal")])
def test_a_same_size_rewrite_with_its_times_put_back_is_committed_whatever_the_stat_settings(
    tmp_path: Path, key: Path, overlay: str, setting: tuple[str, str]
) -> None:
    # A person's repository may tell git to trust less of a file's stat data (ctime is
    # unreliable on some file systems). The launcher compares the agent's files with the index
    # by stat data, so with those settings a rewrite that keeps size and mtime looked
    # unchanged: left out of the commit and the receipt without a word.
    if overlay == "1" and os.geteuid() != 0:
        pytest.skip("only root mounts overlays")
    repo = make_repo(tmp_path / "repo", files={"a/one.txt": "1\n", "b.txt": "b\n"})
    git(repo, "config", *setting)
    env = {"GATEKEEPER_OVERLAY": overlay}
    # Twice: a layered run's first one makes the base checkout, the second reuses it.
    for _ in range(2):
        proc, data = run_json(repo, "python3", "-c", SAME_SIZE_REWRITE, env=env)
        assert proc.returncode == 0 and data is not None, proc.stderr
        changed = git(repo, "diff", "--name-only", f"{data['commit']}~1", data["commit"])
        assert changed.split() == ["a/one.txt"], proc.stderr
        assert git(repo, "show", f"{data['commit']}:a/one.txt") == "2\n"


def _predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


@pytest.mark.skipif(
    os.path.realpath("/bin/sh") == "/bin/sh" or not os.path.exists("/bin/sh"),
    reason="needs /bin/sh to be a link to the shell it runs",
)
@pytest.mark.parametrize(
    "call",
    [
        # The rule's own program, by its path, with another argv[0].
        "os.execv('/bin/sh', ['x', '-c', 'echo ran > ran.txt'])",
        # A link of the agent's own to it.
        "os.symlink('/bin/sh', '/tmp/y'); os.execv('/tmp/y', ['y', '-c', 'echo ran > ran.txt'])",
    ],
)
def test_a_denied_program_that_is_a_link_is_refused_whatever_argv0_says(
    tmp_path: Path, key: Path, call: str
) -> None:
    # `sh` is a link (to dash, on Debian): the program file the kernel runs has another name,
    # and argv[0] is whatever the caller writes. A rule names the program, not a spelling.
    repo = make_repo(tmp_path / "repo", files={"a.txt": "a\n"},
                     policy="paths: {read: ['**'], write: ['**']}\n"
                     "commands: {deny: ['sh -c'], default: allow}\n")  # fmt: skip
    program = f"import os\ntry:\n    {call}\nexcept PermissionError:\n    print('refused')\n"
    proc, data = run_json(repo, "python3", "-c", program)
    assert proc.returncode == 0 and data is not None, proc.stderr
    assert not (Path(data["worktree"]) / "ran.txt").exists()
    pred = _predicate(repo, data["commit"])
    denied = [p for p in pred["processes"] if p["decision"] == "deny"]
    assert any(p["argv"][1:2] == ["-c"] for p in denied), pred["processes"]


def test_a_rule_that_names_a_link_covers_its_program_file_also_with_unreadable_arguments() -> None:
    # The sibling cases of the exec above, decided without a sandbox: arguments the supervisor
    # could not read, a grant of exactly the command line as named, an allow rule.
    from gatekeeper.sandbox.supervise.rules import ALLOW, DENY, CommandRules
    from gatekeeper.sandbox.supervise.setup import grant_programs, rule_programs

    dash = os.path.realpath("/bin/sh")
    if dash == "/bin/sh":
        pytest.skip("needs /bin/sh to be a link to the shell it runs")
    config = {"deny": ["sh -c"], "granted": ["sh -c 'echo ok'"], "allow": ["x"],
              "default": "allow", "programs": rule_programs(["sh -c"])[0],
              "grant_programs": grant_programs(["sh -c 'echo ok'"])}  # fmt: skip
    rules = CommandRules.from_config(config)
    assert rules.decide(None, dash) == (DENY, "sh -c")
    assert rules.decide(["x", "-c", "id"], dash) == (DENY, "sh -c")
    assert rules.decide([dash, "-c", "id"], dash) == (DENY, "sh -c")
    assert rules.decide(["sh", "-c", "echo ok"], dash) == (ALLOW, "sh -c 'echo ok'")
    assert rules.decide(["x", "-s"], dash) == (ALLOW, "x")
