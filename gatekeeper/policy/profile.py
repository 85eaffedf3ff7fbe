"""Agent profiles: what one coding agent needs to run under gatekeeper, and nothing more.

A profile grants the agent's model API hosts, passes its API key in by name (never a stored
login), sets the variables that switch off its own permission prompts and inner sandbox and
keep its state and history out of the repository, and writes settings files into the run's
fresh HOME. `gatekeeper run --profile NAME|FILE` applies it; its grants are recorded in the
receipt like `--grant`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path, PurePosixPath
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from gatekeeper.defaults import empty_dict, empty_list
from gatekeeper.errors import PolicyError
from gatekeeper.policy.model import Grant, _Model
from gatekeeper.policy.patterns import check_pattern

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
HOME_PLACEHOLDER = "{home}"


# Variables the sandbox's boundary and record depend on: no profile sets or passes them.
RESERVED = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "PATH", "BASH_ENV", "ENV",
                      "NO_PROXY", "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR"})  # fmt: skip
RESERVED_PREFIXES = ("LD_", "GATEKEEPER_", "GIT_", "NPM_CONFIG_", "CARGO_HTTP", "YARN_")


def is_reserved(name: str) -> bool:
    upper = name.upper()
    return (upper in RESERVED or upper.startswith(RESERVED_PREFIXES)
            or upper.endswith("_PROXY"))  # fmt: skip


class Profile(_Model):
    version: Literal[1] = 1
    name: str
    description: str = ""
    program: str | None = None  # the agent's command, to warn when CMD is another
    network: list[Grant] = Field(default_factory=empty_list)  # model API hosts, granted for the run
    secrets: list[str] = Field(default_factory=empty_list)  # passed in by name when set
    env: dict[str, str] = Field(default_factory=empty_dict)  # set inside; {home} is the run's HOME
    pass_env: list[str] = Field(default_factory=empty_list)  # non-secret settings passed through
    home_files: dict[str, str] = Field(default_factory=empty_dict)  # written into the run's HOME
    # its caches in the repo: not committed
    state_files: list[str] = Field(default_factory=empty_list)

    @field_validator("state_files")
    @classmethod
    def _state(cls, v: list[str]) -> list[str]:
        for pattern in v:
            problem = check_pattern(pattern)
            if problem:
                raise ValueError(f"{pattern!r} is {problem}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not PROFILE_NAME.match(v):
            raise ValueError(f"{v!r} is not a profile name (lower-case letters, digits, .-_)")
        return v

    @field_validator("secrets", "pass_env", "env")
    @classmethod
    def _names(cls, v: list[str] | dict[str, str]) -> list[str] | dict[str, str]:
        for name in v:  # a dict's keys, a list's items
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if is_reserved(name):
                raise ValueError(f"{name!r} is set by gatekeeper for the sandbox (HOME, "
                                 "PATH, proxies, git and loader settings); a profile may not "
                                 "change it")  # fmt: skip
        return v

    @field_validator("home_files")
    @classmethod
    def _files(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            path = PurePosixPath(name)
            if path.is_absolute() or ".." in path.parts or not path.parts:
                raise ValueError(f"{name!r} must be a relative path inside HOME, without '..'")
        return v


class LoadedProfile:
    """A validated profile and where it came from (recorded in the receipt)."""

    def __init__(self, profile: Profile, source: str, raw: bytes) -> None:
        self.profile = profile
        self.source = source
        self.sha256 = hashlib.sha256(raw).hexdigest()

    def environment(self, home: str) -> dict[str, str]:
        return {k: v.replace(HOME_PLACEHOLDER, home) for k, v in self.profile.env.items()}


def shipped_profiles() -> dict[str, Path]:
    from gatekeeper.resources import resource_path

    folder = resource_path("policies") / "profiles"
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def load_profile(name_or_file: str) -> LoadedProfile:
    """A shipped profile by name, or a profile file; raise PolicyError saying what is wrong."""
    shipped = shipped_profiles()
    if name_or_file in shipped:
        path, source = shipped[name_or_file], f"builtin:{name_or_file}"
    else:
        path, source = Path(name_or_file), name_or_file
        if not path.is_file():
            raise PolicyError(
                f"no profile named {name_or_file!r} and no such file",
                hint=f"shipped profiles: {', '.join(shipped) or 'none'}; or pass a YAML file",
            )
    try:
        raw = path.read_bytes()
        document = yaml.safe_load(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PolicyError(f"profile {source}: cannot read it ({exc})") from exc
    except RecursionError as exc:  # PyYAML recurses once per level of nesting
        raise PolicyError(f"profile {source}: cannot read it (nested too deeply)") from exc
    if not isinstance(document, dict):
        raise PolicyError(f"profile {source}: expected a mapping at the top level")
    try:
        profile = Profile.model_validate(document)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"  {where}: {msg.removeprefix('Value error, ')}")
        raise PolicyError(f"profile {source}: invalid\n" + "\n".join(lines),
                          hint="see docs/agents.md for the profile fields") from exc  # fmt: skip
    return LoadedProfile(profile, source, raw)
