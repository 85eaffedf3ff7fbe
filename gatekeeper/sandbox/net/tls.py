"""The server names (SNI) in a TLS ClientHello, read from the first bytes of a tunnel.

Only the first ClientHello of a tunnel is read. After a HelloRetryRequest the client sends a
second one, which TLS 1.3 requires to name the same server but which the proxy does not
check; the tunnel already goes to the judged address whatever name it carries.
"""

from __future__ import annotations

import struct

MAX_HELLO = 1 << 16
_HANDSHAKE = 0x16
_CLIENT_HELLO = 1
_SNI = 0


class NeedMore(Exception):
    """The ClientHello is not complete yet: read more bytes and try again."""


class NotAClientHello(ValueError):
    """The bytes are a TLS record but not a well-formed ClientHello."""


def looks_like_tls(data: bytes) -> bool:
    """True when data starts like a TLS handshake record (type 22, version 3.x)."""
    return len(data) >= 1 and data[0] == _HANDSHAKE and (len(data) < 2 or data[1] == 3)


def _handshake_bytes(data: bytes) -> bytes:
    """The handshake message reassembled from its records; raise NeedMore until it is whole."""
    message = b""
    offset = 0
    while True:
        if len(message) >= 4:
            length = int.from_bytes(message[1:4], "big")
            if message[0] != _CLIENT_HELLO:
                raise NotAClientHello("the first handshake message is not a ClientHello")
            if length > MAX_HELLO:
                raise NotAClientHello("the ClientHello is too large")
            if len(message) >= 4 + length:
                return message[4 : 4 + length]
        if len(data) < offset + 5:
            raise NeedMore
        kind, _major, _minor, size = struct.unpack("!BBBH", data[offset : offset + 5])
        if kind != _HANDSHAKE or size == 0 or size > (1 << 14) + 2048:
            raise NotAClientHello("not a TLS handshake record")
        if len(data) < offset + 5 + size:
            raise NeedMore
        message += data[offset + 5 : offset + 5 + size]
        offset += 5 + size


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise NotAClientHello("the ClientHello is truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))

    @property
    def done(self) -> bool:
        return self.pos >= len(self.data)


def client_hello_sni(data: bytes) -> str | None:
    """The first host_name in the ClientHello that data starts with, or None (see names)."""
    names = client_hello_names(data)
    return names[0] if names else None


def client_hello_names(data: bytes) -> list[str]:
    """Every host_name in the ClientHello that data starts with ([] when it sends none).

    A server may pick any name of the list, so each one must be judged. Raises NeedMore when
    data holds only part of the hello and NotAClientHello when it is not one (or names a
    server by anything but a host name).
    """
    body = _Cursor(_handshake_bytes(data))
    body.take(2 + 32)  # client_version, random
    body.vector(1)  # session_id
    body.vector(2)  # cipher_suites
    body.vector(1)  # compression_methods
    if body.done:
        return []
    extensions = _Cursor(body.vector(2))
    found: list[str] = []
    seen_sni = False
    while not extensions.done:
        kind = extensions.number(2)
        payload = _Cursor(extensions.vector(2))
        if kind != _SNI:
            continue
        if seen_sni:
            raise NotAClientHello("two server_name extensions")
        seen_sni = True
        names = _Cursor(payload.vector(2))
        while not names.done:
            name_type = names.number(1)
            name = names.vector(2)
            if name_type != 0:
                raise NotAClientHello(f"a server name of unknown type {name_type}")
            try:
                found.append(name.decode("ascii").lower().rstrip("."))
            except UnicodeDecodeError:
                raise NotAClientHello("the server name is not ASCII") from None
    return found
