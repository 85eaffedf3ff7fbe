"""Helpers for the network tests: run a command in a sandbox behind a started session.

The sandbox helper mirrors the lead's boundary closely enough for the network: `bwrap
--unshare-all` (own network namespace with only loopback), uid 0 without capabilities, a
stripped environment, an empty /run with the session's folder bound read-only at
/run/gatekeeper, and the command wrapped by the real bridge.
"""

from __future__ import annotations

import os
import pty
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from net_ns import can_make_namespaces

from gatekeeper.sandbox.net import NetSetup, NetworkSession

needs_netns = pytest.mark.skipif(
    not (can_make_namespaces() and shutil.which("bwrap"))
    and not os.environ.get("GATEKEEPER_REQUIRE_BWRAP"),
    reason="needs root, iproute2 and bubblewrap to build isolated network namespaces",
)

BWRAP = [
    "bwrap",
    "--unshare-all",
    "--unshare-user",
    "--uid",
    "0",
    "--gid",
    "0",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "--tmpfs",
    "/run",
    "--clearenv",
    "--setenv",
    "PATH",
    "/usr/local/bin:/usr/bin:/bin",
    "--setenv",
    "HOME",
    "/tmp",
]


def sandboxed(
    setup: NetSetup, argv: list[str], binds: list[tuple[Path, str]] | None = None
) -> list[str]:
    """The bwrap command line running argv behind the bridge with the session's binds and env."""
    args = list(BWRAP)
    # The test's interpreter stays visible even when it lives under /tmp (a clone there, say).
    for folder in sorted(
        {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    ):
        args += ["--ro-bind-try", os.path.realpath(folder), os.path.realpath(folder)]
    for host, inside in [*setup.binds, *(binds or [])]:
        args += ["--ro-bind", str(host), inside]
    for name, value in setup.env.items():
        args += ["--setenv", name, value]
    return [*args, "--", *setup.wrap(argv, sys.executable)]


def run_inside(
    setup: NetSetup,
    argv: list[str],
    *,
    timeout: float = 60,
    binds: list[tuple[Path, str]] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sandboxed(setup, argv, binds), capture_output=True, text=True, timeout=timeout, check=False
    )


def python_inside(setup: NetSetup, code: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run Python code inside the sandbox (the test's own interpreter, isolated mode)."""
    return run_inside(setup, [sys.executable, "-I", "-c", code], **kwargs)


def mapping_resolver(names: dict[str, list[str]]) -> Callable[[str, int], list[str]]:
    """A resolver that knows only names (made-up hosts to test-namespace addresses)."""

    def resolve(host: str, port: int) -> list[str]:
        if host in names:
            return names[host]
        raise socket.gaierror(socket.EAI_NONAME, f"{host}: unknown to the test resolver")

    return resolve


SessionFactory = Callable[..., tuple[NetworkSession, NetSetup]]


# --- talking to a session's proxy socket directly --------------------------------------------


# How client() reaches the proxy: "unix" speaks on its Unix socket (served on the event
# loop), "lane" connects to a TCP listener handed over to it as the bridge hands over its
# own (served first by the accepting thread, lane.py).
WAY = "unix"


def client(session: NetworkSession) -> socket.socket:
    return lane_client(session) if WAY == "lane" else unix_client(session)


def unix_client(session: NetworkSession) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(str(session.net_dir / "proxy.sock"))
    return sock


def lane_client(session: NetworkSession) -> socket.socket:
    """A TCP connection to a loopback listener the session's proxy accepts on (handed over
    on a channel kept open for the session, as the bridge keeps its own)."""
    handed = getattr(session, "_test_lane", None)
    if handed is None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(256)
        channel = unix_client(session)
        socket.send_fds(channel, [b"\x01"], [listener.fileno()])
        assert channel.recv(1) == b"\x00", "the proxy did not take the listener"
        handed = session._test_lane = (listener, channel)  # type: ignore[attr-defined]
    sock = socket.create_connection(handed[0].getsockname()[:2], timeout=5)
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def exchange(session: NetworkSession, request: bytes) -> bytes:
    with client(session) as sock:
        sock.sendall(request)
        return read_all(sock)


@contextmanager
def answered_tty(*replies: bytes) -> Iterator[tuple[str, list[bytes]]]:
    """A pty whose other end answers each `[y/N]` question with the next reply; yields the
    terminal's path (for --ask tty) and the questions as they were shown."""
    master, slave = pty.openpty()
    prompts: list[bytes] = []

    def answer() -> None:
        for reply in replies:
            text = b""
            while b"[y/N]" not in text:
                text += os.read(master, 1024)
            prompts.append(text)
            os.write(master, reply)

    helper = threading.Thread(target=answer, daemon=True)
    helper.start()
    try:
        yield os.ttyname(slave), prompts
    finally:
        helper.join(5)
        os.close(master)
        os.close(slave)
