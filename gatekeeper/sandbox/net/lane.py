"""The proxy's fast lane: a connection served to its end on the thread that accepted it.

The event loop (proxy.py) can serve every kind of client, but each connection there costs a
hop from the accepting thread, a task, and a turn of the loop for each step: for one request
per connection that cost more than the relay itself. So a client the launcher accepted itself
(from a listener the bridge handed over, a file description no process in the sandbox holds)
is served first by the thread that accepted it, with poll(2) and non-blocking calls: a plain
HTTP request without a body, or a CONNECT, to a destination the policy allows outright, and
every connection to a bridged loopback port. Whatever else it finds (SOCKS, a request body, a
destination refused, asked about at a prompt, or allowed only by address) goes to the event
loop with the bytes read so far, which serves it as if they had just arrived there.

The lane decides, records and answers as the loop would: the same judgement (Decider
.judge_now is Decider.judge for the cases it answers), the same entries, replies and
ClientHello check (proxy.hello_step), the same timeouts. Its relay copies through a small
buffer and then, for bulk, a large one, as relay.py does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import threading
import time
from collections.abc import Callable

from gatekeeper.sandbox.net import sockio
from gatekeeper.sandbox.net.classify import (
    Category,
    IPAddress,
    ip_literal,
    is_loopback_name,
    is_valid_name,
)
from gatekeeper.sandbox.net.decide import ResolveError
from gatekeeper.sandbox.net.httpio import (
    MAX_INTERIM,
    HttpError,
    body_length,
    final_head,
    forward_head,
    parse_request,
    plain_request,
    response_status,
    simple_response,
    split_absolute_uri,
    split_authority,
    split_head,
)
from gatekeeper.sandbox.net.proxy import (
    _LOOPBACK_V4,
    _LOOPBACK_V6,
    CUT_SHORT,
    LINGER_BYTES,
    LINGER_SECONDS,
    TLS_ACCESS_DENIED,
    Proxy,
    hello_step,
    refused_request,
)
from gatekeeper.sandbox.net.record import Entry, loggable_path
from gatekeeper.sandbox.net.relay import CHUNK, let_go, read_buffer
from gatekeeper.sandbox.net.spare import Spares

_CATEGORY_NAMES = {category: category.value for category in Category}  # (.value is slow)
READ = select.POLLIN | select.POLLHUP | select.POLLERR
WRITE = select.POLLOUT | select.POLLHUP | select.POLLERR
CONNECTED = b"HTTP/1.1 200 Connection established\r\n\r\n"
MAX_CLIENTS = 256  # served at once by the lanes of one session; then by the event loop
# The requests that take connections opened ahead (spare.py), and count towards opening
# them: those that may be sent again when the spare they went out on ends before any
# answer (RFC 9110 9.2.2's idempotent methods, which HTTP clients retry on a reused
# connection). Not CONNECT: what a tunnel carries cannot be sent again.
REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})

# What a lane gives back: None when it served the client to the end (and closed it), else the
# bytes it read from the client, for the event loop to serve it.
Served = bytes | None


class _Refused(Exception):
    """A tunnel refused after its first bytes (the reason is the entry's)."""


class _Stale(Exception):
    """A spare ended before any answer to the request sent on it (see spare.py)."""


class Lane:
    """Serves clients of one proxy on the threads that accept them (see the module's text)."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.limits = proxy.limits
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._busy = threading.Condition(self._lock)
        self._clients = 0  # served now
        # Every attempt a lane reads is, until recorded, in one of two places, so that the
        # session's log (read once stop() has returned) holds each exactly once:
        # - _pending, while judged or connected (a name lookup or a connect may outlast
        #   stop's wait): stop() records what is left there as cut short; the thread that
        #   finishes one later finds it gone (_settle) and records nothing more;
        # - _handed, once given back to the event loop (by then its records are the loop's):
        #   the loop takes it out as it takes the client (handed_late), and what the loop
        #   never took is recorded as cut short once it has ended (settle_handed).
        self._pending: dict[socket.socket, Entry] = {}
        self._cut: set[socket.socket] = set()  # clients whose attempt stop() recorded
        self._handed: dict[socket.socket, bytes] = {}
        self._handed_settled = False
        self.stopped = False
        self.spares = Spares(proxy.limits.spare_seconds)

    # --- bookkeeping ----------------------------------------------------------------------

    def _hold(self, sock: socket.socket) -> None:
        """Count sock as open in a lane (stop() shuts it down); raise OSError once stopped."""
        with self._lock:
            if self.stopped:
                raise OSError("the proxy is stopping")
            self._open.add(sock)

    def _drop(self, sock: socket.socket) -> None:
        """Close a socket _hold counted, and count it out."""
        with self._lock:
            self._open.discard(sock)
            sock.close()
            if self.stopped:  # only stop() waits
                self._busy.notify_all()

    def _take(self, client: socket.socket) -> Served:
        """Hold a new client: None when the lane is to serve it; else b"" when the event
        loop is to (the lanes serve MAX_CLIENTS at once), or b"\\x00" when it is to be
        dropped (the proxy is stopping)."""
        with self._lock:
            if self.stopped:
                return b"\x00"
            if self._clients >= MAX_CLIENTS:
                return b""
            self._clients += 1
            self._open.add(client)
        return None

    def _let_go(
        self, client: socket.socket, upstream: socket.socket | None, served: Served = None
    ) -> Served:
        """The client is served: close upstream (when there is one), and count both out.
        served: what is given back for the event loop, which is returned, counted as handed
        over (its attempt the loop's to record); once the lane is stopped it is recorded as
        cut short instead (the loop stops after the lanes) and None is returned."""
        with self._lock:
            self._clients -= 1
            self._open.discard(client)
            if upstream is not None:
                self._open.discard(upstream)
                upstream.close()
            if client in self._cut:  # recorded by stop() already, as cut short
                self._cut.discard(client)
                served = None
            elif served:
                self._pending.pop(client, None)  # (its record is the loop's, or below)
                if self.stopped:
                    self.cut_short(served)
                    served = None
                else:
                    self._handed[client] = served
            if self.stopped:  # only stop() waits
                self._busy.notify_all()
        return served

    def stop(self, wait: float = 2.0) -> None:
        """End every connection a lane serves (their records are then final), waiting up to
        wait seconds for the lanes to finish them."""
        deadline = time.monotonic() + wait
        self.spares.stop()
        with self._lock:
            self.stopped = True
        self.proxy.decider.close()  # lookups queued behind others never start
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # (a connect under way ends too)
            while self._open and (left := deadline - time.monotonic()) > 0:
                self._busy.wait(left)
            # Their records are then there before the session's log is read.
            for client, entry in self._pending.items():
                entry.decision, entry.reason = "error", CUT_SHORT
                self.proxy.recorder.add(entry)
                self._cut.add(client)
            self._pending.clear()

    def _judging(self, client: socket.socket, entry: Entry) -> bool:
        """Count entry as being judged for client; False (recorded as cut short) once the
        lane is stopped."""
        with self._lock:
            if not self.stopped:
                self._pending[client] = entry
                return True
            entry.decision, entry.reason = "error", CUT_SHORT
            self.proxy.recorder.add(entry)
        return False

    def _settle(
        self,
        client: socket.socket,
        entry: Entry,
        decision: str,
        reason: str | None = None,
        category: str | None = None,
    ) -> str | None:
        """Record client's attempt (_judging) as decided (its category too), or as cut short
        once the lane is stopped; the decision recorded, or None when stop() recorded it
        already (and then entry is left as recorded). Under the lock, as stop() records: an
        attempt is never between the two."""
        with self._lock:
            if self._pending.pop(client, None) is None:
                return None
            entry.category = category
            if self.stopped:
                decision, reason = "error", CUT_SHORT
            entry.decision, entry.reason = decision, reason
            self.proxy.recorder.add(entry)
        return decision

    def cut_short(self, data: bytes) -> None:
        """Record a request a lane read (data) that neither it nor the event loop serves:
        the session stopped in between."""
        entry = refused_request(data, HttpError(502, "-"))
        entry.decision, entry.reason = "error", CUT_SHORT
        self.proxy.recorder.add(entry)

    def handed_late(self, client: socket.socket, data: bytes) -> bool:
        """For the event loop, as it takes a client a lane gave back (with data, what was
        read): False when the loop is to serve it; True when it is to close it, its request
        recorded as cut short (the lanes have stopped, and the loop stops next), or already
        recorded so (settle_handed)."""
        with self._lock:
            known = self._handed.pop(client, None) is not None
            if self._handed_settled and not known:
                return True
            if not self.stopped:
                return False
            self.cut_short(data)
        return True

    def settle_handed(self) -> None:
        """Once the event loop has ended: record what the lanes gave back that it never
        took as cut short."""
        with self._lock:
            for data in self._handed.values():
                self.cut_short(data)
            self._handed.clear()
            self._handed_settled = True

    def _connect(
        self, addresses: list[IPAddress], port: int, timeout: float
    ) -> tuple[socket.socket, IPAddress]:
        """A connected non-blocking socket to the first address that answers, and that
        address; each socket is counted open (_hold) before it connects, so that stop()
        ends a connect under way, and none is opened once the lane is stopped. Raise
        OSError."""
        error: OSError = OSError("no address to connect to")
        for address in addresses:
            with self._lock:
                if self.stopped:
                    raise OSError("the proxy is stopping")
                try:
                    sock, done = sockio.open_tcp(address, port)  # (non-blocking: at once)
                except OSError as exc:
                    error = exc
                    continue
                self._open.add(sock)
            try:
                if not done:
                    _connected(sock, address, port, timeout)
                return sock, address
            except OSError as exc:
                self._drop(sock)
                error = exc
        raise error

    # --- the proxy's clients --------------------------------------------------------------

    def serve(self, client: socket.socket) -> Served:
        """Serve a proxy client here, or give back what was read for the event loop."""
        refused = self._take(client)
        if refused is not None:
            return None if refused else b""
        upstream: socket.socket | None = None
        went: tuple[IPAddress, int] | None = None
        served: Served = None
        try:
            served, upstream, went = self._serve(client)
        finally:
            served = self._let_go(client, upstream, served)
            if went is not None:  # after the client has its answer: off its path
                self.spares.served(*went)
        return served

    def _serve(
        self, client: socket.socket
    ) -> tuple[Served, socket.socket | None, tuple[IPAddress, int] | None]:
        """(what serve gives back, the upstream to close, the address and port a request
        that may take a spare was answered from, when it was judged less than the spares'
        keep seconds ago: spare.py opens one there only on a judgement that fresh)."""
        limits = self.limits
        buffer = bytearray()
        deadline = time.monotonic() + limits.header_timeout
        head: bytes | None = None
        start = 0
        try:
            while head is None:
                try:  # (the request is there as the client connects, nearly always)
                    chunk = client.recv(65536, sockio.DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    chunk = _recv(client, deadline)
                if not chunk:
                    return None, None, None  # closed before a whole request
                buffer += chunk
                if buffer[:1] in (b"\x04", b"\x05"):  # SOCKS: the loop's
                    return bytes(buffer), None, None
                head = split_head(buffer, limits.head_limit, start)
                start = max(0, len(buffer) - 3)
            plain = plain_request(head)
            if plain is not None:  # (most requests: the same reading, in fewer steps)
                method, host, port, path, sent = plain
                entry = Entry(host, port, "deny", None, method=method, path=loggable_path(path))
            else:
                request = parse_request(head)
                method = request.method
                if method == "CONNECT":
                    host, port = split_authority(request.target, None)
                    entry = Entry(host, port, "deny", None, method="CONNECT")
                    sent = b""
                else:
                    host, port, path = split_absolute_uri(request.target)
                    if body_length(request) != 0:
                        return head + bytes(buffer), None, None  # a body to frame: the loop's
                    entry = Entry(host, port, "deny", None, method=method,
                                  path=loggable_path(path))  # fmt: skip
                    sent = forward_head(request, host, port, path)
        except TimeoutError:
            if not buffer:  # not a word: dropped, as the loop drops it
                return None, None, None
            late = HttpError(408, "the request head did not arrive in time")
            self.proxy.recorder.add(refused_request(bytes(buffer[:4096]), late))
            self._reply(client, 408, "gatekeeper: the request head did not arrive in time")
            return None, None, None
        except HttpError as exc:
            self.proxy.recorder.add(refused_request(head or b"", exc))
            self._reply(client, exc.status, f"gatekeeper: {exc.message}", exc.message)
            return None, None, None
        except OSError:
            return None, None, None
        opened = self._open_now(client, entry)
        if not isinstance(opened, tuple):
            return (head + bytes(buffer) if opened else None), None, None
        upstream, address, spare = opened
        judged = time.monotonic()
        try:
            if method == "CONNECT":
                self._tunnel(client, upstream, entry, bytes(buffer))
                return None, upstream, None
            try:
                self._forward(client, upstream, entry, sent, stale=spare)
            except _Stale:
                reopened = self._reopen(client, upstream, entry, address)
                if reopened is None:
                    return None, None, None
                upstream = reopened
                self._forward(client, upstream, entry, sent)
        except OSError:
            pass
        fresh = time.monotonic() - judged < self.spares.keep
        if entry.decision != "allow" or entry.method not in REPLAYABLE or not fresh:
            return None, upstream, None
        assert entry.port is not None  # an absolute http:// URL's port (80 by default)
        return None, upstream, (address, entry.port)

    def _open_now(
        self, client: socket.socket, entry: Entry
    ) -> tuple[socket.socket, IPAddress, bool] | bool:
        """(the upstream, its address, whether it is a spare) for entry when the lane may
        serve it (recorded as allowed); True when the event loop is to judge it instead,
        False when it failed here (recorded, answered)."""
        assert entry.port is not None
        if not is_valid_name(entry.host):
            return True
        if ip_literal(entry.host) is None and not is_loopback_name(entry.host):
            sockio.step_aside()  # the name may be looked up: no client waits for that
        if not self._judging(client, entry):
            return False
        try:
            judgement = self.proxy.decider.judge_now(entry.host, entry.port)
        except ResolveError as exc:
            if self._settle(client, entry, "error", str(exc), exc.category):
                self._failed(client, entry.reason or str(exc))
            return False
        if judgement is None:
            return True  # the event loop judges it (_let_go hands it over, or cuts it short)
        category = _CATEGORY_NAMES[judgement.verdict.category]
        timeout = self.limits.connect_timeout
        # The first allowed address is the one a fresh connect tries first.
        address = judgement.addresses[0]
        spare, done = None, True
        if entry.method in REPLAYABLE and (held := self.spares.take(address, entry.port)):
            spare, done = held
            try:
                self._hold(spare)
            except OSError:  # stopped: the connect below is refused as well
                spare.close()
                spare = None
        try:
            if spare is not None and not done:
                try:
                    _connected(spare, address, entry.port, timeout)
                except TimeoutError:  # as a fresh connect would have, in as long
                    self._drop(spare)
                    raise
                except OSError:
                    self._drop(spare)
                    spare = None
            if spare is None:
                upstream, address = self._connect(judgement.addresses, entry.port, timeout)
            else:
                upstream = spare
        except OSError as exc:
            failure = f"connect failed: {exc.strerror or exc}"
            if self._settle(client, entry, "error", failure, category):
                self._failed(client, entry.reason or failure)
            return False
        if self._settle(client, entry, "allow", None, category) != "allow":  # (cut short)
            self._drop(upstream)
            return False
        return upstream, address, spare is not None

    def _reopen(
        self, client: socket.socket, stale: socket.socket, entry: Entry, address: IPAddress
    ) -> socket.socket | None:
        """A new connection to address in place of a spare that ended unanswered; None when
        it failed (recorded, answered)."""
        self._drop(stale)
        assert entry.port is not None
        try:
            upstream, _ = self._connect([address], entry.port, self.limits.connect_timeout)
        except OSError as exc:
            failure = CUT_SHORT if self.stopped else f"connect failed: {exc.strerror or exc}"
            entry.decision, entry.reason = "error", failure
            self._failed(client, failure)
            return None
        return upstream

    def _failed(self, client: socket.socket, failure: str) -> None:
        status = 504 if "timed out" in failure else 502
        self._reply(client, status, f"gatekeeper: {failure}", failure)

    def _tunnel(
        self, client: socket.socket, upstream: socket.socket, entry: Entry, data: bytes
    ) -> None:
        self._send(client, CONNECTED, entry, counted=False)
        try:
            _Join(client, upstream, entry, self.limits.idle_timeout, hello=data).run()
        except _Refused:
            with contextlib.suppress(OSError):
                sockio.send_now(client, TLS_ACCESS_DENIED)

    def _forward(
        self,
        client: socket.socket,
        upstream: socket.socket,
        entry: Entry,
        head: bytes,
        *,
        stale: bool = False,
    ) -> None:
        """Send the request head upstream and relay the answer. With stale (the upstream is
        a spare), raise _Stale when it ends before any answer to a request that may be sent
        again, instead of answering 502."""
        idle = self.limits.idle_timeout
        answer = bytearray()
        heard = False  # any byte from the server (an interim answer is one)
        interim = 0
        try:
            # (each part counted: the send may be cut at its deadline)
            _sendall(upstream, head, time.monotonic() + idle, entry.sent)
            # The server has only now been sent the request: wait before the first read
            # (which would find nothing, nearly always).
            _wait(upstream, READ, time.monotonic() + idle)
            limit = self.limits.head_limit
            while True:
                response = None
                deadline = time.monotonic() + idle
                start = 0  # (searched before: all but its last 3 bytes)
                # (split_head finds nothing in nothing: read first)
                while not answer or (response := split_head(answer, limit, start)) is None:
                    start = max(0, len(answer) - 3)
                    chunk = _recv(upstream, deadline)
                    if not chunk:
                        raise EOFError
                    answer += chunk
                    heard = True
                status = response_status(response)
                if 100 <= status < 200 and status != 101:
                    interim += 1
                    if interim > MAX_INTERIM:
                        raise HttpError(502, "the server sent too many interim (1xx) answers")
                    self._send(client, response, entry)
                    continue
                if status == 101:
                    raise HttpError(502, "the server switched protocols on a plain HTTP request")
                break
        except sockio.Stalled:
            raise  # (the entry says why: _send)
        except (TimeoutError, HttpError, EOFError, OSError) as exc:
            if (
                stale
                and not heard
                and isinstance(exc, (EOFError, ConnectionError))
                and not self.stopped  # (stop() ends every upstream: no retry after it)
            ):
                raise _Stale from None  # (bytes_up counts both sends of the head)
            entry.decision = "error"
            entry.reason = getattr(exc, "message", None) or (
                f"the connection failed: {exc.strerror or exc}"
                if isinstance(exc, OSError) and not isinstance(exc, TimeoutError)
                else "the server sent no complete response"
            )
            self._reply(client, 502, f"gatekeeper: {entry.reason}", entry.reason)
            return
        closed, length = final_head(response, entry.method or "", status)
        if length is not None and len(answer) >= length:
            # All of it is here (as a small answer nearly always is): done, without waiting
            # for the server's end (as on the event loop, proxy.py).
            out = closed + bytes(answer[:length])
            self._send(client, out, entry)
            self._end_answer(client, upstream)
            return
        out = closed + bytes(answer)
        self._send(client, out, entry)
        if length is None:  # to the server's end
            more = sockio.recv_now(upstream, 65536)
            if more == b"":  # the answer was all there, and its end: no relay to set up
                self._end_answer(client, upstream)
                return
            if more:
                self._send(client, more, entry)
        # The rest, up to its length when the head says it (what a server sends after that
        # is no part of the answer: it is not read).
        rest = None if length is None else length - len(answer)
        join = _Join(client, upstream, entry, idle, up=False, budget=rest)
        try:
            join.run()
        except OSError as exc:
            if not self.stopped:  # (stop() ends it: the session's end, no fault)
                entry.decision, entry.reason = "error", f"the answer was cut: {exc}"
                if isinstance(exc, TimeoutError) and join.flows[0].pending:
                    # (bytes held for the client all along: it stopped taking the answer)
                    entry.reason = f"the client did not take the answer within {idle:g}s"
            raise
        if join.flows[0].budget and not self.stopped:  # the server ended before its length
            entry.decision = "error"
            entry.reason = "the answer was cut: the server closed before the length its head said"
        self._end_answer(client, upstream)

    def _send(
        self, client: socket.socket, data: bytes, entry: Entry, *, counted: bool = True
    ) -> None:
        """Send (part of) an answer to the client within the idle timeout, counting what
        went as bytes down (unless not counted); raise sockio.Stalled past it, entry saying
        why (as proxy.Proxy._send), or OSError."""
        idle = self.limits.idle_timeout
        try:
            _sendall(client, data, time.monotonic() + idle, entry.received if counted else None)
        except TimeoutError:
            entry.decision = "error"
            entry.reason = f"the client did not take the answer within {idle:g}s"
            raise sockio.Stalled(f"not taken within {idle:g}s") from None

    def _reply(
        self, client: socket.socket, status: int, body: str, reason: str | None = None
    ) -> None:
        """Send a short answer, half-close, and drain what the client still sends (briefly),
        so that closing does not reset the connection before the client has read it."""
        if self.stopped:  # (stop() ends the client's connection: no answer races it)
            return
        headers = (
            [("X-Gatekeeper-Reason", reason.encode("ascii", "replace").decode())] if reason else []
        )
        deadline = time.monotonic() + LINGER_SECONDS
        with contextlib.suppress(TimeoutError, OSError):
            _sendall(client, simple_response(status, body, headers), deadline)
            _linger(client, taking=False, cap=deadline - time.monotonic())

    def _end_answer(self, client: socket.socket, upstream: socket.socket) -> None:
        """Half-close after an answer (once more after a relay, which half-closed when it
        ended: harmless). When the client has not yet taken all of it (a client that reads
        slowly, and may pipeline its next request meanwhile), linger while it takes the
        rest: a close its next bytes answer with a reset would throw away what is still on
        its way. The upstream is closed first: a linger may last."""
        upstream.close()
        with contextlib.suppress(OSError):
            if not sockio.unacked(client):  # (nearly always: over loopback, taken at once)
                client.shutdown(socket.SHUT_WR)
                return
            _linger(client, taking=True, cap=self.limits.idle_timeout)

    # --- bridged loopback ports -----------------------------------------------------------

    def forwarder(self, port: int) -> Callable[[socket.socket], Served]:
        """Join each client to the host's loopback at port (already allowed), as
        Proxy.forwarder does."""

        def forward(client: socket.socket) -> Served:
            refused = self._take(client)
            if refused is not None:
                return None if refused else b""
            entry = self.proxy.recorder.add(Entry("localhost", port, "allow", "localhost"))
            upstream = None
            try:
                upstream, _ = self._connect([_LOOPBACK_V4, _LOOPBACK_V6], port,
                                            self.limits.connect_timeout)  # fmt: skip
                _Join(client, upstream, entry, self.limits.idle_timeout).run()
            except OSError as exc:
                if upstream is None:
                    entry.decision = "error"
                    entry.reason = (CUT_SHORT if self.stopped
                                    else f"connect failed: {exc.strerror or exc}")  # fmt: skip
            finally:
                self._let_go(client, upstream)
            return None

        return forward


# --- blocking calls with deadlines, on sockets that may be non-blocking ----------------------


def _wait(sock: socket.socket, events: int, deadline: float) -> None:
    """Wait until sock is ready for events; raise TimeoutError at deadline."""
    poller = select.poll()
    poller.register(sock.fileno(), events)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if ready := sockio.poll(poller, left):
            if ready.get(sock.fileno(), 0) & select.POLLERR:
                sockio.drop_errors(sock)  # (an error queue's POLLERR would wake this for ever)
            return


def _recv(sock: socket.socket, deadline: float, size: int = 65536) -> bytes:
    while True:
        data = sockio.recv_now(sock, size)
        if data is not None:
            return data
        _wait(sock, READ, deadline)


def _sendall(
    sock: socket.socket, data: bytes, deadline: float, count: Callable[[int], None] | None = None
) -> None:
    """Send all of data by deadline, telling count of each part sent; raise TimeoutError
    (what went has been counted) or OSError."""
    view: bytes | memoryview = data
    while view:
        try:
            sent = sock.send(view, sockio.DONTWAIT)
        except (BlockingIOError, InterruptedError):
            _wait(sock, WRITE, deadline)
            continue
        if count is not None:
            count(sent)
        if sent == len(view):  # (all of it, nearly always at once)
            return
        view = memoryview(view)[sent:]


def _linger(client: socket.socket, *, taking: bool, cap: float) -> None:
    """A lingering close (sockio.Linger) that waits here, watching the listener meanwhile
    (sockio.poll); raise OSError."""
    linger = sockio.Linger(client, taking=taking, quiet=LINGER_SECONDS, cap=cap,
                           limit=LINGER_BYTES)  # fmt: skip
    peer, nothing = select.poll(), select.poll()
    peer.register(client.fileno(), READ)
    while (wait := linger.next()) is not None:
        sockio.poll(nothing if linger.sleep else peer, wait)


def _connected(sock: socket.socket, address: IPAddress, port: int, timeout: float) -> None:
    """Wait for sock's connect to address to finish; raise OSError (a TimeoutError naming it
    at timeout). A connection made already (a spare) is writable at once.

    The connect's outcome is read before anything else: reading the error queue (which
    _wait empties on POLLERR) also clears the error a failed connect left (an ICMP host
    unreachable, say), and the connect would then look made."""
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(sock.fileno(), WRITE)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"connecting to {address} port {port} timed out")
        ready = sockio.poll(poller, left).get(sock.fileno(), 0)
        if not ready:
            continue
        failed = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if failed:
            raise OSError(failed, os.strerror(failed))
        try:
            sock.getpeername()
            return
        except OSError:  # not connected: ended unconnected, or only the error queue woke it
            if ready & select.POLLHUP:
                raise OSError(errno.ECONNABORTED, "the connect was ended") from None
        if ready & select.POLLERR:
            sockio.drop_errors(sock)


# --- the relay -----------------------------------------------------------------------------


class _Flow:
    """One direction: reads while nothing is pending, writes while something is."""

    def __init__(
        self, src: socket.socket, dst: socket.socket, count: Callable[[int], None]
    ) -> None:
        self.src, self.dst = src, dst
        self.count = count
        self.buffer: memoryview | None = None
        self.filled = False  # a read has filled CHUNK: BULK from then on (relay.read_buffer)
        self.pending = 0
        self.offset = 0
        self.held: bytearray | None = None  # a tunnel's first bytes, until hello_step passes them
        self.end_after = False  # the source ended while its bytes were held
        self.budget: int | None = None  # bytes still to relay, when that is known
        self.done = False

    def want(self) -> tuple[int, int]:
        return (self.dst.fileno(), WRITE) if self.pending else (self.src.fileno(), READ)

    def step(self, entry: Entry) -> None:
        """Read or write once; raise OSError (or _Refused) to end the tunnel."""
        if self.pending:
            self._write()
        elif self.held is not None:
            self._inspect(entry)
        else:
            self._read()

    def _read(self) -> None:
        if self.budget is not None and self.budget <= 0:  # (all of it relayed)
            self._end()
            return
        self.buffer = read_buffer(self.buffer, self.filled)
        room = self._room(len(self.buffer))
        try:
            n = self.src.recv_into(self.buffer, room, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        if n == 0:
            self._end()
            return
        self.filled = self.filled or n >= CHUNK  # (a held ClientHello's may be larger)
        if self.budget is not None:
            self.budget -= n
        self.pending, self.offset = n, 0
        self._write()

    def _room(self, size: int) -> int:
        return size if self.budget is None else min(size, self.budget)

    def _inspect(self, entry: Entry) -> None:
        assert self.held is not None
        data = sockio.recv_now(self.src, 65536)
        if data is None:
            return
        if data:
            self.held += data
            step = hello_step(entry, bytes(self.held))
        else:
            step = "the TLS ClientHello was cut short" if self.held else True
        self._pass_held(entry, step, ended=not data)

    def _pass_held(self, entry: Entry, step: bool | str, *, ended: bool = False) -> None:
        assert self.held is not None
        if isinstance(step, str):
            entry.decision, entry.reason = "deny", step
            raise _Refused(step)
        if step is False:
            return
        held, self.held = self.held, None
        if held:
            self.buffer = read_buffer(self.buffer, self.filled)
            if len(held) > len(self.buffer):
                let_go(self.buffer)
                self.buffer = memoryview(bytearray(len(held)))
            self.buffer[: len(held)] = held
            self.pending, self.offset = len(held), 0
            self._write()
        if ended and not self.pending:
            self._end()
        elif ended:
            self.end_after = True

    def _write(self) -> None:
        while self.pending:
            assert self.buffer is not None
            end = self.offset + self.pending
            try:
                sent = self.dst.send(self.buffer[self.offset : end], sockio.DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            self.offset += sent
            self.pending -= sent
            self.count(sent)
        if self.end_after or self.budget == 0:
            self._end()

    def _end(self) -> None:
        """The source ended: pass the end on as a half-close."""
        self.done = True
        with contextlib.suppress(OSError):
            self.dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        let_go(self.buffer)
        self.buffer = None


class _Join:
    """client <-> upstream until both directions end, an error, or idle seconds of silence.
    hello (a tunnel's first bytes, possibly none) holds the client's bytes until
    proxy.hello_step passes them; up=False relays the answer alone, budget (when known) is
    how much of it is still to come."""

    def __init__(
        self,
        client: socket.socket,
        upstream: socket.socket,
        entry: Entry,
        idle: float,
        *,
        up: bool = True,
        hello: bytes | None = None,
        budget: int | None = None,
    ) -> None:
        self.entry = entry
        self.idle = idle
        self.flows = [_Flow(upstream, client, self._down)]
        self.flows[0].budget = budget
        if up:
            self.flows.append(_Flow(client, upstream, self._up))
        self.hello = hello

    def _up(self, n: int) -> None:
        self.entry.sent(n)

    def _down(self, n: int) -> None:
        self.entry.received(n)

    def run(self) -> None:
        try:
            if self.hello is not None:
                up = self.flows[1]
                up.held = bytearray(self.hello)
                if self.hello:
                    up._pass_held(self.entry, hello_step(self.entry, self.hello))
            self._loop()
        finally:
            for flow in self.flows:
                flow.close()

    def _loop(self) -> None:
        last = time.monotonic()
        poller = select.poll()
        while True:
            wanted: dict[int, int] = {}
            for flow in self.flows:
                if not flow.done:
                    fd, events = flow.want()
                    wanted[fd] = wanted.get(fd, 0) | events
            if not wanted:
                return
            for fd, events in wanted.items():
                poller.register(fd, events)
            left = last + self.idle - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no traffic for {self.idle:g}s")
            ready = sockio.poll(poller, left)
            for fd in wanted:
                poller.unregister(fd)
            if not ready:
                continue
            if any(events & select.POLLERR for events in ready.values()):
                for flow in self.flows:  # (an error queue's POLLERR would wake this for ever)
                    for sock in (flow.src, flow.dst):
                        if ready.get(sock.fileno(), 0) & select.POLLERR:
                            sockio.drop_errors(sock)
            last = time.monotonic()
            for flow in self.flows:
                if flow.done:
                    continue
                fd, events = flow.want()
                if ready.get(fd, 0) & events:
                    flow.step(self.entry)
