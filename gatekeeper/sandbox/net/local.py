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
import struct

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


# Netlink (rtnetlink(7)): a route lookup, as `ip route get` asks it, and what it answers.
_RTM_NEWROUTE, _RTM_GETROUTE, _NLMSG_ERROR, _NLM_F_REQUEST = 24, 26, 2, 1
_RTA_DST, _RTN_LOCAL = 1, 2
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope,
# type, flags
_RTATTR = struct.Struct("=HH")  # length, type


def _route_type(ip: IPAddress) -> int | None:
    """The type of the route the kernel takes to ip (RTN_LOCAL: delivered to this host), or
    None when it cannot be asked (or has no route)."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    address = ip.packed
    attribute = _RTATTR.pack(_RTATTR.size + len(address), _RTA_DST) + address
    body = _RTMSG.pack(family, 8 * len(address), 0, 0, 0, 0, 0, 0, 0) + attribute
    request = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), _RTM_GETROUTE, _NLM_F_REQUEST, 1, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as nl:
            nl.settimeout(1.0)
            nl.send(request + body)
            answer = nl.recv(65536)
    except OSError:
        return None
    if len(answer) < _NLMSGHDR.size + _RTMSG.size:
        return None
    _, kind, _, _, _ = _NLMSGHDR.unpack_from(answer)
    if kind != _RTM_NEWROUTE:  # (an error: no route at all)
        return None
    return _RTMSG.unpack_from(answer, _NLMSGHDR.size)[7]


def routes_to_self(ip: IPAddress) -> bool:
    """True when the kernel would deliver a packet for ip to this host itself.

    The kernel's route to ip is of the local type: an address of an interface, or one of a
    range the host takes as its own with a `local` route (`ip route add local 203.0.113.0/24
    dev lo`: no interface holds such an address, yet every service listening on a wildcard
    address answers it). Where the route cannot be asked, a UDP socket "connected" to ip (a
    route lookup: nothing is sent) gets ip itself as its source address when ip is one of
    the host's interface addresses.
    """
    kind = _route_type(ip)
    if kind is not None:
        return kind == _RTN_LOCAL
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
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
            # A zone index (`%1`) makes an address unequal to itself without one: the host's
            # own address with a zone is still its own (for a link-local one, on some link).
            ip = ipaddress.IPv6Address(int(ip))
        return ip in self.known or routes_to_self(ip)
