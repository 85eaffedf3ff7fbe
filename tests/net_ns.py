"""Network namespaces for the network tests: nothing they do can leave this machine.

`IsolatedNet` makes two namespaces joined by a veth pair and nothing else (no default route, no
uplink): `outer`, which the test thread enters for the duration of a test (so the proxy thread
and bwrap it starts inherit it), and `remote`, a test host at 192.88.99.2 / 10.77.0.2 /
2620:4f:8000::2. A socket keeps the namespace it was created in, so servers are created inside
`remote` and then served from ordinary threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
# Global addresses, so the proxy takes `remote` for the public internet (a documentation range
# is not: nothing on the internet answers there). Nothing reaches their real holders: neither
# namespace has a route off this machine.
OUTER_V4, REMOTE_V4 = "192.88.99.1", "192.88.99.2"
OUTER_PRIVATE, REMOTE_PRIVATE = "10.77.0.1", "10.77.0.2"
OUTER_V6, REMOTE_V6 = "2620:4f:8000::1", "2620:4f:8000::2"
assert all(ipaddress.ip_address(a).is_global for a in (REMOTE_V4, REMOTE_V6)), (
    "this Python no longer takes the test's public addresses for global: pick others"
)

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and os.path.isdir("/proc/self/ns")


class IsolatedNet:
    """Two namespaces, `outer` and `remote`, with only a veth pair between them."""

    def __init__(self, tag: str) -> None:
        self.outer = f"gkt-{tag}-o"
        self.remote = f"gkt-{tag}-r"

    def create(self) -> None:
        """Make both namespaces; raise RuntimeError with ip's message when it cannot."""
        self.delete()
        _ip("netns", "add", self.outer)
        _ip("netns", "add", self.remote)
        veth_o, veth_r = f"{self.outer[:11]}v", f"{self.remote[:11]}v"
        _ip(
            "-n",
            self.outer,
            "link",
            "add",
            veth_o,
            "type",
            "veth",
            "peer",
            "name",
            veth_r,
            "netns",
            self.remote,
        )
        for ns, dev, v4, private, v6 in (
            (self.outer, veth_o, OUTER_V4, OUTER_PRIVATE, OUTER_V6),
            (self.remote, veth_r, REMOTE_V4, REMOTE_PRIVATE, REMOTE_V6),
        ):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{v4}/24", "dev", dev)
            _ip("-n", ns, "addr", "add", f"{private}/24", "dev", dev)
            _ip("-n", ns, "-6", "addr", "add", f"{v6}/64", "dev", dev, "nodad")
            _ip("-n", ns, "link", "set", dev, "up")

    def delete(self) -> None:
        for ns in (self.outer, self.remote):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)

    @contextlib.contextmanager
    def inside(self, which: str = "outer") -> Iterator[None]:
        """Run the block with this thread in the named namespace, then return to the old one."""
        name = self.outer if which == "outer" else self.remote
        with open("/proc/thread-self/ns/net") as old, open(f"/run/netns/{name}") as new:
            _setns(new.fileno())
            try:
                yield
            finally:
                _setns(old.fileno())

    def assert_inside(self, which: str = "outer") -> None:
        """Fail unless this thread is in the named namespace (a guard before starting a proxy)."""
        name = self.outer if which == "outer" else self.remote
        here = os.stat("/proc/thread-self/ns/net").st_ino
        if here != os.stat(f"/run/netns/{name}").st_ino:
            raise AssertionError(f"this thread is not in the isolated namespace {name}")

    def routes(self) -> str:
        """The outer namespace's routing table (for asserting there is no way off the machine)."""
        proc = subprocess.run(
            ["ip", "-n", self.outer, "route", "show", "table", "all"],
            capture_output=True,
            text=True,
            check=True,
        )
        return proc.stdout
