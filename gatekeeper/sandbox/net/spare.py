"""Connections opened ahead: one spare upstream per destination the lanes serve again and again.

A client that makes one connection per request (a package manager fetching metadata file after
file over plain HTTP) waits, through a proxy, for a second connection on every request: the
proxy can connect upstream only once it has read where the request goes, and the server's
accept is then on the client's path. So when a lane has answered a request to a destination
(an address and port, allowed outright, judged less than `keep` seconds before) for the second
time within `keep` seconds, it opens one more connection there, ahead, and the next request
judged to go to that same address and port takes it. What it takes is only the connect: every
request is judged, recorded and answered as before, and a spare carries nothing until a
request that was allowed is sent on it. Only requests that may be sent again take spares and
count towards them (lane.py's REPLAYABLE): never a tunnel.

Spares are few (LIMIT destinations; one each) and short-lived: one not taken within `keep`
seconds is closed, by a thread that runs only while there are spares. A spare the server has
closed or written to meanwhile is dropped when taken, and the request connects afresh; one the
server closes just as a request is sent on it is the caller's to retry (lane.py sends the
request once more, on a new connection).
"""

from __future__ import annotations

import select
import socket
import threading
import time

from gatekeeper.sandbox.net import sockio
from gatekeeper.sandbox.net.classify import IPAddress

LIMIT = 4  # destinations with a spare at once
KEEP_SECONDS = 2.0  # well under the idle timeouts servers set for a connection without a request

Key = tuple[IPAddress, int]


class Spares:
    """The lanes' connections opened ahead (see the module's text). Thread-safe."""

    def __init__(self, keep: float = KEEP_SECONDS, limit: int = LIMIT) -> None:
        """keep: seconds a spare is kept (0: none is ever opened)."""
        self.keep = keep
        self.limit = limit
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._spares: dict[Key, tuple[socket.socket, float, bool]] = {}  # (sock, opened, done)
        self._served: dict[Key, float] = {}  # when a lane last connected to each destination
        self._sweeping = False
        self._stopped = False
        self.opened = self.taken = 0  # counts, for tests and benchmarks

    def take(self, address: IPAddress, port: int) -> tuple[socket.socket, bool] | None:
        """The spare to address and port, if one is held and the server has not ended it or
        written to it, and whether its connect was done when it was opened; None otherwise.
        When not done (over loopback it always is), the caller waits for the connect as for
        any other."""
        if not self._spares:  # (read without the lock: a miss only costs a fresh connect)
            return None
        with self._lock:
            held = self._spares.pop((address, port), None)
        if held is None:
            return None
        sock, opened, done = held
        try:
            if time.monotonic() - opened < self.keep and _unused(sock):
                self.taken += 1
                return sock, done
        except (OSError, ValueError):  # (ValueError: poll(2) of a closed socket)
            pass
        sock.close()
        return None

    def served(self, address: IPAddress, port: int) -> None:
        """A lane connected to address and port for a request: open a spare there when it did
        so before within keep seconds and none is held."""
        key = (address, port)
        now = time.monotonic()
        with self._lock:
            if self._stopped or self.keep <= 0:
                return
            last = self._served.pop(key, None)
            self._served[key] = now  # (last in the dict: the newest)
            if len(self._served) > 4 * self.limit:
                del self._served[next(iter(self._served))]
            if last is None or now - last >= self.keep or key in self._spares:
                return
            # Under the lock, as stop() closes them: none is opened once it has. (A
            # non-blocking connect: over loopback it is made when this returns.)
            try:
                sock, done = sockio.open_tcp(address, port)
            except OSError:
                return
            if len(self._spares) >= self.limit:  # the oldest gives way
                oldest = min(self._spares, key=lambda k: self._spares[k][1])
                self._spares.pop(oldest)[0].close()
            self._spares[key] = (sock, now, done)
            self.opened += 1
            if not self._sweeping:
                self._sweeping = True
                threading.Thread(target=self._sweep, name="gatekeeper-spares", daemon=True).start()

    def _sweep(self) -> None:
        """Close each spare keep seconds after it was opened; end when none is left."""
        with self._lock:
            while self._spares and not self._stopped:
                now = time.monotonic()
                for key, (sock, opened, _) in list(self._spares.items()):
                    if now - opened >= self.keep:
                        del self._spares[key]
                        sock.close()
                if self._spares:
                    first = min(held[1] for held in self._spares.values())
                    self._wake.wait(max(0.01, first + self.keep - now))
            self._sweeping = False

    def stop(self) -> None:
        """Close every spare; open none from now on."""
        with self._lock:
            self._stopped = True
            for sock, _, _ in self._spares.values():
                sock.close()
            self._spares.clear()
            self._wake.notify_all()

    def __len__(self) -> int:
        return len(self._spares)


def _unused(sock: socket.socket) -> bool:
    """Whether the server has neither ended the connection nor sent anything on it (a server
    that closes an idle connection may say why first), and the connection has not failed:
    nothing to report to poll(2) (a connect still under way reports nothing either)."""
    poller = select.poll()
    poller.register(sock.fileno(), _ANY_NEWS)
    return not poller.poll(0)


# Data or an end (POLLIN, POLLRDHUP); a reset or a failed connect (POLLERR, POLLHUP) is
# reported unasked.
_ANY_NEWS = select.POLLIN | select.POLLRDHUP | select.POLLPRI
