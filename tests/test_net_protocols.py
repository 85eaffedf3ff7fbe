"""The wire formats the proxy reads: TLS ClientHello SNI, HTTP/1.x heads, SOCKS5 requests."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest

from gatekeeper.sandbox.net import socks
from gatekeeper.sandbox.net.httpio import (
    HttpError,
    SockReader,
    body_length,
    final_head,
    forward_head,
    parse_request,
    split_absolute_uri,
    split_authority,
)
from gatekeeper.sandbox.net.proxy import sni_problem
from gatekeeper.sandbox.net.tls import (
    NeedMore,
    NotAClientHello,
    client_hello_names,
    client_hello_sni,
    looks_like_tls,
)


def client_hello(server_hostname: str | None) -> bytes:
    """The first flight of a real TLS client (Python's ssl), captured from a memory BIO."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_sni_is_read_from_a_real_client_hello() -> None:
    hello = client_hello("Registry.Test")
    assert looks_like_tls(hello)
    assert client_hello_sni(hello) == "registry.test"
    assert client_hello_sni(client_hello(None)) is None
    assert client_hello_names(hello) == ["registry.test"]
    assert client_hello_names(client_hello(None)) == []


def test_partial_and_malformed_hellos() -> None:
    hello = client_hello("registry.test")
    for cut in (1, 5, 40, len(hello) - 1):
        with pytest.raises(NeedMore):
            client_hello_sni(hello[:cut])
    with pytest.raises(NotAClientHello):
        client_hello_sni(b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00")  # a ServerHello
    with pytest.raises(NotAClientHello):
        client_hello_sni(b"\x17\x03\x03\x00\x01x")  # application data
    assert not looks_like_tls(b"GET / HTTP/1.1\r\n")
    # One hello split across two records is put back together.
    body = hello[5:]
    split = b"\x16\x03\x01" + (100).to_bytes(2, "big") + body[:100]
    split += b"\x16\x03\x01" + (len(body) - 100).to_bytes(2, "big") + body[100:]
    assert client_hello_sni(split) == "registry.test"


def test_sni_rules() -> None:
    assert sni_problem("registry.test", "registry.test") is None
    assert "does not match" in str(sni_problem("registry.test", "other.test"))
    assert "names no server" in str(sni_problem("registry.test", None))
    assert sni_problem("198.51.100.2", None) is None
    assert sni_problem("198.51.100.2", "front.test") is not None
    assert sni_problem("registry.test", ["registry.test", "other.test"]) is not None
    assert sni_problem("registry.test", ["registry.test"]) is None


def test_request_parsing_and_forwarding() -> None:
    request = parse_request(
        b"POST http://web.test:8080/a?b=1 HTTP/1.1\r\nHost: evil.test\r\n"
        b"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nProxy-Authorization: x\r\n"
        b"Content-Length: 3\r\nX-Keep: yes\r\n\r\n"
    )
    host, port, path = split_absolute_uri(request.target)
    assert (host, port, path) == ("web.test", 8080, "/a?b=1")
    assert body_length(request) == 3
    head = forward_head(request, host, port, path).decode()
    assert head.startswith("POST /a?b=1 HTTP/1.1\r\nHost: web.test:8080\r\n")
    assert "X-Keep: yes" in head and "Connection: close" in head
    assert "evil.test" not in head and "X-Hop" not in head and "Proxy-Authorization" not in head
    assert split_absolute_uri("http://[2001:db8::2]/") == ("2001:db8::2", 80, "/")
    assert split_absolute_uri("http://web.test?q") == ("web.test", 80, "/?q")


def test_header_look_ups_ignore_case_and_keep_every_value_in_order() -> None:
    # The values are gathered by name once; a repeated framing header must still be seen twice.
    request = parse_request(
        b"GET http://web.test/ HTTP/1.1\r\nX-A: 1\r\nconnection: x-a\r\nx-a: 2\r\nX-b: 3\r\n\r\n"
    )
    assert request.header("x-a") == ["1", "2"]
    assert request.header("connection") == ["x-a"] and request.header("x-b") == ["3"]
    assert request.header("content-length") == []
    with pytest.raises(HttpError, match="more than once"):
        parse_request(b"POST http://web.test/ HTTP/1.1\r\nContent-Length: 1\r\n"
                      b"content-length: 1\r\n\r\n")  # fmt: skip


@pytest.mark.parametrize(
    "head",
    [
        b"GET http://a.test/ HTTP/2.0\r\n\r\n",
        b"GET  http://a.test/ HTTP/1.1\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\nBad Header: x\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\n folded: x\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\nX: a\nB: c\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\n",
    ],
)
def test_ambiguous_requests_are_refused(head: bytes) -> None:
    with pytest.raises(HttpError):
        parse_request(head)


@pytest.mark.parametrize(
    "authority", ["a.test", "a.test:0", "a.test:http", "::1:443", "[::1", "[::1]x", "a b:1"]
)
def test_bad_connect_authorities(authority: str) -> None:
    with pytest.raises(HttpError):
        split_authority(authority, None)


def test_response_head_is_closed() -> None:
    head = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX: y\r\n\r\n"
    assert final_head(head, "GET", 200) == (
        b"HTTP/1.1 200 OK\r\nX: y\r\nConnection: close\r\n\r\n",
        None,
    )


@pytest.mark.parametrize(
    ("method", "head", "length"),
    [
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", 12),
        ("GET", b"HTTP/1.1 200 OK\r\ncontent-length:  0 \r\n\r\n", 0),
        ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", 0),
        ("GET", b"HTTP/1.1 204 No Content\r\n\r\n", 0),
        ("GET", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", 0),
        # The body ends where the connection does: relayed to the server's end.
        ("GET", b"HTTP/1.1 200 OK\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: x\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 1234567890123456789\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n", None),
        # Heads a client may read otherwise: never cut short on the proxy's reading.
        ("GET", b"HTTP/1.1 200 OK\r\nX-A: a\r\n Content-Length: 5\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent\x0bLength: 5\r\nContent-Length: 5\r\n\r\n", None),
        (
            "GET",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\nTransfer-Encoding: chunked\r\n\r\n",
            None,
        ),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 5\rX: y\r\n\r\n", None),
        ("HEAD", b"HTTP/1.1 200 OK\r\n\tfolded\r\n\r\n", None),
        ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", None),
    ],
)
def test_where_an_answer_ends(method: str, head: bytes, length: int | None) -> None:
    status = int(head.split(b" ")[1])
    assert final_head(head, method, status)[1] == length


def read_socks(data: bytes) -> tuple[str, int] | int | None:
    async def run() -> tuple[str, int] | int | None:
        a, b = socket.socketpair()
        a.setblocking(False)
        b.sendall(data)
        reader = SockReader(asyncio.get_running_loop(), a)
        try:
            assert await socks.read_greeting(reader)
            return await socks.read_request(reader)
        except socks.SocksError as exc:
            return exc.code
        finally:
            a.close()
            b.close()

    return asyncio.run(run())


def test_socks_requests() -> None:
    greet = b"\x05\x01\x00"
    assert read_socks(greet + b"\x05\x01\x00\x01\xc6\x33\x64\x02\x01\xbb") == ("198.51.100.2", 443)
    v6 = bytes.fromhex("20010db8000000000000000000000002")
    assert read_socks(greet + b"\x05\x01\x00\x04" + v6 + b"\x00\x50") == ("2001:db8::2", 80)
    assert read_socks(greet + b"\x05\x01\x00\x03\x0dRegistry.Test\x01\xbb") == (
        "registry.test",
        443,
    )
    assert (
        read_socks(greet + b"\x05\x03\x00\x01\x00\x00\x00\x00\x00\x35")
        == socks.COMMAND_NOT_SUPPORTED
    )
    assert read_socks(greet + b"\x05\x01\x00\x09") == socks.ADDRESS_NOT_SUPPORTED
    assert read_socks(greet + b"\x05\x01\x00\x03\x04a b!\x00\x50") == socks.GENERAL_FAILURE
