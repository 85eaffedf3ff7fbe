"""proc.cmd_output_within: a command (a signature verifier) bounded in time with all it starts.

What it wrote is taken once it has exited, whatever still holds its output; what it left in
its process group is ended then; at the deadline it is ended and the call returns, even when
a process that left the group keeps the pipes open.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from gatekeeper.proc import TimedOut, cmd_output_within


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def _wait_gone(pid: int, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if _gone(pid):
            return True
        time.sleep(0.02)
    return False


def test_output_is_taken_when_the_command_exits_though_a_helper_holds_it(
    tmp_path: Path,
) -> None:
    """A helper left in the group with stdout open neither holds the call to its deadline
    nor makes a quick command count as timed out; it is ended."""
    pid_file = tmp_path / "helper"
    start = time.monotonic()
    code, out, err = cmd_output_within(
        "sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo done; echo said >&2", seconds=20
    )
    assert (code, out, err) == (0, b"done\n", b"said\n")
    assert time.monotonic() - start < 10
    assert _wait_gone(int(pid_file.read_text()))


def test_a_process_that_left_the_group_cannot_hold_the_call(tmp_path: Path) -> None:
    """A grandchild that calls setsid and keeps stdout open: the call returns when the
    command exits (with what it wrote) and, for a command that does not exit, at the
    deadline; the command itself is ended."""
    pid_file = tmp_path / "escaped"
    script = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('out', flush=True)\n"
        "time.sleep(float(sys.argv[1]))\n"
    )
    escaped: list[int] = []
    try:
        start = time.monotonic()
        assert cmd_output_within(sys.executable, "-c", script, "0.2", seconds=20) == (
            0,
            b"out\n",
            b"",
        )
        assert time.monotonic() - start < 10
        escaped.append(int(pid_file.read_text()))

        start = time.monotonic()
        with pytest.raises(TimedOut):
            cmd_output_within(sys.executable, "-c", script, "60", seconds=1.5)
        assert time.monotonic() - start < 6
        escaped.append(int(pid_file.read_text()))
    finally:
        for pid in escaped:
            os.kill(pid, signal.SIGKILL)


def test_input_and_output_larger_than_a_pipe_pass_whole() -> None:
    data = os.urandom(1 << 20)
    code, out, err = cmd_output_within(
        sys.executable,
        "-c",
        "import sys; d = sys.stdin.buffer.read(); sys.stdout.buffer.write(d);"
        " sys.stderr.buffer.write(d[:70000]); sys.exit(3)",
        seconds=60,
        input=data,
    )
    assert (code, out, err) == (3, data, data[:70000])


def test_a_command_that_does_not_read_its_input_is_not_waited_for() -> None:
    """Input the command never reads (it exits first) is dropped, not waited on."""
    code, out, _ = cmd_output_within("sh", "-c", "echo no", seconds=20, input=b"x" * (4 << 20))
    assert (code, out) == (0, b"no\n")


def test_a_killed_command_reports_its_signal() -> None:
    code, _, _ = cmd_output_within("sh", "-c", "kill -9 $$", seconds=20)
    assert code == -signal.SIGKILL


def test_without_pidfds_the_same_holds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Before Linux 5.3 (no pidfd_open) the exit is asked with waitid(2), without reaping."""

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    pid_file = tmp_path / "helper"
    assert cmd_output_within(
        "sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo done", seconds=20
    ) == (0, b"done\n", b"")
    assert _wait_gone(int(pid_file.read_text()))
    start = time.monotonic()
    with pytest.raises(TimedOut):
        cmd_output_within("sleep", "60", seconds=1)
    assert time.monotonic() - start < 5
    data = os.urandom(300_000)
    assert cmd_output_within("cat", seconds=20, input=data) == (0, data, b"")


def test_a_writer_left_in_the_group_cannot_flood_past_the_deadline() -> None:
    """The command exits while a process of its group floods stdout: the group is ended
    before the last reads (which also stop at the deadline), so the call returns as the
    command exits, not when the flood stops."""
    start = time.monotonic()
    code, out, _ = cmd_output_within("sh", "-c", "yes & sleep 0.2", seconds=8)
    assert code == 0 and out.startswith(b"y\n")
    assert time.monotonic() - start < 1.5
