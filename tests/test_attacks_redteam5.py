"""Attacks on the supervisor's one-lookup exec path: an exec of an absolute path is looked up
once by the kernel (openat2 in the process's root), a miss answered at once, a plain path
taken as its own resolution.

Every test runs the real `gatekeeper run` (real bubblewrap, a real repository) and fails when
the hole it names is open.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import test_supervise
from conftest import needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

# The supervisor tests' repository and policy: deny "rm -rf" and "git push", ask
# "pnpm install", writes to src/ and docs/.
repo = test_supervise.repo
_predicate = test_supervise.predicate
TRY_EXECS = test_supervise.TRY_EXECS


def test_a_missing_denied_program_spelled_with_a_trailing_dot_or_slash_is_recorded_as_refused(
    repo: Path,
) -> None:
    # A refused name the agent tries where nothing is is recorded as refused by name (the
    # path's last part, as the path resolves). The one-lookup path judged the raw spelling:
    # `/nowhere/git/.` and `/nowhere/git/` end in `.` and ``, which no rule names, so the
    # attempt of `git push` went unrecorded (and argv[0] says what the agent likes).
    calls = [
        ("/usr/local/nowhere/git/.", ["x", "push", "1"]),
        ("/usr/local/nowhere/git/", ["x", "push", "2"]),
        ("/usr/local/nowhere//git/./", ["x", "push", "3"]),
        ("/usr/local/nowhere/pnpm/.", ["x", "install", "4"]),
        ("/usr/local/nowhere/rm/", ["x", "-rf", "victim", "5"]),
        ("/etc/hostname/git/.", ["x", "push", "6"]),
    ]
    proc, data = run_json(repo, "python3", "-c", f"CALLS = {calls!r}\n{TRY_EXECS}")
    assert proc.returncode == 0 and data is not None, proc.stderr
    # The kernel's own errors, as before.
    errors = [str(errno.ENOENT)] * 5 + [str(errno.ENOTDIR)]
    assert proc.stderr.split()[-6:] == errors, proc.stderr
    pred = _predicate(repo, data["commit"])
    refused = {p["argv"][-1]: p for p in pred["processes"] if p["argv"][0] == "x"}
    rules = {"4": "pnpm install", "5": "rm -rf"}
    assert sorted(refused) == ["1", "2", "3", "4", "5", "6"], pred["processes"]
    for mark, p in refused.items():
        assert p["decision"] == "deny", p
        assert p["rule"].startswith(f"{rules.get(mark, 'git push')} (by name"), p


# renameat2's number where it differs by machine.
RENAMEAT2 = {"x86_64": 316, "aarch64": 276}.get(os.uname().machine)

# A folder on the program's path, swapped for a link to a folder where the same name is a
# link to `rm` (renameat2 RENAME_EXCHANGE), over and over while a child execs the path.
SWAP_AND_EXEC = """\
import ctypes, os, shutil, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs('/tmp/r/plain'); os.makedirs('/tmp/r/other')
shutil.copy('/bin/true', '/tmp/r/plain/tool')
os.symlink('/bin/rm', '/tmp/r/other/tool')
os.symlink('/tmp/r/other', '/tmp/r/link')
os.rename('/tmp/r/plain', '/tmp/r/d')
os.makedirs('src/t/u'); open('src/t/u/f', 'w').write('x')
swapper = os.fork()
if swapper == 0:
    while True:
        libc.syscall(RENAMEAT2, -100, b'/tmp/r/d', -100, b'/tmp/r/link', 2)
tries, end = 0, time.time() + 6
while time.time() < end and os.path.exists('src/t'):
    child = os.fork()
    if child == 0:
        try:
            os.execv('/tmp/r/d/tool', ['tool', '-rf', 'src/t'])
        finally:
            os._exit(1)
    os.waitpid(child, 0)
    tries += 1
os.kill(swapper, 9)
print('tries', tries, 'left', os.path.exists('src/t'), file=sys.stderr)
"""


def test_a_plain_path_swapped_for_a_link_after_its_one_lookup_does_not_run_the_links_program(
    repo: Path,
) -> None:
    if RENAMEAT2 is None:
        pytest.skip("renameat2's number on this machine is not known here")
    # The one lookup (no link on the way) makes the path its own resolution: a folder swapped
    # for a link right after it runs another program than the one judged (a harmless `tool`
    # allowed, `rm -rf` run). What runs is checked at its first watched call and killed
    # there: rm's unlink is that call, so nothing is removed.
    script = f"RENAMEAT2 = {RENAMEAT2}\n{SWAP_AND_EXEC}"
    proc, data = run_json(repo, "python3", "-c", script)
    assert proc.returncode == 0 and data is not None, proc.stderr
    assert "left True" in proc.stderr, proc.stderr
    pred = _predicate(repo, data["commit"])
    ran = [p for p in pred["processes"] if p["argv"][:1] == ["tool"] and p["decision"] == "allow"]
    assert all(p["exe"] == "/tmp/r/d/tool" for p in ran), ran
    # The swap did win some races (or this test proves nothing): those were killed.
    killed = [p for p in pred["processes"] if "differs from what was judged" in (p["rule"] or "")]
    assert killed and all(p["exe"].endswith("/rm") for p in killed), proc.stderr
