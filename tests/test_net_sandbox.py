"""The network boundary from inside a real sandbox: real bridge, real proxy, real namespaces.

Every test runs in an isolated pair of network namespaces (see net_ns.py): the proxy's side
has no route off this machine, and the test hosts live in a namespace of their own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from net_ns import OUTER_V4, REMOTE_PRIVATE, REMOTE_V4, REMOTE_V6, IsolatedNet
from net_sandbox import SessionFactory, answered_tty, needs_netns, python_inside, run_inside
from net_servers import RecordingHTTPServer, TcpRecorder, make_cert, tls_context

pytest_plugins = ["net_fixtures"]
pytestmark = [needs_netns, pytest.mark.sandbox]
T = TypeVar("T")


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("cert"), ["registry.test", "allowed.test"])


class Servers:
    """Servers made for one test, on the remote test host or the host's loopback; closed after."""

    def __init__(self, net: IsolatedNet) -> None:
        self.net = net
        self.made: list[Any] = []

    def remote(self, make: Callable[[], T]) -> T:
        with self.net.inside("remote"):
            return self.local(make)

    def local(self, make: Callable[[], T]) -> T:
        server = make()
        self.made.append(server)
        return server


@pytest.fixture
def servers(outer: IsolatedNet) -> Iterator[Servers]:
    made = Servers(outer)
    yield made
    for server in made.made:
        server.close()


def entries(session) -> list[dict]:  # type: ignore[no-untyped-def]
    requests, _ = session.recorder.snapshot()
    return [r.model_dump() for r in requests]


URLLIB_GET = textwrap.dedent("""
    import ssl, sys, urllib.request, urllib.error
    context = ssl.create_default_context(cafile=sys.argv[2]) if len(sys.argv) > 2 else None
    try:
        with urllib.request.urlopen(sys.argv[1], context=context, timeout=10) as r:
            print(r.status, r.read().decode().strip())
    except urllib.error.HTTPError as e:
        print(e.code, e.headers.get("X-Gatekeeper-Reason"), e.read().decode().strip())
    except OSError as e:
        print("ERROR", e)
""")


def urllib_get(setup, url: str, cafile: Path | None = None):  # type: ignore[no-untyped-def]
    binds = [(cafile, "/tmp/ca.pem")] if cafile else []
    code = URLLIB_GET + "\n"
    argv = [sys.executable, "-I", "-c", code, url] + (["/tmp/ca.pem"] if cafile else [])
    return run_inside(setup, argv, binds=binds)


# --- allowed registry -------------------------------------------------------------------------


def test_registry_named_in_policy_is_reachable_with_curl_and_urllib(
    servers: Servers, start_session: SessionFactory, cert: tuple[Path, Path]
) -> None:
    servers.remote(lambda: RecordingHTTPServer((REMOTE_V4, 443), tls=tls_context(*cert)).start())
    servers.remote(lambda: RecordingHTTPServer((REMOTE_V4, 80)).start())
    session, setup = start_session(
        {"package_registry": "allow", "arbitrary_web": "deny", "registries": ["registry.test"]},
        names={"registry.test": [REMOTE_V4]},
    )
    curl = run_inside(
        setup,
        ["curl", "-sS", "--cacert", "/tmp/ca.pem", "https://registry.test/simple/"],
        binds=[(cert[0], "/tmp/ca.pem")],
    )
    assert curl.returncode == 0, curl.stderr
    assert "GET /simple/ host=registry.test" in curl.stdout
    out = urllib_get(setup, "https://registry.test/simple/demo/", cert[0])
    assert out.stdout.startswith("200 GET /simple/demo/ host=registry.test"), (
        out.stdout + out.stderr
    )
    out = urllib_get(setup, "http://registry.test/plain?token=secret")
    assert out.stdout.startswith("200 GET /plain?token=secret host=registry.test"), (
        out.stdout + out.stderr
    )
    logged = entries(session)
    assert [(e["method"], e["category"], e["decision"]) for e in logged] == [
        ("CONNECT", "package_registry", "allow"),
        ("CONNECT", "package_registry", "allow"),
        ("GET", "package_registry", "allow"),
    ]
    assert all(
        e["host"] == "registry.test" and e["bytes_up"] > 0 and e["bytes_down"] > 0 for e in logged
    )
    assert logged[2]["path"] == "/plain" and logged[2]["port"] == 80  # no query string in the log


def _wheel(folder: Path) -> Path:
    import base64
    import hashlib
    import zipfile

    path = folder / "demo_pkg-1.0-py3-none-any.whl"
    files = {
        "demo_pkg/__init__.py": b"",
        "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
        "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    record += "demo_pkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("demo_pkg-1.0.dist-info/RECORD", record)
    return path


@pytest.mark.slow
def test_pip_downloads_from_a_registry_the_users_pip_config_names(
    servers: Servers, start_session: SessionFactory, cert: tuple[Path, Path], tmp_path: Path
) -> None:
    import hashlib

    wheel = _wheel(tmp_path)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    files = {
        "/simple/demo-pkg/": f'<a href="/files/{wheel.name}#sha256={digest}">x</a>'.encode(),
        f"/files/{wheel.name}": wheel.read_bytes(),
    }
    servers.remote(
        lambda: RecordingHTTPServer((REMOTE_V4, 443), tls=tls_context(*cert), files=files).start()
    )
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\nindex-url = https://registry.test/simple/\n")
    # The registry is not in the policy: it comes from the user's pip configuration.
    session, setup = start_session(
        {"package_registry": "allow", "arbitrary_web": "deny"},
        names={"registry.test": [REMOTE_V4]},
        env={"PIP_CONFIG_FILE": str(pip_conf)},
    )
    proc = run_inside(
        setup,
        [
            "env",
            "PIP_DISABLE_PIP_VERSION_CHECK=1",
            sys.executable,
            "-m",
            "pip",
            "download",
            "--isolated",
            "--no-cache-dir",
            "--no-deps",
            "--index-url",
            "https://registry.test/simple/",
            "--cert",
            "/tmp/ca.pem",
            "-d",
            "/tmp/dl",
            "demo-pkg",
        ],
        binds=[(cert[0], "/tmp/ca.pem")],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Saved" in proc.stdout and wheel.name in proc.stdout
    assert [e["category"] for e in entries(session)] == ["package_registry"] * len(entries(session))
    assert all(e["decision"] == "allow" for e in entries(session))


# --- denied -----------------------------------------------------------------------------------


def test_denied_host_gets_403_and_no_connection_is_attempted(
    servers: Servers, start_session: SessionFactory
) -> None:
    web = servers.remote(lambda: TcpRecorder(REMOTE_V4, 80))
    tls = servers.remote(lambda: TcpRecorder(REMOTE_V4, 443))
    session, setup = start_session({"arbitrary_web": "deny"}, names={"blocked.test": [REMOTE_V4]})
    out = urllib_get(setup, "http://blocked.test/page")
    status, reason, body = out.stdout.split(" ", 2)
    assert status == "403"
    assert reason.startswith("arbitrary_web")
    assert "--grant network=blocked.test:80" in body and "network.arbitrary_web: deny" in body
    curl = run_inside(setup, ["curl", "-sS", "https://blocked.test/"])
    assert curl.returncode != 0 and "403" in curl.stderr
    assert (web.connections, tls.connections) == (0, 0)
    assert [(e["host"], e["port"], e["decision"], e["category"]) for e in entries(session)] == [
        ("blocked.test", 80, "deny", "arbitrary_web"),
        ("blocked.test", 443, "deny", "arbitrary_web"),
    ]
    assert session.denied_summary()[0].startswith("blocked.test:80 (arbitrary_web, deny)")


IGNORE_PROXY = textwrap.dedent("""
    import json, socket, sys
    results = {}
    def attempt(name, fn):
        try:
            fn()
            results[name] = "connected"
        except OSError as exc:
            results[name] = exc.__class__.__name__ + ":" + str(exc.errno)
    def tcp(host, port):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect((host, port))
    def udp():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"x", (sys.argv[1], 9))
    def raw():
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
    def raw_packet():
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    def ping():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP) as s:
            s.sendto(b"\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00", (sys.argv[1], 0))
    attempt("tcp", lambda: tcp(sys.argv[1], int(sys.argv[2])))
    attempt("tcp_private", lambda: tcp(sys.argv[3], int(sys.argv[2])))
    attempt("tcp_v6", lambda: tcp(sys.argv[4], int(sys.argv[2])))
    attempt("tcp_host_side", lambda: tcp(sys.argv[5], int(sys.argv[2])))
    attempt("udp", udp)
    attempt("raw", raw)
    attempt("packet", raw_packet)
    attempt("ping", ping)
    print(json.dumps(results))
""")


def test_a_tool_that_ignores_proxy_variables_cannot_connect_anywhere(
    servers: Servers, start_session: SessionFactory
) -> None:
    target = servers.remote(lambda: TcpRecorder("::", 0))
    _, setup = start_session({"arbitrary_web": "allow", "internal_services": "allow"})
    out = run_inside(
        setup,
        [
            sys.executable,
            "-I",
            "-c",
            IGNORE_PROXY,
            REMOTE_V4,
            str(target.port),
            REMOTE_PRIVATE,
            REMOTE_V6,
            OUTER_V4,
        ],
    )
    results = json.loads(out.stdout)
    assert "connected" not in results.values(), results
    assert results["tcp"].startswith("OSError:101") or "Unreachable" in results["tcp"], (
        results
    )  # ENETUNREACH
    curl = run_inside(
        setup,
        ["curl", "-sS", "--noproxy", "*", "--max-time", "5", f"http://{REMOTE_V4}:{target.port}/"],
    )
    assert curl.returncode != 0
    assert target.connections == 0


def test_dns_lookups_from_inside_fail(servers: Servers, start_session: SessionFactory) -> None:
    def udp_listener() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((REMOTE_V4, 53))
        return sock

    listener = servers.remote(udp_listener)
    listener.settimeout(0.5)
    _, setup = start_session({"arbitrary_web": "allow"}, names={"registry.test": [REMOTE_V4]})
    code = textwrap.dedent(f"""
        import socket
        for name in ("registry.test", "dns-probe.test"):
            try:
                print(socket.getaddrinfo(name, 443))
            except OSError as exc:
                print("lookup failed", name, exc.errno)
        query = bytes.fromhex("abcd01000001000000000000")
        query += b"\\x08registry\\x04test\\x00\\x00\\x01\\x00\\x01"
        for server in ("{REMOTE_V4}", "127.0.0.53", "127.0.0.1"):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(1)
            try:
                s.sendto(query, (server, 53))
                print("answer", s.recv(512))
            except OSError as exc:
                print("query failed", server, type(exc).__name__)
    """)
    out = python_inside(setup, code)
    lines = out.stdout.splitlines()
    assert [line.split()[0:3] for line in lines[:2]] == [
        ["lookup", "failed", "registry.test"],
        ["lookup", "failed", "dns-probe.test"],
    ]
    assert all(line.startswith("query failed") for line in lines[2:]), out.stdout
    getent = run_inside(setup, ["getent", "hosts", "registry.test"])
    assert getent.returncode != 0
    with pytest.raises(TimeoutError):
        listener.recv(512)


def test_a_name_resolving_to_a_private_address_is_refused_as_internal(
    servers: Servers, start_session: SessionFactory
) -> None:
    target = servers.remote(lambda: RecordingHTTPServer((REMOTE_PRIVATE, 80)).start())
    session, setup = start_session(
        {"arbitrary_web": "allow", "internal_services": "deny"},
        names={
            "sneaky.test": [REMOTE_PRIVATE],
            "metadata.test": ["169.254.169.254"],
            "mixed.test": ["fd00::1", "::ffff:10.77.0.2"],
        },
    )
    for url in (
        "http://sneaky.test/",
        "http://metadata.test/latest/",
        f"http://{REMOTE_PRIVATE}/",
        "http://[::ffff:10.77.0.2]/",
        "http://mixed.test/",
        "http://db.internal/",
    ):
        out = urllib_get(setup, url)
        assert out.stdout.startswith("403 internal_services"), (url, out.stdout, out.stderr)
    assert target.connections == 0
    assert {e["category"] for e in entries(session)} == {"internal_services"}
    assert "sneaky.test resolves to 10.77.0.2, an internal address" in str(
        session.recorder.entries[0].reason
    )
    # With internal services allowed, the same name is served.
    _, allowing = start_session(
        {"internal_services": "allow", "arbitrary_web": "deny"},
        names={"sneaky.test": [REMOTE_PRIVATE]},
    )
    out = urllib_get(allowing, "http://sneaky.test/ok")
    assert out.stdout.startswith("200 GET /ok host=sneaky.test"), out.stdout


def test_host_loopback_service_reachable_only_on_allowed_ports(
    servers: Servers, start_session: SessionFactory
) -> None:
    allowed = servers.local(lambda: RecordingHTTPServer(("127.0.0.1", 0)).start())
    other = servers.local(lambda: RecordingHTTPServer(("127.0.0.1", 0)).start())
    session, setup = start_session({"localhost": [allowed.port]})
    direct = run_inside(
        setup, ["curl", "-sS", "--noproxy", "*", f"http://127.0.0.1:{allowed.port}/direct"]
    )
    assert direct.returncode == 0 and "GET /direct" in direct.stdout, direct.stderr
    via_name = run_inside(
        setup, ["curl", "-sS", "--noproxy", "*", f"http://localhost:{allowed.port}/v6"]
    )
    assert via_name.returncode == 0 and "GET /v6" in via_name.stdout, via_name.stderr
    proxied = urllib_get(setup, f"http://localhost:{allowed.port}/proxied")
    assert proxied.stdout.startswith("200 GET /proxied"), proxied.stdout
    refused = run_inside(
        setup, ["curl", "-sS", "--noproxy", "*", f"http://127.0.0.1:{other.port}/"]
    )
    assert refused.returncode == 7  # connection refused: nothing listens there inside
    denied = urllib_get(setup, f"http://127.0.0.1:{other.port}/")
    assert denied.stdout.startswith("403 localhost"), denied.stdout
    assert other.connections == 0
    logged = entries(session)
    assert [(e["category"], e["decision"]) for e in logged] == [("localhost", "allow")] * 3 + [
        ("localhost", "deny")
    ]

    _, closed = start_session({"localhost": "deny"})
    out = run_inside(closed, ["curl", "-sS", "--noproxy", "*", f"http://127.0.0.1:{allowed.port}/"])
    assert out.returncode == 7
    assert urllib_get(closed, f"http://127.0.0.1:{allowed.port}/").stdout.startswith(
        "403 localhost"
    )
    # A grant on the command line opens exactly that port, bridged.
    _, granted = start_session({"localhost": "deny"}, grants=[f"network=localhost:{allowed.port}"])
    out = run_inside(
        granted, ["curl", "-sS", "--noproxy", "*", f"http://127.0.0.1:{allowed.port}/g"]
    )
    assert out.returncode == 0 and "GET /g" in out.stdout


def test_wildcard_grant_matches_subdomains_only(
    servers: Servers, start_session: SessionFactory
) -> None:
    server = servers.remote(lambda: RecordingHTTPServer((REMOTE_V4, 80)).start())
    names = [
        "a.example.com",
        "deep.a.example.com",
        "example.com",
        "badexample.com",
        "a.example.com.evil.test",
    ]
    session, setup = start_session(
        {"arbitrary_web": "deny", "grants": [{"host": "*.example.com"}]},
        names={n: [REMOTE_V4] for n in names},
    )
    status = {n: urllib_get(setup, f"http://{n}/").stdout.split(" ")[0] for n in names}
    assert status == {
        "a.example.com": "200",
        "deep.a.example.com": "200",
        "example.com": "403",
        "badexample.com": "403",
        "a.example.com.evil.test": "403",
    }
    assert sorted(h for _, _, h, _ in server.requests) == ["a.example.com", "deep.a.example.com"]


SNI_CLIENT = textwrap.dedent("""
    import socket, ssl, sys
    host, port, sni = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
    s = socket.create_connection(("127.0.0.1", 3128), timeout=3)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
    print(s.recv(4096).split(b"\\r\\n")[0].decode())
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        context.wrap_socket(s, server_hostname=sni)
        print("handshake ok")
    except (ssl.SSLError, OSError) as exc:
        print("handshake failed", type(exc).__name__, exc)
""")


def test_tls_sni_must_match_the_connect_host(
    servers: Servers, start_session: SessionFactory
) -> None:
    target = servers.remote(lambda: TcpRecorder(REMOTE_V4, 0))
    session, setup = start_session(
        {"arbitrary_web": "deny"},
        grants=["network=allowed.test"],
        names={"allowed.test": [REMOTE_V4]},
    )

    def attempt(sni: str) -> str:
        out = run_inside(
            setup, [sys.executable, "-I", "-c", SNI_CLIENT, "allowed.test", str(target.port), sni]
        )
        return out.stdout

    mismatch = attempt("other.test")
    assert mismatch.startswith("HTTP/1.1 200") and "handshake failed" in mismatch, mismatch
    assert "ACCESS_DENIED" in mismatch.upper()
    missing = attempt("")
    assert "handshake failed" in missing
    assert target.received == b""  # nothing of either hello reached the server
    matching = attempt("allowed.test")  # the server is not TLS: the hello reaches it, then fails
    assert b"allowed.test" in target.received, matching
    reasons = [e.reason for e in session.recorder.entries]
    assert "does not match the requested host allowed.test" in str(reasons[0])
    assert "names no server" in str(reasons[1])
    assert [e.decision for e in session.recorder.entries] == ["deny", "deny", "allow"]


def test_host_unix_sockets_are_unreachable(
    servers: Servers, start_session: SessionFactory, tmp_path: Path
) -> None:
    host_sock = tmp_path / "host.sock"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0gatekeeper-test-{os.getpid()}")
    abstract.listen(8)
    path = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.bind(str(tmp_path / "host.sock"))
    path.listen(8)
    run_sock = Path(f"/run/gatekeeper-test-{os.getpid()}.sock")
    in_run = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    in_run.bind(str(run_sock))
    in_run.listen(8)
    try:
        _, setup = start_session({"arbitrary_web": "allow", "localhost": "allow"})
        code = textwrap.dedent(f"""
            import socket
            for name in ("\\0gatekeeper-test-{os.getpid()}", "{host_sock}", "{run_sock}"):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(name)
                    print("connected")
                except OSError as exc:
                    print("refused", exc.errno)
            try:
                open("/run/gatekeeper/planted", "w")
                print("wrote")
            except OSError as exc:
                print("read-only", exc.errno)
        """)
        out = python_inside(setup, code)
        assert out.stdout.split("\n")[:4] == [
            "refused 111",
            "refused 2",
            "refused 2",
            "read-only 30",
        ], out
        abstract.settimeout(0.2)
        with pytest.raises(TimeoutError):
            abstract.accept()
    finally:
        for sock in (abstract, path, in_run):
            sock.close()
        run_sock.unlink(missing_ok=True)


# --- ask, deny, grant in the record -----------------------------------------------------------


def test_ask_without_a_terminal_denies_and_records_a_pending_escalation(
    servers: Servers, start_session: SessionFactory
) -> None:
    servers.remote(lambda: RecordingHTTPServer((REMOTE_V4, 80)).start())
    session, setup = start_session(
        {"arbitrary_web": "ask"},
        grants=["network=granted.test:80"],
        names={"asked.test": [REMOTE_V4], "granted.test": [REMOTE_V4]},
    )
    assert urllib_get(setup, "http://asked.test/").stdout.startswith("403 arbitrary_web")
    assert urllib_get(setup, "http://asked.test/again").stdout.startswith("403")
    assert urllib_get(setup, "http://granted.test/").stdout.startswith("200")
    requests, escalations = session.stop()
    assert [(e.kind, e.value, e.decision) for e in escalations] == [
        ("network", "granted.test:80", "granted"),
        ("network", "asked.test:80", "pending"),
    ]
    assert [(r.host, r.decision, r.count) for r in requests] == [
        ("asked.test", "deny", 2),  # the same refusal twice: one entry, counted
        ("granted.test", "allow", None),
    ]


def test_ask_tty_prompts_on_the_terminal(servers: Servers, start_session: SessionFactory) -> None:
    servers.remote(lambda: RecordingHTTPServer((REMOTE_V4, 80)).start())
    with answered_tty(b"y\n", b"n\n") as (tty, prompts):
        session, setup = start_session(
            {"arbitrary_web": "ask"},
            ask="tty",
            tty_path=tty,
            names={"yes.test": [REMOTE_V4], "no.test": [REMOTE_V4]},
        )
        assert urllib_get(setup, "http://yes.test/").stdout.startswith("200")
        assert urllib_get(setup, "http://yes.test/cached").stdout.startswith("200")  # asked once
        assert urllib_get(setup, "http://no.test/").stdout.startswith("403")
    assert b"yes.test:80 (arbitrary_web" in prompts[0] and b"no.test:80" in prompts[1]
    _, escalations = session.stop()
    assert [(e.value, e.decision) for e in escalations] == [
        ("yes.test:80", "granted"),
        ("no.test:80", "denied"),
    ]


# --- SOCKS5, many connections, the bridge itself ----------------------------------------------


SOCKS_CLIENT = textwrap.dedent("""
    import ipaddress, socket, sys
    def socks(kind, host, port):
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        s.sendall(b"\\x05\\x01\\x00")
        assert s.recv(2) == b"\\x05\\x00"
        if kind == 3:
            address = bytes([len(host)]) + host.encode()
        else:
            address = ipaddress.ip_address(host).packed
        s.sendall(bytes([5, 1, 0, kind]) + address + port.to_bytes(2, "big"))
        reply = s.recv(10)
        if reply[1] != 0:
            return f"code {reply[1]}"
        s.sendall(b"GET /socks HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return data.split(b"\\r\\n")[0].decode()
    port = int(sys.argv[1])
    for kind, host in ((3, "socks.test"), (1, sys.argv[2]), (4, sys.argv[3]), (3, "denied.test")):
        print(socks(kind, host, port))
""")


def test_socks5_connect_by_name_ipv4_and_ipv6(
    servers: Servers, start_session: SessionFactory
) -> None:
    servers.remote(lambda: RecordingHTTPServer((REMOTE_V4, 8080)).start())
    servers.remote(lambda: RecordingHTTPServer((REMOTE_V6, 8080)).start())
    session, setup = start_session(
        {"arbitrary_web": "deny"},
        grants=["network=socks.test", f"network={REMOTE_V4}:8080", f"network=[{REMOTE_V6}]:8080"],
        names={"socks.test": [REMOTE_V4], "denied.test": [REMOTE_V4]},
    )
    out = run_inside(
        setup, [sys.executable, "-I", "-c", SOCKS_CLIENT, "8080", REMOTE_V4, REMOTE_V6]
    )
    assert out.stdout.splitlines() == ["HTTP/1.1 200 OK"] * 3 + ["code 2"], out.stdout + out.stderr
    curl = run_inside(
        setup, ["sh", "-c", 'curl -sS --proxy "$ALL_PROXY" http://socks.test:8080/curl']
    )
    assert "GET /curl host=socks.test:8080" in curl.stdout, curl.stderr
    assert [(e["method"], e["decision"]) for e in entries(session)] == [("SOCKS5", "allow")] * 3 + [
        ("SOCKS5", "deny"),
        ("SOCKS5", "allow"),
    ]


MANY = textwrap.dedent("""
    import socket, sys, threading
    ok = []
    def one(i):
        s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        s.sendall(f"CONNECT many.test:{sys.argv[1]} HTTP/1.1\\r\\n\\r\\n".encode())
        head = b""
        while not head.endswith(b"\\r\\n\\r\\n"):
            head += s.recv(1)
        barrier.wait()  # all 200 tunnels are open at once
        s.sendall(f"ping {i}\\n".encode())
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        ok.append(data == f"ping {i}\\n".encode())
    barrier = threading.Barrier(200, timeout=30)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(200)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(sum(ok))
""")


def _echo_server(host: str) -> socket.socket:
    import threading

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(512)

    def serve(conn: socket.socket) -> None:
        with conn:
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
            conn.sendall(data)  # only after the client's half-close

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server


@pytest.mark.slow
def test_200_concurrent_tunnels_through_the_bridge_with_half_close(
    servers: Servers, start_session: SessionFactory
) -> None:
    echo = servers.remote(lambda: _echo_server(REMOTE_V4))
    session, setup = start_session({"arbitrary_web": "allow"}, names={"many.test": [REMOTE_V4]})
    out = run_inside(
        setup, [sys.executable, "-I", "-c", MANY, str(echo.getsockname()[1])], timeout=90
    )
    assert out.stdout.strip() == "200", out.stdout + out.stderr
    logged = entries(session)
    assert len(logged) == 200 and all(e["bytes_up"] == e["bytes_down"] > 0 for e in logged)


def test_bridge_keeps_the_commands_pid_exit_status_and_signals(
    start_session: SessionFactory, outer: IsolatedNet
) -> None:
    _, setup = start_session({})
    out = run_inside(setup, ["sh", "-c", "echo $$; yes | head -1; exit 7"])
    assert out.returncode == 7
    assert out.stdout.split() == ["2", "y"]  # bwrap's init is 1: the command itself is 2
    assert out.stderr == ""  # SIGPIPE is back to its default: `yes` died quietly
    missing = run_inside(setup, ["no-such-command-gk"])
    assert missing.returncode == 127 and "no-such-command-gk" in missing.stderr


def test_bridge_exits_when_its_command_does(tmp_path: Path, outer: IsolatedNet) -> None:
    from gatekeeper.sandbox.net.session import BRIDGE

    marker = f"gk-bridge-test-{os.getpid()}"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.run(
        [
            sys.executable,
            str(BRIDGE),
            "--proxy-socket",
            str(tmp_path / marker),
            "--listen",
            f"127.0.0.1:{port}",
            "--",
            "sh",
            "-c",
            "echo $$",
        ],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert proc.returncode == 0
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, marker)]
        if not alive:
            break
        time.sleep(0.05)
    assert not alive


def _cmdline_has(pid: str, marker: str) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return False


BIG_ECHO = textwrap.dedent("""
    import hashlib, os, socket, sys, threading
    size = int(sys.argv[2])
    payload = os.urandom(size)
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(f"CONNECT big.test:{sys.argv[1]} HTTP/1.1\\r\\n\\r\\n".encode())
    head = b""
    while not head.endswith(b"\\r\\n\\r\\n"):
        head += s.recv(1)
    def send():
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
    sender = threading.Thread(target=send)
    sender.start()
    got = hashlib.sha256()
    n = 0
    while chunk := s.recv(1 << 20):
        got.update(chunk)
        n += len(chunk)
    sender.join()
    print(n, got.hexdigest() == hashlib.sha256(payload).hexdigest())
""")


def _streaming_echo_server(host: str) -> socket.socket:
    """Echoes each chunk as it comes and closes after the client's half-close."""
    import threading

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(8)

    def serve(conn: socket.socket) -> None:
        with conn:
            while chunk := conn.recv(1 << 20):
                conn.sendall(chunk)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server


def test_a_large_tunnel_both_ways_arrives_intact_and_counted(
    servers: Servers, start_session: SessionFactory
) -> None:
    # Large enough that both directions fill the relay's first buffer and go on in bulk.
    size = 24 << 20
    echo = servers.remote(lambda: _streaming_echo_server(REMOTE_V4))
    session, setup = start_session({"arbitrary_web": "allow"}, names={"big.test": [REMOTE_V4]})
    out = run_inside(
        setup,
        [sys.executable, "-I", "-c", BIG_ECHO, str(echo.getsockname()[1]), str(size)],
        timeout=60,
    )
    assert out.stdout.split() == [str(size), "True"], out.stdout + out.stderr
    logged = entries(session)
    assert [(e["bytes_up"], e["bytes_down"]) for e in logged] == [(size, size)]
