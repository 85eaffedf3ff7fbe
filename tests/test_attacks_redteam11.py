"""Attacks on how a rule names git, and on what the receipt says a thread's exec ran.

A rule may name a program by its full path (`/usr/bin/git push`): for git, that must hold
git to its own commands as the bare name does, or an alias or a correction runs the command
the rule refuses in git's own process. An exec from a thread other than its process's first
turns the process into the new program: the receipt must say so, with the new program's exit.

Every test runs the real `gatekeeper run` (real bubblewrap, a real repository) and fails when
the hole it names is open.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import make_repo, needs_bwrap
from helpers import run_json
from test_supervise import predicate

pytestmark = [needs_bwrap, pytest.mark.sandbox]


def test_a_rule_naming_git_by_its_path_holds_git_to_its_own_commands(
    tmp_path: Path, key: Path
) -> None:
    # `external: ["/usr/bin/git push"]` refused `git push`, while `git -c
    # help.autocorrect=immediate psh` (git corrects `psh` to `push` and runs it in its own
    # process) pushed, recorded as an allowed `git ... psh`.
    git_path = shutil.which("git")
    assert git_path is not None
    policy = f'commands: {{external: ["{git_path} push"], default: allow}}\n'
    repo = make_repo(tmp_path / "repo", policy=policy, files={"a.txt": "a\n"})
    script = """
git init -q --bare /tmp/bare
git push -q /tmp/bare HEAD:refs/heads/direct 2>/dev/null; echo "direct $?"
git -c help.autocorrect=immediate psh -q /tmp/bare HEAD:refs/heads/corrected 2>/dev/null
echo "corrected $?"
git status --short >/dev/null; echo "status $?"
echo "pushed: $(git --git-dir=/tmp/bare for-each-ref --format='%(refname)' | tr '\\n' ' ')"
"""
    proc, data = run_json(repo, "bash", "-c", script)
    assert data is not None, proc.stderr
    out = proc.stderr + proc.stdout
    assert "direct 126" in out and "corrected 126" in out and "status 0" in out, out
    assert out.split("pushed:")[1].split("\n")[0].strip() == "", out
    processes = predicate(repo, data["commit"])["processes"]
    refused = {p["argv"][3] for p in processes
               if p["argv"][:2] == ["git", "-c"] and p["decision"] == "deny"}  # fmt: skip
    assert refused == {"psh"}, processes


@pytest.mark.parametrize("named", ["on PATH", "in its exec path"])
def test_a_rule_naming_one_of_git_s_files_names_the_others(
    tmp_path: Path, key: Path, named: str
) -> None:
    # git installs itself twice (on PATH, and a copy in its exec path): a rule naming one by
    # its path refused `git push` there while the other pushed, recorded as allowed.
    import subprocess

    on_path = shutil.which("git")
    assert on_path is not None
    copy = Path(subprocess.run(["git", "--exec-path"], capture_output=True, text=True,
                               check=True).stdout.strip()) / "git"  # fmt: skip
    if not copy.is_file():
        pytest.skip("this git has no copy of itself in its exec path")
    rule, other = (on_path, str(copy)) if named == "on PATH" else (str(copy), on_path)
    policy = f'commands: {{external: ["{rule} push"], default: allow}}\n'
    repo = make_repo(tmp_path / "repo", policy=policy, files={"a.txt": "a\n"})
    script = f"""
git init -q --bare /tmp/bare
{rule} push -q /tmp/bare HEAD:refs/heads/named 2>/dev/null; echo "named $?"
{other} push -q /tmp/bare HEAD:refs/heads/other 2>/dev/null; echo "other $?"
echo "pushed: $(git --git-dir=/tmp/bare for-each-ref --format='%(refname)' | tr '\\n' ' ')"
"""
    proc, data = run_json(repo, "bash", "-c", script)
    assert data is not None, proc.stderr
    out = proc.stderr + proc.stdout
    assert "named 126" in out and "other 126" in out, out
    assert out.split("pushed:")[1].split("\n")[0].strip() == "", out


def test_an_exec_from_a_thread_is_recorded_as_its_process(tmp_path: Path, key: Path) -> None:
    # A second thread of python3 execs `sh -c 'exit 3'`: the process is sh from then on. The
    # receipt listed sh under the thread's id (no process had it), with no exit, and gave
    # python3 sh's exit code 3.
    repo = make_repo(tmp_path / "repo", files={"a.txt": "a\n"})
    code = (
        "import os, threading, time\n"
        "def run():\n"
        "    os.execv('/bin/sh', ['sh', '-c', 'exit 3'])\n"
        "threading.Thread(target=run).start()\n"
        "time.sleep(30)\n"
    )
    proc, data = run_json(repo, "bash", "-c", 'python3 -c "$0"; echo "python $?"', code)
    assert data is not None, proc.stderr
    assert "python 3" in proc.stderr + proc.stdout, proc.stderr + proc.stdout
    processes = predicate(repo, data["commit"])["processes"]
    python = [p for p in processes if p["argv"][:2] == ["python3", "-c"]]
    shell = [p for p in processes if p["argv"] == ["sh", "-c", "exit 3"]]
    assert len(python) == 1 and len(shell) == 1, processes
    assert shell[0]["pid"] == python[0]["pid"], processes  # the same process, by its id
    assert shell[0]["exit_code"] == 3, shell
    assert python[0]["exit_code"] != 3, python  # (it never ended: sh took its place)


def test_a_forked_child_s_thread_exec_is_watched_to_its_end(tmp_path: Path, key: Path) -> None:
    # A child forked (never exec'd, so never watched) whose second thread execs `sh -c 'exit
    # 5'` ended with 5, and the receipt gave sh no exit code. A refused exec from a thread
    # was listed under the thread's id.
    repo = make_repo(tmp_path / "repo", policy='commands: {deny: ["perl"], default: allow}\n',
                     files={"a.txt": "a\n"})  # fmt: skip
    code = (
        "import os, threading, time\n"
        "def refused():\n"
        "    try:\n"
        "        os.execv('/usr/bin/perl', ['perl', '-e', '1'])\n"
        "    except OSError:\n"
        "        pass\n"
        "t = threading.Thread(target=refused); t.start(); t.join()\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    run = lambda: os.execv('/bin/sh', ['sh', '-c', 'exit 5'])\n"
        "    threading.Thread(target=run).start()\n"
        "    time.sleep(30)\n"
        "    os._exit(9)\n"
        "print('status', os.waitpid(child, 0)[1] >> 8, 'python', os.getpid())\n"
    )
    proc, data = run_json(repo, "python3", "-c", code)
    assert data is not None, proc.stderr
    assert "status 5" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    processes = predicate(repo, data["commit"])["processes"]
    shell = [p for p in processes if p["argv"] == ["sh", "-c", "exit 5"]]
    assert len(shell) == 1 and shell[0]["exit_code"] == 5, processes
    python = [p for p in processes if p["argv"][:2] == ["python3", "-c"]]
    perl = [p for p in processes if p["argv"][:1] == ["perl"]]
    assert len(python) == 1 and len(perl) == 1 and perl[0]["decision"] == "deny", processes
    assert perl[0]["pid"] == python[0]["pid"], processes  # python's attempt, by its id
