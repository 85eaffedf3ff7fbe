"""Everyday toolchains work inside a run under the default policy, with no escalation.

HOME is where the user has it (the tests' HOME, which holds the worktrees by default) or
under /tmp, as in CI containers.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from gatekeeper.run import layers

from conftest import REAL_HOME, git, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox, pytest.mark.slow]


@pytest.fixture(params=["home", "tmp-home"])
def home(request: pytest.FixtureRequest, isolated_home: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    if request.param == "home":
        yield isolated_home
        return
    folder = Path(tempfile.mkdtemp(prefix="gk-home-", dir="/tmp"))
    for name in (".gitconfig",):
        shutil.copy(isolated_home / name, folder / name)
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(folder / ".gitconfig"))
    monkeypatch.setenv("GATEKEEPER_HOME", str(folder / ".config" / "gatekeeper"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(folder / ".local" / "share"))
    yield folder
    layers.unmount_below(folder)  # the runs' layered worktrees
    shutil.rmtree(folder, ignore_errors=True)


def tool_env() -> dict[str, str]:
    """The toolchains of the machine's own user, as a user's environment points at them."""
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    for name, folder in (("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo")):
        real = Path(REAL_HOME) / folder
        if REAL_HOME and real.is_dir():
            env[name] = str(real)
    return env


def run_ok(repo: Path, script: str, timeout: float = 600) -> dict[str, object]:
    proc, data = run_json(repo, "sh", "-c", script, timeout=timeout, env=tool_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert data is not None
    # A tool may try to write into its own installation, shown read-only (cargo's lock files
    # in CARGO_HOME): refused and recorded (a `write` decision point), and the tool still
    # works; and it may look for its credentials there (a `secret` one). Nothing else.
    # The venv on PATH is one such installation (pytest's plugins' bytecode, say).
    toolchains = [v for k, v in tool_env().items() if k != "PATH"] + [sys.prefix + "/"]
    stray = [w for w in data["denied_writes"] if not any(w.startswith(t) for t in toolchains)]
    assert stray == [], data["denied_writes"]
    others = [e for e in data["escalations"] if e["kind"] not in ("write", "secret")
              or not any(e["value"].startswith(t) for t in toolchains)]  # fmt: skip
    assert others == [], data["escalations"]
    assert data["denied_commands"] == [], data["denied_commands"]
    return data


def test_python_pytest_venv_and_pip_from_local_wheels(home: Path, tmp_path: Path) -> None:
    from conftest import gk

    assert gk("keys", "generate").returncode == 0
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pkg = tmp_path / "pkg"
    (pkg / "tinypkg").mkdir(parents=True)
    (pkg / "tinypkg" / "__init__.py").write_text("VALUE = 42\n")
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "flit_core.buildapi"\n'
        '[project]\nname = "tinypkg"\nversion = "1.0"\ndescription = "t"\n'
    )
    # A wheel is a zip; build it by hand so no build backend is needed.
    import zipfile

    wheel = wheels / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("tinypkg/__init__.py", "VALUE = 42\n")
        z.writestr("tinypkg-1.0.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")  # fmt: skip
        z.writestr("tinypkg-1.0.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n")  # fmt: skip
        z.writestr("tinypkg-1.0.dist-info/RECORD", "")
    repo = make_repo(tmp_path / "repo", files={
        "test_app.py": "def test_ok():\n    assert 1 + 1 == 2\n", "README.md": "r\n"})  # fmt: skip
    shutil.copytree(wheels, repo / "wheels")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "wheels")
    python = Path(sys.base_prefix) / "bin" / "python3"
    python = python if python.exists() else Path("/usr/bin/python3")
    data = run_ok(repo, (
        "python -m pytest -q -p no:cacheprovider test_app.py && "
        f"{python} -m venv .venv-run && .venv-run/bin/pip install -q --no-index "
        "--find-links wheels tinypkg && .venv-run/bin/python -c 'import tinypkg; "
        "assert tinypkg.VALUE == 42' && rm -rf .venv-run"))  # fmt: skip
    assert data["exit_code"] == 0


@pytest.mark.skipif(not shutil.which("npm"), reason="npm is not installed")
def test_npm_install_of_a_local_package_and_npm_test(home: Path, tmp_path: Path) -> None:
    from conftest import gk

    assert gk("keys", "generate").returncode == 0
    repo = make_repo(tmp_path / "repo", files={
        "package.json": '{"name": "app", "version": "1.0.0", "scripts": {"test": '
                        '"node -e \\"require(\'dep\'); console.log(\'ok\')\\""}, '
                        '"dependencies": {"dep": "file:./vendor/dep"}}\n',
        "vendor/dep/package.json": '{"name": "dep", "version": "1.0.0", "main": "index.js"}\n',
        "vendor/dep/index.js": "module.exports = 1;\n",
        ".gitignore": "node_modules/\n",
    })  # fmt: skip
    run_ok(repo, "npm install --no-audit --no-fund --offline && npm test")


@pytest.mark.skipif(not shutil.which("cargo"), reason="cargo is not installed")
def test_cargo_build_offline(home: Path, tmp_path: Path) -> None:
    from conftest import gk

    assert gk("keys", "generate").returncode == 0
    repo = make_repo(tmp_path / "repo", files={
        "Cargo.toml": '[package]\nname = "app"\nversion = "0.1.0"\nedition = "2021"\n',
        "src/main.rs": 'fn main() { println!("hi"); }\n', ".gitignore": "target/\n",
    })  # fmt: skip
    cargo = shutil.which("cargo")
    run_ok(repo, f"{cargo} build --offline -q && ./target/debug/app")


def test_make_with_a_c_compiler_and_git_inside(home: Path, tmp_path: Path) -> None:
    from conftest import gk

    assert gk("keys", "generate").returncode == 0
    repo = make_repo(tmp_path / "repo", files={
        "Makefile": "hello: hello.c\n\tcc -o hello hello.c\n",
        "hello.c": '#include <stdio.h>\nint main(void){puts("hi");return 0;}\n',
        ".gitignore": "hello\n",
    })  # fmt: skip
    data = run_ok(repo, "make -s && ./hello && echo x >> hello.c && git add hello.c && "
                        "git commit -q -m 'edit' && git log --oneline -1 && git diff HEAD~1 --stat")  # fmt: skip
    assert data["agent_commits"]


@pytest.mark.skipif(not shutil.which("javac"), reason="javac is not installed")
def test_javac_and_java(home: Path, tmp_path: Path) -> None:
    from conftest import gk

    assert gk("keys", "generate").returncode == 0
    repo = make_repo(tmp_path / "repo", files={
        "Hello.java": 'class Hello { public static void main(String[] a) '
                      '{ System.out.println("hi"); } }\n',
        ".gitignore": "*.class\n",
    })  # fmt: skip
    run_ok(repo, "javac Hello.java && java Hello")


def test_tools_write_caches_and_state_in_home(home: Path, tmp_path: Path) -> None:
    from conftest import gk

    assert gk("keys", "generate").returncode == 0
    repo = make_repo(tmp_path / "repo")
    run_ok(repo, "mkdir -p ~/.aider ~/.local/state/x ~/.cache/pip ~/.npm && "
                 "echo s > ~/.aider/history && touch ~/.newfile && ls -a ~ >/dev/null")  # fmt: skip
