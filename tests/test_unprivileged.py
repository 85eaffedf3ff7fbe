"""Not only root: the sandbox, supervisor, network boundary and gate for a normal user.

These make an unprivileged user (so the test itself needs root), give it its own HOME, key
and repository, and run the real command line as that user. Folders and files of HOME, PATH
and the current folder that the user may not read are skipped or named, never a traceback.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import needs_bwrap
from unprivileged import AsUser, make_user

pytestmark = [needs_bwrap, pytest.mark.sandbox, pytest.mark.root]

POLICY = (
    "paths: {read: ['**'], write: ['src/**']}\n"
    "commands: {deny: ['git push']}\n"
    "network: {localhost: deny, package_registry: deny, arbitrary_web: deny,"
    " internal_services: deny}\n"
)


@pytest.fixture
def user() -> Iterator[AsUser]:
    yield from make_user(POLICY)


def closed_folder(path: Path, mode: int = 0o700) -> Path:
    """A folder of root's that the user may not read (or not enter); its parents exist."""
    path.mkdir()
    os.chown(path, 0, 0)
    os.chmod(path, mode)
    return path


def run(user: AsUser, script: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> dict:  # type: ignore[type-arg]  # fmt: skip
    proc = user.gk("run", "--repo", str(user.repo), "--json", "--", "sh", "-c", script,
                   env=env, cwd=cwd)  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def predicate(user: AsUser, commit: str) -> dict:  # type: ignore[type-arg]
    note = user.git("notes", "--ref=refs/notes/gatekeeper", "show", commit)
    envelope = json.loads(note.strip().splitlines()[-1])
    return json.loads(base64.b64decode(envelope["payload"]))["predicate"]


def test_a_folder_on_path_the_user_cannot_read_is_skipped(user: AsUser) -> None:
    closed = closed_folder(user.root / "closed")
    (closed / "sh").write_text("#!/bin/sh\nexit 99\n")
    os.chmod(closed / "sh", 0o755)
    beneath = closed_folder(user.root / "shut") / "inner" / "bin"
    beneath.mkdir(parents=True)  # as root: the user cannot reach it
    listable = closed_folder(user.root / "noexec", 0o744)  # may list it, not enter it
    venv = user.root / "tools"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    os.chmod(venv / "pyvenv.cfg", 0o000)
    path = f"{closed}:{beneath}:{listable}:{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    data = run(user, "echo made > src/made.py", env={"PATH": path})
    assert data["exit_code"] == 0
    assert user.git("show", f"{data['commit']}:src/made.py") == "made\n"
    missing = user.gk("run", "--repo", str(user.repo), "--", "no-such-program-here",
                      env={"PATH": path})  # fmt: skip
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr
    assert "skipped PATH folders you may not read" in missing.stderr
    assert str(closed) in missing.stderr


def test_files_in_home_the_user_cannot_read_are_skipped(user: AsUser) -> None:
    home = user.home
    for name in (".npmrc", ".pypirc", ".netrc", ".git-credentials"):
        (home / name).write_text("secret\n")
        os.chmod(home / name, 0o000)
    made = user.run("mkdir", "-p", str(home / ".config"), str(home / ".cargo"),
                    str(home / ".local" / "share"))  # fmt: skip
    assert made.returncode == 0, made.stderr
    pip = closed_folder(home / ".config" / "pip")
    (pip / "pip.conf").write_text("[global]\n")
    closed_folder(home / ".ssh")
    closed_folder(home / ".cargo" / "bin")
    closed_folder(home / ".local" / "share" / "other")
    path = f"{home / '.cargo' / 'bin'}:{home / '.local' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    data = run(user, "echo ok > src/ok.py", env={"PATH": path})
    assert user.git("show", f"{data['commit']}:src/ok.py") == "ok\n"
    assert user.gk("receipt", "show", data["branch"], "--repo", str(user.repo)).returncode == 0


def test_an_unreachable_home_is_named_with_a_remedy(user: AsUser) -> None:
    closed = closed_folder(user.root / "elsewhere")
    bare = {"HOME": str(closed), "GATEKEEPER_HOME": "", "XDG_CONFIG_HOME": "",
            "XDG_DATA_HOME": ""}  # fmt: skip
    proc = user.gk("run", "--repo", str(user.repo), "--", "true", env=bare)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot reach the signing key" in proc.stderr and "GATEKEEPER_HOME" in proc.stderr
    proc = user.gk("keys", "generate", env=bare)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    keyed = {**bare, "GATEKEEPER_HOME": user.env["GATEKEEPER_HOME"]}
    proc = user.gk("run", "--repo", str(user.repo), "--", "true", env=keyed)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot create the worktree folder" in proc.stderr
    assert user.git("branch", "--list", "agent/*") == ""
    # With its worktrees elsewhere, the run works: nothing reads the closed HOME.
    placed = {**keyed, "GATEKEEPER_WORKTREES": str(user.root / "worktrees")}
    data = run(user, "echo w > src/w.py", env=placed)
    assert user.git("show", f"{data['commit']}:src/w.py") == "w\n"


def test_a_current_folder_the_user_cannot_list_does_not_matter(user: AsUser) -> None:
    parent = closed_folder(user.root / "hall", 0o711)  # may pass through, not list
    inner = parent / "room"
    inner.mkdir()
    os.chown(inner, user.uid, user.gid)
    os.chmod(inner, 0o300)  # the user's own, but not readable
    data = run(user, "echo c > src/c.py", cwd=inner)
    assert user.git("show", f"{data['commit']}:src/c.py") == "c\n"


def test_the_boundary_holds_for_a_normal_user(user: AsUser) -> None:
    checkout_readme = (user.repo / "README.md").read_text()
    script = (
        "echo fixed > src/app.py; "
        "echo changed > README.md; "
        f"echo bad > {user.repo}/src/app.py; "
        "echo hook > .git/hooks/pre-commit; "
        "git push origin HEAD; "
        "python3 -c 'import socket; s = socket.socket(); s.settimeout(2); "
        's.connect(("192.0.2.1", 80))\' 2>/dev/null; '
        "curl -s -m 5 -o /dev/null http://example.invalid/; "
        "exit 0"
    )
    proc = user.gk("run", "--repo", str(user.repo), "--json", "--", "sh", "-c", script)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    assert [c["path"] for c in data["changes"]] == ["src/app.py"]
    assert (user.repo / "README.md").read_text() == checkout_readme
    assert user.git("show", "HEAD:src/app.py") == "print('hi')\n"
    assert not (user.repo / ".git" / "hooks" / "pre-commit").exists()
    assert "README.md" in data["denied_writes"]
    assert any(argv[:2] == ["git", "push"] for argv in data["denied_commands"])
    pred = predicate(user, data["commit"])
    sandbox = pred["sandbox"]
    assert sandbox["supervised"] is True and sandbox["launcher_root"] is False
    assert sandbox["cgroup"] is False and "not delegated" in sandbox["cgroup_reason"]
    assert sandbox["process_limit"] == "rlimit" and sandbox["limits"]["process_limit_enforced"]
    hosts = {(n["host"], n["decision"]) for n in pred["network"]}
    assert ("192.0.2.1", "deny") in hosts
    assert any(h == "example.invalid" and d == "deny" for h, d in hosts)
    # The gate, as the same user: the run passes, a human edit after it is blocked.
    check = user.gk("check", "--repo", str(user.repo), "--base", "main", data["branch"])
    assert check.returncode == 0, check.stdout + check.stderr
    user.git("checkout", "-q", "-b", "edited", data["commit"])
    edit = user.run("sh", "-c", f"echo later > {user.repo}/src/later.py")
    assert edit.returncode == 0, edit.stderr
    user.git("add", "src/later.py")
    user.git("commit", "-q", "-m", "human edit")
    check = user.gk("check", "--repo", str(user.repo), "--base", "main", "edited")
    assert check.returncode == 1, check.stdout + check.stderr


def test_a_process_limit_binds_a_normal_user(user: AsUser) -> None:
    policy = user.root / "small.yaml"
    policy.write_text(POLICY + "limits: {max_processes: 40}\n")
    # The shell stops (exit 2) when it cannot fork any more.
    script = "i=0; while [ $i -lt 200 ]; do sleep 5 & i=$((i+1)); done 2>/dev/null; exit 0"
    proc = user.gk("run", "--repo", str(user.repo), "--policy", str(policy), "--json",
                   "--timeout", "60", "--", "sh", "-c", script)  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    pred = predicate(user, data["commit"])
    sleeps = [p for p in pred["processes"] if p["argv"][:1] == ["sleep"]]
    assert 0 < len(sleeps) <= 40, f"{len(sleeps)} sleeps ran under a limit of 40"
