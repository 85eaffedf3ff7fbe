"""Joining two sockets both ways on the event loop, with flow control and no blocking call.

Each direction reads into its own buffer only when the buffer is empty, so a slow reader holds
back a fast writer without unbounded buffering. Every read and write passes MSG_DONTWAIT: the
client socket may have been handed over from the sandbox, which shares its open file
description and can clear O_NONBLOCK at will, so its flags are never trusted. A direction
starts with a small pooled buffer (most answers fit in it) and copies through a large one
(BULK) once a read has filled the small one: bulk then takes a few large calls, not many small
ones. Copying, not splice(2), is also what the receiving end reads fastest: pages spliced on
from the upstream socket reach the client in small pieces that cost it more to take than the
copy costs here (bench/bench_proxy.py shows both).
End of stream in one direction is passed on as a half-close; the tunnel ends when both
directions have, on an error in either, or after a stretch with no traffic at all.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

from gatekeeper.sandbox.net.sockio import DONTWAIT, drop_errors

CHUNK = 128 * 1024  # a direction's first buffer
BULK = 4 << 20  # its buffer once a read has filled CHUNK (as much as a socket sends at once)


class _Pump:
    """One direction of a tunnel: reads while the buffer is empty, writes while it holds data."""

    def __init__(
        self, tunnel: Tunnel, src: socket.socket, dst: socket.socket, count: Callable[[int], None]
    ) -> None:
        self.tunnel = tunnel
        self.loop = tunnel.loop
        self.src_sock, self.dst_sock = src, dst
        self.src, self.dst = src.fileno(), dst.fileno()
        self.count = count
        self.pending = 0  # bytes in the buffer from offset on
        self.reads = 0  # reads that brought data
        self.offset = 0
        self.eof = False
        self.budget: int | None = None  # bytes still to relay, when that is known
        self.done = False
        self.reading = self.writing = False
        self.buffer: memoryview | None = None  # taken at the first read: most never need it
        self.filled = False  # a read has filled CHUNK: BULK from then on
        self.starting = False
        self._on_readable = self._guarded(self._readable)
        self._on_writable = self._guarded(self._writable)

    def _guarded(self, step: Callable[[], None]) -> Callable[[], None]:
        """A readiness callback that ends the tunnel on an unexpected error instead of spinning."""

        def run() -> None:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 (a bug must not leave a hot descriptor behind)
                self.tunnel.fail(OSError(f"relay error: {exc!r}"))

        return run

    def _want_read(self, on: bool) -> None:
        if on and not self.reading:
            self.loop.add_reader(self.src, self._on_readable)
        elif not on and self.reading:
            self.loop.remove_reader(self.src)
        self.reading = on

    def _want_write(self, on: bool) -> None:
        if on and not self.writing:
            self.loop.add_writer(self.dst, self._on_writable)
        elif not on and self.writing:
            self.loop.remove_writer(self.dst)
        self.writing = on

    def start(self) -> None:
        """Relay what is there already (often all of a small answer, and then its end) at
        once; wait for the rest."""
        for _ in range(2):
            reads = self.reads
            self.starting = True  # (not woken: nothing to read is no wonder)
            self._on_readable()
            self.starting = False
            if self.tunnel.closed or self.eof or self.pending or self.reads == reads:
                break
        if not (self.tunnel.closed or self.eof) and self._room() > 0:
            self._want_read(True)

    def _room(self) -> int:
        """How much the next read may take: nothing until all that was read has been sent
        (reading on meanwhile took a trickle per call: the socket's own buffer batches it),
        then what the budget leaves, at most a bulk buffer (and at most the buffer it gets)."""
        if self.pending:
            return 0
        return BULK if self.budget is None else min(BULK, self.budget)

    def _readable(self) -> None:
        room = self._room()
        if room <= 0:
            self._want_read(False)
            return
        self.buffer = read_buffer(self.buffer, self.filled)
        try:
            n = self.src_sock.recv_into(
                self.buffer, min(room, len(self.buffer)), socket.MSG_DONTWAIT
            )
        except (BlockingIOError, InterruptedError):
            # a spurious wake-up, the sandbox's side read it first, or an error queue's
            # POLLERR (which would wake this at once for ever)
            if not self.starting:
                drop_errors(self.src_sock)
            return
        except OSError as exc:
            self.tunnel.fail(exc)
            return
        if n == 0:
            self.eof = True
            self._want_read(False)
            self._finish()
            return
        self.reads += 1
        self.filled = self.filled or n >= CHUNK
        if self.budget is not None:
            self.budget -= n
        self.pending, self.offset = n, 0
        self.tunnel.touch()
        self._drain()
        if not self.tunnel.closed and self._room() <= 0:
            self._want_read(False)

    def _drain(self) -> None:
        """Write what is pending; when the destination is full, wait for it to be writable."""
        while self.pending:
            assert self.buffer is not None
            try:
                sent = self.dst_sock.send(
                    self.buffer[self.offset : self.offset + self.pending], DONTWAIT
                )
            except (BlockingIOError, InterruptedError):
                self._want_write(True)
                return
            except OSError as exc:
                self.tunnel.fail(exc)
                return
            self.offset += sent
            self.pending -= sent
            self.count(sent)
        self._want_write(False)
        if self.eof or self.budget == 0:
            self._finish()

    def _writable(self) -> None:
        pending = self.pending
        self._drain()
        if self.pending == pending and pending:  # woken with no room: as in _readable
            drop_errors(self.dst_sock)
        if not self.tunnel.closed and not self.eof and not self.done and self._room() > 0:
            self._want_read(True)

    def _finish(self) -> None:
        if self.done:
            return
        try:
            self.dst_sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.done = True
        self.tunnel.pump_done()

    def stop(self) -> None:
        self._want_read(False)
        self._want_write(False)
        let_go(self.buffer)
        self.buffer = None


class _BufferPool(threading.local):
    """Copy buffers kept for the next tunnels of this thread (its event loop): a fresh
    CHUNK-sized one is mapped and zeroed by the system each time, which cost a small request
    more than the rest of its relay. Only what a read put in a buffer is ever sent from it."""

    KEEP = 32

    def __init__(self) -> None:
        self.free: list[memoryview] = []

    def take(self) -> memoryview:
        return self.free.pop() if self.free else memoryview(bytearray(CHUNK))

    def give_back(self, buffer: memoryview) -> None:
        if len(self.free) < self.KEEP:
            self.free.append(buffer)


class _BulkPool:
    """BULK-sized buffers, shared by the proxy's threads: at most LIMIT in use at once (past
    that a direction copies on through its small buffer, so many connections cannot make the
    launcher hold much memory), and a few kept for the next bulk directions."""

    KEEP = 2
    LIMIT = 16

    def __init__(self) -> None:
        self.free: list[memoryview] = []
        self.used = 0
        self.lock = threading.Lock()

    def take(self) -> memoryview | None:
        with self.lock:
            if self.used >= self.LIMIT:
                return None
            self.used += 1
            if self.free:
                return self.free.pop()
        try:
            return memoryview(bytearray(BULK))
        except MemoryError:  # copy on through the small buffer; the place is free again
            with self.lock:
                self.used -= 1
            return None

    def give_back(self, buffer: memoryview) -> None:
        with self.lock:
            self.used -= 1
            if len(self.free) < self.KEEP:
                self.free.append(buffer)


_BUFFERS = _BufferPool()
_BULKS = _BulkPool()


def read_buffer(buffer: memoryview | None, filled: bool) -> memoryview:
    """The buffer a direction's next read takes, once all it read before has been sent: a
    pooled CHUNK-sized one at first, a BULK-sized one from the read after one that filled
    CHUNK while the pool has one to give (the small one goes back to its pool)."""
    if filled and (buffer is None or len(buffer) < BULK):
        bulk = _BULKS.take()
        if bulk is not None:
            let_go(buffer)
            return bulk
    return buffer if buffer is not None else _BUFFERS.take()


def let_go(buffer: memoryview | None) -> None:
    """Give a copy buffer back to its pool: one of CHUNK or of BULK bytes, as only the pools
    make (a tunnel's held first bytes are far less than BULK); others are dropped."""
    if buffer is None:
        return
    if len(buffer) == CHUNK:
        _BUFFERS.give_back(buffer)
    elif len(buffer) == BULK:
        _BULKS.give_back(buffer)


class Tunnel:
    """client <-> upstream until both sides finish, an error, or idle_timeout seconds of silence."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        client: socket.socket,
        upstream: socket.socket,
        *,
        idle_timeout: float,
        on_up: Callable[[int], None],
        on_down: Callable[[int], None],
    ) -> None:
        self.loop = loop
        self.client, self.upstream = client, upstream
        self.idle_timeout = idle_timeout
        self.up = _Pump(self, client, upstream, on_up)
        self.down = _Pump(self, upstream, client, on_down)
        self.finished: asyncio.Future[None] = loop.create_future()
        self.closed = False
        self.error: OSError | None = None
        self.last = loop.time()
        # Closes both at its end (else whoever made it does: the proxy's handlers, which may
        # still wait on one of them when the tunnel ends, and must let go of it first).
        self.owns_sockets = True
        self._timer = loop.call_later(min(idle_timeout, 5.0), self._check_idle)
        self._started = {"up": False, "down": False}

    def start(self, *, up: bool = True, down: bool = True) -> None:
        for name, wanted, pump in (("up", up, self.up), ("down", down, self.down)):
            if wanted and not self._started[name] and not self.closed:
                self._started[name] = True
                pump.start()

    def touch(self) -> None:
        self.last = self.loop.time()

    def _check_idle(self) -> None:
        if self.closed:
            return
        idle = self.loop.time() - self.last
        if idle >= self.idle_timeout:
            self.fail(TimeoutError(f"no traffic for {self.idle_timeout:g}s"))
            return
        self._timer = self.loop.call_later(
            min(self.idle_timeout - idle, 5.0) + 0.01, self._check_idle
        )

    def pump_done(self) -> None:
        if self.up.done and self.down.done:
            self.close()

    def fail(self, exc: OSError) -> None:
        if self.error is None:
            self.error = exc
        self.close()

    def close(self) -> None:
        """Stop both directions and close both sockets; safe to call more than once."""
        if self.closed:
            return
        self.closed = True
        self._timer.cancel()
        self.up.stop()
        self.down.stop()
        if self.owns_sockets:
            self.client.close()
            self.upstream.close()
        if not self.finished.done():
            self.finished.set_result(None)

    async def wait(self) -> None:
        await asyncio.shield(self.finished)
