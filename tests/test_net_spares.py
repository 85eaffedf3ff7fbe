"""Connections opened ahead (spare.py): a destination served again and again gets one spare
connection, which the next request to the same address and port takes, and which is never
anything but a connect until a request the policy allows is sent on it.

Lanes only (the proxy's event loop opens none): each client is a TCP connection to a listener
handed over to the proxy, as the sandbox's bridge hands over its own.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import net_sandbox
import pytest
from net_ns import REMOTE_V4, IsolatedNet
from net_sandbox import SessionFactory, exchange, needs_netns

from gatekeeper.sandbox.net import NetworkSession, spare
from gatekeeper.sandbox.net.classify import ip_literal
from gatekeeper.sandbox.net.lane import Lane
from gatekeeper.sandbox.net.proxy import ProxyLimits

pytest_plugins = ["net_fixtures"]
pytestmark = [needs_netns]

RESET = struct.pack("ii", 1, 0)  # SO_LINGER with no time: close() resets
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@pytest.fixture(autouse=True)
def lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net_sandbox, "WAY", "lane")


def start(start_session: SessionFactory, spare_seconds: float = 30.0) -> NetworkSession:
    limits = ProxyLimits(connect_timeout=2, idle_timeout=5, spare_seconds=spare_seconds)
    session, _ = start_session(
        {"arbitrary_web": "allow"}, names={"web.test": [REMOTE_V4]}, limits=limits
    )
    return session


def lane_of(session: NetworkSession) -> Lane:
    return session._thread.lane  # type: ignore[union-attr]


def get(session: NetworkSession, port: int, path: str, method: str = "GET") -> bytes:
    return exchange(session, f"{method} http://web.test:{port}{path} HTTP/1.1\r\n\r\n".encode())


def with_a_spare(session: NetworkSession, server: Server) -> None:
    """Two requests to server (its connections 0 and 1): its connection 2 is then a spare."""
    get(session, server.port, "/1")
    get(session, server.port, "/2")
    assert wait_for(lambda: len(lane_of(session).spares) == 1)


def wait_for(condition: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


class Server:
    """A raw HTTP server on the remote test host that numbers its connections and records,
    for each, the request it read (b"" for none) and whether the other end closed it first.
    `behave(number, head)` answers a request; by default 200 and close."""

    def __init__(self, outer: IsolatedNet, idle: float = 10.0) -> None:
        with outer.inside("remote"):
            self.sock = socket.socket()
            self.sock.bind((REMOTE_V4, 0))
            self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.idle = idle  # an idle connection is closed after this long
        self.heads: dict[int, bytes] = {}
        self.ended: set[int] = set()  # connections the proxy closed without a request
        self.timed_out: set[int] = set()  # connections this server closed idle
        self.behave: Callable[[int, bytes, socket.socket], None] = self._answer
        self.say_first: dict[int, bytes] = {}  # sent on a connection as soon as it is made
        self.reset_at_once: set[int] = set()  # connections reset as soon as they are made
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self.heads)

    def requests(self) -> list[bytes]:
        with self._lock:
            return [h.split(b" ")[1] for _, h in sorted(self.heads.items()) if h]

    @staticmethod
    def _answer(number: int, head: bytes, conn: socket.socket) -> None:
        conn.sendall(OK)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                number = len(self.heads)
                self.heads[number] = b""
            threading.Thread(target=self._serve, args=(number, conn), daemon=True).start()

    def _serve(self, number: int, conn: socket.socket) -> None:
        with conn:
            if number in self.reset_at_once:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
                return
            conn.settimeout(self.idle)
            if number in self.say_first:
                conn.sendall(self.say_first[number])
            head = b""
            try:
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        with self._lock:
                            self.ended.add(number)
                        return
                    head += chunk
            except TimeoutError:
                with self._lock:
                    self.timed_out.add(number)
                return
            except OSError:
                return
            with self._lock:
                self.heads[number] = head
            self.behave(number, head, conn)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


@pytest.fixture
def server(outer: IsolatedNet) -> Iterator[Server]:
    made = Server(outer)
    yield made
    made.close()


def test_a_destination_fetched_again_and_again_takes_connections_opened_ahead(
    start_session: SessionFactory, server: Server
) -> None:
    session = start(start_session)
    spares = lane_of(session).spares
    for number in range(10):
        assert get(session, server.port, f"/{number}").endswith(b"\r\n\r\nok")
        # (opened once the client has its answer: off its path)
        assert wait_for(lambda: len(spares) == (number > 0))  # noqa: B023
    # From the second request on, a spare is opened after each; every request after the
    # second was sent on one.
    assert (spares.opened, spares.taken) == (9, 8)
    assert server.requests() == [f"/{n}".encode() for n in range(10)]
    assert wait_for(lambda: server.connections == 11)  # one spare is held, unused
    # Each request is judged and recorded as before: a spare carries no record of its own.
    entries = session.recorder.entries
    assert [(e.path, e.decision) for e in entries] == [(f"/{n}", "allow") for n in range(10)]
    session.stop()
    assert wait_for(lambda: server.ended == {10})  # the held spare is closed at the end


def test_tunnels_and_posts_neither_take_nor_open_them(
    start_session: SessionFactory, server: Server
) -> None:
    # What a tunnel carries, or a POST, cannot be sent again should a spare turn out to have
    # ended: they connect afresh, always.
    session = start(start_session)
    for _ in range(3):
        with net_sandbox.client(session) as sock:
            sock.sendall(f"CONNECT web.test:{server.port} HTTP/1.1\r\n\r\n".encode())
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += sock.recv(1)
            assert head.startswith(b"HTTP/1.1 200 ")
            sock.sendall(b"GET /t HTTP/1.1\r\n\r\n")
            assert net_sandbox.read_all(sock).endswith(b"\r\n\r\nok")
    for _ in range(3):
        assert get(session, server.port, "/p", "POST").endswith(b"ok")
    spares = lane_of(session).spares
    assert (spares.opened, spares.taken) == (0, 0)
    assert [e.decision for e in session.recorder.entries] == ["allow"] * 6
    # A spare held for GETs is not taken by a POST either.
    with_a_spare(session, server)
    assert get(session, server.port, "/p", "POST").endswith(b"ok")
    assert (len(spares), spares.taken) == (1, 0)


def test_requests_that_failed_open_none(start_session: SessionFactory, server: Server) -> None:
    server.behave = lambda number, head, conn: None  # hangs up unanswered
    session = start(start_session)
    for _ in range(3):
        assert get(session, server.port, "/x").startswith(b"HTTP/1.1 502 ")
    assert lane_of(session).spares.opened == 0
    assert [e.decision for e in session.recorder.entries] == ["error"] * 3


def test_none_is_opened_on_a_judgement_older_than_a_spare_may_live(
    start_session: SessionFactory, server: Server
) -> None:
    # A spare is connected at the end of a request, on the judgement made at its start: only
    # when that is younger than a spare may live (the address could have become another's).
    def slowly(number: int, head: bytes, conn: socket.socket) -> None:
        time.sleep(0.5)
        conn.sendall(OK)

    server.behave = slowly
    session = start(start_session, spare_seconds=0.3)
    net_sandbox.client(session).close()  # (the listener handed over once, before the two)
    # Two at once: they end within the keep time of each other, judged longer ago than that.
    replies: list[bytes] = []
    both = [
        threading.Thread(target=lambda: replies.append(get(session, server.port, "/slow")))
        for _ in range(2)
    ]
    for each in both:
        each.start()
    for each in both:
        each.join()
    assert [r.endswith(b"ok") for r in replies] == [True, True]
    assert wait_for(lambda: len(session.recorder.entries) == 2)
    time.sleep(0.1)  # (a spare would be opened right after the answers)
    assert lane_of(session).spares.opened == 0


def test_none_is_opened_for_a_destination_served_once_or_when_turned_off(
    start_session: SessionFactory, outer: IsolatedNet
) -> None:
    servers = [Server(outer) for _ in range(3)]
    session = start(start_session)
    for each in servers:
        assert get(session, each.port, "/once").endswith(b"ok")
    assert lane_of(session).spares.opened == 0
    off = start(start_session, spare_seconds=0)
    for _ in range(4):
        assert get(off, servers[0].port, "/again").endswith(b"ok")
    assert lane_of(off).spares.opened == 0
    assert servers[0].connections == 5
    for each in servers:
        each.close()


def test_a_spare_is_for_its_own_address_and_port_only(
    start_session: SessionFactory, server: Server, outer: IsolatedNet
) -> None:
    other = Server(outer)
    session = start(start_session)
    get(session, server.port, "/a")
    get(session, server.port, "/b")  # a spare to server's port is opened
    assert wait_for(lambda: server.connections == 3)
    assert get(session, other.port, "/c").endswith(b"ok")  # another port: a connect of its own
    spares = lane_of(session).spares
    assert (spares.opened, spares.taken) == (1, 0)
    assert other.requests() == [b"/c"] and server.requests() == [b"/a", b"/b"]
    # Keyed on the address too: the same port elsewhere does not take it.
    assert spares.take(ip_literal("127.0.0.1"), server.port) is None  # type: ignore[arg-type]
    assert len(spares) == 1
    other.close()


def test_a_spare_the_server_has_closed_is_dropped_and_the_request_connects_afresh(
    start_session: SessionFactory, outer: IsolatedNet
) -> None:
    server = Server(outer, idle=0.2)  # closes a connection that says nothing for 0.2 s
    session = start(start_session)
    get(session, server.port, "/1")
    get(session, server.port, "/2")
    assert wait_for(lambda: server.timed_out == {2})
    assert get(session, server.port, "/3").endswith(b"\r\n\r\nok")
    assert lane_of(session).spares.taken == 0
    assert server.requests() == [b"/1", b"/2", b"/3"]
    assert [e.decision for e in session.recorder.entries] == ["allow"] * 3
    server.close()


def test_a_spare_the_server_has_written_to_is_not_used(
    start_session: SessionFactory, server: Server
) -> None:
    # A server's "408 Request Timeout" on an idle connection must not become the answer to
    # the next request.
    server.say_first[2] = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"
    session = start(start_session)
    with_a_spare(session, server)
    spares = lane_of(session).spares
    spare = next(iter(spares._spares.values()))[0]
    assert wait_for(lambda: readable(spare))  # the 408 has reached the proxy
    reply = get(session, server.port, "/3")
    assert reply.endswith(b"\r\n\r\nok") and b"408" not in reply
    assert spares.taken == 0
    assert server.requests() == [b"/1", b"/2", b"/3"]


def readable(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE"])
def test_a_spare_that_ends_as_a_request_is_sent_on_it(
    start_session: SessionFactory, server: Server, method: str
) -> None:
    # The server closes the spare just as the request arrives (its idle close crossing the
    # request): the request (one that may be sent again) is, once, on a new connection, and
    # recorded once, with the bytes of the attempt that was answered.
    def hang_up_on_the_spare(number: int, head: bytes, conn: socket.socket) -> None:
        if number == 2:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
            return  # closed with a reset, unanswered
        conn.sendall(OK)

    server.behave = hang_up_on_the_spare
    session = start(start_session)
    request = f"{method} http://web.test:{server.port}/3 HTTP/1.1\r\n\r\n".encode()
    exchange(session, request.replace(b"/3", b"/1"))
    exchange(session, request.replace(b"/3", b"/2"))
    assert wait_for(lambda: len(lane_of(session).spares) == 1)
    reply = exchange(session, request)
    assert reply.startswith(b"HTTP/1.1 200 "), reply
    assert lane_of(session).spares.taken == 1
    assert server.requests() == [b"/1", b"/2", b"/3", b"/3"]
    first, _, last = session.recorder.entries
    # The head went out twice (the spare's server may have read it): both count.
    assert (last.path, last.decision, last.bytes_up) == ("/3", "allow", 2 * first.bytes_up)


def test_a_request_whose_spare_ended_and_whose_new_connect_failed_counts_what_went_out(
    start_session: SessionFactory, server: Server
) -> None:
    def end_and_refuse(number: int, head: bytes, conn: socket.socket) -> None:
        if number == 2:  # the spare: reads the head, then ends it and refuses new ones
            server.close()
            return
        conn.sendall(OK)

    server.behave = end_and_refuse
    session = start(start_session)
    with_a_spare(session, server)
    request = f"GET http://web.test:{server.port}/3 HTTP/1.1\r\nX-Data: {'s' * 30000}\r\n\r\n"
    reply = exchange(session, request.encode())
    assert reply.startswith(b"HTTP/1.1 502 ") and b"connect failed" in reply, reply[:200]
    assert len(server.heads[2]) > 30000
    first, _, last = session.recorder.entries
    assert (last.path, last.decision) == ("/3", "error")
    assert last.bytes_up == first.bytes_up + 30000 + len("X-Data: \r\n")


def test_a_spare_that_gave_an_interim_answer_is_not_sent_again(
    start_session: SessionFactory, server: Server
) -> None:
    # A 1xx shows the server read the request: its end after that is the server's error.
    def hint_then_hang_up(number: int, head: bytes, conn: socket.socket) -> None:
        if number == 2:
            conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </s>; rel=preload\r\n\r\n")
            return
        conn.sendall(OK)

    server.behave = hint_then_hang_up
    session = start(start_session)
    with_a_spare(session, server)
    reply = get(session, server.port, "/3")
    assert reply.startswith(b"HTTP/1.1 103 ") and b"HTTP/1.1 502 " in reply, reply
    assert server.requests() == [b"/1", b"/2", b"/3"]
    assert session.recorder.entries[-1].decision == "error"


def test_stopping_during_a_request_on_a_spare_sends_it_nowhere_else(
    start_session: SessionFactory, server: Server
) -> None:
    arrived = threading.Event()

    def hold(number: int, head: bytes, conn: socket.socket) -> None:
        if number == 2:
            arrived.set()
            conn.recv(1)  # until the proxy ends the connection
            return
        conn.sendall(OK)

    server.behave = hold
    session = start(start_session)
    with_a_spare(session, server)
    with net_sandbox.client(session) as sock:
        sock.sendall(f"GET http://web.test:{server.port}/3 HTTP/1.1\r\n\r\n".encode())
        assert arrived.wait(5)
        session.stop()
        assert net_sandbox.read_all(sock) == b""
    assert server.connections == 3  # no new connection after stop()
    last = session.recorder.entries[-1]
    assert (last.path, last.decision) == ("/3", "error")


def test_a_spare_reset_between_the_check_and_the_send_is_replaced(
    start_session: SessionFactory, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reset arrives after take() looked (the check passes): the send fails outright.
    monkeypatch.setattr(spare, "_unused", lambda sock: True)
    server.reset_at_once.add(2)
    session = start(start_session)
    with_a_spare(session, server)
    spares = lane_of(session).spares
    held = next(iter(spares._spares.values()))[0]
    assert wait_for(lambda: held.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0)
    assert get(session, server.port, "/3").endswith(b"\r\n\r\nok")
    assert spares.taken == 1
    assert server.requests() == [b"/1", b"/2", b"/3"]
    assert [e.decision for e in session.recorder.entries] == ["allow"] * 3


def test_a_spare_not_taken_is_closed_after_its_time(
    start_session: SessionFactory, server: Server
) -> None:
    session = start(start_session, spare_seconds=0.3)
    get(session, server.port, "/1")
    get(session, server.port, "/2")
    assert wait_for(lambda: server.ended == {2})
    spares = lane_of(session).spares
    assert (len(spares), spares.opened, spares.taken) == (0, 1, 0)
    # And a request after that connects afresh.
    assert get(session, server.port, "/3").endswith(b"ok")
    assert server.requests() == [b"/1", b"/2", b"/3"]


def test_spares_are_few(start_session: SessionFactory, outer: IsolatedNet) -> None:
    servers = [Server(outer) for _ in range(6)]
    session = start(start_session)
    spares = lane_of(session).spares
    for number, each in enumerate(servers):
        get(session, each.port, "/1")
        get(session, each.port, "/2")
        assert wait_for(lambda: spares.opened == number + 1)  # noqa: B023
    assert spares.opened == 6 and len(spares) == spares.limit == 4
    # The oldest gave way: the first two servers see their spare closed.
    assert wait_for(lambda: [bool(s.ended) for s in servers] == [True] * 2 + [False] * 4)
    session.stop()
    assert wait_for(lambda: all(s.ended == {2} for s in servers))
    for each in servers:
        each.close()


def test_a_spare_closed_meanwhile_is_not_taken() -> None:
    """A spare whose socket is closed is dropped (poll(2) of it raised ValueError)."""
    from gatekeeper.sandbox.net.classify import ip_literal
    from gatekeeper.sandbox.net.spare import Spares

    spares = Spares(keep=30)
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        port = listener.getsockname()[1]
        address = ip_literal("127.0.0.1")
        assert address is not None
        sock = socket.create_connection(("127.0.0.1", port))
        sock.close()
        spares._spares[(address, port)] = (sock, time.monotonic(), True)
        assert spares.take(address, port) is None
    finally:
        spares.stop()
        listener.close()
