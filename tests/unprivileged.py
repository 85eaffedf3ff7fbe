"""Running the real command line as an unprivileged user made for the test (the test is root).

The user gets its own HOME, key and repository, and an interpreter it may run that imports
this checkout: the test's own interpreter may live where the user cannot reach (root's HOME).
"""

from __future__ import annotations

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

USER = "gk-unpriv-test"
CHECKOUT = Path(__file__).resolve().parents[1]


@dataclass
class AsUser:
    uid: int
    gid: int
    root: Path  # the user's own folder: HOME, repository, interpreter
    repo: Path
    env: dict[str, str]
    python: Path

    @property
    def home(self) -> Path:
        return Path(self.env["HOME"])

    def run(self, *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return subprocess.run(
            [*as_user(self.uid, self.gid), *argv], env={**self.env, **(env or {})},
            cwd=cwd or self.root, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def gk(self, *args: str, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return self.run(str(self.python), "-m", "gatekeeper", *args, env=env, cwd=cwd)

    def git(self, *args: str) -> str:
        proc = self.run("git", "-C", str(self.repo), *args)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


def as_user(uid: int, gid: int) -> list[str]:
    """The command prefix that runs a program as uid. setpriv itself execs the program while
    it still holds root's capabilities (a path through /root resolves for it), so a shell
    between makes that exec the user's own, as every later one is."""
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--inh-caps=-all", "--", "/bin/sh", "-c", 'exec "$@"', "sh"]  # fmt: skip


def _user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", USER], check=True)  # fmt: skip
        return pwd.getpwnam(USER)


def _interpreter(uid: int, gid: int) -> str:
    """An interpreter of this Python version the user may run: the tests' own base
    interpreter, else the system's python3."""
    wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                      shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):  # fmt: skip
        if not candidate:
            continue
        probe = subprocess.run(
            [*as_user(uid, gid), candidate, "-c",
             "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
            capture_output=True, text=True, check=False, cwd="/",
        )  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip() == wanted:
            return candidate
    pytest.skip(f"no python{wanted} the user {USER} may run")


def _importable(venv: Path, uid: int, gid: int) -> bool:
    probe = subprocess.run(
        [*as_user(uid, gid), str(venv / "bin" / "python"), "-c",
         "import gatekeeper, pygit2, pydantic, yaml"],
        capture_output=True, check=False, cwd="/",
    )  # fmt: skip
    return probe.returncode == 0


def user_python(venv: Path, uid: int, gid: int) -> Path:
    """A virtual environment the user may run that imports this checkout and its dependencies
    (in place when the user can read them, else from a copy in venv)."""
    subprocess.run([_interpreter(uid, gid), "-m", "venv", "--without-pip", str(venv)],
                   check=True)  # fmt: skip
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    pth = venv / "lib" / version / "site-packages" / "checkout.pth"
    site = Path(sysconfig.get_paths()["purelib"])
    pth.write_text(f"{CHECKOUT}\n{site}\n")
    for path in [venv, *venv.rglob("*")]:
        os.lchown(path, uid, gid)
    if not _importable(venv, uid, gid):
        copy = venv / "copy"
        shutil.copytree(CHECKOUT / "gatekeeper", copy / "src" / "gatekeeper")
        shutil.copytree(site, copy / "site", ignore=shutil.ignore_patterns("__editable__*"))
        pth.write_text(f"{copy / 'src'}\n{copy / 'site'}\n")
        for path in [copy, *copy.rglob("*")]:
            os.lchown(path, uid, gid)
    return venv / "bin" / "python"


def needs_root_for_users() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("useradd") is None:
        pytest.skip("needs root (to make the user), setpriv and useradd")


def make_user(policy: str | None = None) -> Iterator[AsUser]:
    """A user of its own with HOME, signing key and a repository it owns (gatekeeper init'ed,
    its key in the trust file), made with the real command line run as that user."""
    needs_root_for_users()
    pw = _user()
    root = Path(tempfile.mkdtemp(prefix="gk-unpriv-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        home = root / "home"
        home.mkdir()
        os.chown(root, pw.pw_uid, pw.pw_gid)
        (home / ".gitconfig").write_text("[user]\n\tname = U\n\temail = u@example.invalid\n"
                                         "[init]\n\tdefaultBranch = main\n")  # fmt: skip
        for path in [home, *home.rglob("*")]:
            os.lchown(path, pw.pw_uid, pw.pw_gid)
        python = user_python(root / "venv", pw.pw_uid, pw.pw_gid)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "GATEKEEPER_HOME": str(home / ".config" / "gatekeeper"),
            "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
            "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"), "GIT_CONFIG_NOSYSTEM": "1",
        }  # fmt: skip
        repo = root / "repo"
        user = AsUser(pw.pw_uid, pw.pw_gid, root, repo, env, python)
        made = user.run("mkdir", str(repo))
        assert made.returncode == 0, made.stderr
        user.git("init", "-q", "-b", "main")
        for name, text in {"README.md": "# demo\n", "src/app.py": "print('hi')\n"}.items():
            step = user.run("sh", "-c", 'mkdir -p "$(dirname "$1")" && printf %s "$2" > "$1"',
                            "sh", str(repo / name), text)  # fmt: skip
            assert step.returncode == 0, step.stderr
        for step_args in (("keys", "generate"), ("init", "--repo", str(repo), "--no-hooks")):
            proc = user.gk(*step_args)
            assert proc.returncode == 0, proc.stderr
        if policy is not None:
            written = user.run("sh", "-c", 'printf %s "$2" > "$1"', "sh",
                               str(repo / ".gatekeeper" / "policy.yaml"), policy)  # fmt: skip
            assert written.returncode == 0, written.stderr
        user.git("add", "-A")
        user.git("commit", "-q", "-m", "initial")
        yield user
    finally:
        shutil.rmtree(root, ignore_errors=True)
