"""The host's own addresses: every address of every interface, read with getifaddrs(3).

A connection to any of them reaches the host's own services as surely as one to 127.0.0.1,
so the proxy counts them as `localhost`, not as the web or an internal network. The list is
read when the run starts, and each address judged later is also checked with a route lookup,
so that an address the host gains during the run (a new temporary IPv6 address, a VPN)
counts as well.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket

from gatekeeper.sandbox.net.classify import IPAddress


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [
    ("next", ctypes.POINTER(_Ifaddrs)),
    ("name", ctypes.c_char_p),
    ("flags", ctypes.c_uint),
    ("addr", ctypes.c_void_p),
    ("netmask", ctypes.c_void_p),
    ("ifu", ctypes.c_void_p),
    ("data", ctypes.c_void_p),
]


def host_addresses() -> frozenset[IPAddress]:
    """Every IPv4 and IPv6 address of this network namespace's interfaces.

    Raises OSError when the interfaces cannot be listed (the caller must not guess).
    """
    # The process's own C library: finding it by name would run `ldconfig -p` on every run.
    libc = ctypes.CDLL(None, use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"listing the host's addresses (getifaddrs): {os.strerror(err)}")
    found: set[IPAddress] = set()
    try:
        node = head
        while node:
            item = node.contents
            if item.addr:
                family = ctypes.c_ushort.from_address(item.addr).value
                if family == socket.AF_INET:  # sockaddr_in: family, port, address
                    found.add(ipaddress.IPv4Address(ctypes.string_at(item.addr + 4, 4)))
                elif family == socket.AF_INET6:  # sockaddr_in6: family, port, flowinfo, address
                    found.add(ipaddress.IPv6Address(ctypes.string_at(item.addr + 8, 16)))
            node = item.next
    finally:
        libc.freeifaddrs(head)
    return frozenset(found)


def routes_to_self(ip: IPAddress) -> bool:
    """True when the kernel would deliver a packet for ip to this host itself.

    A UDP socket "connected" to ip (a route lookup: nothing is sent) gets ip itself as its
    source address exactly when ip is one of the host's own addresses.
    """
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((str(ip), 9))
            source = str(probe.getsockname()[0]).split("%", 1)[0]
        return ipaddress.ip_address(source) == ip
    except (OSError, ValueError):
        return False


class HostAddresses:
    """`ip in HostAddresses(...)`: ip is one of this host's own addresses (see the module)."""

    def __init__(self, known: frozenset[IPAddress]) -> None:
        self.known = known

    def __contains__(self, ip: object) -> bool:
        if not isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address):
            return False
        return ip in self.known or routes_to_self(ip)
