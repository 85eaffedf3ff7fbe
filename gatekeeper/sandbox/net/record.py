"""The log of every network attempt and escalation, shared by the proxy thread and the launcher."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gatekeeper.receipt.models import Escalation, NetworkRequest

MAX_PATH = 200


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def loggable_path(target: str) -> str:
    """The path of a request target without its query or fragment (they may carry tokens)."""
    path = target.split("?", 1)[0].split("#", 1)[0] or "/"
    return path if len(path) <= MAX_PATH else path[: MAX_PATH - 1] + "…"


@dataclass
class Entry:
    """One attempt; bytes are filled in as the connection runs and final when it closes."""

    host: str
    port: int | None
    decision: str
    category: str | None
    method: str | None = None
    path: str | None = None
    time: str = field(default_factory=now_iso)
    bytes_up: int = 0
    bytes_down: int = 0
    reason: str | None = None  # why it was refused or failed; for the run summary
    pid: int | None = None

    def to_model(self) -> NetworkRequest:
        return NetworkRequest(
            host=self.host,
            port=self.port,
            decision=self.decision,
            category=self.category,
            method=self.method,
            path=self.path,
            time=self.time,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
        )


class Recorder:
    """Thread-safe lists of entries and escalations, in the order they happened."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[Entry] = []
        self.escalations: list[Escalation] = []
        self._escalated: set[tuple[str, str]] = set()

    def add(self, entry: Entry) -> Entry:
        with self._lock:
            self.entries.append(entry)
        return entry

    def escalate(self, value: str, decision: str) -> None:
        """Record a network escalation once per (value, decision)."""
        with self._lock:
            if (value, decision) in self._escalated:
                return
            self._escalated.add((value, decision))
            self.escalations.append(
                Escalation(kind="network", value=value, decision=decision, time=now_iso())
            )

    def snapshot(self) -> tuple[list[NetworkRequest], list[Escalation]]:
        with self._lock:
            return [e.to_model() for e in self.entries], list(self.escalations)

    def denied(self) -> list[Entry]:
        """Refused or failed attempts, for the run summary."""
        with self._lock:
            return [e for e in self.entries if e.decision != "allow"]
