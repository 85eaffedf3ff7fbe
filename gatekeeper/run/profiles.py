"""Apply an agent profile to a run: its grants, its environment, its settings files in HOME."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gatekeeper.run.grants import Grants

if TYPE_CHECKING:  # (a profile's models are loaded only for a run given one)
    from gatekeeper.policy.profile import LoadedProfile


def profile_grants(loaded: LoadedProfile, grants: Grants, argv: list[str]) -> Grants:
    """grants plus the profile's: its API hosts and the API keys set in the environment."""
    profile = loaded.profile
    network = [f"{g.host}:{p}" for g in profile.network for p in (g.ports or [443])]
    present = [name for name in profile.secrets if os.environ.get(name)]
    if profile.secrets and not present:
        print(f"gatekeeper: warning: profile {profile.name}: none of "
              f"{', '.join(profile.secrets)} is set; the agent will have no API key",
              file=sys.stderr)  # fmt: skip
    if profile.program and argv and Path(argv[0]).name != profile.program:
        print(f"gatekeeper: warning: profile {profile.name} is for `{profile.program}`, "
              f"the command is `{Path(argv[0]).name}`", file=sys.stderr)  # fmt: skip
    return Grants(
        commands=list(grants.commands),
        writes=list(grants.writes),
        network=[*grants.network, *(n for n in network if n not in grants.network)],
        secrets=[*grants.secrets, *(s for s in present if s not in grants.secrets)],
        exact_commands=list(grants.exact_commands),
        withheld_writes=list(grants.withheld_writes),
        file_writes=list(grants.file_writes),
    )


def profile_environment(loaded: LoadedProfile, home: str) -> dict[str, str]:
    """Variables the profile sets inside, and the non-secret ones it passes through."""
    env = {n: os.environ[n] for n in loaded.profile.pass_env if n in os.environ}
    env.update(loaded.environment(home))
    return env


def home_file_binds(loaded: LoadedProfile, scratch: Path, home: str) -> list[str]:
    """bwrap arguments that put the profile's settings files into the run's fresh HOME.

    The files are written into the run's scratch folder and bound writable at their place:
    the agent may change its own settings, and nothing of them outlives the run.
    """
    args: list[str] = []
    folder = scratch / "home-files"
    for rel, text in loaded.profile.home_files.items():
        source = folder / rel
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text)
        args += ["--bind", str(source), str(Path(home) / rel)]
    return args
