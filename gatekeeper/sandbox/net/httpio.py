"""HTTP/1.x for the proxy: reading heads off a raw socket, parsing them strictly, replying."""

from __future__ import annotations

import asyncio
import functools
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gatekeeper.sandbox.net import sockio
from gatekeeper.sandbox.net.classify import is_valid_name, normalize_host

HEAD_LIMIT = 64 * 1024
MAX_INTERIM = 16  # 1xx answers passed on before the final one (each counted as bytes down)
READ_SIZE = 64 * 1024
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
HOP_BY_HOP = {
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
}
REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class HttpError(Exception):
    """A request the proxy answers with an error status instead of forwarding."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class SockReader:
    """Buffered reads from a socket through the event loop (never blocking: see sockio)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, buffer: bytes = b""
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.buffer = bytearray(buffer)

    async def fill(self) -> bool:
        """Read once more into the buffer; False at end of stream."""
        data = await sockio.recv(self.sock, READ_SIZE)
        self.buffer += data
        return bool(data)

    def fill_now(self) -> bool | None:
        """Read once more into the buffer if the socket has something: True when it had,
        False at end of stream, None when nothing is there yet. Raise OSError."""
        data = sockio.recv_now(self.sock, READ_SIZE)
        if data is None:
            return None
        self.buffer += data
        return bool(data)

    def head_now(self, limit: int = HEAD_LIMIT, start: int = 0) -> bytes | None:
        """The bytes up to the blank line when the buffer holds them (searched from start on),
        else None; raise HttpError(431) past limit, HttpError(400) at a bare CR or LF."""
        return split_head(self.buffer, limit, start)

    async def read_head(self, limit: int = HEAD_LIMIT) -> bytes:
        """Bytes up to the blank line; raise HttpError(431) past limit, EOFError at the end."""
        start = 0
        while (head := self.head_now(limit, start)) is None:
            start = max(0, len(self.buffer) - 3)
            if not await self.fill():
                raise EOFError("the connection closed before the end of the header block")
        return head

    async def read_line(self, limit: int = 4096) -> bytes:
        """One line without its CRLF; raise HttpError past limit or at a bare CR or LF (as soon
        as one arrives, not once the line has grown to the limit), EOFError at the end."""
        while True:
            end = self.buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 2]
                if b"\r" in line or b"\n" in line:
                    raise HttpError(400, "a bare CR or LF inside a chunk line")
                return line
            _refuse_bare_cr_lf(self.buffer, "a chunk line")
            if len(self.buffer) > limit:
                raise HttpError(400, "a chunk-size line is too long")
            if not await self.fill():
                raise EOFError("the connection closed in the middle of a line")

    async def read_some(self, most: int = READ_SIZE) -> bytes:
        if not self.buffer and not await self.fill():
            return b""
        data = bytes(self.buffer[:most])
        del self.buffer[:most]
        return data

    async def read_exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not await self.fill():
                raise EOFError("the connection closed in the middle of a body")
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def take(self) -> bytes:
        data = bytes(self.buffer)
        self.buffer.clear()
        return data


def split_head(buffer: bytearray, limit: int = HEAD_LIMIT, start: int = 0) -> bytes | None:
    """Take the bytes up to the blank line off the front of buffer when it holds them
    (searched from start on), else None; raise HttpError(431) past limit, HttpError(400) at
    a bare CR or LF."""
    end = buffer.find(b"\r\n\r\n", start)
    if end >= 0 and end + 4 <= limit:
        head = bytes(buffer[: end + 4])
        del buffer[: end + 4]
        return head
    if len(buffer) >= limit:
        raise HttpError(431, f"the header block is larger than {limit // 1024} KiB")
    _refuse_bare_cr_lf(buffer, "the header block", start)
    return None


_BARE_CR_LF = re.compile(rb"(?<!\r)\n|\r(?=[^\n])")


def _refuse_bare_cr_lf(buffer: bytearray, where: str, start: int = 0) -> None:
    """Raise HttpError(400) when buffer holds a LF without a CR before it or a CR with
    something other than a LF after it: a lenient server would read either as a line end.
    Refusing it as soon as it arrives spares the client a wait for a line end that a strict
    reading cannot find (until a timeout or the size limit). Only from start on (what came
    since the last look, which looked up to the last bytes before it), so that a head sent
    a byte at a time is not scanned again in full for each."""
    if _BARE_CR_LF.search(buffer, start):
        raise HttpError(400, f"a bare CR or LF in {where}")


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    # The values by lower-case name, gathered once: the framing checks look a dozen up.
    by_name: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    # Passed framing_checks (parse_request made it so): body_length need not check again.
    framed: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, list[str]] = {}
        for name, value in self.headers:
            by_name.setdefault(name.lower(), []).append(value)
        self.by_name = {name: tuple(values) for name, values in by_name.items()}

    def header(self, name: str) -> list[str]:
        """Every value of the header name (lower case), in order."""
        return list(self.by_name.get(name, ()))


# What a request line's target and a field value may hold (RFC 9112 3.2, RFC 9110 5.5): no
# control characters at all in a target; in a value, tab but no other control and no DEL.
_TARGET = re.compile(r"^[\x21-\x7e]+$")
_FIELD_VALUE = re.compile(r"^[\t\x20-\x7e\x80-\xff]*$")
# Headers that decide where a request ends; a Connection header may not name them (a
# hop-by-hop strip would change the framing between us and the server).
FRAMING = {"content-length", "transfer-encoding", "host"}
MAX_CONTENT_LENGTH_DIGITS = 18


def parse_request_line(line: str) -> tuple[str, str, str]:
    """(method, target, version) of a request line; raise HttpError(400) unless exact."""
    parts = line.split(" ")
    if (
        len(parts) != 3
        or not _TOKEN.fullmatch(parts[0])
        or not _TARGET.fullmatch(parts[1])
        or parts[2] not in ("HTTP/1.0", "HTTP/1.1")
    ):
        raise HttpError(400, "the request line is not `METHOD TARGET HTTP/1.x`")
    return parts[0], parts[1], parts[2]


# A whole head that every check of parse_request passes line by line: one match instead of a
# dozen per header. Anything else (an error, or a head this does not cover) takes the checks
# line by line, which say what is wrong.
_WELL_FORMED = re.compile(
    r"([!#$%&'*+.^_`|~0-9A-Za-z-]+) ([\x21-\x7e]+) (HTTP/1\.[01])\r\n"
    r"((?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*\r\n)*)\r\n"
)


def parse_request(head: bytes) -> Request:
    """Parse a request head strictly; raise HttpError(400) on anything ambiguous.

    Lines end with CRLF only: a bare CR or LF anywhere, a folded line, a control character in
    a value or a name with space before its colon is refused, because some server behind the
    proxy would read such a head differently (and maybe as two requests).
    """
    text = head.decode("latin-1")
    match = _WELL_FORMED.fullmatch(text)
    if match is None:
        return _parse_request_lines(head)
    method, target, version, block = match.groups()
    headers: list[tuple[str, str]] = []
    for line in block.split("\r\n")[:-1]:
        name, _, value = line.partition(":")
        if "_" in name:
            _refuse_look_alike(name)
        headers.append((name, value.strip(" \t")))
    request = Request(method, target, version, headers)
    framing_checks(request)
    request.framed = True
    return request


def _parse_request_lines(head: bytes) -> Request:
    """parse_request, line by line: the checks that say which one a head fails."""
    if not head.endswith(b"\r\n\r\n"):
        raise HttpError(400, "the request head does not end with an empty line")
    lines = head[:-4].decode("latin-1").split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        raise HttpError(400, "a bare CR or LF inside a request line or header")
    method, target, version = parse_request_line(lines[0])
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            raise HttpError(400, "a folded header line (obs-fold)")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise HttpError(400, f"malformed header line {line[:60]!r}")
        if not _FIELD_VALUE.fullmatch(value):
            raise HttpError(400, f"a control character in the {name[:40]} header")
        _refuse_look_alike(name)
        headers.append((name, value.strip(" \t")))
    request = Request(method, target, version, headers)
    framing_checks(request)
    request.framed = True
    return request


def _refuse_look_alike(name: str) -> None:
    lower = name.lower()
    if "_" in lower and lower.replace("_", "-") in FRAMING | {"connection"}:
        # CGI-style servers read Content_Length as Content-Length.
        raise HttpError(400, f"a look-alike of a framing header: {name[:40]}")


# The headers framing_checks looks at: a request with none of them passes every check.
_FRAMING_CHECKED = frozenset({"connection", "content-length", "transfer-encoding"})


def framing_checks(request: Request) -> None:
    """Refuse every framing a server could read differently from us; raise HttpError(400)."""
    if _FRAMING_CHECKED.isdisjoint(request.by_name):
        return
    named = {v.strip().lower() for c in request.header("connection") for v in c.split(",")}
    named.discard("")
    if any(not _TOKEN.fullmatch(n) for n in named):
        raise HttpError(400, "a malformed Connection header")
    if named & FRAMING:
        raise HttpError(400, "the Connection header names a framing header")
    lengths = request.header("content-length")
    encodings = request.header("transfer-encoding")
    if len(lengths) > 1:
        raise HttpError(400, "Content-Length is given more than once")
    if lengths and (
        not lengths[0].isascii()
        or not lengths[0].isdigit()
        or len(lengths[0]) > MAX_CONTENT_LENGTH_DIGITS
    ):
        raise HttpError(400, f"a malformed Content-Length {lengths[0][:20]!r}")
    if len(encodings) > 1:
        raise HttpError(400, "Transfer-Encoding is given more than once")
    if encodings and lengths:
        raise HttpError(400, "both Transfer-Encoding and Content-Length are set")
    if encodings and encodings[0].lower() != "chunked":
        # Only `chunked` alone: any other coding (or `chunked` not last) leaves the end of the
        # body to the server's guess.
        raise HttpError(400, f"unsupported Transfer-Encoding {encodings[0][:40]!r}")
    if encodings and request.version == "HTTP/1.0":
        raise HttpError(400, "Transfer-Encoding in an HTTP/1.0 request")


@functools.lru_cache(maxsize=1024)  # a run asks for the same few hosts again and again
def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """`host:port` or `[v6]:port` to (normalized host, port); raise HttpError(400) if malformed."""
    bad = HttpError(400, f"malformed host or port {authority[:80]!r}")
    host, port_text = authority, ""
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise bad
        host, rest = authority[1:close], authority[close + 1 :]
        if rest and not rest.startswith(":"):
            raise bad
        port_text = rest[1:]
    elif ":" in authority:
        host, port_text = authority.rsplit(":", 1)
        if ":" in host:  # an IPv6 literal must be in brackets
            raise bad
    host = normalize_host(host)
    if not host or not is_valid_name(host):
        raise bad
    if not port_text:
        if default_port is None:
            raise HttpError(400, f"{authority[:80]!r} needs a port, as in host:443")
        return host, default_port
    # (at most 5 ASCII digits before int(): past 4,300 digits it raises ValueError)
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        raise bad
    if not 0 < int(port_text) < 65536:
        raise bad
    return host, int(port_text)


_PATH_START = re.compile(r"[/?]")


def split_absolute_uri(target: str) -> tuple[str, int, str]:
    """`http://host[:port]/path?q#f` to (host, port, origin-form target without the fragment).

    A fragment is never sent to a server (RFC 9110 4.2.4), so it is cut here, before the
    target is both logged and forwarded. Raise HttpError(400) for anything else.
    """
    lower = target[:8].lower()
    if lower.startswith("https://"):
        raise HttpError(
            400, "https:// URLs go through CONNECT (set HTTPS_PROXY), not plain forwarding"
        )
    if not lower.startswith("http://"):
        raise HttpError(400, "this is gatekeeper's proxy: send an absolute http:// URL or CONNECT")
    rest = target[7:].split("#", 1)[0]
    found = _PATH_START.search(rest)
    cut = found.start() if found else len(rest)
    authority, path = rest[:cut], rest[cut:] or "/"
    if "@" in authority or "\\" in authority:
        raise HttpError(400, "credentials in the URL are not forwarded")
    if path.startswith("?"):
        path = "/" + path
    host, port = split_authority(authority, 80)
    return host, port, path


def body_length(request: Request) -> int | None:
    """The request body's length, None for chunked; raise HttpError on conflicting framing."""
    if not request.framed:
        framing_checks(request)
    if request.by_name.get("transfer-encoding"):
        return None
    lengths = request.by_name.get("content-length")
    return int(lengths[0]) if lengths else 0


def host_header(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port == 80 else f"{shown}:{port}"


_NOT_FORWARDED = frozenset(HOP_BY_HOP | FRAMING)


def forward_head(request: Request, host: str, port: int, path: str) -> bytes:
    """The request as the origin server gets it: origin-form, Host from the URL, no hop-by-hop.

    The framing headers are written by us from what we parsed (one Content-Length or
    `Transfer-Encoding: chunked`), never copied, so the server frames the body as we do.
    """
    length = body_length(request)
    skip = _NOT_FORWARDED
    if "connection" in request.by_name:
        named = {v.strip().lower() for c in request.header("connection") for v in c.split(",")}
        skip = skip | named
    lines = [f"{request.method} {path} {request.version}", f"Host: {host_header(host, port)}"]
    for name, value in request.headers:
        if name.lower() not in skip:
            lines.append(f"{name}: {value}")
    if length is None:
        lines.append("Transfer-Encoding: chunked")
    elif length or "content-length" in request.by_name:
        lines.append(f"Content-Length: {length}")
    lines.append("Connection: close")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if data.count(b"\n") != data.count(b"\r\n") or data.count(b"\r") != data.count(b"\r\n"):
        raise HttpError(400, "a bare CR or LF inside a request line or header")  # never trust
    return data


# The request most clients send, read in one match (plain_request): a request line, then
# fields written `Name: value` (a token without `_`, a colon, one space, a value with no space
# or tab at either end), none of them one that says where the request ends, is hop by hop, or
# names others that are (Connection).
_PLAIN_REQUEST = re.compile(
    rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) ([\x21-\x7e]+) (HTTP/1\.[01])\r\n"
    rb"((?:[!#$%&'*+.^`|~0-9A-Za-z-]+: [\x21-\x7e\x80-\xff]"
    rb"(?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?\r\n)*)\r\n"
)
_NOT_PLAIN_FIELD = re.compile(
    rb"^(?:" + b"|".join(sorted(n.encode() for n in _NOT_FORWARDED if n != "host")) + rb"):",
    re.IGNORECASE | re.MULTILINE,
)
_HOST_FIELD = re.compile(rb"^host:[^\r\n]*\r\n", re.IGNORECASE | re.MULTILINE)


def plain_request(head: bytes) -> tuple[str, str, int, str, bytes] | None:
    """(method, host, port, path, the head as forward_head writes it) for a request with an
    absolute http:// target and no body, written as most clients write one (_PLAIN_REQUEST);
    None for any other, which parse_request reads (and says what is wrong with it).

    The same reading as parse_request, split_absolute_uri, body_length and forward_head in
    turn, in a few matches: tests/test_fuzz_http.py holds the two to the same result."""
    match = _PLAIN_REQUEST.fullmatch(head)
    if match is None:
        return None
    method, target, version, block = match.groups()
    if method == b"CONNECT" or _NOT_PLAIN_FIELD.search(block):
        return None
    try:
        host, port, path = split_absolute_uri(target.decode("ascii"))
    except HttpError:
        return None
    forwarded = b"%s %s %s\r\nHost: %s\r\n%sConnection: close\r\n\r\n" % (
        method,
        path.encode("ascii"),
        version,
        host_header(host, port).encode("latin-1"),
        _HOST_FIELD.sub(b"", block),
    )
    return method.decode("ascii"), host, port, path, forwarded


def response_status(head: bytes) -> int:
    """The status code of a response head; raise HttpError(502) when it is not HTTP."""
    first = head.split(b"\r\n", 1)[0].split(b" ")
    if len(first) < 2 or not first[0].startswith(b"HTTP/1.") or not first[1].isdigit():
        raise HttpError(502, "the server did not answer with HTTP/1.x")
    return int(first[1])


# A response head final_head reads strictly as a whole: a status line, then field lines whose
# names are tokens (directly followed by the colon) and whose values hold no CR or LF. In it,
# the fields final_head drops or reads, each found with its value.
_PLAIN_RESPONSE = re.compile(rb"([^\r\n]*\r\n)((?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n]*\r\n)*)\r\n")
_NOTED_FIELD = re.compile(
    rb"^(connection|keep-alive|proxy-connection|content-length|transfer-encoding):([^\r\n]*)\r\n",
    re.IGNORECASE | re.MULTILINE,
)
_DROPPED = (b"connection", b"keep-alive", b"proxy-connection")


def final_head(head: bytes, method: str, status: int) -> tuple[bytes, int | None]:
    """A final response head with its connection headers replaced by `Connection: close`,
    and the length of the body that follows when the head alone says it (RFC 9112 6.3: none
    after HEAD, 204 or 304; else one well-formed Content-Length and no Transfer-Encoding),
    read strictly: None when the body ends where the connection does, and also for a head a
    client could read otherwise (a folded line, a bare CR or LF, a field name that is not a
    token), whose answer is then relayed to its end as it comes."""
    plain = _PLAIN_RESPONSE.fullmatch(head)
    if plain is None:
        return _final_head_lines(head, method, status)
    # The same reading in two matches (the answer to nearly every request is such a head):
    # tests/test_fuzz_http.py holds the two to the same result.
    first, block = plain.groups()
    kept = [first]
    length = None
    strict = True
    at = 0
    for found in _NOTED_FIELD.finditer(block):
        name = found[1].lower()
        if name in _DROPPED:
            kept.append(block[at : found.start()])
            at = found.end()
        elif name == b"transfer-encoding":
            strict = False
        else:
            value = found[2].strip(b" \t")
            if length is not None or not value.isdigit() or len(value) > 18:
                strict = False
            else:
                length = int(value)
    kept.append(block[at:] + b"Connection: close\r\n\r\n")
    closed = b"".join(kept)
    if not strict:
        return closed, None
    return closed, 0 if method == "HEAD" or status in (204, 304) else length


def _final_head_lines(head: bytes, method: str, status: int) -> tuple[bytes, int | None]:
    """final_head, line by line: any head, strictly read or not."""
    lines = head.decode("latin-1").split("\r\n")
    kept = [lines[0]]
    strict = head.endswith(b"\r\n\r\n") and not any("\r" in x or "\n" in x for x in lines)
    length = None
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        lower = name.strip().lower()
        if lower not in ("connection", "keep-alive", "proxy-connection"):
            kept.append(line)
        if not sep or not _TOKEN.fullmatch(name) or lower == "transfer-encoding":
            strict = False  # (a folded line starts with a space, which no token holds)
        elif lower == "content-length":
            value = value.strip(" \t")
            if length is not None or not value.isdigit() or not value.isascii() or len(value) > 18:
                strict = False
            else:
                length = int(value)
    kept.append("Connection: close")
    closed = ("\r\n".join(kept) + "\r\n\r\n").encode("latin-1")
    if not strict:
        return closed, None
    return closed, 0 if method == "HEAD" or status in (204, 304) else length


def simple_response(status: int, body: str, headers: list[tuple[str, str]] | None = None) -> bytes:
    """A complete response that closes the connection, with a one-line text body."""
    data = (body.rstrip("\n") + "\n").encode("utf-8")
    lines = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(data)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in headers or []),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + data


_CHUNK_SIZE = re.compile(r"[0-9A-Fa-f]{1,15}")
_CHUNK_EXT = re.compile(r"[\t\x20-\x7e\x80-\xff]*")


async def send_body(
    reader: SockReader, send: Callable[[bytes], Awaitable[None]], length: int | None
) -> None:
    """Pass exactly one request body (length bytes, or chunked when None) from reader to send.

    Nothing after the body is passed on, so a second, pipelined request never reaches the
    server. Chunk-size lines are re-written by us (size only, extensions dropped) and trailers
    are checked and dropped, so no byte of the framing is the client's. Raises EOFError when
    the client stops early, HttpError on broken chunk framing.
    """
    if length is not None:
        await _copy(reader, send, length)
        return
    while True:
        size = _chunk_size(await reader.read_line())
        if size == 0:
            while True:
                trailer = await reader.read_line()
                if not trailer:
                    # The last chunk goes out only once the trailers are checked: a server
                    # never sees the end of a body that is then refused.
                    await send(b"0\r\n\r\n")
                    return
                _check_trailer(trailer)
        await send(b"%x\r\n" % size)
        await _copy(reader, send, size)
        if await reader.read_exact(2) != b"\r\n":
            raise HttpError(400, "a chunk does not end with CRLF")
        await send(b"\r\n")


def _chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (hex digits, then an optional `;extension`); else 400."""
    text = line.decode("latin-1")
    digits, _, extension = text.partition(";")
    digits = digits.rstrip(" \t")
    if not _CHUNK_SIZE.fullmatch(digits) or not _CHUNK_EXT.fullmatch(extension):
        raise HttpError(400, "malformed chunk size")
    return int(digits, 16)


def _check_trailer(line: bytes) -> None:
    text = line.decode("latin-1")
    name, sep, value = text.partition(":")
    if not sep or not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
        raise HttpError(400, "a malformed trailer field")


async def _copy(reader: SockReader, send: Callable[[bytes], Awaitable[None]], size: int) -> None:
    while size > 0:
        data = await reader.read_some(min(size, 256 * 1024))
        if not data:
            raise EOFError("the client closed in the middle of the body")
        size -= len(data)
        await send(data)
