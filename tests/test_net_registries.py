"""Registries come from the policy, the user's own package-manager configuration and what the
installed package managers report (asked outside the sandbox, never in the repository)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gatekeeper.sandbox.net import installed
from gatekeeper.sandbox.net.registries import discover_registries, registry_sources, rule_for


def hosts(rules: list) -> dict[str, set[int] | None]:  # type: ignore[type-arg]
    return {r.host: set(r.ports) if r.ports else None for r in rules}


def test_rule_for_urls_and_hosts() -> None:
    assert hosts([rule_for("https://pkgs.test/simple/")]) == {"pkgs.test": {80, 443}}
    assert hosts([rule_for("http://pkgs.test:8080/simple")]) == {"pkgs.test": {80, 443, 8080}}
    assert hosts([rule_for("sparse+https://crates.test/index/")]) == {"crates.test": {80, 443}}
    assert hosts([rule_for("mirror.test:8443")]) == {"mirror.test": {8443}}
    assert rule_for("*.corp.test") is None  # a registry names one host, never a pattern
    assert rule_for("https://*.corp.test/") is None
    assert rule_for("file:///srv/wheels") is None
    assert rule_for("./wheels") is None
    assert rule_for("") is None


def test_each_package_manager_configuration_is_read(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(
        "[global]\nindex-url = https://pip-user.test/simple\n"
        "extra-index-url =\n    https://pip-extra1.test/simple\n    https://pip-extra2.test/simple\n"
        "[install]\ntrusted-host = pip-trusted.test\n"
    )
    (home / ".pip").mkdir()
    (home / ".pip" / "pip.conf").write_text("[global]\nfind-links = https://pip-legacy.test/\n")
    (home / ".npmrc").write_text(
        "registry=https://npm-user.test/\n@corp:registry=https://npm-scope.test/\n"
        "//npm-user.test/:_authToken=not-a-host\n"
    )
    (home / ".cargo").mkdir()
    (home / ".cargo" / "config.toml").write_text(
        '[source.crates-io]\nreplace-with = "mirror"\n'
        '[source.mirror]\nregistry = "sparse+https://cargo-mirror.test/index/"\n'
        '[registries.corp]\nindex = "https://cargo-corp.test/git/index"\n'
    )
    (home / ".config" / "uv").mkdir()
    (home / ".config" / "uv" / "uv.toml").write_text(
        '[[index]]\nurl = "https://uv-index.test/simple"\n'
    )
    (home / ".config" / "pypoetry").mkdir()
    (home / ".config" / "pypoetry" / "config.toml").write_text(
        '[repositories.corp]\nurl = "https://poetry-src.test/simple/"\n'
    )
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CONFIG_DIRS": str(tmp_path / "no-xdg"),
        "PIP_INDEX_URL": "https://pip-env.test/simple",
        "PIP_EXTRA_INDEX_URL": "https://pip-env-extra.test/a https://pip-env-extra2.test/b",
        "NPM_CONFIG_REGISTRY": "https://npm-env.test/",
        "CARGO_REGISTRIES_OTHER_INDEX": "https://cargo-env.test/index",
        "UV_INDEX_URL": "https://uv-env.test/simple",
    }
    found = set(hosts(discover_registries(["policy-registry.test"], env)))
    expected = {
        "policy-registry.test",
        "pip-user.test", "pip-extra1.test", "pip-extra2.test", "pip-trusted.test",
        "pip-legacy.test", "pip-env.test", "pip-env-extra.test", "pip-env-extra2.test",
        "npm-user.test", "npm-scope.test", "npm-env.test",
        "cargo-mirror.test", "cargo-corp.test", "cargo-env.test",
        "uv-index.test", "uv-env.test", "poetry-src.test",
    }  # fmt: skip
    assert expected <= found
    assert not any("authtoken" in h or "not-a-host" in h for h in found)


def test_broken_configuration_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / ".npmrc").write_bytes(b"\xff\xfe not text")
    (tmp_path / ".cargo").mkdir()
    (tmp_path / ".cargo" / "config.toml").write_text("[[[ not toml")
    (tmp_path / ".pip").mkdir()
    (tmp_path / ".pip" / "pip.conf").write_text("no section header\n")
    env = {
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "x"),
        "XDG_CONFIG_DIRS": "/nonexistent",
    }
    found = discover_registries(["policy.test"], env)  # does not raise
    assert "policy.test" in hosts(found)


# --- what the installed package managers report -------------------------------------------------


def tool_env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(home), **extra}


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_npm_is_asked_for_its_registries_and_never_in_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".npmrc").write_text(
        "registry=https://npm-user.test/\n@corp:registry=https://npm-scope.test/\n"
    )
    project = tmp_path / "worktree"  # what an agent could commit, and the launcher's cwd
    project.mkdir()
    (project / "package.json").write_text("{}\n")
    (project / ".npmrc").write_text("registry=https://evil.test/\n@x:registry=https://evil.test/\n")
    monkeypatch.chdir(project)
    found = installed.npm_registries(installed.clean_env(tool_env(home)))
    assert {urlsplit(u).hostname for u in found} == {"npm-user.test", "npm-scope.test"}


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_npms_own_default_registry_is_what_npm_reports(tmp_path: Path) -> None:
    env = installed.clean_env(tool_env(tmp_path))
    reported = subprocess.run(
        ["npm", "config", "get", "registry"], capture_output=True, text=True, env=env, cwd="/",
        timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    rule = rule_for(reported)
    assert rule is not None
    assert rule in registry_sources([], tool_env(tmp_path))["npm"]


def _super_pom_urls(mvn: str) -> set[str]:
    """The test's own reading of the installed maven's super-POM: every <url> in it."""
    lib = Path(os.path.realpath(mvn)).parent.parent / "lib"
    urls: set[str] = set()
    for jar in lib.glob("maven-model-builder-*.jar"):
        with zipfile.ZipFile(jar) as zf:
            text = zf.read("org/apache/maven/model/pom-4.0.0.xml").decode()
        urls |= set(re.findall(r"<url>\s*([^<\s]+)\s*</url>", text))
    return urls


@pytest.mark.skipif(shutil.which("mvn") is None, reason="maven is not installed")
def test_maven_central_from_the_super_pom_and_the_users_mirrors(tmp_path: Path) -> None:
    mvn = shutil.which("mvn")
    assert mvn
    central = _super_pom_urls(mvn)
    if not central:
        pytest.skip("this maven keeps its super-POM elsewhere")
    (tmp_path / ".m2").mkdir()
    (tmp_path / ".m2" / "settings.xml").write_text(
        '<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0"><mirrors>'
        "<mirror><id>corp</id><mirrorOf>*</mirrorOf><url>https://maven-mirror.test/m2</url></mirror>"
        "<mirror><id>off</id><mirrorOf>x</mirrorOf><url>http://blocked.test/</url>"
        "<blocked>true</blocked></mirror>"
        "</mirrors></settings>"
    )
    found = installed.maven_registries(installed.clean_env(tool_env(tmp_path)))
    assert central <= set(found)
    assert "https://maven-mirror.test/m2" in found
    assert "http://blocked.test/" not in found  # a blocked mirror is never used


def test_cargo_index_folders_and_their_download_hosts(tmp_path: Path) -> None:
    index = tmp_path / "cargo" / "registry" / "index"
    (index / "cargo-index.test-0123456789abcdef" / ".cache").mkdir(parents=True)
    (index / "cargo-index.test-0123456789abcdef" / ".cache" / "config.json").write_text(
        '{"dl": "https://cargo-dl.test/crates", "api": "https://cargo-api.test"}'
    )
    (index / "forge.test-fedcba9876543210" / ".git").mkdir(parents=True)  # a git index
    (index / "not-a-cargo-folder").mkdir()
    env = {"HOME": str(tmp_path), "CARGO_HOME": str(tmp_path / "cargo")}
    found = {r.host for r in registry_sources([], env).get("cargo", [])}
    assert found == {"cargo-index.test", "cargo-dl.test"}  # no forge, no publishing api


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not installed")
def test_go_proxies_and_checksum_database_are_what_go_env_reports(tmp_path: Path) -> None:
    env = tool_env(
        tmp_path,
        GOPROXY="https://goproxy.test|https://goproxy2.test,direct",
        GOSUMDB="sum.test+abcd https://sumdb.test/",
        GONOSUMDB="private.test/*",
    )
    found = {r.host for r in registry_sources([], env).get("go", [])}
    assert found == {"goproxy.test", "goproxy2.test", "sumdb.test"}


def test_a_tool_that_is_missing_or_no_path_adds_nothing(tmp_path: Path) -> None:
    assert installed.tool_registries({"HOME": str(tmp_path)}) == {
        name: [] for name in installed.TOOLS
    }
    empty = tmp_path / "bin"
    empty.mkdir()
    assert installed.tool_registries({"PATH": str(empty), "HOME": str(tmp_path)}) == {
        name: [] for name in installed.TOOLS
    }


def test_a_program_named_like_a_tool_in_the_current_directory_is_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    for name in ("npm", "go", "python3", "mvn"):
        (tmp_path / name).write_text(f"#!/bin/sh\ntouch {marker}\necho https://evil.test/\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.chdir(tmp_path)  # as if the launcher ran in a checkout holding these
    for path in (".", "", "bin:."):
        found = installed.tool_registries({"PATH": path, "HOME": str(tmp_path)})
        assert not any(found.values()) and not marker.exists()


def test_no_program_in_the_worktree_is_asked_even_when_path_leads_there(tmp_path: Path) -> None:
    from gatekeeper.policy.model import Policy
    from gatekeeper.sandbox.net import NetworkSession

    worktree = tmp_path / "worktree"
    marker = tmp_path / "ran"
    bins = [worktree / ".venv" / "bin", worktree / "node_modules" / ".bin"]
    for folder in bins:
        folder.mkdir(parents=True)
        for name in ("npm", "go", "python3", "python", "mvn", "pip"):
            (folder / name).write_text(f"#!/bin/sh\ntouch {marker}\necho https://evil.test/\n")
            (folder / name).chmod(0o755)
    linked = tmp_path / "bin"  # a folder outside that links into the worktree
    linked.mkdir()
    (linked / "npm").symlink_to(bins[1] / "npm")
    path = os.pathsep.join([*map(str, bins), str(linked), "/usr/bin", "/bin"])
    session = NetworkSession(
        Policy.model_validate({"network": {"package_registry": "allow"}}),
        grants=[],
        ask="never",
        run_dir=tmp_path / "run",
        project=worktree,
        env={"PATH": path, "HOME": str(tmp_path / "home")},
    )
    assert not marker.exists()
    assert "evil.test" not in {r.host for r in session.rules.registries}


def test_a_relative_or_worktree_config_path_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "checkout"  # the launcher's cwd: a checkout with committed files
    worktree = tmp_path / "worktree"
    for folder in (checkout, worktree):
        (folder / ".cargo").mkdir(parents=True)
        (folder / "pip.conf").write_text("[global]\nindex-url = https://evil.test/simple\n")
        (folder / ".npmrc").write_text("registry=https://evil.test/\n")
        (folder / ".cargo" / "config.toml").write_text('[registry]\nindex = "https://evil.test/"\n')
    monkeypatch.chdir(checkout)
    for env in (
        {"PIP_CONFIG_FILE": "pip.conf", "NPM_CONFIG_USERCONFIG": ".npmrc", "CARGO_HOME": ".cargo"},
        {"HOME": ".", "XDG_CONFIG_DIRS": ".:pip"},
        {"PIP_CONFIG_FILE": str(worktree / "pip.conf"), "HOME": str(worktree),
         "NPM_CONFIG_USERCONFIG": str(worktree / ".npmrc"), "CARGO_HOME": str(worktree / ".cargo")},
    ):  # fmt: skip
        found = registry_sources([], env, avoid=[worktree])
        assert not any(r.host == "evil.test" for rules in found.values() for r in rules), env


def test_tools_are_asked_once_per_process_and_a_hanging_one_is_abandoned(tmp_path: Path) -> None:
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "count"
    # A package manager that answers slowly and one that never answers.
    (bin_dir / "npm").write_text(
        f'#!/bin/sh\necho x >> {count}\necho \'{{"registry": "https://npm-slow.test/"}}\'\n'
    )
    (bin_dir / "go").write_text("#!/bin/sh\nexec sleep 60\n")
    for name in ("npm", "go"):
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    started = time.monotonic()
    first = installed.tool_registries(env)
    assert time.monotonic() - started < installed.DEADLINE + 2
    assert first["npm"] == ["https://npm-slow.test/"] and first["go"] == []
    assert installed.tool_registries(env) == first
    assert count.read_text() == "x\n"  # asked once
