"""Inside the sandbox: loopback ports whose connections are handed to the launcher's Unix sockets.

    python3 bridge.py --proxy-socket SOCK --listen 127.0.0.1:3128 [--forward PORT=SOCK]...
                      [--nofile N] -- CMD [ARG...]

It binds the ports, then forks: the child passes each listening socket over the matching Unix
socket (one byte 0x01 with the descriptor as SCM_RIGHTS), so that the launcher accepts on it
itself, with no hop through this process per connection. Where the launcher declines (its
answer is not 0x00), the child accepts and passes each accepted socket over instead (one byte
0x00 with the descriptor, on one connection kept open), and the parent execs
CMD, which keeps its pid and exit status. The child dies with CMD (parent-death signal, and
the sandbox's pid namespace). Standard library only: it runs from a bind-mounted file.
"""

from __future__ import annotations

# The command's way to its exec loads only the interpreter's C modules (`socket` and `signal`
# load `enum`, `selectors` and more: some 7 ms before every command); the child that serves
# the ports loads the rest.
import _signal
import _socket
import os
import sys

TYPE_CHECKING = False  # typing is not imported at run time: start-up time is per command
if TYPE_CHECKING:
    import socket
    from typing import NoReturn

HANDOFF = b"\x00"
LISTENER = b"\x01"
PR_SET_PDEATHSIG = 1
USAGE = (
    "usage: bridge.py --proxy-socket SOCK --listen HOST:PORT [--forward PORT=SOCK]... "
    "[--nofile N] -- CMD [ARG...]"
)


def fail(message: str, code: int = 125) -> NoReturn:
    sys.stderr.write(f"gatekeeper-bridge: {message}\n")
    sys.stderr.flush()
    os._exit(code)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        fail(f"{text!r} is not a port number\n{USAGE}", 2)
    return int(text)


def parse(argv: list[str]) -> tuple[dict[tuple[str, int], str], int | None, list[str]]:
    """({(host, port): unix socket path}, soft descriptor limit for CMD, CMD argv)."""
    routes: dict[tuple[str, int], str] = {}
    proxy: str | None = None
    listen: list[tuple[str, int]] = []
    nofile: int | None = None
    i = 0
    while i < len(argv) and argv[i] != "--":
        flag, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if value is None:
            fail(f"{flag} needs a value\n{USAGE}", 2)
        if flag == "--proxy-socket":
            proxy = value
        elif flag == "--listen":
            host, _, number = value.rpartition(":")
            listen.append((host.strip("[]") or "127.0.0.1", _port(number)))
        elif flag == "--forward":
            number, _, path = value.partition("=")
            routes[("127.0.0.1", _port(number))] = path
            routes[("::1", _port(number))] = path
        elif flag == "--nofile" and value.isdigit():
            nofile = int(value)
        else:
            fail(f"unknown option {flag}\n{USAGE}", 2)
        i += 2
    command = argv[i + 1 :]
    if not command or (listen and proxy is None):
        fail(USAGE, 2)
    for host, port in listen:
        routes[(host, port)] = proxy or ""
        if host == "127.0.0.1":
            routes[("::1", port)] = proxy or ""
    return routes, nofile, command


def bind_all(routes: dict[tuple[str, int], str]) -> list[tuple[int, str]]:
    """Listening sockets (their descriptors) for every route; IPv6 loopback is best effort."""
    bound = []
    for (host, port), path in routes.items():
        family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
        sock = None
        try:
            sock = _socket.socket(family, _socket.SOCK_STREAM)
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1024)
        except OSError as exc:
            if sock is not None:
                sock.close()
            if family == _socket.AF_INET6:
                continue
            fail(f"cannot listen on {host}:{port} inside the sandbox: {exc.strerror}")
        sock.setblocking(False)
        bound.append((sock.detach(), path))
    return bound


def die_with_parent(parent: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass  # the loop below also watches the parent
    if os.getppid() != parent:
        os._exit(0)


class Channels:
    """One Unix connection to each launcher socket, kept open: every client is handed over on
    it, which costs far less than a connection of its own per client."""

    def __init__(self) -> None:
        self.open: dict[str, socket.socket] = {}

    def _connect(self, path: str) -> socket.socket:
        import socket

        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            unix.settimeout(5)
            unix.connect(path)
        except OSError:
            unix.close()
            raise
        self.open[path] = unix
        return unix

    def hand_listener(self, listening: socket.socket, path: str) -> bool:
        """Ask the launcher to accept on listening itself (one byte 0x01 with the socket); True
        when it does (its answer is 0x00), and our copy is closed. False: we accept on it."""
        import socket

        try:
            unix = self.open.get(path) or self._connect(path)
            socket.send_fds(unix, [LISTENER], [listening.fileno()])
            taken = unix.recv(1) == b"\x00"
        except OSError:
            taken = False
        if taken:
            listening.close()
        return taken

    def hand_over(self, client: socket.socket, path: str) -> None:
        """Pass client to the launcher through the Unix socket at path; close our copy either
        way. A channel the launcher closed is opened again once."""
        import socket

        try:
            for attempt in (0, 1):
                unix = self.open.get(path) or self._connect(path)
                try:
                    socket.send_fds(unix, [HANDOFF], [client.fileno()])
                    return
                except OSError:
                    del self.open[path]
                    unix.close()
                    if attempt:
                        raise
        except OSError as exc:
            sys.stderr.write(
                f"gatekeeper-bridge: the launcher's socket {path} is unreachable: {exc}\n"
            )
        finally:
            client.close()


def serve(bound: list[tuple[int, str]], parent: int) -> None:
    import selectors
    import socket

    selector = selectors.DefaultSelector()
    channels = Channels()
    for fd, path in bound:
        sock = socket.socket(fileno=fd)
        if not channels.hand_listener(sock, path):
            selector.register(sock, selectors.EVENT_READ, path)
    while True:
        for key, _ in selector.select(timeout=1.0):
            listening = key.fileobj
            assert isinstance(listening, socket.socket)
            while True:
                try:
                    client, _ = listening.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                client.setblocking(True)
                channels.hand_over(client, key.data)
        if os.getppid() != parent:
            os._exit(0)


def main(argv: list[str]) -> None:
    routes, nofile, command = parse(argv)
    bound = bind_all(routes)
    parent = os.getpid()
    if os.fork() == 0:
        die_with_parent(parent)
        os.setsid()
        for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT):
            _signal.signal(sig, _signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        try:
            serve(bound, parent)
        finally:
            os._exit(0)
    for fd, _ in bound:
        os.close(fd)
    if nofile is not None:  # the launcher raised its own limit for the proxy; CMD gets the old one
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if 0 < nofile < soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    # Python ignores these at start-up; CMD gets the defaults it would have had without us.
    for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
        if hasattr(_signal, name):
            _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        fail(
            f"cannot run {command[0]!r}: {exc.strerror}",
            127 if isinstance(exc, FileNotFoundError) else 126,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
