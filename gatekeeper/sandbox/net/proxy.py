"""The launcher's proxy: HTTP CONNECT, plain HTTP forwarding and SOCKS5 on Unix sockets.

Clients arrive through handoff.py (the bridge passes each accepted TCP socket over, so bytes
cross a single relay). The protocol is told by the first byte: 0x05 SOCKS5, 0x04 SOCKS4
(refused), anything else HTTP. Every attempt, allowed or not, becomes an Entry in the Recorder.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from gatekeeper.sandbox.net import sockio, socks
from gatekeeper.sandbox.net.classify import IPAddress, ip_literal, is_valid_name
from gatekeeper.sandbox.net.decide import Decider, Judgement, ResolveError
from gatekeeper.sandbox.net.handoff import Handler
from gatekeeper.sandbox.net.httpio import (
    HEAD_LIMIT,
    MAX_INTERIM,
    HttpError,
    SockReader,
    body_length,
    final_head,
    forward_head,
    parse_request,
    response_status,
    send_body,
    simple_response,
    split_absolute_uri,
    split_authority,
)
from gatekeeper.sandbox.net.record import Entry, Recorder, loggable_path
from gatekeeper.sandbox.net.relay import Tunnel
from gatekeeper.sandbox.net.spare import KEEP_SECONDS
from gatekeeper.sandbox.net.tls import (
    MAX_HELLO,
    NeedMore,
    NotAClientHello,
    client_hello_names,
    looks_like_tls,
)

TLS_ACCESS_DENIED = bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31])
HTTPS_PORT = 443
LINGER_SECONDS = 1.0
LINGER_BYTES = 1 << 20
SOCKS4_REJECTED = bytes([0x00, 0x5B, 0, 0, 0, 0, 0, 0])
CONNECTED = b"HTTP/1.1 200 Connection established\r\n\r\n"

T = TypeVar("T")


# Why an attempt the session's stop cut short (judging, connecting) was not served.
CUT_SHORT = "the run ended before it was served"


@dataclass(frozen=True)
class ProxyLimits:
    header_timeout: float = 30.0  # to finish a request head or SOCKS handshake (slow clients)
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0  # a tunnel with no traffic either way is closed
    spare_seconds: float = KEEP_SECONDS  # a connection opened ahead is kept (spare.py); 0: none
    head_limit: int = HEAD_LIMIT
    max_connections: int = 1024


def refusal_text(host: str, port: int, judgement: Judgement) -> tuple[str, str]:
    """(header reason, one-line body) for a refused destination, naming the way to allow it."""
    verdict = judgement.verdict
    category = verdict.category.value
    hint = verdict.grant_hint
    header = f"{category}: {verdict.reason}".encode("ascii", "replace").decode()
    body = (
        f"gatekeeper: refused {hint} ({category}): {verdict.reason}. To allow it for one run, "
        f"re-run with --grant network={hint} (or --ask tty to be asked); to allow it always, "
        f"add it to network.grants in the policy."
    )
    return header, body


class Proxy:
    """Connection handlers sharing one Decider and Recorder, on the session's event loop."""

    def __init__(self, decider: Decider, recorder: Recorder, limits: ProxyLimits) -> None:
        self.decider = decider
        self.recorder = recorder
        self.limits = limits
        self.tunnels: set[Tunnel] = set()
        # The session stops: a later tunnel closes at once, and nothing more connects (set as
        # the stop begins, while the lanes end what they serve).
        self.closing = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    # --- dispatch -------------------------------------------------------------------------

    async def handle(self, client: socket.socket, data: bytes) -> None:
        """Serve one proxy client whose first bytes (possibly none yet) are data."""
        reader = SockReader(self.loop, client, data)
        try:
            if not reader.buffer:
                more = reader.fill_now()  # what a client sends as it connects is there already
                if more is None:
                    async with asyncio.timeout(self.limits.header_timeout):
                        more = await reader.fill()
                if not more:
                    return
            first = reader.buffer[0]
            if first == socks.VERSION:
                await self._socks(client, reader)
            elif first == 4:
                await sockio.send_within(client, SOCKS4_REJECTED, self.refusal_seconds)
            else:
                await self._http(client, reader)
        except (TimeoutError, OSError, EOFError):
            pass

    async def _connect(self, addresses: list[IPAddress], port: int) -> socket.socket:
        """A connected non-blocking socket to the first address that answers; raise OSError."""
        error: OSError = OSError("no address to connect to")
        for address in addresses:
            if self.closing:  # the run has ended: no more connections
                raise OSError(CUT_SHORT)
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                target = (str(address), port)
                if not sockio.connect_now(sock, target):  # over loopback it is, at once
                    async with asyncio.timeout(self.limits.connect_timeout):  # no task
                        await sockio.wait_connected(sock, target)
                if self.closing:  # made as the run ended: nothing is sent on it
                    sock.close()
                    raise OSError(CUT_SHORT)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except TimeoutError:
                sock.close()
                error = TimeoutError(f"connecting to {address} port {port} timed out")
            except OSError as exc:
                sock.close()
                error = exc
            except asyncio.CancelledError:  # the session stops mid-connect
                sock.close()
                raise
        raise error

    async def _open(
        self, entry: Entry
    ) -> tuple[socket.socket | None, Judgement | None, str | None]:
        """Judge and connect for entry; (upstream, judgement, failure text). Updates entry."""
        assert entry.port is not None
        if not is_valid_name(entry.host):
            entry.decision, entry.reason = "deny", "not a valid host name"
            return None, None, f"{entry.host[:80]!r} is not a valid host name"
        try:
            return await self._judge_and_connect(entry)
        except asyncio.CancelledError:  # the session stops: the attempt is still recorded
            entry.decision, entry.reason = "error", CUT_SHORT
            self.recorder.add(entry)
            raise

    async def _judge_and_connect(
        self, entry: Entry
    ) -> tuple[socket.socket | None, Judgement | None, str | None]:
        assert entry.port is not None
        try:
            judgement = await self.decider.judge(entry.host, entry.port)
        except ResolveError as exc:
            entry.decision, entry.reason, entry.category = "error", str(exc), exc.category
            return None, None, str(exc)
        entry.category = judgement.verdict.category.value
        if not judgement.allowed:
            entry.decision, entry.reason = "deny", judgement.verdict.reason
            return None, judgement, None
        try:
            upstream = await self._connect(judgement.addresses, entry.port)
        except OSError as exc:
            failure = CUT_SHORT if self.closing else f"connect failed: {exc.strerror or exc}"
            entry.decision, entry.reason = "error", failure
            return None, judgement, entry.reason
        entry.decision = "allow"
        return upstream, judgement, None

    @property
    def refusal_seconds(self) -> float:
        """How long a refusal (a short answer, no upstream behind it) may take to go out, as
        in the lane (lane.Lane._reply)."""
        return min(self.limits.idle_timeout, LINGER_SECONDS)

    async def _send(
        self,
        client: socket.socket,
        data: bytes,
        entry: Entry,
        count: Callable[[int], None] | None = None,
    ) -> None:
        """Send (part of) an answer to the client within the idle timeout, telling count of
        what went: a client that takes nothing (its sharer of the socket may have filled the
        send queue) must not hold the task, and the upstream, until the session ends. Raise
        sockio.Stalled past it, entry saying why, or OSError."""
        try:
            await sockio.send_within(client, data, self.limits.idle_timeout, count)
        except sockio.Stalled:
            entry.decision = "error"
            entry.reason = (
                f"the client did not take the answer within {self.limits.idle_timeout:g}s"
            )
            raise

    async def _while_open(
        self, tunnel: Tunnel, work: Coroutine[Any, Any, T]
    ) -> asyncio.Future[T] | None:
        """Run work until it is done (its task, done, is returned) or the tunnel closes
        (None). Either way work has ended, and its waits have let go of their sockets, when
        this returns: a socket closed while a wait still holds it in the loop's selector would
        stay there (a shared one's description lives on in the sandbox, and would wake the
        loop for ever), and the next socket given its number could not wait."""
        task = asyncio.ensure_future(work)
        try:
            waits: list[asyncio.Future[Any]] = [task, tunnel.finished]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait([task])
        return None if task.cancelled() else task

    def _tunnel(self, client: socket.socket, upstream: socket.socket, entry: Entry) -> Tunnel:
        """A tunnel that closes neither socket: its handler closes the upstream, and handoff
        the client, once every wait on them has ended (_while_open: the tunnel may close, at
        its idle timeout, while the handler waits on the client)."""

        def up(n: int) -> None:
            entry.sent(n)

        def down(n: int) -> None:
            entry.received(n)

        tunnel = Tunnel(
            self.loop,
            client,
            upstream,
            idle_timeout=self.limits.idle_timeout,
            on_up=up,
            on_down=down,
        )
        tunnel.owns_sockets = False
        if self.closing:  # (a handler that went on past the session's stop: it ends here)
            tunnel.close()
            return tunnel
        self.tunnels.add(tunnel)
        tunnel.finished.add_done_callback(lambda _: self.tunnels.discard(tunnel))
        return tunnel

    # --- HTTP -----------------------------------------------------------------------------

    async def _http(self, client: socket.socket, reader: SockReader) -> None:
        head = b""
        try:
            head = reader.head_now(self.limits.head_limit) or b""  # the usual case: all there
            if not head:
                async with asyncio.timeout(self.limits.header_timeout):
                    head = await reader.read_head(self.limits.head_limit)
            request = parse_request(head)
            if request.method == "CONNECT":
                host, port = split_authority(request.target, None)
                entry = Entry(host, port, "deny", None, method="CONNECT")
                await self._http_connect(client, reader, entry)
            else:
                host, port, path = split_absolute_uri(request.target)
                length = body_length(request)
                entry = Entry(
                    host, port, "deny", None, method=request.method, path=loggable_path(path)
                )
                await self._http_forward(
                    client, reader, entry, forward_head(request, host, port, path), length
                )
        except TimeoutError:
            if reader.buffer:  # part of a request: log what it named
                late = HttpError(408, "the request head did not arrive in time")
                self.recorder.add(refused_request(bytes(reader.buffer[:4096]), late))
            await self._reply(client, 408, "gatekeeper: the request head did not arrive in time")
        except HttpError as exc:
            self.recorder.add(refused_request(head, exc))
            await self._reply(client, exc.status, f"gatekeeper: {exc.message}", exc.message)
        except EOFError:
            return

    async def _reply(
        self, client: socket.socket, status: int, body: str, reason: str | None = None
    ) -> None:
        headers = (
            [("X-Gatekeeper-Reason", reason.encode("ascii", "replace").decode())] if reason else []
        )
        with contextlib.suppress(OSError):
            response = simple_response(status, body, headers)
            await sockio.send_within(client, response, self.refusal_seconds)
            await self._linger(client, taking=False)

    async def _linger(self, client: socket.socket, *, taking: bool) -> None:
        """A lingering close (sockio.Linger), so that closing does not reset the connection
        before the client has read the answer; raise OSError."""
        cap = self.limits.idle_timeout if taking else LINGER_SECONDS
        linger = sockio.Linger(client, taking=taking, quiet=LINGER_SECONDS, cap=cap,
                               limit=LINGER_BYTES)  # fmt: skip
        while (wait := linger.next()) is not None:
            if linger.sleep:
                await asyncio.sleep(wait)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await sockio.wait_readable(client)

    async def _refuse_http(
        self, client: socket.socket, entry: Entry, judgement: Judgement | None, failure: str | None
    ) -> None:
        self.recorder.add(entry)
        assert entry.port is not None
        if judgement is not None and failure is None:
            header, body = refusal_text(entry.host, entry.port, judgement)
            await self._reply(client, 403, body, header)
        else:
            status = 504 if failure and "timed out" in failure else 502
            await self._reply(client, status, f"gatekeeper: {failure}", failure)

    async def _http_connect(self, client: socket.socket, reader: SockReader, entry: Entry) -> None:
        upstream, judgement, failure = await self._open(entry)
        if upstream is None:
            await self._refuse_http(client, entry, judgement, failure)
            return
        self.recorder.add(entry)
        try:
            await self._send(client, CONNECTED, entry)
            await self._relay(client, upstream, reader, entry)
        finally:
            upstream.close()

    async def _relay(
        self, client: socket.socket, upstream: socket.socket, reader: SockReader, entry: Entry
    ) -> None:
        """Relay a tunnel (CONNECT, SOCKS) whose success answer the client has taken: only
        now is the tunnel made, whose idle clock would otherwise run out under the wait for
        the client to take it."""
        tunnel = self._tunnel(client, upstream, entry)
        try:
            tunnel.start(up=False, down=True)
            await self._inspect_then_relay(tunnel, reader, entry)
            await tunnel.wait()
        finally:
            tunnel.close()

    async def _inspect_then_relay(self, tunnel: Tunnel, reader: SockReader, entry: Entry) -> None:
        """Hold the client's first bytes until a TLS ClientHello's SNI is checked against the
        host (hello_step). Only the first ClientHello is read; until the tunnel closes (at its
        idle timeout, which the hello's bytes put off as any traffic does)."""
        data = reader.take()
        while (step := hello_step(entry, data)) is False:
            receive = await self._while_open(tunnel, sockio.recv(tunnel.client, 65536))
            if receive is None:
                return
            chunk = receive.result()
            if not chunk:
                step = "the TLS ClientHello was cut short" if data else True
                break
            tunnel.touch()
            data += chunk
        if isinstance(step, str):
            return self._refuse_tunnel(tunnel, entry, step)
        if data:

            def up(n: int) -> None:
                entry.sent(n)
                tunnel.touch()

            sent = await self._while_open(tunnel, sockio.sendall(tunnel.upstream, data, up))
            if sent is None:
                return
            sent.result()
        tunnel.start(up=True)

    def _refuse_tunnel(self, tunnel: Tunnel, entry: Entry, reason: str) -> None:
        entry.decision, entry.reason = "deny", reason
        with contextlib.suppress(OSError):
            sockio.send_now(tunnel.client, TLS_ACCESS_DENIED)
        tunnel.close()

    async def _http_forward(
        self,
        client: socket.socket,
        reader: SockReader,
        entry: Entry,
        head: bytes,
        length: int | None,
    ) -> None:
        upstream, judgement, failure = await self._open(entry)
        if upstream is None:
            await self._refuse_http(client, entry, judgement, failure)
            return
        self.recorder.add(entry)
        loop = self.loop
        tunnel = self._tunnel(client, upstream, entry)
        tunnel.up.done = True  # the request body is copied below, framed; nothing after it is sent

        # The tunnel's idle clock runs over the whole exchange, and every byte that moves
        # either way puts it off: the body going up (however long the upload), the answer's
        # head coming down and going out. It measures idleness, not how long the upload took.
        def up(n: int) -> None:
            entry.sent(n)
            tunnel.touch()

        def down(n: int) -> None:
            entry.received(n)
            tunnel.touch()

        body = self._start_request(reader, upstream, entry, head, length, up)
        try:
            answer = SockReader(loop, upstream)
            interim = 0
            while True:
                response = await self._answer_head(tunnel, answer)
                status = response_status(response)
                if 100 <= status < 200 and status != 101:
                    interim += 1
                    if interim > MAX_INTERIM:
                        raise HttpError(502, "the server sent too many interim (1xx) answers")
                    await self._send(client, response, entry, down)
                    continue
                if status == 101:
                    raise HttpError(502, "the server switched protocols on a plain HTTP request")
                break
            rest = answer.take()
            # When the head says where the answer ends and all of it is here, it is done: no
            # wait for the server's end (nor for the rest of a request body it answered
            # early); else the rest is relayed, to that end when there is one.
            closed, length = final_head(response, entry.method or "", status)
            whole = length is not None and len(rest) >= length
            out = closed + (rest[:length] if whole else rest)
            await self._send(client, out, entry, down)
            if not whole:
                if length is not None:  # (what the server sends past it is not read)
                    tunnel.down.budget = length - len(rest)
                tunnel.start(up=False, down=True)
                await tunnel.wait()
                if tunnel.error is not None or tunnel.down.budget != 0:
                    cut_short(entry, tunnel)
                    return  # relayed to the server's end, or broken
            early = not body.done()  # answered before all of the request body was sent
            if early and status < 300:
                # A success before the body is all read: the server may read on (RFC 9112
                # 9.3), so the body is sent to its end first (up to the idle timeout).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.limits.idle_timeout):
                        await asyncio.wait([body])
            await self._end_request(body, tunnel, upstream)
            # As lane.Lane._end_answer: a client that has not yet taken all of the answer
            # is lingered for while it takes the rest, so that its next bytes do not reset it;
            # one still sending a body the server answered early, as after a refusal.
            with contextlib.suppress(OSError):
                if sockio.unacked(client):
                    await self._linger(client, taking=True)
                elif early:
                    await self._linger(client, taking=False)
                else:
                    client.shutdown(socket.SHUT_WR)
            return
        except sockio.Stalled:
            return  # (the entry says why: _send)
        except (TimeoutError, HttpError, EOFError, OSError) as exc:
            # OSError: the server reset the connection (also after a refused body closed it).
            entry.decision = "error"
            refused = body.result() if body.done() and not body.cancelled() else None
            if refused is not None:  # the client's body broke: its error, not the server's
                entry.reason = refused.message
                await self._end_request(body, tunnel, upstream)
                await self._reply(client, refused.status, f"gatekeeper: {refused.message}",
                                  refused.message)  # fmt: skip
                return
            entry.reason = getattr(exc, "message", None) or (
                f"the connection failed: {exc.strerror or exc}"
                if isinstance(exc, OSError) and not isinstance(exc, TimeoutError)
                else "the server sent no complete response"
            )
            await self._end_request(body, tunnel, upstream)
            await self._reply(client, 502, f"gatekeeper: {entry.reason}", entry.reason)
        finally:
            await self._end_request(body, tunnel, upstream)

    async def _end_request(
        self, body: asyncio.Future[HttpError | None], tunnel: Tunnel, upstream: socket.socket
    ) -> None:
        """Stop sending the request and close the upstream; safe to call more than once. The
        body's task has let go of the upstream's descriptor before it is closed, which it would
        otherwise hold in the loop's selector, where a new socket given the same number
        would fail to wait."""
        body.cancel()
        try:
            await asyncio.wait([body])
        finally:
            tunnel.close()
            upstream.close()

    async def _answer_head(self, tunnel: Tunnel, answer: SockReader) -> bytes:
        """The server's next answer head, waited for until the tunnel's idle clock runs out
        (the request's body going up puts it off: a long upload is no silence); raise
        TimeoutError then, HttpError, EOFError or OSError."""
        limit = self.limits.head_limit
        start = 0
        while (head := answer.head_now(limit, start)) is None:
            start = max(0, len(answer.buffer) - 3)
            filled = await self._while_open(tunnel, answer.fill())
            if filled is None:
                raise TimeoutError
            if not filled.result():
                raise EOFError("the connection closed before the end of the header block")
            tunnel.touch()
        return head

    def _start_request(
        self,
        reader: SockReader,
        upstream: socket.socket,
        entry: Entry,
        head: bytes,
        length: int | None,
        count: Callable[[int], None],
    ) -> asyncio.Future[HttpError | None]:
        """Send the head and the one body, telling count of each part sent; the future holds
        the HttpError that refused the body, if any. A request without a body whose head fits
        in the socket's buffer goes out at once, without a task of its own."""
        sent = 0
        if length == 0:
            with contextlib.suppress(OSError):  # the task below meets the error again
                sent = sockio.send_now(upstream, head)
            count(sent)
            if sent == len(head):
                done: asyncio.Future[HttpError | None] = self.loop.create_future()
                done.set_result(None)
                return done

        async def send(data: bytes) -> None:
            await sockio.sendall(upstream, data, count)  # (each part: it may be cut short)

        async def rest() -> HttpError | None:
            try:
                await send(head[sent:])
                await send_body(reader, send, length)
            except (HttpError, EOFError) as exc:
                # The body's framing broke (or the client stopped in the middle of it): nothing
                # more is sent, and the server would wait for the rest of the body until the
                # idle timeout. Closing the upstream ends the wait for its answer at once.
                with contextlib.suppress(OSError):
                    upstream.shutdown(socket.SHUT_RDWR)
                if isinstance(exc, HttpError):
                    return exc
                return HttpError(400, "the client closed in the middle of the request body")
            except OSError:
                pass
            return None

        return asyncio.ensure_future(rest())

    # --- SOCKS5 ---------------------------------------------------------------------------

    async def _socks(self, client: socket.socket, reader: SockReader) -> None:
        try:
            async with asyncio.timeout(self.limits.header_timeout):
                if not await socks.read_greeting(reader):
                    await sockio.sendall(client, socks.NO_ACCEPTABLE_METHOD)
                    return
                await sockio.sendall(client, socks.NO_AUTH)
                host, port = await socks.read_request(reader)
        except socks.SocksError as exc:
            if exc.host is not None:  # a request was read: it is an attempt, logged
                self.recorder.add(
                    Entry(exc.host, exc.port, "deny", None, method="SOCKS5", reason=exc.message)
                )
            if exc.code is not None:
                await sockio.send_within(client, socks.reply(exc.code), self.refusal_seconds)
            return
        entry = Entry(host, port, "deny", None, method="SOCKS5")
        upstream, judgement, failure = await self._open(entry)
        self.recorder.add(entry)
        if upstream is None:
            if failure is None:
                code = socks.NOT_ALLOWED
            elif entry.reason and "resolve" in entry.reason:
                code = socks.HOST_UNREACHABLE
            elif failure and "refused" in failure.lower():
                code = socks.CONNECTION_REFUSED
            else:
                code = (
                    socks.TTL_EXPIRED
                    if failure and "timed out" in failure
                    else socks.GENERAL_FAILURE
                )
            await sockio.send_within(client, socks.reply(code), self.refusal_seconds)
            return
        try:
            await self._send(client, socks.reply(socks.SUCCEEDED), entry)
            await self._relay(client, upstream, reader, entry)
        finally:
            upstream.close()

    # --- loopback forwards ----------------------------------------------------------------

    def forwarder(self, port: int) -> Handler:
        """A handler joining each client to the host's loopback at port (already allowed)."""

        async def forward(client: socket.socket, data: bytes) -> None:
            entry = self.recorder.add(Entry("localhost", port, "allow", "localhost"))
            try:
                upstream = await self._connect([_LOOPBACK_V4, _LOOPBACK_V6], port)
            except OSError as exc:
                failure = CUT_SHORT if self.closing else f"connect failed: {exc.strerror or exc}"
                entry.decision, entry.reason = "error", failure
                return
            except asyncio.CancelledError:  # the session stops mid-connect
                entry.decision, entry.reason = "error", CUT_SHORT
                raise
            tunnel = self._tunnel(client, upstream, entry)
            try:
                if data:

                    def up(n: int) -> None:
                        entry.sent(n)
                        tunnel.touch()

                    sent = await self._while_open(tunnel, sockio.sendall(upstream, data, up))
                    if sent is None:
                        return
                    sent.result()
                tunnel.start()
                await tunnel.wait()
            finally:
                tunnel.close()
                upstream.close()

        return forward


def cut_short(entry: Entry, tunnel: Tunnel) -> None:
    """Mark entry when the relay of its answer ended before the answer did: broken, idle past
    the timeout, or the server's end before the length its head said."""
    if tunnel.error is not None:
        entry.decision, entry.reason = "error", f"the answer was cut: {tunnel.error}"
    elif tunnel.down.eof and tunnel.down.budget:  # (None: to the server's end, as it was)
        entry.decision = "error"
        entry.reason = "the answer was cut: the server closed before the length its head said"


def refused_request(head: bytes, error: HttpError) -> Entry:
    """The log entry for a request refused before its destination was judged: the host and
    port as far as the request line names them ("?" when it names none)."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    words = line.split(" ")
    method = words[0][:32] if words and words[0].isalpha() else None
    host, port, path = "?", None, None
    if len(words) >= 2:
        try:
            if method == "CONNECT":
                host, port = split_authority(words[1], None)
            else:
                host, port, target = split_absolute_uri(words[1])
                path = loggable_path(target) if target.isascii() and target.isprintable() else None
        except HttpError:
            pass
    return Entry(
        host, port, "deny", None, method=method, path=path,
        reason=f"{error.status}: {error.message}",
    )  # fmt: skip


def hello_step(entry: Entry, data: bytes) -> bool | str:
    """What to do with a tunnel's first bytes from the client: True to pass them (and all
    after) on, False to wait for more, or why the tunnel is refused.

    Bytes that are not TLS pass unchecked on other ports (the tunnel already goes to the
    judged address); on port 443 only TLS passes: anything else there would be a protocol the
    SNI check cannot see into. A ClientHello's server names must be the host.
    """
    if not data:
        return False
    if not looks_like_tls(data):
        return "not TLS on port 443" if entry.port == HTTPS_PORT else True
    try:
        problem = sni_problem(entry.host, client_hello_names(data))
    except NeedMore:
        return "the TLS ClientHello is too large" if len(data) > MAX_HELLO + 64 else False
    except NotAClientHello as exc:
        return f"TLS: {exc}"
    return True if problem is None else problem


def sni_problem(host: str, names: list[str] | str | None) -> str | None:
    """Why a ClientHello's server names do not fit the requested host, or None when they do.

    Every name offered must be the host: a server may choose any name of the list.
    """
    offered = [names] if isinstance(names, str) else list(names or [])
    if not offered:
        if ip_literal(host) is not None:
            return None
        return f"the TLS ClientHello names no server, but the tunnel is for {host}"
    for sni in offered:
        if sni != host:
            return f"the TLS server name {sni[:80]!r} does not match the requested host {host}"
    return None


def _loopback(text: str) -> IPAddress:
    address = ip_literal(text)
    assert address is not None
    return address


_LOOPBACK_V4 = _loopback("127.0.0.1")
_LOOPBACK_V6 = _loopback("::1")
