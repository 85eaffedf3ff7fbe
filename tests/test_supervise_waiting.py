"""How the supervisor's loop waits: it looks for the next notification before it sleeps only
while they come close together and the machine has a CPU to spare, and never with one CPU."""

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


def loadavg(tmp_path: Path, running: int) -> str:
    """A stand-in for /proc/loadavg with `running` processes ready to run."""
    path = tmp_path / f"loadavg-{running}"
    path.write_text(f"0.52 0.58 0.59 {running}/192 12345\n")
    return str(path)


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the loop offered the CPU between two looks (once per look)."""
    counted: list[int] = []
    monkeypatch.setattr(supervisor.os, "sched_yield", lambda: counted.append(1))
    return counted


def test_it_looks_while_events_come_close_together_and_stops_once_they_do_not(
    pipe: tuple[int, int, select.poll], looks: list[int], tmp_path: Path
) -> None:
    r, w, poll = pipe
    waiting = Waiting(2.0, loadavg(tmp_path, 2))
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
    waiting.close()


def test_a_look_ends_with_the_event_it_finds(
    pipe: tuple[int, int, select.poll], tmp_path: Path
) -> None:
    r, w, poll = pipe
    waiting = Waiting(2.0, loadavg(tmp_path, 1))
    waiting.gap = 0.0
    os.write(w, b"x")
    assert waiting.wait(poll, timeout_ms=60_000) == [(r, select.POLLIN)]
    waiting.close()


@pytest.mark.parametrize(("cpus", "running"), [(1.0, 1), (1.5, 1), (2.0, 3), (4.0, 9)])
def test_with_one_cpu_or_none_to_spare_it_never_looks(
    pipe: tuple[int, int, select.poll],
    looks: list[int],
    tmp_path: Path,
    cpus: float,
    running: int,
) -> None:
    _, _, poll = pipe
    waiting = Waiting(cpus, loadavg(tmp_path, running))
    waiting.gap = 0.0
    assert waiting.wait(poll, timeout_ms=2) == []
    assert not looks
    waiting.close()


def test_the_real_count_of_processes_ready_to_run_is_read(tmp_path: Path) -> None:
    waiting = Waiting(10_000.0)
    assert waiting._cpu_free()
    waiting.close()
    assert not Waiting(10_000.0, str(tmp_path / "missing"))._cpu_free()


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
    named = groups / "caf\u00e9"  # a cgroup's name is any bytes: not read as ASCII
    named.mkdir()
    (named / "cpu.max").write_text("150000 100000\n")
    own.write_bytes(b"0::/caf\xc3\xa9\n")
    assert usable_cpus(str(own), str(groups)) == min(on, 1.5)
    own.write_bytes(b"0::/caf\xe9\n")  # not UTF-8 either
    assert usable_cpus(str(own), str(groups)) == on
    (named / "cpu.max").write_text("100000 0\n")
    own.write_bytes(b"0::/caf\xc3\xa9\n")
    assert usable_cpus(str(own), str(groups)) == on
