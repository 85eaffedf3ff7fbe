"""How connections reach the launcher: Unix listeners, the accept loop, the bridge's hand-over.

The bridge inside the sandbox connects to a listener here and sends one byte, 0x00, with the
TCP socket it accepted attached as SCM_RIGHTS; the handler then serves that socket itself, so
the bytes of the connection cross a single relay. A client that speaks straight away on the
Unix socket (no descriptor) is served on the Unix connection. Anything else is dropped.

A handed-over socket shares its open file description with the sandbox, which can change its
flags and options (O_NONBLOCK, SO_RCVTIMEO, SO_LINGER) at any moment: only a connected TCP
stream is accepted, every read and write passes MSG_DONTWAIT (sockio.py), and its last close,
which SO_LINGER can make wait, happens on a thread of its own, never on the event loop.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import queue
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from gatekeeper.sandbox.net.sockio import wait_readable

HANDOFF = b"\x00"

# A connection handler: the client socket and the bytes already read from it.
Handler = Callable[[socket.socket, bytes], Awaitable[None]]


def unix_listener(path: Path) -> socket.socket:
    """A listening Unix socket at path (replacing a stale one), mode 0600; raise OSError."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    path.chmod(0o600)
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(
    listening: socket.socket,
    handler: Handler,
    tasks: set[asyncio.Task[None]],
    *,
    max_connections: int,
    first_bytes_timeout: float,
) -> None:
    """Accept on listening until cancelled, running each connection as a task in tasks."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            conn, _ = await loop.sock_accept(listening)
        except OSError as exc:  # out of descriptors: back off instead of spinning
            print(f"gatekeeper: proxy accept failed: {exc}", file=sys.stderr)
            await asyncio.sleep(0.1)
            continue
        if len(tasks) >= max_connections:
            conn.close()
            continue
        conn.setblocking(False)
        task = loop.create_task(arrive(conn, handler, first_bytes_timeout))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def arrive(conn: socket.socket, handler: Handler, timeout: float) -> None:
    """Find the real client behind a Unix connection and run handler on it; never raises."""
    try:
        data, fds = await asyncio.wait_for(_receive(conn), timeout)
    except (TimeoutError, OSError):
        conn.close()
        return
    client = conn
    if fds:
        conn.close()
        adopted = _adopt(fds) if data == HANDOFF else _close_all(fds)
        if adopted is None:
            return
        client, data = adopted, b""
    elif not data:
        conn.close()  # connected and closed without a word
        return
    try:
        await handler(client, data)
    except Exception as exc:  # noqa: BLE001 (one broken connection must not stop the proxy)
        print(f"gatekeeper: proxy: unexpected error: {exc!r}", file=sys.stderr)
    finally:
        client.close()


async def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """The first message on conn and any descriptors that came with it."""
    while True:
        try:
            data, ancillary, _flags, _addr = conn.recvmsg(
                4096, socket.CMSG_SPACE(4 * 4), socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC
            )
            break
        except (BlockingIOError, InterruptedError):
            await wait_readable(conn)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds.extend(received)
    return data, fds


def _close_all(fds: list[int]) -> socket.socket | None:
    """Close descriptors that arrived unasked; None, for want of a client."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    return None


class SharedSocket(socket.socket):
    """A socket received from the sandbox, whose file description a process there shares."""

    def close(self) -> None:
        # The last close of a TCP socket with SO_LINGER set waits until the peer has read
        # everything, however non-blocking the socket is: never on the event loop.
        _CLOSER.close(super().close)


class _Closer:
    """One daemon thread that runs the closes that may wait."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def close(self, close: Callable[[], None]) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="gatekeeper-closer", daemon=True
                )
                self.thread.start()
        self.queue.put(close)

    def _run(self) -> None:
        while True:
            close = self.queue.get()
            with contextlib.suppress(OSError):
                close()


_CLOSER = _Closer()


def is_connected_tcp(sock: socket.socket) -> bool:
    """True for a connected TCP stream socket (what the bridge's accept() returns)."""
    try:
        domain = sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)
        kind = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        protocol = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL)
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        sock.getpeername()
    except OSError:  # not a socket, or not connected (ENOTCONN)
        return False
    return (
        domain in (socket.AF_INET, socket.AF_INET6)
        and kind == socket.SOCK_STREAM
        and protocol == socket.IPPROTO_TCP
        and not listening
    )


def _adopt(fds: list[int]) -> socket.socket | None:
    """The one connected TCP socket the bridge handed over; None (all closed) otherwise.

    Its own O_NONBLOCK is set for good measure, but nothing relies on it (see sockio.py).
    """
    if len(fds) != 1:
        return _close_all(fds)
    try:
        sock = SharedSocket(fileno=fds[0])
    except OSError:  # not a socket at all
        return _close_all(fds)
    if not is_connected_tcp(sock):
        sock.close()
        return None
    sock.setblocking(False)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
