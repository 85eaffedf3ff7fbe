"""Attacks on the supervisor's one-lookup exec path: an exec of an absolute path is looked up
once by the kernel (openat2 in the process's root), a miss answered at once, a plain path
taken as its own resolution.

Every test runs the real `gatekeeper run` (real bubblewrap, a real repository) and fails when
the hole it names is open.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from conftest import gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

POLICY = """\
paths: {read: ['**'], write: ['src/**', 'docs/**']}
commands:
  deny: ["rm -rf", "git push"]
  ask: ["pnpm install"]
  default: allow
"""


@pytest.fixture
def repo(tmp_path: Path, key: Path) -> Path:
    return make_repo(tmp_path / "repo", policy=POLICY,
                     files={"src/app.py": "x\n", "README.md": "r\n", "victim": "v\n"})  # fmt: skip


def _predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


# Execs a path and prints the error each gets, in order, on stderr.
TRY_EXECS = (
    "import os, sys\n"
    "def code(path, argv):\n"
    "    try:\n"
    "        os.execv(path, argv)\n"
    "    except OSError as exc:\n"
    "        return exc.errno\n"
    "print(*[code(p, a) for p, a in CALLS], file=sys.stderr)\n"
)


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
        ("/etc/hostname/git/.", ["x", "push", "4"]),
    ]
    proc, data = run_json(repo, "python3", "-c", f"CALLS = {calls!r}\n{TRY_EXECS}")
    assert proc.returncode == 0 and data is not None, proc.stderr
    # The kernel's own errors, as before.
    assert proc.stderr.split()[-4:] == [str(errno.ENOENT)] * 3 + [str(errno.ENOTDIR)], proc.stderr
    pred = _predicate(repo, data["commit"])
    refused = {p["argv"][-1]: p for p in pred["processes"] if p["argv"][:2] == ["x", "push"]}
    assert sorted(refused) == ["1", "2", "3", "4"], pred["processes"]
    for p in refused.values():
        assert p["decision"] == "deny" and p["rule"].startswith("git push"), p
