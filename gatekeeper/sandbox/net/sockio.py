"""Socket reads and writes on the event loop that never block, whoever shares the socket.

A socket handed over from the sandbox shares its open file description with a process there,
which can clear O_NONBLOCK (or set a receive timeout) at any moment; asyncio's sock_recv and
sock_sendall would then block the proxy's only thread. Every call here passes MSG_DONTWAIT,
which makes that one call non-blocking whatever the description's flags say.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import select
import socket
import termios
import threading
import time
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


class Linger:
    """A lingering close: half-close, then read and drop what the peer still sends, so that
    the close does not answer its late bytes with a reset that throws away what it has not
    yet taken. With taking (after an answer), lingering ends as soon as the peer has
    acknowledged all that was sent (its receive queue keeps that through a reset), and goes
    on while it keeps taking more (a slow reader) up to cap seconds, however much it sends
    meanwhile (the rest of a request body the server answered early, say: at most
    limit/4 bytes a tick are read, so a flood neither holds the caller nor costs much);
    without, until the peer ends, quiet seconds have passed or limit bytes were drained.

    The caller waits as told, until next() says the close may come::

        while (wait := linger.next()) is not None:
            (sleep if linger.sleep else wait for the peer's next bytes), up to wait seconds

    A reader's progress shows in no event, so while taking it sleeps in ticks; so does it
    after a wake-up that brought nothing to read (an error queue the peer's sharer of the
    socket filled keeps poll(2) waking at once)."""

    # soon at first (most take the rest within a millisecond), then less often
    FIRST_TICK, TICK = 0.0005, 0.05

    def __init__(
        self, sock: socket.socket, *, taking: bool, quiet: float, cap: float, limit: int
    ) -> None:
        sock.shutdown(socket.SHUT_WR)
        self.sock = sock
        self.taking = taking
        self.quiet = quiet
        self.limit = limit
        now = time.monotonic()
        self.until = now + quiet
        self.end = now + cap
        self.left = unacked(sock) if taking else 0
        self.tick = self.FIRST_TICK
        self.sleep = taking
        self.waited = False  # the last wait was for the peer's bytes
        self.drained = 0
        self.scratch = bytearray(65536)

    def next(self) -> float | None:
        """Drain what is there; None when the close may come now, else the seconds to wait
        (see the class's text). Raise OSError."""
        got = 0
        while got < self.limit // 4:
            if self.drained >= self.limit and not self.taking:
                return None
            try:
                n = self.sock.recv_into(self.scratch, len(self.scratch), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            if not n:
                return None
            got += n
            self.drained += n
        if self.waited and not got:
            drop_errors(self.sock)
            self.sleep = True
        now = time.monotonic()
        if self.taking:
            left = unacked(self.sock)
            if not left:
                return None
            if left < self.left:  # it took some: more time
                self.left, self.until = left, now + self.quiet
        wait = min(self.until, self.end) - now
        if wait <= 0:
            return None
        self.waited = not self.sleep
        if not self.sleep:
            return wait
        tick, self.tick = self.tick, min(self.tick * 2, self.TICK)
        return min(wait, tick)


async def recv(sock: socket.socket, size: int) -> bytes:
    """Up to size bytes (b"" at end of stream); raise OSError."""
    woken = False
    while (data := recv_now(sock, size)) is None:
        if woken:  # with nothing to read: an error queue's POLLERR
            drop_errors(sock)
        await wait_readable(sock)
        woken = True
    return data


async def sendall(
    sock: socket.socket,
    data: bytes | bytearray | memoryview,
    count: Callable[[int], None] | None = None,
) -> None:
    """Send all of data, telling count of each part sent; raise OSError."""
    view = memoryview(data)
    woken = False
    while view:
        try:
            sent = sock.send(view, DONTWAIT)
        except (BlockingIOError, InterruptedError):
            if woken:  # with no room: an error queue's POLLERR
                drop_errors(sock)
            await wait_writable(sock)
            woken = True
            continue
        woken = False
        view = view[sent:]
        if count is not None:
            count(sent)


class Stalled(OSError):
    """A send that did not go out within its deadline: the peer took none of it, or too
    little (a sharer of the socket may have filled its send queue)."""


async def send_within(
    sock: socket.socket,
    data: bytes | bytearray | memoryview,
    timeout: float,
    count: Callable[[int], None] | None = None,
) -> None:
    """sendall within timeout seconds; raise Stalled past it (count has been told of what
    went), or OSError."""
    try:
        async with asyncio.timeout(timeout):
            await sendall(sock, data, count)
    except TimeoutError:
        raise Stalled(f"not taken within {timeout:g}s") from None


def drop_errors(sock: socket.socket) -> None:
    """Empty sock's error queue (transmit timestamps a sharer of its description asked for
    with SO_TIMESTAMPING, say), which recv() never does: while it holds anything, poll(2)
    reports POLLERR at once, and a wait for the socket would wake for ever. Only on a TCP
    socket: a Unix one has no error queue and would read its data instead."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):
        for _ in range(1024):
            sock.recvmsg(1, 1024, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)


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
    try:
        sock.getpeername()
    except OSError:  # woken by something else (its error queue): not taken for a connection
        raise OSError(errno.ENOTCONN, f"Connect call failed {address}") from None


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
