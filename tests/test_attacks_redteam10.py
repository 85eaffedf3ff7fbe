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
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import git, make_repo, needs_bwrap
from helpers import run_json
from test_supervise import _run_on_a_terminal, predicate

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


def _run_swap(tmp_path: Path, answers: list[bytes]) -> tuple[str, list[dict[str, object]]]:
    """The swap above under `--ask tty` with a policy that asks about `git tag`: the
    terminal's output and the receipt's processes."""
    return _run_asked(tmp_path, SWAP_WHILE_ASKED, answers)


def _run_asked(
    tmp_path: Path, script: str, answers: list[bytes]
) -> tuple[str, list[dict[str, object]]]:
    """A Python script under `--ask tty` with a policy that asks about `git tag`: the
    terminal's output and the receipt's processes."""
    policy = 'commands: {ask: ["git tag"], default: allow}\n'
    repo = make_repo(tmp_path / "repo", policy=policy, files={"a.txt": "a\n"})
    (repo / "agent.py").write_text(script)
    git(repo, "add", "agent.py")
    git(repo, "commit", "-qm", "agent")
    # Each question answered a second after it is shown: the agent's other thread or process
    # acts then.
    _, output = _run_on_a_terminal(
        ["run", "--repo", str(repo), "--ask", "tty", "--", "python3", "agent.py"],
        answers, timeout=90, pause=1.0,
    )  # fmt: skip
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


# Inside the sandbox: a child execs `git tag`, which is asked about; while the person reads
# the question, its parent kills it (a kill is no call the supervisor waits on).
KILLED_WHILE_ASKED = r"""
import os, signal, time
child = os.fork()
if child == 0:
    os.execv("/usr/bin/git", ["git", "tag", "asked-then-gone"])
time.sleep(0.3)
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
"""


def test_an_exec_whose_caller_is_gone_when_answered_is_not_recorded_as_run(
    tmp_path: Path, key: Path
) -> None:
    # The person says yes to a caller already killed: nothing ran, and the receipt does not
    # count it among the commands let run.
    output, processes = _run_asked(tmp_path, KILLED_WHILE_ASKED, [b"y"])
    assert output.count("Allow? [y/N]") == 1, output
    asked = [p for p in processes if p["argv"] == ["git", "tag", "asked-then-gone"]]
    assert len(asked) == 1, processes
    assert asked[0]["decision"] == "deny", asked
    assert asked[0]["rule"] == "(gone before it could be judged)", asked
    ran = [p["argv"] for p in processes if p["decision"] == "allow"]
    assert ["python3", "agent.py"] in ran, ran
    assert not [a for a in ran if "asked-then-gone" in str(a)], ran


def _hard_linked_pair() -> tuple[str, str] | None:
    """Two names in /usr/bin of one program file (`perl` and `perl5.36.0`), if any."""
    by_id: dict[tuple[int, int], list[str]] = {}
    for entry in sorted(os.scandir("/usr/bin"), key=lambda e: e.name):
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if entry.is_file(follow_symlinks=False) and st.st_nlink > 1:
            by_id.setdefault((st.st_dev, st.st_ino), []).append(entry.name)
    pairs = sorted(sorted(names, key=len)[:2] for names in by_id.values() if len(names) > 1)
    return (pairs[0][0], pairs[0][1]) if pairs else None


def _refused_in_run(repo: Path, script: str, *attempts: str) -> tuple[str, list[dict]]:
    """Runs script under bash in the sandbox, where each attempt echoes its name and exit
    status: each was refused (126). The run's output and its receipt's processes."""
    proc, data = run_json(repo, "bash", "-c", script)
    assert data is not None, proc.stderr
    out = proc.stderr + proc.stdout
    for attempt in attempts:
        assert f"{attempt} 126" in out, out
    return out, predicate(repo, data["commit"])["processes"]


def test_a_program_a_rule_names_is_that_program_by_any_name_git_or_a_link_gives_it(
    tmp_path: Path, key: Path
) -> None:
    # git runs `git-remote add ...` as `git remote add ...`: called through its exec path's
    # links (/usr/lib/git-core/git-push) or with argv[0] so named. A hard link of a program
    # (`perl5.36.0` of `perl`) is that program. Each is refused as its rule says, and recorded.
    pair = _hard_linked_pair()
    assert pair is not None, "no program with two names in /usr/bin on this machine"
    named, other = pair
    policy = (f'commands: {{deny: ["git remote add", "{named}"], external: ["git push"], '
              "default: allow}\n")  # fmt: skip
    repo = make_repo(tmp_path / "repo", policy=policy, files={"a.txt": "a\n"})
    core = git(repo, "--exec-path").strip()
    script = f"""
git init -q --bare /tmp/bare
{core}/git-remote add evil1 /tmp/bare; echo "dashed-remote $?"
(exec -a git-remote git add evil2 /tmp/bare); echo "argv0-remote $?"
{core}/git-push -q /tmp/bare HEAD:refs/heads/pushed1; echo "dashed-push $?"
(exec -a git-push git -q /tmp/bare HEAD:refs/heads/pushed2); echo "argv0-push $?"
{other} --version >/dev/null 2>&1; echo "hard-link $?"
echo "remotes: $(git remote | tr '\\n' ' ')"
echo "pushed: $(git --git-dir=/tmp/bare for-each-ref --format='%(refname)' | tr '\\n' ' ')"
"""
    out, processes = _refused_in_run(
        repo, script, "dashed-remote", "argv0-remote", "dashed-push", "argv0-push", "hard-link"
    )
    assert out.split("remotes:")[1].split("\n")[0].strip() == "", out
    assert out.split("pushed:")[1].split("\n")[0].strip() == "", out
    refused = {" ".join(p["argv"][:2]): p["rule"] for p in processes if p["decision"] == "deny"}
    assert refused[f"{core}/git-remote add"] == "git remote add", refused
    assert refused["git-remote add"] == "git remote add", refused
    assert refused[f"{core}/git-push -q"] == "external: git push", refused
    assert refused["git-push -q"] == "external: git push", refused
    assert refused[f"{other} --version"] == named, refused


# `#!` lines the kernel and a naive reading split differently: the last byte of a line with
# no newline in 256 bytes, blanks before a NUL, NUL after the interpreter, a shorter file
# with no newline at all.
SHEBANG_CASES = [
    b"#!{I}",
    b"#!{I} -x",
    b"#!{I} -x  ",
    b"#! {I}\t a b \n",
    b"#!{I} a\0b\n",
    b"#!{I}\0x y\n",
    b"#!{I} arg  \0 z\n",
    b"#!{I}   \0 z\n",
    b"#!{I} " + b"y" * 300,
    b"#!{I} " + b" " * 240 + b"pushZ",
    b"#!" + b"/" * 300,
    b"#!   \n",
    # {I@N}: the interpreter's name padded with slashes to end just before byte N, with no
    # newline in the 256 bytes: the kernel looks for its end up to byte 255, then drops it
    b"#!{I@254} -x " + b"z" * 40 + b"\n",
    b"#!{I@255} " + b"z" * 40 + b"\n",
    b"#!{I@255}\0",
    b"#!{I@256}" + b"z" * 40 + b"\n",
]


@pytest.mark.parametrize("line", SHEBANG_CASES)
def test_a_shebang_line_is_split_as_the_kernel_splits_it(tmp_path: Path, line: bytes) -> None:
    from gatekeeper.sandbox.supervise.supervisor import _shebang

    shows = tmp_path / "shows"  # an interpreter that shows each word it is given
    shows.write_text("#!/bin/sh\nfor a; do printf '[%s]' \"$a\"; done\n")
    shows.chmod(0o755)
    head = line.replace(b"{I}", bytes(shows))
    if padded := re.search(rb"\{I@(\d+)\}", line):
        pad = int(padded.group(1)) - padded.start() - len(bytes(shows))
        head = line.replace(padded.group(0), b"/" * pad + bytes(shows))
    script = tmp_path / "s"
    script.write_bytes(head)
    script.chmod(0o755)
    try:
        ran = subprocess.run([str(script)], capture_output=True, check=False).stdout.decode()
    except OSError:
        ran = None  # the kernel runs nothing
    interpreter, argument = _shebang(head[:256])
    if ran is None or not (os.path.exists(interpreter) and os.path.samefile(interpreter, shows)):
        assert ran is None and (not interpreter or not os.path.exists(interpreter)), (
            ran,
            interpreter,
        )
        return
    assert ran == ("" if argument is None else f"[{argument}]") + f"[{script}]", (ran, argument)


def test_a_hard_link_is_judged_at_every_level_a_rule_could_see_it(
    tmp_path: Path, key: Path
) -> None:
    # A hard link of a denied program named on a `#!` line, or given to the dynamic loader,
    # is that program too. (A copy under another name is not: see docs/security-launcher.md.)
    pair = _hard_linked_pair()
    assert pair is not None, "no program with two names in /usr/bin on this machine"
    named, other = pair
    policy = f'commands: {{deny: ["{named}"], default: allow}}\n'
    repo = make_repo(tmp_path / "repo", policy=policy, files={"a.txt": "a\n"})
    loader_path = subprocess.run(
        [sys.executable, "-c", "from gatekeeper.sandbox.supervise.loader import interpreter_of;"
         f"print(interpreter_of('/usr/bin/{other}'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    script = f"""
printf '#!/usr/bin/{other} --version\\n' > /tmp/via-shebang; chmod +x /tmp/via-shebang
/tmp/via-shebang >/dev/null 2>&1; echo "shebang $?"
{loader_path} /usr/bin/{other} --version >/dev/null 2>&1; echo "loader $?"
"""
    _, processes = _refused_in_run(repo, script, "shebang", "loader")
    refused = {p["argv"][0]: p["rule"] for p in processes if p["decision"] == "deny"}
    assert refused["/tmp/via-shebang"] == named, refused
    assert refused[loader_path] == named, refused


def test_git_runs_only_its_own_commands_by_name_where_a_rule_names_git(
    tmp_path: Path, key: Path
) -> None:
    # An alias the agent defines, or help.autocorrect, makes git run a command a rule refuses
    # under another word, in git's own process: `git psh` pushed, `git remot add` added a
    # remote. Where a rule names git, an exec of git naming none of git's own commands is
    # refused; git's own commands run as before. A command git runs as a program (bisect)
    # becomes an alias where git looks for it in another exec path: refused then. `git send-pack` pushes too: the default
    # policy names it beside `git push`.
    repo = make_repo(tmp_path / "repo", files={"a.txt": "a\n"})  # the default policy
    script = """
git init -q --bare /tmp/bare
printf '[help]\n\tautocorrect = immediate\n[alias]\n\tp = push\n\tbisect = push\n' > ~/.gitconfig
git psh -q /tmp/bare HEAD:refs/heads/autocorrected 2>/dev/null; echo "autocorrect $?"
git p -q /tmp/bare HEAD:refs/heads/aliased 2>/dev/null; echo "alias $?"
git -c alias.q=push q -q /tmp/bare HEAD:refs/heads/inline 2>/dev/null; echo "inline $?"
git remot add evil /tmp/bare 2>/dev/null; echo "remot $?"
git send-pack /tmp/bare HEAD:refs/heads/sendpack 2>/dev/null; echo "send-pack $?"
mkdir -p /tmp/empty
GIT_EXEC_PATH=/tmp/empty git bisect -q /tmp/bare HEAD:refs/heads/env 2>/dev/null; echo "env-path $?"
git --exec-path=/tmp/empty bisect -q /tmp/bare HEAD:refs/heads/opt 2>/dev/null; echo "opt-path $?"
git bisect log >/dev/null 2>&1; echo "bisect $?"
git -c help.autocorrect=immediate --shallow-file status psh -q /tmp/bare HEAD:refs/heads/shallow 2>/dev/null; echo "shallow-file $?"
git --unknown-option psh -q /tmp/bare HEAD:refs/heads/unknown 2>/dev/null; echo "unknown-option $?"
git init -q /tmp/up && git -C /tmp/up -c user.name=a -c user.email=a@b commit -q --allow-empty -m s
git clone -q /tmp/up /tmp/c1 2>/dev/null; echo "clone $?"
git ls-remote /tmp/up >/dev/null 2>&1; echo "ls-remote $?"
git --no-literal-pathspecs status >/dev/null; echo "flag $?"
echo x > stashed.txt; git add stashed.txt; git stash push -q; echo "stash $?"; git stash pop -q
git config --global alias.x push; echo "config $?"
git status --short >/dev/null; echo "status $?"
git -C . log --oneline -1 >/dev/null; echo "log $?"
echo "remotes: $(git remote | tr '\\n' ' ')"
echo "pushed: $(git --git-dir=/tmp/bare for-each-ref --format='%(refname)' | tr '\\n' ' ')"
"""
    proc, data = run_json(repo, "bash", "-c", script)
    assert data is not None, proc.stderr
    out = proc.stderr + proc.stdout
    refused = ("autocorrect", "alias", "inline", "remot", "send-pack", "env-path", "opt-path",
               "shallow-file", "unknown-option")  # fmt: skip
    for attempt in refused:
        assert f"{attempt} 126" in out, out
    # git's transports start `git-upload-pack PATH` (a dashed name: the builtin, no alias).
    # A rule's second word is git's command: `git stash push` and `git config alias.x push`
    # are not `git push`.
    for attempt in ("status", "log", "clone", "ls-remote", "flag", "stash", "config"):
        assert f"{attempt} 0" in out, out
    assert "bisect 126" not in out and "bisect 127" not in out, out  # (git's own, not a push)
    assert out.split("remotes:")[1].split("\n")[0].strip() == "", out
    assert out.split("pushed:")[1].split("\n")[0].strip() == "", out
    rules = {p["rule"] for p in predicate(repo, data["commit"])["processes"]}
    assert any(str(r).startswith("(git runs `psh`, none of its own commands") for r in rules)
    assert "external: git send-pack" in rules, rules


def test_git_under_another_name_is_held_to_git_s_own_commands_too(
    tmp_path: Path, key: Path
) -> None:
    # A hard link of git (as git's own Makefile installs its exec path's programs) called by
    # any other name is git: `foo psh` autocorrects to push as `git psh` does.
    import shutil
    import uuid

    real = os.path.realpath(shutil.which("git") or "/usr/bin/git")
    folder = Path("/usr/local/lib") / f"gk-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    try:
        try:
            os.link(real, folder / "foo")
        except OSError as exc:
            pytest.skip(f"no hard link of {real} can be made in /usr/local/lib here: {exc}")
        repo = make_repo(tmp_path / "repo", files={"a.txt": "a\n"})  # the default policy
        script = f"""
git init -q --bare /tmp/bare
{folder}/foo -c help.autocorrect=immediate psh -q /tmp/bare HEAD:refs/heads/x 2>/dev/null; echo "linked $?"
{folder}/foo status >/dev/null; echo "status $?"
echo "pushed: $(git --git-dir=/tmp/bare for-each-ref --format='%(refname)' | tr '\\n' ' ')"
"""
        proc, data = run_json(repo, "bash", "-c", script)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert data is not None, proc.stderr
    out = proc.stderr + proc.stdout
    assert "linked 126" in out and "status 0" in out, out
    assert out.split("pushed:")[1].split("\n")[0].strip() == "", out
