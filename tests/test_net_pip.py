"""`pip install` under the default policy: pip's index is a package registry, a decision point.

Nothing leaves this machine. The sessions and runs live in the isolated `outer` namespace
(net_ns.py), which has no route off the machine, and a pending or refused name is never
looked up. The registry that does answer is a PEP 503 index over a wheel the test builds,
served in the `remote` namespace under a made-up name that only the launcher's own mount
namespace resolves (an /etc/hosts of the test's, bound over the real one by `unshare`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from net_ns import REMOTE_V4, IsolatedNet
from net_sandbox import SessionFactory, answered_tty, needs_netns, run_inside
from net_servers import RecordingHTTPServer

from gatekeeper.sandbox.net.installed import PIP_QUERY, clean_env

from conftest import make_repo

pytest_plugins = ["net_fixtures"]
pytestmark = [needs_netns, pytest.mark.sandbox]

REGISTRY = "registry.test"  # made up; resolved only by the test's own /etc/hosts
DEFAULT_POLICY = "network: {localhost: deny, package_registry: ask, arbitrary_web: deny, internal_services: deny}\n"  # noqa: E501


def pip_reports() -> list[str]:
    """What the python3 on PATH says pip's default index and file host are (asked, not sent)."""
    python = shutil.which("python3")
    if python is None:
        pytest.skip("no python3 on PATH")
    proc = subprocess.run(
        [python, "-c", PIP_QUERY], capture_output=True, text=True, cwd="/",
        env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}, timeout=30, check=False,
    )  # fmt: skip
    lines = proc.stdout.split()
    if proc.returncode != 0 or len(lines) < 2:
        pytest.skip("the python3 on PATH has no pip")
    return lines


def default_index_host() -> str:
    host = urlsplit(pip_reports()[0]).hostname
    assert host
    return host


def wheel(folder: Path, name: str = "six", version: str = "99.0") -> Path:
    """A tiny pure-Python wheel with one module that prints INSTALLED when imported."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": b"print('INSTALLED')\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = ""
    for file, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{file},sha256={digest},{len(data)}\n"
    record += f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for file, data in files.items():
            zf.writestr(file, data)
        zf.writestr(f"{info}/RECORD", record)
    return path


def simple_index(whl: Path, project: str = "six") -> dict[str, bytes]:
    """A PEP 503 index (root and project page) and the wheel, as server paths."""
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    link = f'<a href="/files/{whl.name}#sha256={digest}">{whl.name}</a>'
    return {
        "/simple/": f'<a href="/simple/{project}/">{project}</a>'.encode(),
        f"/simple/{project}/": f"<!DOCTYPE html><html><body>{link}</body></html>".encode(),
        f"/files/{whl.name}": whl.read_bytes(),
    }


@pytest.fixture
def registry(outer: IsolatedNet, tmp_path: Path) -> Iterator[RecordingHTTPServer]:
    files = simple_index(wheel(tmp_path))
    with outer.inside("remote"):
        server = RecordingHTTPServer((REMOTE_V4, 0), files=files).start()
    yield server
    server.close()


def pip_install(index: str | None, trusted: str | None = None) -> list[str]:
    """`pip install six` into /tmp/site and import it; the index pip's own default if None."""
    argv = [
        "python3", "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--retries", "0",
        "--timeout", "10", "--disable-pip-version-check", "--target", "/tmp/site",
    ]  # fmt: skip
    if index:
        argv += ["--index-url", index]
    if trusted:
        argv += ["--trusted-host", trusted]
    return [*argv, "six"]


# --- the installed pip's own default index ------------------------------------------------------


def test_the_installed_pips_default_index_and_file_host_are_registries() -> None:
    from gatekeeper.sandbox.net.registries import registry_sources

    index, file_host = pip_reports()[:2]
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    found = {r.host for r in registry_sources([], env).get("pip", [])}
    assert {urlsplit(index).hostname, file_host} <= found


def test_pip_install_from_the_default_index_is_a_pending_registry_escalation(
    start_session: SessionFactory,
) -> None:
    """The issue: `pip install six` under the default policy was refused as arbitrary_web."""
    host = default_index_host()
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    session, setup = start_session(
        {"package_registry": "ask", "arbitrary_web": "deny"}, env=env, ask="never"
    )
    proc = run_inside(setup, ["sh", "-c", " ".join(pip_install(None))], timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    requests, escalations = session.recorder.snapshot()
    assert requests, proc.stderr
    assert all(r.host == host for r in requests)  # nothing else was tried
    assert {r.category for r in requests} == {"package_registry"}
    assert all(r.decision != "allow" for r in requests)
    assert [(e.kind, e.value, e.decision) for e in escalations] == [
        ("network", f"{host}:443", "pending")
    ]


def test_the_tools_are_asked_with_a_clean_environment_and_never_in_the_repository(
    tmp_path: Path,
) -> None:
    from gatekeeper.sandbox.net.installed import ask_tool

    env = clean_env(
        {"PATH": os.environ["PATH"], "HOME": "/h", "https_proxy": "http://x", "LD_PRELOAD": "x",
         "PIP_INDEX_URL": "http://i", "NPM_CONFIG__AUTHTOKEN": "secret", "GOPROXY": "http://g"}
    )  # fmt: skip
    assert "https_proxy" not in env and "LD_PRELOAD" not in env
    assert "NPM_CONFIG__AUTHTOKEN" not in env
    assert env["PIP_INDEX_URL"] == "http://i" and env["GOPROXY"] == "http://g"
    os.chdir(tmp_path)  # the launcher's own cwd is not where a tool runs
    assert ask_tool(["sh", "-c", "pwd"], env) == "/\n"
    assert ask_tool(["sh", "-c", "sleep 30"], env, timeout=0.5) is None
    started = time.monotonic()  # a descendant in a session of its own keeps the pipe open
    assert ask_tool(["sh", "-c", "setsid sleep 5 & echo x"], env, timeout=0.5) is None
    assert time.monotonic() - started < 3
    assert ask_tool(["sh", "-c", "exit 3"], env) is None
    assert ask_tool([str(tmp_path / "missing-tool")], env) is None


# --- `gatekeeper run` with the user's configured index ------------------------------------------


def gk_resolving(
    hosts: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `gatekeeper` in a mount namespace of its own where hosts is /etc/hosts."""
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(hosts)]
    return subprocess.run(
        [*argv, sys.executable, "-m", "gatekeeper", *args], env={**os.environ, **(env or {})},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def receipt(hosts: Path, repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk_resolving(hosts, "receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


@pytest.fixture
def users_pip(
    isolated_home: Path, registry: RecordingHTTPServer, tmp_path: Path
) -> tuple[str, Path]:
    """The user's own pip.conf names the registry; returns (its index URL, an /etc/hosts)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to give the launcher its own /etc/hosts")
    index = f"http://{REGISTRY}:{registry.port}/simple/"
    conf = isolated_home / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"[global]\nindex-url = {index}\ntrusted-host = {REGISTRY}:{registry.port}\n")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{REMOTE_V4} {REGISTRY}\n")
    return index, hosts


def run_pip(
    hosts: Path, repo: Path, index: str, *extra: str
) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    install = " ".join(pip_install(index, urlsplit(index).netloc))
    # `;`, not `&&`: a version manager's shim may fail after pip succeeded (it cannot rehash);
    # the tests read pip's own output and the module's, never the exit code.
    script = f"{install}; PYTHONPATH=/tmp/site python3 -c 'import six'"
    proc = gk_resolving(
        hosts, "run", "--repo", str(repo), "--json", *extra, "--", "sh", "-c", script
    )
    return proc, json.loads(proc.stdout) if proc.stdout.strip() else {}


@pytest.mark.slow
def test_default_policy_makes_the_configured_index_a_pending_escalation(
    tmp_path: Path, key: Path, outer: IsolatedNet, registry: RecordingHTTPServer,
    users_pip: tuple[str, Path],
) -> None:  # fmt: skip
    index, hosts = users_pip
    repo = make_repo(tmp_path / "r", policy=DEFAULT_POLICY)
    outer.assert_inside()
    proc, data = run_pip(hosts, repo, index)
    assert "No matching distribution found for six" in proc.stderr, proc.stderr
    assert "INSTALLED" not in proc.stderr
    assert registry.requests == []  # refused before it was even looked up
    where = f"{REGISTRY}:{registry.port}"
    assert {"kind": "network", "value": where, "decision": "pending"}.items() <= next(
        e for e in data["escalations"] if e["value"] == where
    ).items()
    summary = gk_resolving(
        hosts, "run", "--repo", str(repo), "--", "sh", "-c", " ".join(pip_install(index, where))
    ).stderr
    assert f'pending   network `{where}` needs approval: rerun with --grant network="{where}"' in (
        summary
    ), summary
    assert registry.requests == []
    pred = receipt(hosts, repo, data["commit"])
    # pip's HTTP library looks for ~/.netrc: one secret decision point, however often.
    assert [(e["kind"], e["value"], e["decision"]) for e in pred["escalations"]
            if e["kind"] != "secret"] == [("network", where, "pending")]  # fmt: skip
    assert [e["value"] for e in pred["escalations"] if e["kind"] == "secret"] in (
        [], [f"{os.environ['HOME']}/.netrc"])  # fmt: skip
    assert {(n["host"], n["category"]) for n in pred["network"]} == {(REGISTRY, "package_registry")}
    assert all(n["decision"] != "allow" for n in pred["network"])
    # The receipt says which registries were found, and from where.
    assert any(REGISTRY in line for line in pred["sandbox"]["registries"]), pred["sandbox"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["grant", "policy"])
def test_granted_or_allowed_registry_installs_through_the_proxy(
    tmp_path: Path, key: Path, outer: IsolatedNet, registry: RecordingHTTPServer,
    users_pip: tuple[str, Path], how: str,
) -> None:  # fmt: skip
    index, hosts = users_pip
    where = f"{REGISTRY}:{registry.port}"
    policy = DEFAULT_POLICY.replace("package_registry: ask", "package_registry: allow")
    repo = make_repo(tmp_path / "r", policy=policy if how == "policy" else DEFAULT_POLICY)
    extra = ["--grant", f"network={where}"] if how == "grant" else []
    outer.assert_inside()
    proc, data = run_pip(hosts, repo, index, *extra)
    assert "Successfully installed six-99.0" in proc.stderr, proc.stderr
    assert "INSTALLED" in proc.stderr  # the module pip put in /tmp/site, not a system one
    assert [r[1] for r in registry.requests] == ["/simple/six/", "/files/six-99.0-py3-none-any.whl"]
    pred = receipt(hosts, repo, data["commit"])
    assert {(n["host"], n["category"], n["decision"]) for n in pred["network"]} == {
        (REGISTRY, "package_registry", "allow")
    }
    assert [n["path"] for n in pred["network"]] == [
        "/simple/six/",
        "/files/six-99.0-py3-none-any.whl",
    ]
    pending = [e for e in pred["escalations"] if e["decision"] == "pending"]
    # pip's HTTP library looks for ~/.netrc: one secret decision point, however often.
    assert [e["value"] for e in pending] in ([], [f"{os.environ['HOME']}/.netrc"])


@pytest.mark.skipif(
    os.environ.get("GATEKEEPER_TEST_REAL_INDEX") != "1",
    reason="set GATEKEEPER_TEST_REAL_INDEX=1 to check this machine's own pip configuration",
)
def test_the_machines_real_pip_index_is_discovered_without_contacting_it() -> None:
    """With the machine's real environment and HOME: whatever index pip is set to use (its
    configuration, else its default) is a registry. Nothing is fetched: only pip is asked."""
    import pwd

    from gatekeeper.sandbox.net.registries import discover_registries

    real = {**os.environ, "HOME": pwd.getpwuid(os.getuid()).pw_dir}
    real.pop("XDG_CONFIG_HOME", None)  # the tests' own; the machine's user has theirs
    proc = subprocess.run(
        ["python3", "-m", "pip", "config", "get", "global.index-url"], capture_output=True,
        text=True, env=clean_env(real), cwd="/", timeout=60, check=False,
    )  # fmt: skip
    index = proc.stdout.strip() if proc.returncode == 0 else pip_reports()[0]
    host = urlsplit(index).hostname
    assert host in {r.host for r in discover_registries([], real)}


def test_ask_tty_asks_about_the_registry_and_pip_installs_once_approved(
    start_session: SessionFactory, registry: RecordingHTTPServer, tmp_path: Path
) -> None:

    home = tmp_path / "user"
    (home / ".config" / "pip").mkdir(parents=True)
    where = f"{REGISTRY}:{registry.port}"
    index = f"http://{where}/simple/"
    (home / ".config" / "pip" / "pip.conf").write_text(f"[global]\nindex-url = {index}\n")
    with answered_tty(b"y\n") as (tty, prompts):
        session, setup = start_session(
            {"package_registry": "ask", "arbitrary_web": "deny"},
            ask="tty",
            tty_path=tty,
            names={REGISTRY: [REMOTE_V4]},
            env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")},
        )
        install = " ".join(pip_install(index, where))
        proc = run_inside(setup, ["sh", "-c", install], timeout=120)
    assert "Successfully installed six-99.0" in proc.stdout, proc.stdout + proc.stderr
    assert f"{where} (package_registry".encode() in prompts[0]
    requests, escalations = session.recorder.snapshot()
    assert {(r.host, r.category, r.decision) for r in requests} == {
        (REGISTRY, "package_registry", "allow")
    }
    assert [(e.value, e.decision) for e in escalations] == [(where, "granted")]
