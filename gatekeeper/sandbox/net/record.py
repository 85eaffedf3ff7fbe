"""The log of every network attempt and escalation, shared by the proxy thread and the launcher.

The log is bounded, whatever the sandbox does: repeated refused attempts (same host, port,
category, decision and method) are one entry with a count and the time of the first and the
last. Refusals take at most MAX_REFUSED of the MAX_ENTRIES entries, so that refusals the agent
makes up at no cost never push out what reached the network: past their room they are only
counted, in one overflow entry at the end. Past MAX_ENTRIES, an allowed attempt is summed
into one entry per destination (host, port and category: a count, the first and last time,
the bytes both ways; the method when all had the same), up to MAX_SUMMED destinations, and
past those into one entry per category (host MORE_DESTINATIONS). An allowed attempt is never
only counted. Connections the proxy closed unserved, being full, have an entry of their own
(host BUSY_HOST, with a count), outside the room refusals share. Every step is a dictionary
look-up, so a flood costs linear time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gatekeeper.receipt.models import Escalation, NetworkRequest, escalation_id
from gatekeeper.text import times

MAX_PATH = 200
MAX_ENTRIES = 10_000
MAX_REFUSED = MAX_ENTRIES // 2  # refused attempts listed; allowed ones have the rest
MAX_SUMMED = 1_000  # destinations whose allowed attempts past MAX_ENTRIES are summed
MAX_SUMMARY_LINES = 100
OVERFLOW_HOST = "(more attempts)"
BUSY_HOST = "(too many connections at once)"  # closed unserved: the proxy was full
_SUMMED_PATH = "(summed: many requests)"
MORE_DESTINATIONS = "(more destinations)"


# The second now_iso last wrote out, and how it reads (without its offset): one tuple, so
# that threads read and replace it whole.
_SECOND: tuple[int, str] = (-1, "")


def now_iso() -> str:
    """The time in UTC to the millisecond, as datetime's isoformat writes it."""
    global _SECOND
    now = time.time()
    second = int(now)
    known = _SECOND
    if known[0] != second:
        known = _SECOND = (second, datetime.fromtimestamp(second, UTC).isoformat()[:-6])
    return f"{known[1]}.{int((now - second) * 1000):03d}+00:00"


def loggable_path(target: str) -> str:
    """The path of a request target without its query or fragment (they may carry tokens)."""
    path = target.split("?", 1)[0].split("#", 1)[0] or "/"
    return path if len(path) <= MAX_PATH else path[: MAX_PATH - 1] + "…"


@dataclass(slots=True)  # (one per request, made on the proxy's hot path)
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
    count: int = 1
    last_time: str | None = None
    # The entry this attempt's bytes are summed into too (past MAX_ENTRIES: Recorder.add).
    into: Entry | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> tuple[str, int | None, str | None, str, str | None]:
        return (self.host, self.port, self.category, self.decision, self.method)

    def sent(self, n: int) -> None:
        """n more bytes went up (to the server)."""
        with _SUMS:  # (into is set under it too: no part is counted twice or missed)
            self.bytes_up += n
            if self.into is not None:
                self.into.bytes_up += n

    def received(self, n: int) -> None:
        """n more bytes came down (to the client)."""
        with _SUMS:
            self.bytes_down += n
            if self.into is not None:
                self.into.bytes_down += n

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
            count=self.count if self.count > 1 else None,
            last_time=self.last_time if self.count > 1 else None,
        )


# Entries that sum others are written by the threads of many connections at once.
_SUMS = threading.Lock()


def _later(known: str | None, new: str) -> str:
    """The later of two times as now_iso writes them (the same form: their text sorts so)."""
    return new if known is None or new > known else known


class Recorder:
    """Thread-safe, bounded lists of entries and escalations, in the order they happened."""

    def __init__(
        self,
        max_entries: int = MAX_ENTRIES,
        max_refused: int | None = None,
        max_summed: int = MAX_SUMMED,
    ) -> None:
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.max_refused = max_entries // 2 if max_refused is None else max_refused
        self.max_summed = max_summed
        self.entries: list[Entry] = []
        self.escalations: list[Escalation] = []
        self._escalated: set[tuple[str, str]] = set()
        self._refused: dict[tuple[str, int | None, str | None, str, str | None], Entry] = {}
        self._summed: dict[tuple[str, int | None, str | None], Entry] = {}
        self.overflow: Entry | None = None
        self.busy: Entry | None = None  # connections the proxy closed unserved (turn_away)
        self.escalations_dropped = 0

    def add(self, entry: Entry) -> Entry:
        """Record entry; return the entry that holds it (an earlier one for a repeat).

        An attempt already refused at this point (decision other than allow) is folded into
        an earlier one with the same key; refusals past max_refused are only counted. An
        allowed attempt past max_entries is summed into its destination's entry (its bytes
        too, as they move: Entry.sent, Entry.received), past max_summed destinations into
        its category's. The entry is still returned, so callers may go on filling it in.
        """
        with self._lock:
            if entry.decision != "allow":
                earlier = self._refused.get(entry.key)
                if earlier is not None:
                    earlier.count += entry.count
                    last = entry.last_time or entry.time
                    earlier.last_time = _later(earlier.last_time or earlier.time, last)
                    earlier.time = min(earlier.time, entry.time)
                    return earlier
                if len(self._refused) >= self.max_refused:
                    self._overflow(entry)
                    return entry
            if len(self.entries) >= self.max_entries:
                if entry.decision == "allow":
                    self._sum(entry)
                else:
                    self._overflow(entry)
                return entry
            self.entries.append(entry)
            if entry.decision != "allow":
                self._refused[entry.key] = entry
        return entry

    def _sum(self, entry: Entry) -> None:
        """Sum an allowed attempt into its destination's entry (its category's, past
        max_summed destinations)."""
        key: tuple[str, int | None, str | None] = (entry.host, entry.port, entry.category)
        summed = self._summed.get(key)
        if summed is None and len(self._summed) >= self.max_summed:
            key = (MORE_DESTINATIONS, None, entry.category)
            summed = self._summed.get(key)
        if summed is None:
            summed = self._summed[key] = Entry(
                key[0], key[1], "allow", entry.category, method=entry.method,
                path=_SUMMED_PATH, time=entry.time, count=0,
                reason="past the log's room: allowed attempts to one destination, summed",
            )  # fmt: skip
        if summed.method != entry.method:
            summed.method = None  # (several: the method of each is not kept)
        summed.count += entry.count
        summed.time = min(summed.time, entry.time)
        summed.last_time = _later(summed.last_time, entry.last_time or entry.time)
        with _SUMS:
            summed.bytes_up += entry.bytes_up
            summed.bytes_down += entry.bytes_down
            entry.into = summed

    def _overflow(self, entry: Entry) -> None:
        if self.overflow is None:
            why = "more distinct attempts than the log keeps"
            self.overflow = Entry(
                OVERFLOW_HOST, None, "not-recorded", None, time=entry.time, reason=why, count=0
            )
        # Entries come in from the proxy as they happen and from the supervisor's record at
        # the end: the first and last times are the earliest and latest seen, not the order.
        self.overflow.count += entry.count
        self.overflow.time = min(self.overflow.time, entry.time)
        self.overflow.last_time = _later(self.overflow.last_time, entry.last_time or entry.time)

    def count_overflow(self, count: int, first: str | None = None, last: str | None = None) -> None:
        """Count attempts only counted where they were seen (past another record's listed
        ones), the first at first and the last at last, in the overflow entry."""
        if count > 0:
            entry = Entry(OVERFLOW_HOST, None, "not-recorded", None, count=count, last_time=last)
            if first:
                entry.time = first
            with self._lock:
                self._overflow(entry)

    def turn_away(self, reason: str) -> None:
        """Count a connection the proxy closed unserved, being full, in its own entry."""
        now = now_iso()
        with self._lock:
            if self.busy is None:
                self.busy = Entry(BUSY_HOST, None, "error", None, time=now, reason=reason)
            else:
                self.busy.count += 1
                self.busy.last_time = now

    def escalate(self, value: str, decision: str) -> None:
        """Record a network escalation once per (value, decision), at most max_entries of them
        (the attempts behind the rest are still in the log, or counted in its overflow)."""
        with self._lock:
            if (value, decision) in self._escalated:
                return
            self._escalated.add((value, decision))
            if len(self.escalations) >= self.max_entries:
                self.escalations_dropped += 1
                return
            self.escalations.append(
                Escalation(
                    kind="network",
                    value=value,
                    decision=decision,
                    time=now_iso(),
                    id=escalation_id("network", value),
                )  # fmt: skip
            )

    def snapshot(self) -> tuple[list[NetworkRequest], list[Escalation]]:
        with self._lock:
            requests = [e.to_model() for e in self.entries]
            with _SUMS:
                requests += [e.to_model() for e in self._summed.values()]
            if self.busy is not None:
                requests.append(self.busy.to_model())
            if self.overflow is not None:
                overflow = self.overflow.to_model()
                requests.append(overflow.model_copy(update={"count": self.overflow.count}))
            return requests, list(self.escalations)

    def denied(self) -> list[Entry]:
        """Refused or failed attempts, for the run summary."""
        with self._lock:
            return [e for e in self.entries if e.decision != "allow"]

    def summary(self) -> list[str]:
        """One line per refused or failed destination (at most MAX_SUMMARY_LINES, then one
        line saying how many more), for the run summary."""
        lines: dict[str, None] = {}
        more = 0
        with self._lock:
            busy = [self.busy] if self.busy is not None else []
        # The proxy being full first: past the lines shown, it would be only counted.
        for entry in busy + self.denied():
            place = entry.host if entry.port is None else f"{entry.host}:{entry.port}"
            kind = f"{entry.category}, " if entry.category else ""
            where = f"{place} ({kind}{entry.decision})"
            line = f"{where}: {entry.reason}{times(entry.count)}"
            if line in lines:
                continue
            if len(lines) < MAX_SUMMARY_LINES:
                lines[line] = None
            else:
                more += 1
        with self._lock:
            dropped = self.overflow.count if self.overflow is not None else 0
            unasked = self.escalations_dropped
        if more or dropped:
            lines[f"... and {more + dropped} more refused or unrecorded attempts"] = None
        if unasked:
            lines[f"... and {unasked} more network escalations, not recorded one by one"] = None
        return list(lines)
