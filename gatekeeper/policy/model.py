"""The policy file: which paths an agent may read and write, which commands, networks, secrets."""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gatekeeper.defaults import empty_list
from gatekeeper.errors import PolicyError
from gatekeeper.policy import POLICY_PATH as POLICY_PATH
from gatekeeper.policy import TRUST_PATH as TRUST_PATH
from gatekeeper.policy.patterns import check_pattern, is_write_allowed, normalize

# Paths whose change can loosen the gate itself; a change to them needs the target policy's consent.
DEFAULT_PROTECTED = (
    ".gatekeeper/**",
    ".githooks/**",
    ".husky/**",
    ".github/**",
    ".gitlab-ci.yml",
    ".gitlab/**",
    ".circleci/**",
    ".ci/**",
    "Jenkinsfile",
    # Other forges' and CI services' pipelines (a self-hosted forge runs the pre-receive hook).
    ".forgejo/**",
    ".gitea/**",
    ".woodpecker/**",
    ".woodpecker.yml",
    ".woodpecker.yaml",
    ".drone.yml",
    ".drone.yaml",
    ".drone.jsonnet",
    ".drone.star",
    ".travis.yml",
    "azure-pipelines.yml",
    "azure-pipelines.yaml",
    ".azure-pipelines/**",
    "bitbucket-pipelines.yml",
    ".buildkite/**",
    ".cirrus.yml",
    ".cirrus.star",
    "appveyor.yml",
    ".appveyor.yml",
    ".semaphore/**",
    ".tekton/**",
    "cloudbuild.yaml",
    "cloudbuild.yml",
    "buildspec.yml",
    "buildspec.yaml",
    "bitrise.yml",
    "codemagic.yaml",
    ".gitpod.yml",
    ".gitpod.Dockerfile",
    ".gitmodules",
    ".gitattributes",
    "**/.gitattributes",
    # Git hook managers: their configuration is code run on commit or push.
    ".pre-commit-config.yaml",
    ".pre-commit-config.yml",
    "lefthook.yml",
    "lefthook.yaml",
    "lefthook.json",
    "lefthook.toml",
    ".lefthook.yml",
    ".lefthook.yaml",
    ".lefthook.json",
    ".lefthook.toml",
    "lefthook-local.yml",
    "lefthook-local.yaml",
    "lefthook-local.json",
    "lefthook-local.toml",
    ".lefthook-local.yml",
    ".lefthook-local.yaml",
    ".lefthook-local.json",
    ".lefthook-local.toml",
    ".config/lefthook.yml",
    ".config/lefthook.yaml",
    ".config/lefthook-local.yml",
    ".config/lefthook-local.yaml",
    ".overcommit.yml",
    ".simple-git-hooks.json",
    ".simple-git-hooks.js",
    ".simple-git-hooks.cjs",
    "simple-git-hooks.json",
    "simple-git-hooks.js",
    "simple-git-hooks.cjs",
    # Git LFS's settings in the repository (the server its objects and credentials go to).
    ".lfsconfig",
    # Files that run code or grant tools when a person or an agent opens the repository:
    # editor tasks, launch configurations and settings, dev containers, direnv, and the
    # agents' own project settings (hooks, commands, MCP servers, test commands).
    ".vscode/**",
    ".idea/**",
    ".zed/**",
    ".fleet/**",
    "**/*.code-workspace",
    ".devcontainer/**",
    ".devcontainer.json",
    ".envrc",
    "**/.envrc",
    ".mcp.json",
    ".claude/**",
    ".codex/**",
    ".cursor/**",
    ".gemini/**",
    ".aider.conf.yml",
)

# Shell builtins: a shell runs them without an exec, so no command rule can see them.
SHELL_ONLY_BUILTINS = frozenset(
    "source . cd exec eval export set unset alias unalias read shift return exit break continue "
    "trap ulimit umask readonly local declare typeset builtin hash jobs fg bg wait getopts let "
    "shopt".split()
)
# Also programs on disk, but a shell runs its own builtin instead when called by name.
SHELL_ALSO_BUILTINS = frozenset("echo printf test [ kill pwd true false command type".split())


class Decision(str, Enum):
    allow = "allow"
    ask = "ask"
    deny = "deny"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_patterns(values: list[str]) -> list[str]:
    cleaned = []
    for value in values:
        problem = check_pattern(value)
        if problem:
            raise ValueError(f"{value!r} is {problem}")
        cleaned.append(normalize(value))
    return cleaned


class Paths(_Model):
    read: list[str] = Field(default_factory=lambda: ["**"])
    write: list[str] = Field(default_factory=empty_list)
    # None: the built-in protected list; a list replaces it ([] protects nothing extra).
    protected: list[str] | None = None
    # Commit files the agent made that .gitignore covers (they are listed either way).
    commit_ignored: bool = False
    # Who, besides a write entry that names a protected path explicitly, may change protected
    # paths (the policy and trust file among them): nobody, or also a commit signed by a
    # `person` key of the target's trust file. Agent runs always need the explicit entry.
    protected_writers: Literal["nobody", "person"] = "nobody"

    @field_validator("read", "write", "protected")
    @classmethod
    def _patterns(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _check_patterns(v)

    @property
    def protected_patterns(self) -> tuple[str, ...]:
        return DEFAULT_PROTECTED if self.protected is None else tuple(self.protected)


class Commands(_Model):
    allow: list[str] = Field(default_factory=empty_list)
    ask: list[str] = Field(default_factory=empty_list)
    deny: list[str] = Field(default_factory=empty_list)
    # Writes to the world outside (push, publish, deploy, comment): never run inside; each
    # attempt is refused and recorded as an `external-write` decision point for the person.
    external: list[str] = Field(default_factory=empty_list)
    default: Decision = Decision.allow

    @field_validator("allow", "ask", "deny", "external")
    @classmethod
    def _nonempty(cls, v: list[str]) -> list[str]:
        for rule in v:
            if not rule.split():
                raise ValueError("a command rule may not be empty")
        return v

    @field_validator("external")
    @classmethod
    def _external(cls, v: list[str]) -> list[str]:
        for rule in v:
            try:
                shlex.split(rule)
            except ValueError as exc:
                # Matched word by word: a rule that cannot be split would match by accident.
                raise ValueError(f"{rule!r} is not a command line ({exc})") from None
        return v


HOST_RE = re.compile(r"^(\*\.)?[A-Za-z0-9_.:\[\]-]+$")


class Grant(_Model):
    host: str
    ports: list[Annotated[int, Field(ge=1, le=65535)]] | None = None

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not HOST_RE.match(v) or v.startswith("*") and not v.startswith("*."):
            raise ValueError(f"{v!r} is not a host name, IP literal or '*.domain' pattern")
        return v.lower()


class Network(_Model):
    localhost: Decision | list[Annotated[int, Field(ge=1, le=65535)]] = Decision.deny
    package_registry: Decision = Decision.ask
    arbitrary_web: Decision = Decision.ask
    internal_services: Decision = Decision.deny
    registries: list[str] = Field(default_factory=empty_list)
    grants: list[Grant] = Field(default_factory=empty_list)

    @field_validator("registries")
    @classmethod
    def _registries(cls, v: list[str]) -> list[str]:
        # A registry entry names exactly one host; a pattern belongs in `grants`, where it is
        # visibly a grant of its own.
        for entry in v:
            if "*" in entry or "?" in entry or not entry.strip():
                raise ValueError(f"{entry!r}: a registry is one host name (a pattern such as "
                                 "'*.example.com' belongs in network.grants)")  # fmt: skip
        return v


class Secrets(_Model):
    environment: Literal["stripped"] = "stripped"
    dotfiles: Literal["blocked"] = "blocked"
    credential_helpers: Literal["unavailable"] = "unavailable"
    # Extra names (globs on a file or folder name) to hide wherever they are.
    extra: list[str] = Field(default_factory=empty_list)
    # Environment variables passed through besides the built-in allowlist (never secrets).
    pass_env: list[str] = Field(default_factory=empty_list)


# Upper bounds the kernel and the event loop can apply (setrlimit takes a signed 64-bit value,
# a timer a few billion seconds, pids.max at most 2**22): past them a run would crash.
MAX_TIMEOUT = 366 * 24 * 3600
MAX_PROCESSES = 1 << 22
MAX_BYTES = 1 << 62


class Limits(_Model):
    timeout: Annotated[int, Field(ge=1, le=MAX_TIMEOUT)] = 3600  # seconds, wall clock
    max_processes: Annotated[int, Field(ge=8, le=MAX_PROCESSES)] = 1024
    max_file_size: Annotated[int, Field(ge=1, le=MAX_BYTES)] = 1 << 30  # bytes
    # What a run may add to the result commit, by apparent size; files beyond it are left out.
    max_added_bytes: Annotated[int, Field(ge=0, le=MAX_BYTES)] = 4 << 30  # bytes


class Policy(_Model):
    version: Literal[1] = 1
    paths: Paths = Field(default_factory=Paths)
    commands: Commands = Field(default_factory=Commands)
    network: Network = Field(default_factory=Network)
    secrets: Secrets = Field(default_factory=Secrets)
    limits: Limits = Field(default_factory=Limits)

    def allows_write(self, path: str) -> bool:
        """True when the agent may change path (write set, protected paths aside)."""
        return is_write_allowed(self.paths.write, self.paths.protected_patterns, path)


@dataclass(frozen=True)
class LoadedPolicy:
    """A validated policy and where it came from, as the receipt records it."""

    policy: Policy
    path: str  # repo-relative path or the file given with --policy
    sha256: str  # of the exact bytes
    source_commit: str | None  # the commit it was read from; None for --policy FILE
    raw: bytes


def policy_warnings(policy: Policy) -> list[str]:
    """What in a valid policy cannot work as its author expects (shown when a run starts)."""
    warnings = []
    for kind in ("deny", "ask", "external"):
        for rule in getattr(policy.commands, kind):
            name = rule.split()[0]
            if name in SHELL_ONLY_BUILTINS:
                warnings.append(
                    f"commands.{kind} rule {rule!r} can never match: `{name}` is a shell "
                    "builtin, run inside the shell without an exec; rules see execs only"
                )
            elif name in SHELL_ALSO_BUILTINS:
                warnings.append(
                    f"commands.{kind} rule {rule!r} matches only when `{name}` is run as a "
                    "program: shells run their own builtin of that name without an exec"
                )
    return warnings


def _field_name(loc: tuple[Any, ...]) -> str:
    # Drop pydantic's union-member tags such as `str-enum[Decision]` from the location.
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in _TAGS))]
    return ".".join(parts) or "(top level)"


_TAGS = {"str", "int", "list", "dict", "bool"}


def parse_policy(data: bytes, source: str) -> Policy:
    """Parse and validate policy bytes; raise PolicyError naming source, field and expectation."""
    try:
        document = yaml.safe_load(data.decode("utf-8")) if data.strip() else None
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{source}: not UTF-8 text ({exc})") from exc
    except RecursionError as exc:
        # PyYAML builds nested collections recursively: a few thousand `[` exhaust the stack.
        raise PolicyError(
            f"{source}: not valid YAML: nested too deeply",
            hint="policies are YAML (or JSON); check indentation and quoting",
        ) from exc
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(
            f"{source}: not valid YAML{where}: {problem}",
            hint="policies are YAML (or JSON); check indentation and quoting",
        ) from exc
    if document is None:
        raise PolicyError(f"{source}: the policy is empty", hint="start from `gatekeeper init`")
    if not isinstance(document, dict):
        raise PolicyError(
            f"{source}: expected a mapping at the top level, got {type(document).__name__}"
        )
    try:
        return Policy.model_validate(document)
    except ValidationError as exc:
        by_field: dict[str, list[str]] = {}
        for err in exc.errors():
            field = _field_name(err["loc"])
            if err["type"] == "extra_forbidden":
                by_field.setdefault(field, []).append(
                    "unknown key (misspelt, or not a policy field)"
                )
            else:
                got = err.get("input")
                shown = repr(got) if not isinstance(got, dict | list) else type(got).__name__
                msg = err["msg"].removeprefix("Value error, ")
                by_field.setdefault(field, []).append(f"{msg} (got {shown})")
        lines = [f"  {field}: " + "; or ".join(msgs) for field, msgs in by_field.items()]
        raise PolicyError(
            f"{source}: invalid policy\n" + "\n".join(lines),
            hint="see policies/default.yaml for every field and its allowed values",
        ) from exc


def load_policy_file(path: Path) -> LoadedPolicy:
    """Load a policy from a file on disk (`--policy FILE`)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"cannot read policy {path}: {exc.strerror}") from exc
    policy = parse_policy(data, str(path))
    return LoadedPolicy(policy, str(path), hashlib.sha256(data).hexdigest(), None, data)


def load_policy_at(
    git_dir: Path,
    commit: str,
    path: str = POLICY_PATH,
    read: Callable[[], bytes | None] | None = None,
) -> LoadedPolicy | None:
    """Load the policy committed at path in commit, or None when the commit has none.

    read: gives the file's bytes (None when absent), read from git already (RulesAhead)."""
    from gatekeeper.git import read_blob_at

    data = read_blob_at(git_dir, commit, path) if read is None else read()
    if data is None:
        return None
    policy = parse_policy(data, f"{path} at {commit[:12]}")
    return LoadedPolicy(policy, path, hashlib.sha256(data).hexdigest(), commit, data)


def builtin_policy(name: str = "default") -> LoadedPolicy:
    """One of the policies shipped in policies/ (default, docs-only, example)."""
    from gatekeeper.resources import resource_path

    path = resource_path("policies") / f"{name}.yaml"
    if not path.is_file():
        raise PolicyError(f"no built-in policy named {name!r}")
    loaded = load_policy_file(path)
    return LoadedPolicy(loaded.policy, f"builtin:{name}", loaded.sha256, None, loaded.raw)
