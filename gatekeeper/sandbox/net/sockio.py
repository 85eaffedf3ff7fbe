"""Socket reads and writes on the event loop that never block, whoever shares the socket.

A socket handed over from the sandbox shares its open file description with a process there,
which can clear O_NONBLOCK (or set a receive timeout) at any moment; asyncio's sock_recv and
sock_sendall would then block the proxy's only thread. Every call here passes MSG_DONTWAIT,
which makes that one call non-blocking whatever the description's flags say.
"""

from __future__ import annotations

import asyncio
import socket

DONTWAIT = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


async def wait_readable(sock: socket.socket) -> None:
    """Wait until sock has something to read (or an error to report)."""
    await _wait(sock, write=False)


async def wait_writable(sock: socket.socket) -> None:
    await _wait(sock, write=True)


async def _wait(sock: socket.socket, *, write: bool) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if write:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


async def recv(sock: socket.socket, size: int) -> bytes:
    """Up to size bytes (b"" at end of stream); raise OSError."""
    while True:
        try:
            return sock.recv(size, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            await wait_readable(sock)


async def sendall(sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
    """Send all of data; raise OSError."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view, DONTWAIT)
        except (BlockingIOError, InterruptedError):
            await wait_writable(sock)
            continue
        view = view[sent:]


def send_now(sock: socket.socket, data: bytes) -> int:
    """Send what fits now, without waiting; 0 when nothing does. Raise OSError."""
    try:
        return sock.send(data, DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return 0
