"""Apply the redactor to everything the launcher gathered before any of it is recorded."""

from __future__ import annotations

import dataclasses
import os

from gatekeeper.receipt.redact import Redactor
from gatekeeper.run.grants import Grants
from gatekeeper.run.record import Observations


def redactor_for(grants: Grants) -> Redactor:
    """A redactor that knows the values of every secret passed into the run."""
    return Redactor(os.environ[name] for name in grants.secrets if os.environ.get(name))


def redact_observations(seen: Observations, redactor: Redactor) -> Observations:
    """seen with secrets removed from every argv, escalation value and logged request path."""
    observed = seen.observed
    observed.processes = [p.model_copy(update={"argv": redactor.argv(p.argv)})
                          for p in observed.processes]  # fmt: skip
    observed.escalations = [e.model_copy(update={"value": redactor.text(e.value)})
                            for e in observed.escalations]  # fmt: skip
    for outcome in (seen.outcome, *seen.checks):
        outcome.argv = redactor.argv(outcome.argv)
    network = [r.model_copy(update={"path": redactor.text(r.path)}) if r.path else r
               for r in seen.network]  # fmt: skip
    return dataclasses.replace(seen, argv=redactor.argv(seen.argv), network=network)
