"""Unusual permissions left by the agent, for a launcher run by a normal user (not root).

Root reads anything, so these run the real command line as an unprivileged user made for the
test, with its own HOME and a repository it owns; the test itself needs root to set that up.
"""

from __future__ import annotations

import base64
import glob
import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import make_repo, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.sandbox]

USER = "gk-launcher-test"
POLICY = "paths: {read: ['**'], write: ['src/**']}\n"


@dataclass
class AsUser:
    uid: int
    gid: int
    root: Path
    repo: Path
    env: dict[str, str]

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--",
             *argv], env=self.env, cwd=self.root, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def gk(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.root / "venv" / "bin" / "python"), "-m", "gatekeeper", *args)

    def git(self, *args: str) -> str:
        proc = self.run("git", "-C", str(self.repo), *args)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


def user_python(venv: Path) -> None:
    """An interpreter the user may run that imports this checkout and its dependencies.

    The test's own interpreter may live where the user cannot reach (root's HOME).
    """
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if system is None:
        pytest.skip("no system python3")
    version = subprocess.run([system, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if version != str(sys.version_info[:2]):
        pytest.skip(f"the system python3 is {version}, the tests run on {sys.version_info[:2]}")
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths()["purelib"])
    checkout = Path(__file__).resolve().parents[1]
    pth = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (pth / "checkout.pth").write_text(f"{checkout}\n{site}\n")


@pytest.fixture
def user(tmp_path: Path, key: Path) -> Iterator[AsUser]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to make the user) and setpriv")
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        USER], check=True)  # fmt: skip
        pw = pwd.getpwnam(USER)
    root = Path(tempfile.mkdtemp(prefix="gk-perm-", dir="/tmp"))
    try:
        home = root / "home"
        home.mkdir()
        (home / ".gitconfig").write_text("[user]\n\tname = U\n\temail = u@example.invalid\n"
                                         "[init]\n\tdefaultBranch = main\n")  # fmt: skip
        repo = make_repo(
            root / "repo", policy=POLICY, files={"src/a.py": "a\n", "README.md": "r\n"}
        )
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "GATEKEEPER_HOME": str(home / ".config" / "gatekeeper"),
            "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
            "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"), "GIT_CONFIG_NOSYSTEM": "1",
        }  # fmt: skip
        user_python(root / "venv")
        for path in [root, *root.rglob("*")]:
            os.lchown(path, pw.pw_uid, pw.pw_gid)
        as_user = AsUser(pw.pw_uid, pw.pw_gid, root, repo, env)
        proc = as_user.gk("keys", "generate")
        assert proc.returncode == 0, proc.stderr
        yield as_user
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(user: AsUser, script: str) -> dict:  # type: ignore[type-arg]
    proc = user.gk("run", "--repo", str(user.repo), "--json", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def scratch_left(data: dict) -> list[str]:  # type: ignore[type-arg]
    return glob.glob(f"{tempfile.gettempdir()}/gatekeeper-run-{data['run_id']}-*")


def receipt(user: AsUser, commit: str) -> dict:  # type: ignore[type-arg]
    """The predicate as signed (the user's key is not in the repository's trust file)."""
    note = user.git("notes", "--ref=refs/notes/gatekeeper", "show", commit)
    envelope = json.loads(note.strip().splitlines()[-1])
    return json.loads(base64.b64decode(envelope["payload"]))["predicate"]


def test_the_launcher_runs_as_a_normal_user(user: AsUser) -> None:
    assert user.run("id", "-u").stdout.strip() == str(user.uid) != "0"


def test_a_folder_without_x_permission_is_committed(user: AsUser) -> None:
    data = run(user, "mkdir -p src/nox && echo a > src/nox/f && chmod 600 src/nox")
    assert user.git("show", f"{data['commit']}:src/nox/f") == "a\n"
    assert data["not_committed"] == [] and data["denied_writes"] == []


def test_files_of_a_chmod_000_folder_do_not_vanish(user: AsUser) -> None:
    data = run(user, "mkdir -p src/locked/deep && echo b > src/locked/deep/g && "
               "echo c > src/locked/h && chmod 000 src/locked/deep src/locked")  # fmt: skip
    assert user.git("show", f"{data['commit']}:src/locked/deep/g") == "b\n"
    assert user.git("show", f"{data['commit']}:src/locked/h") == "c\n"


def test_a_chmod_000_file_in_the_write_set_is_not_a_denied_write(user: AsUser) -> None:
    data = run(user, "echo c > src/h && chmod 000 src/h && echo d > src/a.py && chmod 000 src/a.py")
    assert user.git("show", f"{data['commit']}:src/h") == "c\n"
    assert user.git("show", f"{data['commit']}:src/a.py") == "d\n"
    assert data["denied_writes"] == []
    pred = receipt(user, data["commit"])
    assert not [w for w in pred["writes"] if w["decision"] == "deny"]


def test_read_only_folders_in_the_scratch_space_are_cleaned_up(user: AsUser) -> None:
    assert scratch_left(run(user, "true")) == []
    data = run(user, "G=$(git rev-parse --git-dir) && mkdir -p $G/ro/sub && touch $G/ro/sub/f && "
               "chmod 500 $G/ro/sub $G/ro && chmod 000 $G/refs/tags && echo x > src/x.py")  # fmt: skip
    assert scratch_left(data) == []
    assert user.git("show", f"{data['commit']}:src/x.py") == "x\n"
    # The worktree itself goes with `discard`, read-only folders and all.
    run(user, "mkdir -p src/ro2/sub && chmod 500 src/ro2/sub src/ro2")
    proc = user.gk("discard", "--repo", str(user.repo), data["run_id"])
    assert proc.returncode == 0, proc.stderr
    assert not Path(data["worktree"]).exists()


@pytest.mark.parametrize(
    "script",
    [
        "mkdir -p src/nox && echo a > src/nox/f && chmod 600 src/nox",
        "mkdir -p src/locked && echo b > src/locked/g && chmod 000 src/locked",
        "echo c > src/h && chmod 000 src/h",
        "mkdir -p src/ro/sub && chmod 500 src/ro/sub src/ro && G=$(git rev-parse --git-dir) && "
        "mkdir $G/ro $G/ro/sub && chmod 500 $G/ro/sub $G/ro",
    ],
)
def test_as_root_the_same_leftovers_are_committed_and_cleaned_up(tmp_path: Path, key: Path,
                                                                  script: str) -> None:  # fmt: skip
    # Root reads through any mode on the host, but inside the sandbox the agent runs without
    # capabilities in its own user namespace: its chmod 000 binds it as much as anyone.
    from conftest import git
    from helpers import run_json

    repo = make_repo(tmp_path / "repo", policy=POLICY, files={"src/a.py": "a\n"})
    proc, data = run_json(repo, "sh", "-c", script + "; ls src/locked 2>&1; exit 0")
    assert proc.returncode == 0, proc.stderr
    assert data["denied_writes"] == [] and data["not_committed"] == []
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    for expected in ("src/nox/f", "src/locked/g", "src/h"):
        if f"> {expected}" in script:
            assert expected in files
    assert not glob.glob(f"{tempfile.gettempdir()}/gatekeeper-run-{data['run_id']}-*")
