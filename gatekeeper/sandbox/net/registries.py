"""Package registries: the policy's, the user's configuration's and the installed tools' own.

No registry is built in: the hosts come from the policy's `network.registries`, from pip,
npm/yarn, cargo, uv and poetry configuration (environment variables and the user's and the
system's own files), and from what the installed pip, npm, go, maven and cargo report they use
or fall back to (installed.py). Files in the repository (its .npmrc, pyproject.toml,
uv.toml, .cargo/config.toml, .yarnrc.yml) are never read, and no tool is asked there: an
agent can commit them, and the next run would then reach whatever host it named as a package
registry. Each entry names exactly one host; a wildcard
(`*.example`) is never a registry. Unreadable or malformed files are skipped: they can only
add registries, never remove a policy decision.
"""

from __future__ import annotations

import configparser
import os
import pwd
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gatekeeper.sandbox.net.classify import HostRule, normalize_host, parse_host_port
from gatekeeper.sandbox.net.installed import is_under, tool_registries

DEFAULT_PORTS = frozenset({80, 443})


def rule_for(entry: str) -> HostRule | None:
    """A registry rule from a URL (`https://host[:port]/...`, `sparse+https://...`) or a host."""
    entry = entry.strip().strip("\"'")
    if not entry or entry.startswith(("file:", "/", ".")):
        return None
    if "://" in entry:
        parts = urlsplit(entry.split("+", 1)[1] if entry.split("://")[0].count("+") else entry)
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            return None
        if not host or "*" in host:
            return None
        ports = DEFAULT_PORTS | ({port} if port else set())
        return HostRule(normalize_host(host), frozenset(ports))
    try:
        rule = parse_host_port(entry.split("/", 1)[0])
    except ValueError:
        return None
    if "*" in rule.host:
        return None  # a registry entry names exactly one host, never a pattern
    return rule if rule.ports else HostRule(rule.host, DEFAULT_PORTS)


def _split(value: str) -> list[str]:
    return [v for v in re.split(r"[\s,]+", value) if v]


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) if os.path.isabs(home) else Path(pwd.getpwuid(os.getuid()).pw_dir)


# Variables that name files or folders to read. A relative one would be read from the
# launcher's current directory (often a checkout of the repository), one under avoid from
# the run's worktree: both hold files an agent can commit.
_PATH_VARIABLES = ("HOME", "PIP_CONFIG_FILE", "NPM_CONFIG_USERCONFIG", "CARGO_HOME",
                   "XDG_CONFIG_HOME", "VIRTUAL_ENV")  # fmt: skip


def _config_env(env: Mapping[str, str], avoid: list[str]) -> dict[str, str]:
    kept = dict(env)
    for name in _PATH_VARIABLES:
        value = kept.get(name)
        if value is not None and (not os.path.isabs(value) or is_under(value, avoid)):
            del kept[name]
    if "XDG_CONFIG_DIRS" in kept:
        kept["XDG_CONFIG_DIRS"] = ":".join(
            d
            for d in kept["XDG_CONFIG_DIRS"].split(":")
            if os.path.isabs(d) and not is_under(d, avoid)
        )
    return kept


def _pip(env: Mapping[str, str]) -> list[str]:
    found: list[str] = []
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST"):
        found += _split(env.get(name, ""))
    home = _home(env)
    config_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    files = [Path("/etc/pip.conf")]
    files += [
        Path(d) / "pip" / "pip.conf" for d in env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":") if d
    ]
    files += [
        config_home / "pip" / "pip.conf",
        home / ".pip" / "pip.conf",
        home / ".config" / "pip" / "pip.conf",
    ]
    if env.get("VIRTUAL_ENV"):
        files.append(Path(env["VIRTUAL_ENV"]) / "pip.conf")
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    for path in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in parser.sections():
            for key in ("index-url", "extra-index-url", "find-links", "trusted-host"):
                found += _split(parser.get(section, key, fallback=""))
    return found


def _npmrc(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    found = []
    for line in lines:
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and (key == "registry" or key.endswith(":registry")):
            found.append(value.strip())
    return found


def _npm(env: Mapping[str, str]) -> list[str]:
    found = [
        v
        for k, v in env.items()
        if k.lower() == "npm_config_registry"
        or (k.lower().startswith("npm_config_@") and k.lower().endswith(":registry"))
    ]
    home = _home(env)
    files = [Path(env.get("NPM_CONFIG_USERCONFIG") or home / ".npmrc"), Path("/etc/npmrc")]
    for path in files:
        found += _npmrc(path)
    for path in [home / ".yarnrc.yml"]:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found += re.findall(r"npmRegistryServer:\s*[\"']?([^\s\"']+)", text)
    return found


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


def _tables(value: object) -> Iterable[dict[str, Any]]:
    if isinstance(value, dict):
        yield from (v for v in value.values() if isinstance(v, dict))


def _cargo(env: Mapping[str, str]) -> list[str]:
    found = [v for k, v in env.items() if re.fullmatch(r"CARGO_REGISTRIES_\w+_INDEX", k)]
    found += [env[k] for k in ("CARGO_REGISTRY_INDEX",) if k in env]
    cargo_home = Path(env.get("CARGO_HOME") or _home(env) / ".cargo")
    files = [cargo_home / "config.toml", cargo_home / "config"]
    for path in files:
        data = _toml(path)
        for table in _tables(data.get("source")):
            found += [str(table[k]) for k in ("registry", "git") if k in table]
        for table in _tables(data.get("registries")):
            found += [str(table["index"])] if "index" in table else []
        registry = data.get("registry")
        if isinstance(registry, dict) and "index" in registry:
            found.append(str(registry["index"]))
    return found


def _uv(env: Mapping[str, str]) -> list[str]:
    found: list[str] = []
    for name in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX"):
        found += [v.split("=", 1)[-1] for v in _split(env.get(name, ""))]
    config_home = Path(env.get("XDG_CONFIG_HOME") or _home(env) / ".config")
    documents = [_toml(config_home / "uv" / "uv.toml"), _toml(Path("/etc/uv/uv.toml"))]
    # Poetry keeps extra repositories in its own user configuration (never the pyproject's).
    poetry = _toml(config_home / "pypoetry" / "config.toml").get("repositories")
    found += [str(t["url"]) for t in _tables(poetry) if "url" in t]
    found += [v for k, v in env.items() if re.fullmatch(r"POETRY_REPOSITORIES_\w+_URL", k)]
    for doc in documents:
        for key in ("index-url", "extra-index-url", "find-links"):
            value = doc.get(key)
            found += [value] if isinstance(value, str) else [str(v) for v in value or []]
        for index in doc.get("index", []) if isinstance(doc.get("index"), list) else []:
            if isinstance(index, dict) and "url" in index:
                found.append(str(index["url"]))
    return found


def registry_sources(
    policy_registries: list[str],
    env: Mapping[str, str] | None = None,
    avoid: Iterable[Path] = (),
    cache: Path | None = None,
) -> dict[str, list[HostRule]]:
    """Registry rules by where they came from: the policy, the user's configuration files and
    variables, and what each installed package manager reports (see installed.py; cache is
    the file its answers are kept in between runs).

    Never from the repository: see the module's docstring; no program in avoid (the run's
    worktree) is run.
    """
    folders = [os.path.abspath(a) for a in avoid] + [os.path.realpath(a) for a in avoid]
    env = _config_env(os.environ if env is None else env, folders)
    entries: dict[str, list[str]] = {"policy": list(policy_registries)}
    for name, source in (("pip", _pip), ("npm", _npm), ("cargo", _cargo), ("uv", _uv)):
        entries[f"{name} configuration"] = source(env)
    for tool, found in tool_registries(env, avoid, cache).items():
        entries[tool] = found
    rules: dict[str, list[HostRule]] = {}
    for where, texts in entries.items():
        for text in texts:
            rule = rule_for(text)
            if rule is not None and rule not in rules.setdefault(where, []):
                rules[where].append(rule)
    return {where: found for where, found in rules.items() if found}


def discover_registries(
    policy_registries: list[str], env: Mapping[str, str] | None = None
) -> list[HostRule]:
    """Registry rules from the policy, the user's package-manager configuration and the
    installed package managers' own defaults. Never from the repository."""
    rules: list[HostRule] = []
    for found in registry_sources(policy_registries, env).values():
        rules += [rule for rule in found if rule not in rules]
    return rules


def describe(sources: dict[str, list[HostRule]]) -> list[str]:
    """One line per source, `pip: host:port, ...`, for a person reading how a run was set up."""
    return [
        f"{where}: "
        + ", ".join(f"{r.host}:{'/'.join(map(str, sorted(r.ports or [])))}" for r in rules)
        for where, rules in sources.items()
    ]
