"""`--grant KIND=VALUE`: what a person pre-approves for one run."""

from __future__ import annotations

from dataclasses import dataclass, field

from gatekeeper.errors import UsageError
from gatekeeper.policy.patterns import check_pattern, normalize

KINDS = ("command", "write", "network", "secret")


@dataclass
class Grants:
    commands: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    network: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    # Command lines approved as decision points of a resumed run: each runs exactly as it was
    # approved (the same words, and the program its name finds), never as a pattern.
    exact_commands: list[str] = field(default_factory=list)
    # Paths a decision in force denies (on the resumed run or one it resumed): never written in
    # this run, also where a granted write covers them (an approved folder, a denied file in it).
    withheld_writes: list[str] = field(default_factory=list)
    # Approved writes of files (the agent wrote a file there, and made no folder): a missing
    # one is made as an empty file for the run, never as a folder.
    file_writes: list[str] = field(default_factory=list)

    @property
    def as_strings(self) -> list[str]:
        return (
            [f"command={c}" for c in self.commands]
            + [f"command={c}" for c in self.exact_commands if c not in self.commands]
            + [f"write={w}" for w in self.writes]
            + [f"network={n}" for n in self.network]
            + [f"secret={s}" for s in self.secrets]
        )


def parse_grants(values: list[str]) -> Grants:
    """Parse --grant values; raise UsageError naming the bad one and the accepted forms."""
    grants = Grants()
    for value in values:
        kind, sep, rest = value.partition("=")
        rest = rest.strip().strip('"').strip("'")
        if not sep or kind not in KINDS or not rest:
            raise UsageError(
                f"--grant {value!r}: expected KIND=VALUE with KIND one of {', '.join(KINDS)}",
                hint='e.g. --grant command="pnpm install" --grant write=docs/** '
                "--grant network=api.example.com:443 --grant secret=NPM_TOKEN",
            )
        if kind == "command":
            grants.commands.append(rest)
        elif kind == "write":
            problem = check_pattern(rest)
            if problem:
                raise UsageError(f"--grant write={rest}: {rest!r} is {problem}")
            grants.writes.append(normalize(rest))
        elif kind == "network":
            grants.network.append(rest)
        else:
            if not rest.replace("_", "").isalnum():
                raise UsageError(f"--grant secret={rest}: expected an environment variable name")
            grants.secrets.append(rest)
    return grants
