"""The supervisor's event log folded into the receipt's entries: every refused process and
write, every failed or still running process, the first MAX_LISTED of the others; the rest
counted, so that a run of a hundred thousand processes keeps a receipt that can be read."""

from __future__ import annotations

import json
from pathlib import Path

from gatekeeper.receipt.models import WRITES
from gatekeeper.sandbox.supervise import setup
from gatekeeper.sandbox.supervise.rules import NOTHING_THERE
from gatekeeper.sandbox.supervise.setup import read_events


def _log(path: Path, events: list[dict]) -> Path:  # type: ignore[type-arg]
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _exec(pid: int, name: str, decision: str = "allow") -> dict:  # type: ignore[type-arg]
    return {"t": "exec", "pid": pid, "ppid": 1, "argv": [name], "cwd": "/w",
            "decision": decision}  # fmt: skip


def test_past_the_listed_processes_only_those_that_ended_well_are_counted_not_listed(
    tmp_path: Path,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setattr(setup, "MAX_LISTED_PROCESSES", 3)
    events = []
    for pid in range(10, 15):  # 3 listed, 2 past them that end with 0: counted
        events += [_exec(pid, f"ok{pid}"), {"t": "exit", "pid": pid, "code": 0}]
    events += [
        _exec(20, "fails"),
        _exec(21, "killed"),
        _exec(22, "runs"),
        _exec(23, "refused", "deny"),
    ]
    events += [_exec(24, "replaced"), _exec(24, "again")]  # one process, two programs
    events += [{"t": "exit", "pid": 20, "code": 2}, {"t": "killed", "pid": 21, "signal": 9},
               {"t": "exit", "pid": 24, "code": 0}]  # fmt: skip
    observed = read_events(_log(tmp_path / "events", events))
    listed = [p.argv[0] for p in observed.processes]
    assert listed == ["ok10", "ok11", "ok12", "fails", "killed", "runs", "refused"], listed
    assert observed.processes_unlisted == 4  # ok13, ok14, replaced, again
    by_name = {p.argv[0]: p for p in observed.processes}
    assert by_name["fails"].exit_code == 2
    assert by_name["killed"].killed and by_name["killed"].signal_name == "SIGKILL"
    assert by_name["runs"].exit_code is None and not by_name["runs"].killed
    assert by_name["refused"].decision == "deny"


def test_past_the_listed_writes_allowed_ones_are_counted_refused_ones_listed(
    tmp_path: Path,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setattr(setup, "MAX_LISTED_WRITES", 2)
    events = [{"t": "write", "pid": 5, "path": f"src/{i}", "op": "create", "decision": "allow"}
              for i in range(5)]  # fmt: skip
    events.append({"t": "write", "pid": 5, "path": "README.md", "op": "write", "decision": "deny"})
    observed = read_events(_log(tmp_path / "events", events))
    assert [(w.path, w.decision) for w in observed.writes] == [
        ("src/0", "allow"),
        ("src/1", "allow"),
        ("README.md", "deny"),
    ]
    assert observed.writes_unlisted == 3


def test_a_large_run_is_read_line_by_line_into_a_bounded_record(tmp_path: Path) -> None:
    """200,000 processes (a large build): the record lists 10,000 and counts the rest."""
    path = tmp_path / "events"
    with path.open("w") as out:
        for pid in range(200_000):
            out.write(json.dumps(_exec(1000 + pid, "cc1")) + "\n")
            out.write(json.dumps({"t": "exit", "pid": 1000 + pid, "code": 0}) + "\n")
    observed = read_events(path)
    assert len(observed.processes) == setup.MAX_LISTED_PROCESSES
    assert observed.processes_unlisted == 200_000 - setup.MAX_LISTED_PROCESSES


def test_a_refusal_repeated_is_one_entry_with_its_count_and_last_time(tmp_path: Path) -> None:
    """A tool that retries a refused write or command in a loop costs one entry each."""
    events = []
    for i in range(1000):
        events.append({"t": "write", "pid": 5, "path": "/etc/x", "op": "create",
                       "decision": "deny", "time": f"t{i}"})  # fmt: skip
        events.append({**_exec(100 + i, "sudo", "deny"), "time": f"t{i}", "rule": "sudo"})
    events.append({"t": "write", "pid": 5, "path": "/etc/x", "op": "unlink", "decision": "deny"})
    events.append({"t": "write", "pid": 5, "path": "/etc/y", "op": "create", "decision": "deny"})
    events.append({**_exec(7, "sudo", "deny"), "cwd": "/elsewhere", "rule": "sudo"})
    observed = read_events(_log(tmp_path / "events", events))
    writes = [(w.path, w.op, w.count, w.pid, w.time, w.last_time) for w in observed.writes]
    assert writes == [("/etc/x", "create", 1000, 5, "t0", "t999"),
                      ("/etc/x", "unlink", None, 5, None, None),
                      ("/etc/y", "create", None, 5, None, None)]  # fmt: skip
    procs = [(p.cwd, p.pid, p.count, p.time, p.last_time) for p in observed.processes]
    assert procs == [("/w", 100, 1000, "t0", "t999"), ("/elsewhere", 7, None, None, None)]
    # An entry for one event keeps the receipt's shape from before counts.
    repeated, single = WRITES.dump_python(observed.writes[:2])
    assert "count" not in single and "last_time" not in single
    assert repeated["count"] == 1000 and repeated["last_time"] == "t999"


def test_a_path_searchs_refused_misses_are_one_entry_and_what_it_found_another(
    tmp_path: Path,
) -> None:
    """`git push` looked for in each folder of PATH: the misses, refused by name, are one
    attempt (the first folder's path, counted); the program found and refused is its own
    entry, as is a refusal of the same command line at a path where a file was."""
    missed = f"external: git push {NOTHING_THERE}"
    push = {**_exec(9, "git", "deny"), "argv": ["git", "push"]}
    events = [{**push, "exe": f"/p{i}/git", "rule": missed, "time": f"t{i}", "missed": True}
              for i in range(8)]  # fmt: skip
    events.append({**push, "exe": "/usr/bin/git", "rule": "external: git push", "time": "t8"})
    events.append({**push, "exe": "/opt/git", "rule": "external: git push", "time": "t9"})
    # refused at files, with rule texts that end as a miss's does (a rule's text may hold the
    # agent's words): not misses, each its own entry
    events += [{**push, "exe": f"/w/{d}/s", "rule": f"x {NOTHING_THERE}"} for d in "ab"]
    observed = read_events(_log(tmp_path / "events", events))
    procs = [(p.exe, p.rule, p.count, p.last_time) for p in observed.processes]
    assert procs == [("/p0/git", missed, 8, "t7"), ("/usr/bin/git", "external: git push", None,
                     None), ("/opt/git", "external: git push", None, None),
                     ("/w/a/s", f"x {NOTHING_THERE}", None, None),
                     ("/w/b/s", f"x {NOTHING_THERE}", None, None)]  # fmt: skip


def test_a_decision_point_or_secret_lookup_repeated_is_read_once(tmp_path: Path) -> None:
    events = [{"t": "escalation", "kind": "command", "value": "npm publish",
               "decision": "pending", "time": f"t{i}"} for i in range(500)]  # fmt: skip
    events.append({"t": "escalation", "kind": "command", "value": "npm publish",
                   "decision": "allow", "time": "later"})  # fmt: skip
    events += [{"t": "secret", "path": "/home/u/.netrc", "time": f"t{i}"} for i in range(500)]
    observed = read_events(_log(tmp_path / "events", events))
    assert [(e.decision, e.time) for e in observed.escalations] == [
        ("pending", "t0"),
        ("allow", "later"),
    ]
    assert [s["time"] for s in observed.secrets] == ["t0"]


def test_past_the_listed_refusals_the_rest_are_one_entry_with_their_count(
    tmp_path: Path,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """An agent that tries a million paths or commands cannot make a record too large to read."""
    monkeypatch.setattr(setup, "MAX_LISTED_REFUSALS", 3)
    events: list[dict] = []  # type: ignore[type-arg]
    for i in range(6):
        events.append({"t": "write", "pid": 5, "path": f"/etc/{i}", "op": "create",
                       "decision": "deny", "time": f"t{i}"})  # fmt: skip
        events.append({**_exec(10 + i, f"tool{i}", "deny"), "time": f"t{i}"})
        events.append({"t": "escalation", "kind": "command", "value": f"tool{i}",
                       "decision": "pending", "time": f"t{i}"})  # fmt: skip
    events.append({"t": "write", "pid": 5, "path": "/etc/0", "op": "create", "decision": "deny"})
    observed = read_events(_log(tmp_path / "events", events))
    writes = [(w.path, w.count) for w in observed.writes]
    assert writes == [("/etc/0", 2), ("/etc/1", None), ("/etc/2", None),
                      (setup.MORE_REFUSED_WRITES, 3)]  # fmt: skip
    assert observed.writes[-1].last_time == "t5" and observed.writes[-1].time == "t3"
    procs = [(p.argv, p.count, p.decision) for p in observed.processes]
    assert procs == [(["tool0"], None, "deny"), (["tool1"], None, "deny"),
                     (["tool2"], None, "deny"),
                     ([setup.MORE_REFUSED_COMMANDS], 3, "deny")]  # fmt: skip
    assert [e.value for e in observed.escalations] == ["tool0", "tool1", "tool2"]


def test_each_process_keeps_its_own_refusals(tmp_path: Path) -> None:
    """Folded by process: a child and a grandchild refused the same write each have an entry
    (the selftest and a reviewer tell them apart), and execs by different parents too."""
    events = [{"t": "write", "pid": pid, "path": ".git/config", "op": "write",
               "decision": "deny"} for pid in (5, 6, 7, 6)]  # fmt: skip
    events += [{**_exec(100 + i, "sudo", "deny"), "ppid": ppid} for i, ppid in enumerate((5, 6, 5))]
    observed = read_events(_log(tmp_path / "events", events))
    assert [(w.pid, w.count) for w in observed.writes] == [(5, None), (6, 2), (7, None)]
    assert [(p.ppid, p.count) for p in observed.processes] == [(5, 2), (6, None)]


def test_direct_attempts_fold_by_destination_and_past_the_listed_ones_are_counted(
    tmp_path: Path,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """A flood of connects to outside addresses costs the launcher one entry per destination
    (a million to one port: one entry), and past the listed destinations only a count; the
    network log gets every attempt, with the times the supervisor saw."""
    from gatekeeper.run.runner import _record_direct_attempts
    from gatekeeper.sandbox.net.record import OVERFLOW_HOST, Recorder

    monkeypatch.setattr(setup, "MAX_LISTED_REFUSALS", 3)
    events = [{"t": "connect", "pid": 7, "host": "198.51.100.9", "port": 443, "decision": "deny",
               "time": f"t{i}"} for i in range(1000)]  # fmt: skip
    events.append({"t": "connect", "pid": 8, "host": "198.51.100.9", "port": 443,
                   "decision": "deny", "via": "sendto", "time": "u"})  # fmt: skip
    events += [{"t": "connect", "pid": 7, "host": "198.51.100.10", "port": p, "decision": "deny",
                "time": f"p{p}"} for p in range(1, 6)]  # fmt: skip
    observed = read_events(_log(tmp_path / "events", events))
    assert [(c["port"], c.get("via"), c.get("count"), c.get("last_time"))
            for c in observed.connects] == [(443, None, 1000, "t999"), (443, "sendto", None, None),
                                            (1, None, None, None), (2, None, 4, "p5")]  # fmt: skip
    assert observed.connects[-1]["more"] and observed.connects[-1]["time"] == "p2"

    class Network:  # the session's two calls, onto a real recorder
        recorder = Recorder()

        def record_direct_attempt(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            from gatekeeper.sandbox.net.session import NetworkSession

            NetworkSession.record_direct_attempt(self, *args, **kwargs)  # type: ignore[arg-type]

        def count_unlisted_attempts(self, *args):  # type: ignore[no-untyped-def]
            from gatekeeper.sandbox.net.session import NetworkSession

            NetworkSession.count_unlisted_attempts(self, *args)  # type: ignore[arg-type]

    network = Network()
    _record_direct_attempts(network, observed)  # type: ignore[arg-type]
    requests, _ = network.recorder.snapshot()
    assert [(r.host, r.port, r.method, r.count, r.time, r.last_time) for r in requests] == [
        ("198.51.100.9", 443, None, 1000, "t0", "t999"),
        ("198.51.100.9", 443, "sendto", None, "u", None),
        ("198.51.100.10", 1, None, None, "p1", None),
        (OVERFLOW_HOST, None, None, 4, "p2", "p5"),
    ]
    assert sum(r.count or 1 for r in requests) == 1006


def test_the_network_logs_first_and_last_times_are_the_earliest_and_latest_seen() -> None:
    """The proxy logs as attempts happen, the supervisor's record is read at the end: a
    repeated or an overflowed attempt's times are the earliest and the latest, not the
    order they were logged in."""
    from gatekeeper.sandbox.net.record import Entry, Recorder

    log = Recorder(max_entries=1, max_refused=1)
    log.add(Entry("192.0.2.1", 443, "deny", "web", time="t5"))
    log.add(Entry("192.0.2.1", 443, "deny", "web", time="t3"))  # a repeat seen earlier
    log.add(Entry("192.0.2.2", 443, "deny", "web", time="t7"))  # past the log: overflow
    log.count_overflow(10, "t1", "t4")  # the supervisor's, counted
    requests, _ = log.snapshot()
    assert [(r.host, r.count, r.time, r.last_time) for r in requests] == [
        ("192.0.2.1", 2, "t3", "t5"),
        ("(more attempts)", 11, "t1", "t7"),
    ]


def test_a_real_path_named_like_a_label_is_not_folded_into_the_label(tmp_path: Path) -> None:
    # A refusal recorded under a label (no approval lifts it) and a refused write of a real
    # repository path spelt the same, by one process: two entries, the real one with no
    # reason (it stays a decision point), whichever comes first.
    label = "another process's /proc links"
    for reasons in (["why", None], [None, "why"]):
        events = tmp_path / f"events-{reasons[0]}.jsonl"
        events.write_text("".join(
            json.dumps({"t": "write", "pid": 7, "path": label, "op": "create",
                        "decision": "deny", "time": f"t{i}",
                        **({"reason": r} if r else {})}) + "\n"
            for i, r in enumerate(reasons)
        ))  # fmt: skip
        writes = read_events(events).writes
        assert sorted((w.reason or "", w.count) for w in writes) == [("", None), ("why", None)]
