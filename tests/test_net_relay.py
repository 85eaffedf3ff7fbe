"""The relay and the proxy's socket helpers on real loopback TCP connections of this process."""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import select
import socket
import termios
import threading
import time
from collections.abc import Iterator

import pytest

from gatekeeper.sandbox.net import lane, relay, sockio
from gatekeeper.sandbox.net.handoff import SharedSocket
from gatekeeper.sandbox.net.record import Entry
from gatekeeper.sandbox.net.relay import BULK, CHUNK, Tunnel

SMALL_BUFFER = 64 * 1024  # fixed socket buffers (no autotuning), so the bounds below are firm


def tcp_pair(buffer: int | None = None) -> tuple[socket.socket, socket.socket]:
    """(connecting end, accepted end) of one loopback TCP connection."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        near = socket.socket()
        if buffer is not None:
            near.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
            near.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
        near.connect(listener.getsockname())
        far, _ = listener.accept()
    if buffer is not None:
        far.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    return near, far


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def counted_tunnel(
    loop: asyncio.AbstractEventLoop, client: socket.socket, upstream: socket.socket
) -> tuple[Tunnel, dict[str, int]]:
    counts = {"up": 0, "down": 0}

    def up(n: int) -> None:
        counts["up"] += n

    def down(n: int) -> None:
        counts["down"] += n

    for sock in (client, upstream):
        sock.setblocking(False)
    tunnel = Tunnel(loop, client, upstream, idle_timeout=30.0, on_up=up, on_down=down)
    return tunnel, counts


def test_a_tunnel_whose_answer_is_already_there_ends_at_its_start(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # A small answer and its end are usually in the socket before the relay starts: it is
    # passed on at once, not one turn of the event loop later.
    user, client = tcp_pair()
    upstream, server = tcp_pair()
    server.sendall(b"the whole answer")
    server.shutdown(socket.SHUT_WR)

    async def start() -> bool:
        tunnel, counts = counted_tunnel(asyncio.get_running_loop(), client, upstream)
        tunnel.up.done = True  # as for a forwarded request: nothing more goes up
        await asyncio.sleep(0.05)  # the answer and its FIN have arrived at the upstream socket
        tunnel.start(up=False, down=True)
        ended = tunnel.finished.done()
        await tunnel.wait()
        assert counts == {"up": 0, "down": len(b"the whole answer")}
        return ended

    try:
        assert loop.run_until_complete(start())
        user.settimeout(5)
        received = b""
        while chunk := user.recv(4096):
            received += chunk
        assert received == b"the whole answer"
    finally:
        for sock in (user, client, upstream, server):
            sock.close()


def test_a_busy_direction_buffers_at_most_one_buffer_and_keeps_every_byte_in_order(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # A reader that stops holds back the writer: the relay holds at most one copy buffer of
    # its own (the bulk one, once a read filled the first), and once the reader goes on
    # nothing is lost or reordered.
    user, client = tcp_pair(SMALL_BUFFER)
    upstream, server = tcp_pair(SMALL_BUFFER)
    data = bytes(range(256)) * (12 * BULK // 256)

    async def relay() -> None:
        running = asyncio.get_running_loop()
        tunnel, counts = counted_tunnel(running, client, upstream)
        user.setblocking(False)
        server.setblocking(False)
        tunnel.start()
        pushed = 0
        for _ in range(200):  # push until the writer is held back, with the reader stopped
            try:
                pushed += user.send(data[pushed : pushed + CHUNK])
            except BlockingIOError:
                await asyncio.sleep(0.01)
        # Four socket buffers (the kernel doubles what was set) and one copy buffer.
        assert CHUNK < pushed <= 4 * 2 * SMALL_BUFFER + BULK
        assert counts["up"] < pushed  # the rest waits in the relay and the kernel
        received = bytearray()
        while len(received) < len(data):
            if pushed < len(data):
                try:
                    pushed += user.send(data[pushed : pushed + CHUNK])
                except BlockingIOError:
                    pass
            try:
                chunk = server.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            assert chunk, "the relay ended the stream early"
            received += chunk
        assert bytes(received) == data
        assert counts["up"] == len(data)
        user.shutdown(socket.SHUT_WR)
        server.shutdown(socket.SHUT_WR)
        async with asyncio.timeout(5):
            await tunnel.wait()
        assert tunnel.error is None

    try:
        loop.run_until_complete(relay())
    finally:
        for sock in (user, client, upstream, server):
            sock.close()


def test_connect_now_is_done_at_once_over_loopback_and_a_refusal_is_an_oserror(
    loop: asyncio.AbstractEventLoop,
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        sock = socket.socket()
        sock.setblocking(False)
        with sock:
            assert sockio.connect_now(sock, listener.getsockname())
            accepted, _ = listener.accept()
            with accepted:
                accepted.sendall(b"hello")
                sock.settimeout(5)
                assert sock.recv(5) == b"hello"
        closed_port = listener.getsockname()  # nothing listens there once it is closed
    sock = socket.socket()
    sock.setblocking(False)

    async def refused() -> None:
        if not sockio.connect_now(sock, closed_port):
            async with asyncio.timeout(5):
                await sockio.wait_connected(sock, closed_port)

    with sock, pytest.raises(OSError) as raised:
        loop.run_until_complete(refused())
    assert raised.value.errno == errno.ECONNREFUSED


def test_a_copy_buffer_used_again_by_the_next_tunnel_carries_none_of_the_last_ones_bytes(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Copy buffers, small and bulk, are kept for the next tunnels: only what a read put in one
    # may ever leave it. A client socket shared with the sandbox is copied like any other.
    secret = b"S" * (3 * BULK + 5)  # fills the first buffer, then bulk ones
    middling = b"m" * (CHUNK + 7)  # a bulk buffer again (from the pool), for its last bytes
    sizes: list[int] = []
    taken = relay.read_buffer

    def read_buffer(buffer: memoryview | None, filled: bool) -> memoryview:
        chosen = taken(buffer, filled)
        sizes.append(len(chosen))
        return chosen

    monkeypatch.setattr(relay, "read_buffer", read_buffer)

    async def one(payload: bytes) -> tuple[bytes, set[int]]:
        user, accepted = tcp_pair()
        client = SharedSocket(fileno=accepted.detach())  # as a socket from the sandbox is
        upstream, server = tcp_pair()
        sizes.clear()

        def send() -> None:
            server.sendall(payload)
            server.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        try:
            running = asyncio.get_running_loop()
            tunnel, _ = counted_tunnel(running, client, upstream)
            tunnel.up.done = True
            sender.start()
            tunnel.start(up=False, down=True)
            user.setblocking(False)
            received = b""
            async with asyncio.timeout(10):
                while chunk := await running.sock_recv(user, 1 << 20):
                    received += chunk
                await tunnel.wait()
            return received, set(sizes)
        finally:
            sender.join(10)
            for sock in (user, client, upstream, server):
                sock.close()

    async def each() -> list[tuple[bytes, set[int]]]:
        return [await one(payload) for payload in (secret, b"ok\n", middling)]

    (big, big_sizes), (small, small_sizes), (middle, _) = loop.run_until_complete(each())
    assert (big, small, middle) == (secret, b"ok\n", middling)
    assert big_sizes == {CHUNK, BULK} and small_sizes == {CHUNK}, (big_sizes, small_sizes)


def test_bulk_buffers_are_bounded_across_directions_and_each_is_given_back() -> None:
    # Past LIMIT bulk directions at once, a direction copies on through its small buffer (so
    # many connections cannot make the launcher hold much memory), and takes a bulk one as
    # soon as one is given back.
    pool = relay._BULKS
    assert pool.used == 0, "a bulk buffer of an earlier test was never given back"
    held = [relay.read_buffer(None, filled=True) for _ in range(pool.LIMIT)]
    assert {len(buffer) for buffer in held} == {BULK} and pool.used == pool.LIMIT
    small = relay.read_buffer(None, filled=True)
    assert len(small) == CHUNK and relay.read_buffer(small, filled=True) is small
    relay.let_go(held.pop())
    grown = relay.read_buffer(small, filled=True)
    assert len(grown) == BULK and pool.used == pool.LIMIT
    for buffer in [*held, grown]:
        relay.let_go(buffer)
    assert pool.used == 0 and len(pool.free) <= pool.KEEP


def test_a_bulk_buffer_that_cannot_be_made_leaves_its_place_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Out of memory for a bulk buffer: the direction copies on through its small one, and
    # the place it was counted in is free again (else each failure would take one for good).
    def no_memory(size: int) -> bytearray:
        raise MemoryError

    small = relay.read_buffer(None, filled=False)
    monkeypatch.setattr(relay._BULKS, "free", [])  # (none kept: each is made)
    monkeypatch.setattr(relay, "bytearray", no_memory, raising=False)
    assert relay.read_buffer(small, filled=True) is small
    assert relay._BULKS.used == 0
    monkeypatch.delattr(relay, "bytearray")
    grown = relay.read_buffer(small, filled=True)
    assert len(grown) == BULK and relay._BULKS.used == 1
    relay.let_go(grown)
    assert relay._BULKS.used == 0


def test_a_direction_whose_held_first_bytes_took_a_larger_buffer_still_goes_bulk() -> None:
    # A TLS ClientHello held over several reads can be longer than CHUNK; the buffer it was
    # passed on in is as long. A read that fills it is a full read too: the next goes bulk.
    src_peer, src = tcp_pair()
    dst, dst_peer = tcp_pair()
    src.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * CHUNK)  # all of it waits there
    counted: list[int] = []
    flow = lane._Flow(src, dst, counted.append)
    before = relay._BULKS.used
    try:
        flow.buffer = memoryview(bytearray(CHUNK + 19))  # as _pass_held leaves it
        data = bytes(range(256)) * ((3 * CHUNK) // 256)
        src_peer.sendall(data)
        src_peer.shutdown(socket.SHUT_WR)
        waiting = array.array("i", [0])
        deadline = time.monotonic() + 5
        while waiting[0] < len(data) and time.monotonic() < deadline:  # (queued: SIOCINQ)
            fcntl.ioctl(src.fileno(), termios.FIONREAD, waiting)
        dst_peer.settimeout(5)
        received = b""
        entry = Entry("web.test", 443, "allow", "arbitrary_web", method="CONNECT")
        deadline = time.monotonic() + 5
        while not flow.done and time.monotonic() < deadline:
            flow.step(entry)
            while len(received) < sum(counted):
                received += dst_peer.recv(1 << 20)
        assert flow.filled and flow.buffer is not None and len(flow.buffer) == BULK
        assert received == data and sum(counted) == len(data)
    finally:
        flow.close()
        for sock in (src_peer, src, dst, dst_peer):
            sock.close()
    assert relay._BULKS.used == before


SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
# transmit timestamps by software, reported without the data: each send queues one on the
# socket's error queue, which recv() never empties and poll(2) reports as POLLERR
TIMESTAMP_SENDS = (1 << 1) | (1 << 4) | (1 << 11)


@pytest.mark.parametrize("taking", [True, False], ids=["after-an-answer", "after-a-refusal"])
def test_a_lingering_close_waits_without_spinning_on_an_error_queue(
    monkeypatch: pytest.MonkeyPatch, taking: bool
) -> None:
    # A process sharing a handed-over socket's description can set SO_TIMESTAMPING on it:
    # the proxy's own sends then fill its error queue, poll(2) wakes at once for ever, and a
    # lingering close that waited only for readability would spin for all of its time.
    from gatekeeper.sandbox.net.lane import _linger

    peer, sock = tcp_pair(buffer=4096)
    with peer, sock:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TIMESTAMP_SENDS)
        sock.send(b"x")  # (stamped as it goes out)
        time.sleep(0.05)
        with pytest.raises(BlockingIOError):
            while True:  # (more than the peer, which reads nothing, takes)
                sock.send(b"x" * 65536, sockio.DONTWAIT)
        assert sockio.unacked(sock)
        awake = select.poll()
        awake.register(sock.fileno(), select.POLLIN)
        assert awake.poll(0) == [(sock.fileno(), select.POLLERR)]
        rounds = 0
        step = sockio.Linger.next

        def counted(self: sockio.Linger) -> float | None:
            nonlocal rounds
            rounds += 1
            return step(self)

        monkeypatch.setattr(sockio.Linger, "next", counted)
        _linger(sock, taking=taking, cap=0.5)
        # Ticks of at most 50 ms after the first few (a spin makes some 100,000 in 0.5 s).
        assert 2 <= rounds <= 40, rounds


def stamped(sock: socket.socket) -> None:
    """Set what a sharer of sock's description could: each send then leaves an entry on its
    error queue, and poll(2) reports POLLERR until it is read from there."""
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TIMESTAMP_SENDS)
    sock.send(b"x")
    time.sleep(0.05)


def test_waits_on_a_socket_with_an_error_queue_do_not_spin(loop: asyncio.AbstractEventLoop) -> None:
    # The event loop's reads and a tunnel, and the lane's relay, each with nothing to move
    # for 0.3 s: a handful of wake-ups, not one per turn of the loop.
    from gatekeeper.sandbox.net import lane

    peer, sock = tcp_pair()
    far_peer, far = tcp_pair()
    with peer, sock, far_peer, far:
        stamped(sock)
        far.setblocking(False)
        reads = 0
        recv_now = sockio.recv_now

        def counted(s: socket.socket, size: int) -> bytes | None:
            nonlocal reads
            reads += 1
            return recv_now(s, size)

        async def read() -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.3):
                    await sockio.recv(sock, 100)

        sockio.recv_now = counted  # type: ignore[assignment]
        try:
            loop.run_until_complete(read())
        finally:
            sockio.recv_now = recv_now  # type: ignore[assignment]
        assert reads <= 5, reads

        tunnel = Tunnel(loop, sock, far, idle_timeout=30, on_up=lambda n: None,
                        on_down=lambda n: None)  # fmt: skip
        tunnel.owns_sockets = False
        woken = 0
        readable = tunnel.up._readable

        def counted_readable() -> None:
            nonlocal woken
            woken += 1
            readable()

        tunnel.up._on_readable = tunnel.up._guarded(counted_readable)
        tunnel.start()
        loop.run_until_complete(asyncio.sleep(0.3))
        tunnel.close()
        assert woken <= 5, woken

        stamped(sock)  # (again: the reads above emptied its error queue)
        steps = 0
        step = lane._Flow.step

        def counted_step(flow: lane._Flow, entry: Entry) -> None:
            nonlocal steps
            steps += 1
            step(flow, entry)

        join = lane._Join(sock, far, Entry("web.test", 80, "allow", None), 0.3)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lane._Flow, "step", counted_step)
            with pytest.raises(TimeoutError):
                join.run()
        assert steps <= 5, steps


def test_dropping_errors_reads_no_data_of_a_unix_socket() -> None:
    # MSG_ERRQUEUE means nothing to a Unix socket: a read with it takes the data itself.
    near, far = socket.socketpair()
    with near, far:
        far.settimeout(2)
        near.sendall(b"request bytes")
        sockio.drop_errors(far)
        assert far.recv(100) == b"request bytes"
