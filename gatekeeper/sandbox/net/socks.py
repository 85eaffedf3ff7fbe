"""SOCKS5 (RFC 1928) for the proxy: no authentication, the CONNECT command, any address type."""

from __future__ import annotations

import ipaddress

from gatekeeper.sandbox.net.classify import is_valid_name, normalize_host
from gatekeeper.sandbox.net.httpio import SockReader

VERSION = 5
SUCCEEDED = 0x00
GENERAL_FAILURE = 0x01
NOT_ALLOWED = 0x02  # connection not allowed by ruleset
HOST_UNREACHABLE = 0x04
CONNECTION_REFUSED = 0x05
TTL_EXPIRED = 0x06
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_NOT_SUPPORTED = 0x08
NO_ACCEPTABLE_METHOD = b"\x05\xff"
NO_AUTH = b"\x05\x00"


class SocksError(Exception):
    """A request refused before policy: code is the reply to send (None: send nothing more).

    host and port are what the request named, as far as it was read (host printable, for
    the log), or None when no request was read at all.
    """

    def __init__(
        self, code: int | None, message: str, host: str | None = None, port: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.host = host
        self.port = port


def reply(code: int) -> bytes:
    """A reply with the given code and an all-zero bound address."""
    return bytes([VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0])


async def read_greeting(reader: SockReader) -> bool:
    """Read the method list; True when it offers no-authentication. Raise EOFError at end."""
    version, count = await reader.read_exact(2)
    if version != VERSION or count == 0:
        raise SocksError(None, "not a SOCKS5 greeting")
    methods = await reader.read_exact(count)
    return 0 in methods


async def read_request(reader: SockReader) -> tuple[str, int]:
    """Read a request; return (normalized host, port). Raise SocksError for what is not served."""
    version, command, _reserved, kind = await reader.read_exact(4)
    if version != VERSION:
        raise SocksError(GENERAL_FAILURE, "not a SOCKS5 request")
    problem: str | None = None
    if kind == 1:
        host = str(ipaddress.IPv4Address(await reader.read_exact(4)))
    elif kind == 4:
        host = str(ipaddress.IPv6Address(await reader.read_exact(16)))
    elif kind == 3:
        (length,) = await reader.read_exact(1)
        raw = await reader.read_exact(length)
        host = normalize_host(raw.decode("ascii", "backslashreplace"))
        if not raw.isascii():
            problem = "the host name is not ASCII"
        elif not is_valid_name(host):
            problem = "not a valid host name"
        if problem is not None:
            host = host.encode("unicode_escape").decode("ascii")[:100]
    else:
        raise SocksError(ADDRESS_NOT_SUPPORTED, f"address type {kind} is not supported", "?")
    port = int.from_bytes(await reader.read_exact(2), "big")
    if problem is not None:
        raise SocksError(GENERAL_FAILURE, problem, host, port)
    if command != 1:
        raise SocksError(
            COMMAND_NOT_SUPPORTED,
            "only CONNECT is supported (no BIND or UDP ASSOCIATE)",
            host,
            port,
        )
    if port == 0:
        raise SocksError(GENERAL_FAILURE, "port 0", host, port)
    return host, port
