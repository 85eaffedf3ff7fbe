"""How connections reach the launcher: Unix listeners, the accept loop, the bridge's hand-over.

The bridge inside the sandbox connects to a listener here and sends one byte, 0x00, with the
TCP socket it accepted attached as SCM_RIGHTS; the handler then serves that socket itself, so
the bytes of the connection cross a single relay. A client that speaks straight away on the
Unix socket (no descriptor) is served on the Unix connection. Anything else is dropped.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

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
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, ancillary, _flags, _addr = conn.recvmsg(4096, socket.CMSG_SPACE(4 * 4))
            break
        except (BlockingIOError, InterruptedError):
            await _readable(loop, conn)
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


def _adopt(fds: list[int]) -> socket.socket | None:
    """The one stream socket the bridge handed over, non-blocking; None (all closed) otherwise."""
    if len(fds) != 1:
        return _close_all(fds)
    try:
        sock = socket.socket(fileno=fds[0])
    except OSError:  # not a socket at all
        return _close_all(fds)
    if sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    sock.setblocking(False)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Wait until sock has something to read (or an error to report)."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())
