"""Command rules: `rm -rf`, `git push`, `pnpm install` matched against the argv of every exec.

The first word matches the program by basename (or by full path when the rule gives one);
the following words must be the argv's next words, in order (a prefix).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

ALLOW, ASK, DENY = "allow", "ask", "deny"


def split_rule(rule: str) -> list[str]:
    try:
        return shlex.split(rule)
    except ValueError:
        return rule.split()


def rule_matches(rule: list[str], argv: list[str], exe: str | None) -> bool:
    if not rule or not argv:
        return False
    head = rule[0]
    names = {argv[0]} | ({exe} if exe else set())
    if "/" in head:
        hit = head in names or (exe is not None and os.path.realpath(head) == exe)
    else:
        hit = any(os.path.basename(n) == head for n in names)
    return hit and argv[1 : len(rule)] == rule[1:]


@dataclass
class CommandRules:
    allow: list[list[str]]
    ask: list[list[str]]
    deny: list[list[str]]
    default: str
    granted: list[list[str]]

    @classmethod
    def from_config(cls, data: dict[str, object]) -> CommandRules:
        def rules(key: str) -> list[list[str]]:
            return [split_rule(r) for r in data.get(key, []) or []]  # type: ignore[union-attr]

        return cls(rules("allow"), rules("ask"), rules("deny"), str(data.get("default", ALLOW)),
                   rules("granted"))  # fmt: skip

    def decide(self, argv: list[str] | None, exe: str | None) -> tuple[str, str | None]:
        """(decision, the rule that decided) for an exec; deny wins over ask, ask over allow.

        argv None means it could not be read: any deny or ask rule for the same program
        then decides, since its arguments cannot be checked.
        """
        if argv is None:
            probe = [exe or ""]
            for kind, rules in ((DENY, self.deny), (ASK, self.ask)):
                for rule in rules:
                    if rule_matches(rule[:1], probe, exe):
                        return DENY if kind == DENY else ASK, shlex.join(rule)
            return self.default, None
        for rule in self.deny:
            if rule_matches(rule, argv, exe):
                return DENY, shlex.join(rule)
        for rule in self.granted:
            if rule_matches(rule, argv, exe):
                return ALLOW, shlex.join(rule)
        for rule in self.ask:
            if rule_matches(rule, argv, exe):
                return ASK, shlex.join(rule)
        for rule in self.allow:
            if rule_matches(rule, argv, exe):
                return ALLOW, shlex.join(rule)
        return self.default, None
