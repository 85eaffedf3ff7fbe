"""Registries come from the policy and from the user's own package-manager configuration."""

from __future__ import annotations

from pathlib import Path

from gatekeeper.sandbox.net.registries import discover_registries, rule_for


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
