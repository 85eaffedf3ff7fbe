"""Property-based tests of the proxy's HTTP/1.1 parsing: malformed, oversized and
smuggling-shaped requests.

Each request must be refused cleanly (a 4xx answer, the connection closed, the attempt
recorded) or forwarded so that a lenient server reads exactly one request with the body the
proxy framed: never two, never a crash or a hang. The proxy runs in this process on a socket
pair; the only server is a recorder on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gatekeeper.policy.model import Policy
from gatekeeper.sandbox.net.asking import Asker
from gatekeeper.sandbox.net.classify import Rules
from gatekeeper.sandbox.net.decide import Decider
from gatekeeper.sandbox.net.httpio import (
    HttpError,
    _final_head_lines,
    _parse_request_lines,
    body_length,
    final_head,
    forward_head,
    parse_request,
    plain_request,
    split_absolute_uri,
    split_authority,
)
from gatekeeper.sandbox.net.lane import Lane
from gatekeeper.sandbox.net.proxy import Proxy, ProxyLimits
from gatekeeper.sandbox.net.record import Recorder

FUZZ = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PORT = "{port}"  # filled in with the recorder's port

# --- a lenient server's reading, for what the proxy forwards ---------------------------------


INCOMPLETE = b"<incomplete>"


def lenient_read(data: bytes) -> tuple[list[tuple[str, str, dict[str, str], bytes]], bytes]:
    """Requests as a forgiving server reads them: LF or CR ends a line, folded lines join,
    names are trimmed, any `chunked` in Transfer-Encoding wins over the first Content-Length.
    Returns (requests, what is left that it could not read)."""
    requests = []
    while data:
        match = re.search(rb"\r?\n\r?\n", data)
        if not match:
            break
        head, data = data[: match.start()], data[match.end() :]
        lines: list[str] = []
        for raw in re.split(rb"\r\n|\n|\r", head):
            text = raw.decode("latin-1")
            if text[:1] in (" ", "\t") and lines:
                lines[-1] += " " + text.strip()
            else:
                lines.append(text)
        words = lines[0].split()
        if len(words) < 2:
            break
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.setdefault(name.strip().lower(), value.strip())
        body = b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                end = data.find(b"\n")
                if end < 0:
                    return requests, data
                size = int(data[:end].split(b";")[0].strip() or b"0", 16)
                data = data[end + 1 :]
                if size == 0:
                    while True:
                        end = data.find(b"\n")
                        line, data = data[:end].strip(), data[end + 1 :]
                        if not line or end < 0:
                            break
                    break
                if len(data) < size:
                    return requests, INCOMPLETE + data
                body += data[:size]
                data = data[size:].removeprefix(b"\r").removeprefix(b"\n")
        elif "content-length" in headers:
            length = int(headers["content-length"].split(",")[0].strip())
            if len(data) < length:
                return requests, INCOMPLETE + data
            body, data = data[:length], data[length:]
        requests.append((words[0], words[1], headers, body))
    return requests, data


# --- request generation ------------------------------------------------------------------------

METHODS = ["GET", "POST", "PUT", "CONNECT", "get", "G\x00ET", "GET ", "", "PRI", "GET\t"]
TARGETS = [
    f"http://127.0.0.1:{PORT}/p", f"http://127.0.0.1:{PORT}/p?q=1#frag", f"http://127.0.0.1:{PORT}",
    f"http://127.0.0.1:{PORT}@evil.test/", f"http://evil.test#@127.0.0.1:{PORT}/",
    f"127.0.0.1:{PORT}", f"http://127.0.0.1:{PORT}/a b", f"http://127.0.0.1:{PORT}/\x7f",
    "/origin-form", "*", f"http://127.0.0.1:{PORT}/" + "a" * 70_000, f"HTTP://127.0.0.1:{PORT}/",
    f"127.0.0.1:{PORT}\r\nX-Injected: 1", f"127.0.0.1:{PORT} HTTP/1.1\r\nHost: x",
    f"http://127.0.0.1:{PORT}/\r\nX-Injected: 1", f"http://127.0.0.1:{PORT}\\@evil.test/",
    f"http://127.0.0.1:{PORT}/\xff", f"http://127.0.0.1:0{PORT}/", "http://[::1/",
    f"http://127.0.0.1:{PORT}:{PORT}/", f"127.0.0.1:{PORT}/path", "https://127.0.0.1/",
]  # fmt: skip
VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "http/1.1", "HTTP/1.1 ", "HTTP/1.10", ""]
HEADERS = [
    "Host: 127.0.0.1", "Host: evil.test", "Host: evil.test\r\nHost: other.test",
    "Content-Length: 5", "Content-Length: 0", "Content-Length:  5 ", "Content-Length: +5",
    "Content-Length: 05", "Content-Length: 5, 5", "Content-Length: -1", "Content-Length: 0x5",
    "Content-Length: 99999999999999999999", "Content-Length: 5\r\nContent-Length: 5",
    "Content-Length: 5\r\nContent-Length: 6", "Content-Length: \u0665",
    "Transfer-Encoding: chunked", "Transfer-Encoding: Chunked", "Transfer-Encoding:  chunked",
    "Transfer-Encoding: chunked, identity", "Transfer-Encoding: identity, chunked",
    "Transfer-Encoding: xchunked", "Transfer-Encoding: chunked\x0b", "Transfer-Encoding : chunked",
    " Transfer-Encoding: chunked", "X-Folded: a\r\n chunked", "Transfer-Encoding:\r\n chunked",
    "Transfer_Encoding: chunked", "Content_Length: 5", "Connection: close, content-length",
    "Connection: Transfer-Encoding", "Connection: keep-alive, X-Drop", "X-Drop: 1",
    "Proxy-Connection: keep-alive", "Upgrade: h2c", "Expect: 100-continue", "X-A: a\rb",
    "X-A: a\nb", "X-A: a\x00b", "X-\xe9: 1", "X-Long: " + "v" * 70_000, "NoColon", ": empty",
    "X-Obs: \xe9\xff", "TE: trailers", "Trailer: X-T", "Keep-Alive: 5",
]  # fmt: skip
BODIES = [
    b"", b"hello", b"5\r\nhello\r\n0\r\n\r\n", b"5;ext=1\r\nhello\r\n0\r\n\r\n",
    b"5\nhello\n0\n\n", b"fffffffffffffffff\r\n", b"-1\r\n", b"0x5\r\nhello\r\n0\r\n\r\n",
    b"5\r\nhelloXX0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n", b"0\r\nX-T: a\rb\r\n\r\n",
    b"5 \r\nhello\r\n0\r\n\r\n", b" 5\r\nhello\r\n0\r\n\r\n", b"5\r\nhello\r\n0\r\n",
    b"hello" + f"GET http://127.0.0.1:{PORT}/smuggled HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
    b"0\r\n\r\n" + f"GET http://127.0.0.1:{PORT}/smuggled HTTP/1.1\r\n\r\n".encode(),
    b"5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
]  # fmt: skip
SEPARATORS = ["\r\n"] * 6 + ["\n", "\r", "\r\r\n", "\n\r"]


VALID_HEADERS = HEADERS[:5] + ["Transfer-Encoding: chunked", "X-Drop: 1", "Expect: 100-continue",
                               "Connection: keep-alive, X-Drop", "User-Agent: fuzz"]  # fmt: skip


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    """Half the time a request that is valid but for at most one smuggling-shaped part."""
    if draw(st.booleans()):
        method = draw(st.sampled_from(["GET", "POST", "PUT", "CONNECT"]))
        target = f"127.0.0.1:{PORT}" if method == "CONNECT" else draw(st.sampled_from(TARGETS[:3]))
        text = f"{method} {target} {draw(st.sampled_from(VERSIONS[:2]))}\r\n"
        headers = draw(st.lists(st.sampled_from(VALID_HEADERS), max_size=3))
        if draw(st.booleans()):
            headers.append(draw(st.sampled_from(HEADERS)))
        text += "".join(h + "\r\n" for h in headers) + "\r\n"
        return text.encode("latin-1", "replace") + draw(st.sampled_from(BODIES))
    sep = st.sampled_from(SEPARATORS)
    line = " ".join(
        [draw(st.sampled_from(METHODS)), draw(st.sampled_from(TARGETS)),
         draw(st.sampled_from(VERSIONS))]
    )  # fmt: skip
    if draw(st.integers(0, 9)) == 0:
        line = line.replace(" ", draw(st.sampled_from(["  ", "\t"])), 1)
    text = line + draw(sep)
    for header in draw(st.lists(st.sampled_from(HEADERS), max_size=5)):
        text += header + draw(sep)
    text += draw(st.sampled_from(["\r\n", "\r\n", "\n", ""]))
    return text.encode("latin-1", "replace") + draw(st.sampled_from(BODIES))


# --- the parser on its own --------------------------------------------------------------------


@FUZZ
@given(raw=raw_requests())
@example(raw=b"POST http://h.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
def test_a_parsed_head_is_forwarded_so_a_lenient_server_reads_it_the_same(raw: bytes) -> None:
    data = raw.replace(PORT.encode(), b"8080")
    end = data.find(b"\r\n\r\n")
    head = data[: end + 4] if end >= 0 else data
    try:
        request = parse_request(head)
        if request.method == "CONNECT":
            split_authority(request.target, None)
            return
        host, port, path = split_absolute_uri(request.target)
        length = body_length(request)
        forwarded = forward_head(request, host, port, path)
    except HttpError as exc:
        assert 400 <= exc.status < 500 and exc.message
        return
    framed = b"5\r\nhello\r\n0\r\n\r\n" if length is None else b"x" * length
    requests, left = lenient_read(forwarded + framed)
    assert left == b"" and len(requests) == 1, forwarded
    method, target, headers, body = requests[0]
    assert (method, target) == (request.method, path)
    assert headers["host"] in (host, f"{host}:{port}", f"[{host}]:{port}", f"[{host}]")
    assert body == (b"hello" if length is None else framed)
    assert "\r" not in forwarded.decode("latin-1").replace("\r\n", "")


@FUZZ
@given(raw=raw_requests())
@example(raw=b"GET http://h.test/ HTTP/1.1\r\nX_Drop: 1\r\nContent_Length: 5\r\n\r\n")
def test_a_head_parsed_whole_reads_as_it_does_line_by_line(raw: bytes) -> None:
    """parse_request takes a well-formed head in one match: it must accept exactly what the
    line-by-line checks accept, and read the same request from it."""
    data = raw.replace(PORT.encode(), b"8080")
    end = data.find(b"\r\n\r\n")
    head = data[: end + 4] if end >= 0 else data
    outcomes = []
    for parse in (parse_request, _parse_request_lines):
        try:
            request = parse(head)
        except HttpError as exc:
            outcomes.append(exc.status)
        else:
            outcomes.append((request.method, request.target, request.version, request.headers))
    assert outcomes[0] == outcomes[1]


PLAIN_METHODS = ["GET", "HEAD", "DELETE", "OPTIONS", "PUT", "POST", "get", "CONNECT", "G_T"]
PLAIN_TARGETS = [
    "http://h.test/", "http://H.Test:80/p?q=1#f", "http://[::1]:8080/x", "http://h.test?x=1",
    "http://a@h.test/", "http://h.test:0/", "HTTP://h.test/", "http://h.test/%2e%2e/a",
    "http://h.test", "http://h.test:99999/", "https://h.test/", "h.test:443", "/origin",
    "http://h.test\\@e.test/", "http://xn--bcher-kva.example/", "http://1.2.3.4:8080/a#b?c",
    "http://h.test#frag", "http://h_t.test/", "http://h.test./", "http://[fe80::1%25eth0]/",
]  # fmt: skip
PLAIN_FIELDS = [
    "Host: h.test", "host: other.test", "HOST:x", "Host:  h.test", "User-Agent: a b/1.0",
    "Accept: */*", "Accept-Encoding: gzip, deflate", "X:  y", "X: y ", "X: y\t", "X: \ty", "X:",
    "X: ", "X_Y: 1", "X: \xe9\xff", "X: a\x00b", "X : y", " X: y", "Connection: keep-alive",
    "connection: close", "Keep-Alive: 1", "TE: trailers", "Te: x", "Trailer: x", "Upgrade: h2c",
    "Proxy-Authorization: Basic eA==", "Proxy-Connection: x", "Proxy-Authenticate: x",
    "Content-Length: 0", "Content-Length: 5", "Transfer-Encoding: chunked", "Connectionx: y",
    "X-Connection: y", "Hostname: y", "Expect: 100-continue", "X: a\rb", "NoColon",
    "Content_Length: 5", "transfer_encoding: chunked", "Connection_: x", "_Host: x",
]  # fmt: skip


def forwarded_the_long_way(head: bytes) -> tuple[str, str, int, str, bytes] | None:
    """What the lanes forward without plain_request: None when they would not forward it
    as it is (refused, a body to frame, a tunnel)."""
    try:
        request = parse_request(head)
        if request.method == "CONNECT":
            return None
        host, port, path = split_absolute_uri(request.target)
        if body_length(request) != 0:
            return None
        return request.method, host, port, path, forward_head(request, host, port, path)
    except HttpError:
        return None


@settings(FUZZ, max_examples=3000)
@given(
    method=st.sampled_from(PLAIN_METHODS),
    target=st.sampled_from(PLAIN_TARGETS),
    version=st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/1.2"]),
    fields=st.lists(st.sampled_from(PLAIN_FIELDS), max_size=5),
    end=st.sampled_from(["\r\n"] * 6 + ["\n", ""]),
)
def test_a_plain_request_is_read_as_the_long_way_reads_it(
    method: str, target: str, version: str, fields: list[str], end: str
) -> None:
    """plain_request takes the requests most clients send in a few matches: for every head it
    takes, the same request, forwarded byte for byte as the long way forwards it; and it
    takes none that the long way refuses, frames a body for, or tunnels."""
    head = f"{method} {target} {version}\r\n{''.join(f + chr(13) + chr(10) for f in fields)}{end}"
    raw = head.encode("latin-1")
    plain = plain_request(raw)
    if plain is not None:
        assert plain == forwarded_the_long_way(raw)


@pytest.mark.parametrize(
    "head",
    [
        b"GET http://h.test/simple HTTP/1.1\r\nHost: h.test\r\nUser-Agent: curl/8.5.0\r\n"
        b"Accept: */*\r\n\r\n",
        b"GET http://h.test:8080/simple/pkg/ HTTP/1.1\r\nHost: h.test:8080\r\n"
        b'User-Agent: pip/24.0 {"ci":null}\r\nAccept-Encoding: gzip, deflate\r\n'
        b"Accept: application/vnd.pypi.simple.v1+json\r\n\r\n",
        b"HEAD http://[::1]:8080/a?b=c HTTP/1.0\r\n\r\n",
    ],
)
def test_the_requests_clients_send_take_the_plain_reading(head: bytes) -> None:
    plain = plain_request(head)
    assert plain is not None and plain == forwarded_the_long_way(head)


RESPONSE_LINES = [
    b"HTTP/1.1 200 OK", b"HTTP/1.1 204 No Content", b"HTTP/1.0 304 Not Modified",
    b"HTTP/1.1 200 \xe9t\xe9", b"HTTP/1.1 200 OK\rX: 1", b"HTTP/1.1 200",
]  # fmt: skip
RESPONSE_FIELDS = [
    b"Content-Length: 3", b"content-length:3", b"CONTENT-LENGTH:  3 \t", b"Content-Length: 03",
    b"Content-Length: 3, 3", b"Content-Length: +3", b"Content-Length: \xb2", b"Content-Length:",
    b"Content-Length: 1234567890123456789", b"Content-Length : 3", b" Content-Length: 3",
    b"Content_Length: 3", b"X-Content-Length: 9", b"Content-Lengthy: 9", b"Transfer-Encoding: x",
    b"transfer-encoding: chunked", b"Connection: close", b"connection: keep-alive, x",
    b"Keep-Alive: timeout=5", b"Proxy-Connection: x", b"Connection : x", b"\x85Connection: x",
    b"Connection\x0b: x", b"X-A: a\x00b", b"X-\xe9: 1", b"X: \xe9\xff", b"NoColon", b": empty",
    b"\tfolded", b"X: a\rb", b"X: a\nb", b"Set-Cookie: a=b",
]  # fmt: skip


@settings(FUZZ, max_examples=3000)  # (a pure function: a few thousand heads take a second)
@given(
    first=st.sampled_from(RESPONSE_LINES),
    fields=st.lists(st.sampled_from(RESPONSE_FIELDS), max_size=6),
    ends=st.lists(st.sampled_from([b"\r\n"] * 8 + [b"\n", b"\r", b"\r\r\n"]), min_size=7,
                  max_size=7),
    last=st.sampled_from([b"\r\n", b"\r\n", b"\n", b""]),
    method=st.sampled_from(["GET", "HEAD"]),
)  # fmt: skip
def test_a_response_head_read_whole_reads_as_it_does_line_by_line(
    first: bytes, fields: list[bytes], ends: list[bytes], last: bytes, method: str
) -> None:
    """final_head reads a plain head in two matches: the same head, and the same length, as
    its reading line by line, for every head."""
    head = first + ends[0] + b"".join(f + e for f, e in zip(fields, ends[1:], strict=False))
    head += last
    status = int(first.split(b" ")[1][:3])
    assert final_head(head, method, status) == _final_head_lines(head, method, status)


# --- the proxy end to end ---------------------------------------------------------------------


class Upstream:
    """A server on 127.0.0.1 that records what each connection sent, then answers 200."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        data = b""
        conn.settimeout(0.2)
        with conn:
            try:
                while chunk := conn.recv(65536):
                    data += chunk
            except OSError:
                pass
            with self.lock:
                self.received.append(data)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            except OSError:
                pass

    def take(self) -> list[bytes]:
        with self.lock:
            got, self.received = self.received, []
        return got

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


LIMITS = ProxyLimits(header_timeout=0.5, connect_timeout=1.0, idle_timeout=1.0)


def drive(
    port: int, data: bytes, half_close: bool = True, way: str = "loop"
) -> tuple[bytes, Recorder]:
    """Send data to a fresh proxy (then half-close); return its whole answer and its record.
    way "lane" serves it in the lane first (as a sandboxed client is), then on the event
    loop what the lane gives back. Fails on a crash of the handler or when it does not
    finish in time."""
    policy = Policy.model_validate({"network": {"localhost": [port]}})
    recorder = Recorder()
    decider = Decider(
        Rules(policy.network, cli_grants=[], registries=[]), Asker("never", recorder),
        lambda host, port: [],
    )  # fmt: skip
    proxy = Proxy(decider, recorder, LIMITS)
    ours, theirs = socket.socketpair()
    reply = bytearray()

    def client() -> None:
        ours.settimeout(5)
        try:
            ours.sendall(data)
            if half_close:
                ours.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the proxy answered and closed before it read everything
        try:
            while chunk := ours.recv(65536):
                reply.extend(chunk)
        except OSError:
            pass

    async def main() -> None:
        theirs.setblocking(False)
        talker = threading.Thread(target=client)
        talker.start()
        try:
            async with asyncio.timeout(8):
                data: bytes | None = b""
                if way == "lane":
                    loop = asyncio.get_running_loop()
                    data = await loop.run_in_executor(None, Lane(proxy).serve, theirs)
                if data is not None:
                    await proxy.handle(theirs, data)
        finally:
            theirs.close()
            await asyncio.get_running_loop().run_in_executor(None, talker.join, 8)

    started = time.monotonic()
    asyncio.run(main())
    ours.close()
    assert time.monotonic() - started < 8, "the proxy hung"
    return bytes(reply), recorder


REFUSALS = {b"400", b"403", b"405", b"408", b"413", b"431", b"501"}


@settings(FUZZ, max_examples=60)
@given(raw=raw_requests())
@example(raw=b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
@example(raw=b"POST http://127.0.0.1:{port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"5\r\nhello\r\n0\r\n\r\nGET http://127.0.0.1:{port}/smuggled HTTP/1.1\r\n\r\n")  # fmt: skip
@example(raw=b"CONNECT 127.0.0.1:{port}\r\nX: 1 HTTP/1.1\r\n\r\n")
@pytest.mark.parametrize("way", ["loop", "lane"])
def test_the_proxy_refuses_cleanly_or_forwards_one_request(
    upstream: Upstream, raw: bytes, way: str
) -> None:
    data = raw.replace(PORT.encode(), str(upstream.port).encode())
    reply, recorder = drive(upstream.port, data, way=way)
    time.sleep(0.05)
    received = upstream.take()
    status = reply.split(b" ", 2)[1] if reply.startswith(b"HTTP/1.1 ") else None
    if not received:
        if b"\r\n\r\n" not in data:
            assert status in (None, *REFUSALS), reply[:200]
            return  # cut short: answered or closed, nothing forwarded
        if status == b"200" and data.startswith(b"CONNECT "):
            return  # a tunnel the client sent nothing through
        assert status in REFUSALS, reply[:200]
        assert recorder.entries, "a refused request is recorded"
        assert all(e.decision != "allow" for e in recorder.entries)
        return
    assert len(received) == 1
    if data.startswith(b"CONNECT "):
        assert status == b"200", reply[:200]
        return  # a tunnel: what passes through it is the client's own stream
    requests, left = lenient_read(received[0])
    assert b"smuggled" not in received[0]
    if status != b"200":
        # The body broke (or stopped) on the way: refused, and the server got no whole request.
        assert status in REFUSALS, reply[:200]
        assert [e.decision for e in recorder.entries] == ["error"]
        assert not requests or left, received[0][:500]
        return
    assert len(requests) == 1 and left == b"", received[0][:500]
    assert reply.endswith(b"ok"), reply[:200]
    assert [e.decision for e in recorder.entries] == ["allow"]


class FramingUpstream(Upstream):
    """A server that, like a real one, waits until it has read one whole request."""

    def _one(self, conn: socket.socket) -> None:
        data = b""
        conn.settimeout(5)
        with conn:
            try:
                while not lenient_read(data)[0] or lenient_read(data)[1]:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except (OSError, ValueError):
                pass
            with self.lock:
                self.received.append(data)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            except OSError:
                pass


BROKEN_BODIES = [
    (b"5\r\nhello\r\nzz\r\n", "malformed chunk size"),
    (b"5\r\nhelloXX", "does not end with CRLF"),
    (b"fffffffffffffffff\r\n", "malformed chunk size"),
    (b"5\nhello\n0\n\n", "bare CR or LF"),
    (b"5\r\nhello\r\n0\rX\r\n", "bare CR or LF"),
    (b"0\r\nX-T: a\rb\r\n\r\n", "bare CR or LF"),
    (b"0\r\n folded\r\n\r\n", "malformed trailer"),
]


@pytest.mark.parametrize("body, reason", BROKEN_BODIES)
def test_a_broken_chunked_body_is_refused_at_once(body: bytes, reason: str) -> None:
    """The body's framing is checked as it is passed on: when it broke, the proxy stopped
    sending and waited for an answer the server could never give (it waits for the rest of
    the body), so the client hung until the idle timeout and got a 502, or no answer at all
    when the server reset the connection; a bare LF in a chunk line waited for a CRLF."""
    server = FramingUpstream()
    global LIMITS
    saved, LIMITS = LIMITS, ProxyLimits(header_timeout=5, connect_timeout=2, idle_timeout=6)
    try:
        head = (
            f"POST http://127.0.0.1:{server.port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
        started = time.monotonic()
        reply, recorder = drive(server.port, head + body, half_close=False)
        took = time.monotonic() - started
        received = server.take()
    finally:
        LIMITS = saved
        server.close()
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:200]
    assert took < 3, took
    assert [(e.decision, reason in (e.reason or "")) for e in recorder.entries] == [("error", True)]
    # The server never saw the end of a body that was then refused.
    assert all(not r.endswith(b"0\r\n\r\n") for r in received), received


@pytest.mark.parametrize(
    "head",
    [b"GET http://127.0.0.1:{port}/ HTTP/1.1\nHost: x\n\n",
     b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\rX: y\r\n"],
)  # fmt: skip
def test_a_bare_lf_head_is_refused_at_once(upstream: Upstream, head: bytes) -> None:
    """A head whose lines end in a bare LF never holds a CRLF CRLF: the proxy waited for the
    header timeout (30 s by default) and answered 408, while a lenient server would have
    read the head long before."""
    global LIMITS
    saved, LIMITS = LIMITS, ProxyLimits(header_timeout=5, connect_timeout=2, idle_timeout=6)
    try:
        started = time.monotonic()
        reply, recorder = drive(upstream.port, head.replace(b"{port}", b"1"), half_close=False)
        took = time.monotonic() - started
    finally:
        LIMITS = saved
    assert reply.startswith(b"HTTP/1.1 400 ") and b"bare CR or LF" in reply, reply[:200]
    assert took < 3, took
    assert recorder.entries and recorder.entries[0].decision == "deny"
    assert upstream.take() == []


@st.composite
def socks_requests(draw: st.DrawFn, port: int) -> bytes:
    """SOCKS5 greetings and requests, valid or not, to the allowed port or elsewhere."""
    methods = draw(st.sampled_from([b"\x00", b"\x02", b"", b"\x00\x01\x02"]))
    greeting = bytes([5, draw(st.sampled_from([len(methods), 0, 255]))]) + methods
    command = draw(st.sampled_from([1, 2, 3, 9]))
    target_port = draw(st.sampled_from([port, 0, 1, 65535])).to_bytes(2, "big")
    address = draw(
        st.sampled_from(
            [b"\x01\x7f\x00\x00\x01", b"\x04" + bytes(15) + b"\x01", b"\x03\x09127.0.0.1",
             b"\x03\x09localhost", b"\x03\x00", b"\x03\x05\xff\xfe\x00ab", b"\x03\x0bevil\r\n.test",
             b"\x05\x01\x02", b"\x03\xff" + b"a" * 255, b"\x01\x7f"]
        )
    )  # fmt: skip
    request = bytes([draw(st.sampled_from([5, 4])), command, 0]) + address + target_port
    tail = draw(st.sampled_from([b"", b"GET / HTTP/1.0\r\n\r\n", b"\x16\x03\x01"]))
    data = greeting + request + tail
    cut = draw(st.integers(0, len(data)))
    return data[:cut] if draw(st.integers(0, 4)) == 0 else data


@settings(FUZZ, max_examples=40)
@given(data=st.data())
@pytest.mark.parametrize("way", ["loop", "lane"])
def test_socks_requests_never_crash_or_reach_elsewhere(
    upstream: Upstream, data: st.DataObject, way: str
) -> None:
    raw = data.draw(socks_requests(upstream.port))
    reply, recorder = drive(upstream.port, raw, way=way)
    time.sleep(0.05)
    received = upstream.take()
    allowed = [e for e in recorder.entries if e.decision == "allow"]
    assert all(e.port == upstream.port for e in allowed), recorder.entries
    # A tunnel connects to its judged (allowed) address before the client's first bytes are
    # checked (a TLS ClientHello's name): refused then, the server saw a connection, no bytes.
    assert len([r for r in received if r]) <= len(allowed), (received, recorder.entries)
