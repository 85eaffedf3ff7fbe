"""How connections reach the launcher: Unix listeners, the accept loop, the bridge's hand-over.

The bridge inside the sandbox connects to a listener here and sends one byte, 0x00, with the
TCP socket it accepted attached as SCM_RIGHTS; the handler then serves that socket itself, so
the bytes of the connection cross a single relay. The bridge keeps that Unix connection open
and hands over every later client on it the same way (a new connection per client cost more
than the client's own request). A client that speaks straight away on the
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
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

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
        limits = _Limits(tasks, max_connections)
        _spawn(loop, arrive(conn, handler, first_bytes_timeout, limits), tasks)


class _Limits:
    """Where a channel's clients are counted, and how many connections there may be."""

    def __init__(self, tasks: set[asyncio.Task[None]], most: int) -> None:
        self.tasks = tasks
        self.most = most


def _spawn(
    loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]]
) -> None:
    task = loop.create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def arrive(
    conn: socket.socket, handler: Handler, timeout: float, limits: _Limits | None = None
) -> None:
    """Find the real client behind a Unix connection and run handler on it; never raises.

    A connection whose first message is a hand-over stays open as the bridge's channel: each
    further message on it must be one more hand-over (anything else ends the channel), and
    each handed-over client is served by a task of its own, counted in limits.
    """
    try:
        received = _receive_now(conn)  # the bridge sent it before connecting: no wait at all
        if received is None:
            async with asyncio.timeout(timeout):
                received = await _receive(conn)
    except (TimeoutError, OSError):
        conn.close()
        return
    data, fds = received
    client = conn
    if fds:
        adopted = _adopt(fds) if data == HANDOFF else _close_all(fds)
        if adopted is None:
            conn.close()
            return
        if limits is None:
            conn.close()
            client, data = adopted, b""
        else:
            await _channel(conn, adopted, handler, limits)
            return
    elif not data:
        conn.close()  # connected and closed without a word
        return
    await _run(handler, client, data)


async def _run(handler: Handler, client: socket.socket, data: bytes) -> None:
    try:
        await handler(client, data)
    except Exception as exc:  # noqa: BLE001 (one broken connection must not stop the proxy)
        print(f"gatekeeper: proxy: unexpected error: {exc!r}", file=sys.stderr)
    finally:
        client.close()


async def _channel(
    conn: socket.socket, first: socket.socket, handler: Handler, limits: _Limits
) -> None:
    """Serve first, then every client handed over on conn, until conn ends or misbehaves."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def take(client: socket.socket) -> None:
        if len(limits.tasks) >= limits.most:
            client.close()
            return
        _spawn(loop, _run(handler, client, b""), limits.tasks)

    def readable() -> None:
        while not ended.done():
            try:
                received = _receive_now(conn, 1)
            except OSError:
                received = (b"", [])
            if received is None:
                return
            data, fds = received
            adopted = _adopt(fds) if fds and data == HANDOFF else _close_all(fds)
            if adopted is None:  # the end, or anything but a hand-over: the channel is done
                ended.set_result(None)
                return
            take(adopted)

    take(first)
    loop.add_reader(conn.fileno(), readable)
    try:
        readable()  # hand-overs that came with the first one
        await ended
    finally:
        loop.remove_reader(conn.fileno())
        conn.close()


def _receive_now(conn: socket.socket, size: int = 4096) -> tuple[bytes, list[int]] | None:
    """The next message on conn and the descriptors that came with it; None when none is
    there yet. Raise OSError."""
    try:
        data, ancillary, _flags, _addr = conn.recvmsg(
            size, socket.CMSG_SPACE(4 * 4), socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC
        )
    except (BlockingIOError, InterruptedError):
        return None
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds.extend(received)
    return data, fds


async def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """The first message on conn and any descriptors that came with it."""
    while True:
        received = _receive_now(conn)
        if received is not None:
            return received
        await wait_readable(conn)


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
