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
import errno
import functools
import os
import queue
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from gatekeeper.sandbox.net.sockio import wait_readable, watching

HANDOFF = b"\x00"
NO_LINGER = struct.pack("ii", 0, 0)
KEEP_IDLE = 8  # threads of a listener kept waiting for their turn (a new one costs more)
LISTENER = b"\x01"
MAX_LISTENERS = 64  # at once per Unix socket: each is a thread
LISTENERS_PER_CHANNEL = 4  # the bridge hands over two (IPv4 and IPv6) per Unix socket

# A connection handler: the client socket and the bytes already read from it.
Handler = Callable[[socket.socket, bytes], Awaitable[None]]
# A lane (lane.py): serves a client on the calling thread and returns None (the client may be
# closed), or returns the bytes it read, for a Handler to go on from.
Lane = Callable[[socket.socket], bytes | None]


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
    channel_ends: list[float] | None = None,
    bridge_ports: frozenset[int] = frozenset(),
    lane: Lane | None = None,
    turned_away: Callable[[], None] | None = None,
    handed_late: Callable[[socket.socket, bytes], bool] | None = None,
) -> None:
    """Accept on listening until cancelled, running each connection as a task in tasks.

    lane, when given, serves each client accepted from a listener the bridge handed over on
    the accepting thread first (lane.py); what it gives back, handler serves.

    channel_ends gets the time (time.time()) at which each of the bridge's hand-over
    channels ended: the bridge holds one open for as long as it lives. A channel is the
    bridge's when it handed over a loopback listener on one of bridge_ports (the ports the
    bridge listens on, which nothing else in the sandbox can bind while it lives); any other
    process may open and close a channel of its own.

    turned_away is told of each connection closed unserved because max_connections are
    being served already (the session records it: never a silent drop).

    handed_late is asked of each client a lane gave back (with what it read) as the loop
    takes it: True when it is recorded as cut short (the lanes have stopped, and the loop
    stops next), and the client is closed.
    """
    loop = asyncio.get_running_loop()
    hub = _Hub(loop, handler, tasks, max_connections)
    hub.channel_ends = channel_ends
    hub.bridge_ports = bridge_ports
    hub.lane = lane
    hub.turned_away = turned_away
    hub.handed_late = handed_late
    try:
        while True:
            try:
                conn, _ = await loop.sock_accept(listening)
            except OSError as exc:  # out of descriptors: back off instead of spinning
                print(f"gatekeeper: proxy accept failed: {exc}", file=sys.stderr)
                await asyncio.sleep(0.1)
                continue
            if len(tasks) >= max_connections:
                hub.turn_away(conn)
                continue
            conn.setblocking(False)
            hub.spawn(arrive(conn, handler, first_bytes_timeout, hub))
    finally:
        hub.stop()


class _Hub:
    """What the connections of one Unix listener share: the handler, the tasks that count
    against max_connections, and the TCP listeners handed over to it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        handler: Handler,
        tasks: set[asyncio.Task[None]],
        most: int,
    ) -> None:
        self.loop = loop
        self.handler = handler
        self.tasks = tasks
        self.most = most
        self.acceptors: list[_Acceptor] = []
        self.channel_ends: list[float] | None = None
        self.bridge_ports: frozenset[int] = frozenset()
        self.lane: Lane | None = None
        self.turned_away: Callable[[], None] | None = None
        self.handed_late: Callable[[socket.socket, bytes], bool] | None = None

    def is_bridges(self, acceptor: _Acceptor) -> bool:
        """Whether acceptor listens where the bridge does (see serve)."""
        try:
            host, port = acceptor.sock.getsockname()[:2]
        except (OSError, ValueError):
            return False
        return port in self.bridge_ports and host in ("127.0.0.1", "::1")

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def take(self, client: socket.socket, data: bytes = b"") -> None:
        """Serve client (data read from it already) as a task of its own, or close it when
        there are too many."""
        if data and self.handed_late is not None and self.handed_late(client, data):
            client.close()  # (recorded: the lanes stop before the loop, which would not serve it)
            return
        if len(self.tasks) >= self.most:
            self.turn_away(client)
            return
        self.spawn(_run(self.handler, client, data))

    def turn_away(self, client: socket.socket) -> None:
        """Close a connection unserved (as many as this hub serves at once are being
        served), said first: the record is there by the time the client sees the close."""
        if self.turned_away is not None:
            self.turned_away()
        client.close()

    def listen(self, fds: list[int]) -> _Acceptor | None:
        """Accept on the TCP listener in fds from now on; None (all closed) when it is not
        one, or when this hub has as many as it takes."""
        if len(fds) != 1 or len(self.acceptors) >= MAX_LISTENERS:
            _close_all(fds)
            return None
        try:
            sock = socket.socket(fileno=fds[0])
        except OSError:
            _close_all(fds)
            return None
        if not is_tcp_listener(sock):
            sock.close()
            return None
        acceptor = _Acceptor(self, sock)
        self.acceptors.append(acceptor)
        acceptor.start()
        return acceptor

    def unlisten(self, acceptor: _Acceptor) -> None:
        acceptor.stop()
        if acceptor in self.acceptors:
            self.acceptors.remove(acceptor)

    def stop(self) -> None:
        for acceptor in list(self.acceptors):
            self.unlisten(acceptor)


class _Acceptor:
    """Threads accepting on a TCP listener the bridge handed over, for the hub's event loop.

    The listener's file description is shared with the sandbox, which may set or clear
    O_NONBLOCK or take a connection first: each accept runs on a thread of its own, where a
    blocking accept harms nothing, after poll(2), so a non-blocking one does not spin. What it
    accepts is a new file description of the launcher's alone. With a lane, the thread that
    accepted a client serves it and the event loop gets only what the lane gives back (all
    of it, once the lane serves as many as it takes); without one, every client goes to the
    loop.
    """

    def __init__(self, hub: _Hub, sock: socket.socket) -> None:
        self.hub = hub
        self.sock = sock
        self.family, self.proto = int(sock.family), sock.proto
        self.stopping = False
        self.lock = threading.Lock()
        self.turn = threading.Condition(self.lock)  # one thread at a time accepts
        self.accepting = False
        self.threads = 0  # alive
        self.idle = 0  # of them, waiting for their turn to accept

    def start(self) -> None:
        with self.lock:
            self.threads += 1
            self._start_thread()

    def _start_thread(self) -> None:
        threading.Thread(target=self._run, name="gatekeeper-accept", daemon=True).start()

    def stop(self) -> None:
        """End the threads: shutdown() wakes a blocked accept() and poll()."""
        with self.lock:
            self.stopping = True
            self.turn.notify_all()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _run(self) -> None:
        """Take turns: accept a client and serve it in the lane, watching the listener
        meanwhile; only when another client arrives before this one is served does the next
        idle thread (or a new one) take the turn, so that one client at a time costs no
        other thread a wake-up. Then wait for another turn, or end when KEEP_IDLE others wait."""
        try:
            holding = False
            while True:
                if not holding:
                    with self.lock:
                        self.idle += 1
                        while self.accepting and not self.stopping:
                            self.turn.wait()
                        self.idle -= 1
                        if self.stopping:
                            return
                        self.accepting = holding = True
                client = self._accept()
                if client is None:  # the listener is gone: every thread ends
                    with self.lock:
                        self.accepting = False
                        self.stopping = True
                        self.turn.notify_all()
                    return
                lane = self.hub.lane
                if lane is None:
                    served = self._serve(client, None)
                else:
                    state = {"holding": True}
                    with watching(self.sock.fileno(), functools.partial(self._pass_turn, state)):
                        served = self._serve(client, lane)
                    holding = state["holding"]
                if not served:
                    return
                if not holding:
                    with self.lock:
                        if self.idle >= KEEP_IDLE or self.stopping:  # enough others wait
                            return
        finally:
            with self.lock:
                if holding:
                    self.accepting = False
                    self.turn.notify()
                self.threads -= 1
                last = self.threads == 0
            if last:
                self.sock.close()

    def _pass_turn(self, state: dict[str, bool]) -> None:
        """A client waits while this thread serves another: let an idle thread (or a new one)
        accept it. (Threads stay few: past its own limit, a lane gives each client to the
        event loop at once, and the thread with the turn keeps it.)"""
        with self.lock:
            self.accepting = state["holding"] = False
            if self.idle:
                self.turn.notify()
            else:
                self.threads += 1
                self._start_thread()

    def _accept(self) -> socket.socket | None:
        """The next client; None once the listener is shut down or closed."""
        poller = select.poll()
        try:
            poller.register(self.sock.fileno(), select.POLLIN)
        except (OSError, ValueError):
            return None
        while not self.stopping:
            for _, event in poller.poll():
                if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    return None  # shut down (by us at the end, or by the sandbox)
            try:
                # socket.accept() as it is, without its look-ups of the listener's family and
                # type (an enum each, per client)
                fd, _ = self.sock._accept()  # type: ignore[attr-defined]
                client = socket.socket(self.family, socket.SOCK_STREAM, self.proto, fileno=fd)
            except (BlockingIOError, InterruptedError):
                continue  # taken by another, on a non-blocking description
            except OSError as exc:
                if self.stopping or exc.errno in (errno.EINVAL, errno.EBADF):
                    return None
                time.sleep(0.1)  # out of descriptors: back off instead of spinning
                continue
            client.setblocking(False)
            try:
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # SO_LINGER comes along from the listener, which the sandbox may have set:
                # a close must never wait for the client to read.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, NO_LINGER)
            except OSError:
                pass
            return client
        return None

    def _serve(self, client: socket.socket, lane: Lane | None) -> bool:
        """Serve client in the lane, then hand what it gives back to the loop; False once
        the loop is closed."""
        data = b""
        if lane is not None:
            given: bytes | None
            try:
                given = lane(client)
            except Exception as exc:  # noqa: BLE001 (one broken connection must not stop it)
                print(f"gatekeeper: proxy: unexpected error: {exc!r}", file=sys.stderr)
                given = None
            if given is None:
                client.close()
                return True
            data = given
        try:
            self.hub.loop.call_soon_threadsafe(self.hub.take, client, data)
        except RuntimeError:  # the loop is closed (after the lanes: recorded as cut short)
            if data and self.hub.handed_late is not None:
                self.hub.handed_late(client, data)
            client.close()
            return False
        return True


async def arrive(
    conn: socket.socket, handler: Handler, timeout: float, hub: _Hub | None = None
) -> None:
    """Find the real client behind a Unix connection and run handler on it; never raises.

    A connection whose first message is a hand-over (of a client, or of a listener) stays
    open as the bridge's channel: each further message on it must be one more hand-over
    (anything else ends the channel); each client is served by a task of its own. The
    launcher accepts on a listener until the channel that brought it ends.
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
    if fds and hub is not None and data in (HANDOFF, LISTENER):
        await _channel(conn, data, fds, hub)
        return
    if fds:
        conn.close()
        adopted = _adopt(fds) if data == HANDOFF else _close_all(fds)
        if adopted is None:
            return
        client, data = adopted, b""
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


async def _channel(conn: socket.socket, data: bytes, fds: list[int], hub: _Hub) -> None:
    """Take the hand-over (data, fds), then every later one on conn, until conn ends or
    carries anything else. A listener's hand-over is answered with one byte: 0x00 when the
    launcher accepts on it from now on, 0x01 when it does not (the bridge then accepts)."""
    loop = hub.loop
    ended: asyncio.Future[None] = loop.create_future()
    listeners: list[_Acceptor] = []  # they end with the channel, that is with the bridge
    bridges = False  # the bridge's own channel (see serve)

    def one(data: bytes, fds: list[int]) -> bool:
        if data == LISTENER and fds:
            if len(listeners) < LISTENERS_PER_CHANNEL:
                taken = hub.listen(fds)  # it closes them when it does not take them
            else:
                taken = None
                _close_all(fds)
            if taken is not None:
                listeners.append(taken)
                nonlocal bridges
                bridges = bridges or hub.is_bridges(taken)
            with contextlib.suppress(OSError):
                conn.send(b"\x01" if taken is None else b"\x00", socket.MSG_DONTWAIT)
            return True
        adopted = _adopt(fds) if fds and data == HANDOFF else _close_all(fds)
        if adopted is None:  # a bad descriptor, the end, or anything but a hand-over
            return False
        hub.take(adopted)
        return True

    def readable() -> None:
        while not ended.done():
            try:
                received = _receive_now(conn, 1)
            except OSError:
                received = (b"", [])
            if received is None:
                return
            if not one(*received):
                ended.set_result(None)

    try:
        if not one(data, fds):
            return
        loop.add_reader(conn.fileno(), readable)
        try:
            readable()  # hand-overs that came with the first one
            await ended
        finally:
            loop.remove_reader(conn.fileno())
    finally:
        for acceptor in listeners:
            hub.unlisten(acceptor)
        conn.close()
        if hub.channel_ends is not None and bridges:
            hub.channel_ends.append(time.time())


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
    return _is_tcp(sock, listening=False)


def is_tcp_listener(sock: socket.socket) -> bool:
    """True for a listening TCP socket (what the bridge binds)."""
    return _is_tcp(sock, listening=True)


def _is_tcp(sock: socket.socket, *, listening: bool) -> bool:
    """True for a TCP stream socket that listens, or (listening=False) is connected."""
    try:
        domain = sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)
        kind = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        protocol = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL)
        accepting = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if not listening:
            sock.getpeername()
    except OSError:  # not a socket, or not connected (ENOTCONN)
        return False
    return (
        domain in (socket.AF_INET, socket.AF_INET6)
        and kind == socket.SOCK_STREAM
        and protocol == socket.IPPROTO_TCP
        and bool(accepting) == listening
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
