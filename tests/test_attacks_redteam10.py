"""Attacks on what a person's yes covers, and on what the receipt lists as run.

The supervisor reads an exec's argv from the caller's memory and judges it; the kernel copies
the argv only once the call goes on, so a second thread can point it elsewhere in between
(most easily while a person reads the question about it). What then runs is checked at its
first watched call: a yes covers the command line the person saw, not every one the same ask
rule covers, and whatever runs in place of what was judged is what the receipt lists.

Every test runs the real `gatekeeper run` (real bubblewrap, a real repository, a real
terminal for the question) and fails when the hole it names is open.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from conftest import git, make_repo, needs_bwrap
from test_supervise import predicate

pytestmark = [needs_bwrap, pytest.mark.sandbox]

# Inside the sandbox: exec `git tag approved-by-person`; while the person reads the question,
# a second thread points argv[2] at another name (a pointer store: no call to watch).
SWAP_WHILE_ASKED = r"""
import ctypes, threading, time
libc = ctypes.CDLL(None, use_errno=True)
keep = [ctypes.create_string_buffer(s) for s in
        (b"/usr/bin/git", b"git", b"tag", b"approved-by-person", b"SWAPPED-never-approved")]
path, s_git, s_tag, s_ok, s_bad = keep
argv = (ctypes.c_void_p * 4)(*(ctypes.addressof(s) for s in (s_git, s_tag, s_ok)), None)
envp = (ctypes.c_void_p * 1)(None)
def flip():
    time.sleep(0.3)  # the supervisor has read the argv and waits for the person
    argv[2] = ctypes.addressof(s_bad)
threading.Thread(target=flip, daemon=True).start()
libc.execve(path.raw.rstrip(b"\0"), argv, envp)
"""


def _on_a_terminal(args: list[str], answers: list[bytes], timeout: float = 90) -> str:
    """Run the CLI with a pseudo-terminal as its controlling terminal, answering its
    questions in turn, each a second after it is shown (the agent's second thread acts in
    that second); the terminal's output."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.execv(sys.executable, [sys.executable, "-m", "gatekeeper", *args])
    output = b""
    seen = 0
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
        while seen < len(answers) and output.count(b"Allow? [y/N]") > seen:
            time.sleep(1.0)
            os.write(fd, answers[seen] + b"\r")
            seen += 1
    os.waitpid(pid, 0)
    os.close(fd)
    return output.decode(errors="replace")


def _run_swap(tmp_path: Path, answers: list[bytes]) -> tuple[str, list[dict[str, object]]]:
    """The swap above under `--ask tty` with a policy that asks about `git tag`: the
    terminal's output and the receipt's processes."""
    policy = 'commands: {ask: ["git tag"], default: allow}\n'
    repo = make_repo(tmp_path / "repo", policy=policy, files={"a.txt": "a\n"})
    (repo / "swap.py").write_text(SWAP_WHILE_ASKED)
    git(repo, "add", "swap.py")
    git(repo, "commit", "-qm", "swap")
    output = _on_a_terminal(
        ["run", "--repo", str(repo), "--ask", "tty", "--", "python3", "swap.py"], answers
    )
    branch = git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/agent/").split()
    assert len(branch) == 1, output
    pred = predicate(repo, git(repo, "rev-parse", branch[0]).strip())
    return output, pred["processes"]  # type: ignore[no-any-return]


def test_a_yes_covers_the_command_line_asked_about_not_another_the_rule_covers(
    tmp_path: Path, key: Path
) -> None:
    # The person approves `git tag approved-by-person`; the argv is pointed at
    # `git tag SWAPPED-never-approved` while they read. What runs differs from what they
    # saw: it is asked about as it is, and a no ends it before it makes the tag.
    output, processes = _run_swap(tmp_path, [b"y", b"n"])
    questions = output.split("Allow? [y/N]")
    assert len(questions) == 3, output
    assert "git tag approved-by-person" in questions[0]
    assert "git tag SWAPPED-never-approved" in questions[1]
    killed = [p for p in processes if p["argv"] == ["git", "tag", "SWAPPED-never-approved"]]
    assert len(killed) == 1 and killed[0]["decision"] == "deny", processes
    assert "differs from what was judged" in str(killed[0]["rule"])
    assert not [p for p in processes if p["decision"] == "allow" and "SWAPPED" in str(p["argv"])]
    assert "denied    command git tag SWAPPED-never-approved" in output


def test_what_ran_in_place_of_what_was_judged_is_what_the_receipt_lists(
    tmp_path: Path, key: Path
) -> None:
    # Both command lines approved, one after the other: the tag is made, and the receipt
    # lists the command line that ran (saying what was judged at the exec), not the one the
    # argv held when it was first read.
    _, processes = _run_swap(tmp_path, [b"y", b"y"])
    tags = [p for p in processes if (p["argv"] or [""])[0] == "git"]
    assert len(tags) == 1, processes
    ran = tags[0]
    assert ran["argv"] == ["git", "tag", "SWAPPED-never-approved"], ran
    assert ran["decision"] == "allow" and ran["exit_code"] == 0, ran
    assert "what ran differs from what was judged at its exec: git tag approved-by-person" in str(
        ran["rule"]
    )
