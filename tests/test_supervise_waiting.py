"""How the supervisor's loop waits: it looks for the next notification before it sleeps only
while they come close together, and never with one CPU."""

from __future__ import annotations

import os
import select
from collections.abc import Iterator
from pathlib import Path

import pytest

from gatekeeper.sandbox.supervise import supervisor
from gatekeeper.sandbox.supervise.supervisor import Waiting, usable_cpus


@pytest.fixture
def pipe() -> Iterator[tuple[int, int, select.poll]]:
    r, w = os.pipe()
    poll = select.poll()
    poll.register(r, select.POLLIN)
    yield r, w, poll
    os.close(r)
    os.close(w)


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the loop offered the CPU between two looks (once per look)."""
    counted: list[int] = []
    monkeypatch.setattr(supervisor.os, "sched_yield", lambda: counted.append(1))
    return counted


def test_it_looks_while_events_come_close_together_and_stops_once_they_do_not(
    pipe: tuple[int, int, select.poll], looks: list[int]
) -> None:
    r, w, poll = pipe
    waiting = Waiting(spin=True)
    os.write(w, b"x")
    assert waiting.wait(poll, timeout_ms=0) == [(r, select.POLLIN)]
    assert not looks, "at the start the loop has seen no gap: it sleeps"
    for _ in range(50):  # events ready at once, gap after gap
        waiting.wait(poll, timeout_ms=0)
    assert waiting.gap < supervisor.SPIN_SECONDS
    os.read(r, 1)
    assert waiting.wait(poll, timeout_ms=5) == []
    assert looks, "after close events it looked before it slept"
    for _ in range(20):  # nothing comes: each wait lasts the window and its sleep
        waiting.wait(poll, timeout_ms=5)
    assert waiting.gap >= supervisor.SPIN_SECONDS
    seen = len(looks)
    waiting.wait(poll, timeout_ms=5)
    assert len(looks) == seen, "events far apart: it sleeps at once"


def test_a_look_ends_with_the_event_it_finds(pipe: tuple[int, int, select.poll]) -> None:
    r, w, poll = pipe
    waiting = Waiting(spin=True)
    waiting.gap = 0.0
    os.write(w, b"x")
    assert waiting.wait(poll, timeout_ms=60_000) == [(r, select.POLLIN)]


def test_with_one_cpu_it_never_looks(pipe: tuple[int, int, select.poll], looks: list[int]) -> None:
    _, w, poll = pipe
    waiting = Waiting(spin=False)
    waiting.gap = 0.0
    assert waiting.wait(poll, timeout_ms=2) == []
    assert not looks


def test_a_cgroup_cpu_limit_counts_as_fewer_cpus(tmp_path: Path) -> None:
    own = tmp_path / "cgroup"
    groups = tmp_path / "fs"
    (groups / "agents" / "one").mkdir(parents=True)
    own.write_text("1:cpu:/\n0::/agents/one\n")
    on = len(os.sched_getaffinity(0))
    assert usable_cpus(str(own), str(groups)) == on  # no cpu.max files: no limit
    (groups / "agents" / "one" / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(str(own), str(groups)) == on
    (groups / "agents" / "cpu.max").write_text("50000 100000\n")  # half a CPU, a group above
    assert usable_cpus(str(own), str(groups)) == 0.5
    own.write_text("garbage\n")
    assert usable_cpus(str(own), str(groups)) == on
