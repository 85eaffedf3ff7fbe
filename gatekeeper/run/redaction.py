"""Apply the redactor to everything the launcher gathered before any of it is recorded."""

from __future__ import annotations

import dataclasses
import os

from gatekeeper.receipt.models import Predicate, escalation_id
from gatekeeper.receipt.redact import Redactor
from gatekeeper.run.grants import Grants
from gatekeeper.run.record import Observations


def secret_names(grants: Grants, passed: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Variables whose values must never reach the record: the secrets passed in, and what a
    profile or policy passes through (meant for settings, but nobody checks that they are)."""
    return [*grants.secrets, *passed]


def redactor_for(grants: Grants, passed: list[str] | tuple[str, ...] = ()) -> Redactor:
    """A redactor that knows the values of every secret passed into the run."""
    return Redactor(os.environ[n] for n in secret_names(grants, passed) if os.environ.get(n))


# Fields of the predicate that must match git objects and the policy exactly (the gate compares
# them); a secret in a committed path is in the branch already, and is refused elsewhere.
# Fields whose values come from a fixed vocabulary are kept too: redacting them would tell the
# secret to whoever reads the receipt.
KEEP = frozenset({"changes", "agent_commits", "base", "policy", "run_id", "branch", "counts",
                  "started_at", "finished_at", "source", "decision", "op", "category", "kind",
                  "method", "time", "last_time"})  # fmt: skip


def redact_predicate(predicate: Predicate, redactor: Redactor) -> Predicate:
    """predicate with every other string field redacted (paths, cwd, hosts, reasons, argv)."""
    if not redactor.values:
        return predicate
    data = redactor.data(predicate.model_dump(mode="json"), KEEP)
    assert isinstance(data, dict)  # a dict redacted is a dict
    # An escalation's id names its kind and value as recorded: the redacted value, so that
    # nothing of a secret is in the id and an approval of the shown value matches it.
    escalations: dict[str, dict[str, object]] = {}
    for e in data["escalations"]:
        key = escalation_id(e["kind"], e["value"])
        escalations.setdefault(key, {**e, "id": key})  # two values may redact to one
    data["escalations"] = list(escalations.values())
    data["counts"] = {**data["counts"], "escalations": len(escalations)}
    return Predicate.model_validate(data)


def redact_observations(seen: Observations, redactor: Redactor) -> Observations:
    """seen with secrets removed from every argv, escalation value and logged request path."""
    observed = seen.observed
    observed.processes = [dataclasses.replace(p, argv=redactor.argv(p.argv))
                          for p in observed.processes]  # fmt: skip
    observed.escalations = [e.model_copy(update={"value": redactor.text(e.value)})
                            for e in observed.escalations]  # fmt: skip
    for outcome in (seen.outcome, *seen.checks):
        outcome.argv = redactor.argv(outcome.argv)
    network = [r.model_copy(update={"path": redactor.text(r.path)}) if r.path else r
               for r in seen.network]  # fmt: skip
    return dataclasses.replace(seen, argv=redactor.argv(seen.argv), network=network)
