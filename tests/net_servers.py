"""Servers for the network tests: HTTP(S) with a record of what they saw, a raw TCP recorder."""

from __future__ import annotations

import datetime
import http.server
import os
import socket
import ssl
import threading
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RecordingHTTPServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _serve(self) -> None:
        body = self._body()
        self.server.requests.append((self.command, self.path, self.headers.get("Host", ""), body))
        files = self.server.files
        if self.path in files:
            data = files[self.path]
            self.send_response(200)
            self.send_header(
                "Content-Type",
                "text/html" if self.path.endswith("/") else "application/octet-stream",
            )
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(self.server.big_size))
            self.end_headers()
            self._send_big()
            return
        else:
            host = self.headers.get("Host")
            data = f"{self.command} {self.path} host={host} body={len(body)}\n".encode()
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_big(self) -> None:
        assert self.server.big_path is not None
        self.wfile.flush()
        with open(self.server.big_path, "rb") as fh:
            self.connection.sendfile(fh)

    do_GET = do_POST = do_PUT = do_HEAD = _serve


class RecordingHTTPServer(http.server.ThreadingHTTPServer):
    """An HTTP/1.1 server that records (method, path, Host, body) and counts connections."""

    daemon_threads = True
    request_queue_size = 512

    def __init__(
        self,
        address: tuple[str, int],
        *,
        tls: ssl.SSLContext | None = None,
        files: dict[str, bytes] | None = None,
        big: Path | None = None,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self.tls = tls
        self.requests: list[tuple[str, str, str, bytes]] = []
        self.connections = 0
        self.files = files or {}
        self.big_path = big
        self.big_size = big.stat().st_size if big else 0

    def get_request(self) -> tuple[socket.socket, object]:
        sock, addr = super().get_request()
        self.connections += 1
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request: object, client_address: object) -> None:
        pass

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> RecordingHTTPServer:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class TcpRecorder:
    """Accepts connections and records every byte sent to it; answers nothing unless told to."""

    def __init__(self, host: str, port: int = 0, reply: bytes = b"") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.connections = 0
        self.active = 0  # connections still being read
        self.received = b""
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def idle(self, timeout: float = 10) -> None:
        """Wait until every connection made so far has been read to its end (the proxy may
        answer its client before the server has read what it was sent)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.active == 0:
                    return
            time.sleep(0.01)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self.active += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._read(conn)
        finally:
            with self._lock:
                self.active -= 1

    def _read(self, conn: socket.socket) -> None:
        with conn:
            if self.reply:
                conn.sendall(self.reply)
            conn.settimeout(10)
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                with self._lock:
                    self.received += data

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        self.sock.close()


def make_cert(folder: Path, names: list[str]) -> tuple[Path, Path]:
    """A self-signed certificate for names; (cert.pem, key.pem). The cert is its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(key_path, 0o600)
    return cert_path, key_path


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context
