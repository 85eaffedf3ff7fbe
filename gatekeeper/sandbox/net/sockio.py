"""Socket reads and writes on the event loop that never block, whoever shares the socket.

A socket handed over from the sandbox shares its open file description with a process there,
which can clear O_NONBLOCK (or set a receive timeout) at any moment; asyncio's sock_recv and
sock_sendall would then block the proxy's only thread. Every call here passes MSG_DONTWAIT,
which makes that one call non-blocking whatever the description's flags say.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import select
import socket
import termios
import threading
from collections.abc import Callable
from ipaddress import IPv4Address, IPv6Address

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


def recv_now(sock: socket.socket, size: int) -> bytes | None:
    """Up to size bytes if there are any (b"" at end of stream), else None; raise OSError."""
    try:
        return sock.recv(size, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None


def unacked(sock: socket.socket) -> int:
    """Bytes sent on sock that the other end has not acknowledged yet (SIOCOUTQ): a close
    now that its end answers with a reset would lose them."""
    return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"), "little")


async def recv(sock: socket.socket, size: int) -> bytes:
    """Up to size bytes (b"" at end of stream); raise OSError."""
    while (data := recv_now(sock, size)) is None:
        await wait_readable(sock)
    return data


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


def connect_now(sock: socket.socket, address: tuple[str, int]) -> bool:
    """Start connecting the non-blocking sock to address (an IP literal, never a name); True
    when it is connected already, as a connection over loopback is when connect(2) returns
    (the handshake ran inside the call). Raise OSError when it failed at once."""
    error = sock.connect_ex(address)
    if error == 0:
        return True
    if error not in (errno.EINPROGRESS, errno.EINTR):
        raise OSError(error, os.strerror(error))
    try:
        sock.getpeername()  # ENOTCONN until the handshake is done
    except OSError:
        return False
    return True


def open_tcp(address: IPv4Address | IPv6Address, port: int) -> tuple[socket.socket, bool]:
    """A new non-blocking TCP socket (TCP_NODELAY) connecting to address and port, and whether
    it is connected already (connect_now); raise OSError, the socket closed."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, connect_now(sock, (str(address), port))
    except OSError:
        sock.close()
        raise


async def wait_connected(sock: socket.socket, address: tuple[str, int]) -> None:
    """Wait for the connect to address that connect_now started; raise OSError when it failed."""
    await wait_writable(sock)
    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error:
        raise OSError(error, f"Connect call failed {address}")  # in asyncio's words


def send_now(sock: socket.socket, data: bytes) -> int:
    """Send what fits now, without waiting; 0 when nothing does. Raise OSError."""
    try:
        return sock.send(data, DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return 0


class _Watch(threading.local):
    """A listener the calling thread keeps an eye on while it blocks (see watching)."""

    fd = -1
    arrived: Callable[[], None] | None = None


_WATCH = _Watch()


def watching(fd: int, arrived: Callable[[], None]) -> _Watching:
    """While in the block, every wait of this thread made through poll() below also watches
    fd (a listener), and calls arrived, once, when something is there to accept."""
    return _Watching(fd, arrived)


class _Watching:
    """watching's context manager (a class: it is entered once per client, and a
    generator-based one costs several times as much)."""

    def __init__(self, fd: int, arrived: Callable[[], None]) -> None:
        self.fd, self.arrived = fd, arrived

    def __enter__(self) -> None:
        _WATCH.fd, _WATCH.arrived = self.fd, self.arrived

    def __exit__(self, *_: object) -> None:
        _WATCH.fd, _WATCH.arrived = -1, None


def step_aside() -> None:
    """Before a wait that is not a poll() below (a name lookup): call arrived now, as if a
    client had come, so that none waits behind it."""
    arrived = _WATCH.arrived
    if arrived is not None:
        _WATCH.arrived = None
        arrived()


def poll(poller: select.poll, timeout: float) -> dict[int, int]:
    """poller.poll(timeout in seconds) as {fd: events}, watching the listener of watching()."""
    arrived = _WATCH.arrived
    if arrived is None:
        return dict(poller.poll(timeout * 1000))
    fd = _WATCH.fd
    poller.register(fd, select.POLLIN)
    try:
        ready = dict(poller.poll(timeout * 1000))
    finally:
        poller.unregister(fd)
    if ready.pop(fd, 0):
        _WATCH.arrived = None
        arrived()
    return ready
