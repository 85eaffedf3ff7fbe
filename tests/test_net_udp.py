"""Datagrams and TCP Fast Open to outside addresses are refused and recorded, like connect().

The sandbox has no route but loopback, so nothing leaves it; the supervisor is notified of
`sendto` with an address and of `sendmsg`/`sendmmsg` with MSG_FASTOPEN, and the receipt names
each outside attempt with the call that made it. A UDP `sendmsg` with a name and no flag is
refused by the kernel but not recorded (docs/security-network.md says why). The targets are
documentation addresses (192.0.2.1, 2001:db8::1), reachable from nowhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from net_ns import IsolatedNet
from net_sandbox import needs_netns

from conftest import gk, make_repo
from helpers import run_json

pytest_plugins = ["net_fixtures"]
pytestmark = [needs_netns, pytest.mark.sandbox]

SENDS = r"""
import ctypes, json, socket

FASTOPEN = getattr(socket, "MSG_FASTOPEN", 0x20000000)
results = {}


def attempt(name, fn):
    try:
        fn()
        results[name] = "sent"
    except OSError as e:
        results[name] = e.errno


def udp_sendto():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"q", ("192.0.2.1", 53))


def udp6_sendto():
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.sendto(b"q", ("2001:db8::1", 5353))


def fastopen_sendto():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.sendto(b"GET / HTTP/1.0\r\n\r\n", FASTOPEN, ("192.0.2.1", 443))


def fastopen_sendmsg():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.sendmsg([b"hello"], [], FASTOPEN, ("192.0.2.1", 8443))


def fastopen_sendmmsg():
    # sendmmsg(2) has no Python wrapper: one mmsghdr naming 192.0.2.1:9443, MSG_FASTOPEN.
    libc = ctypes.CDLL(None, use_errno=True)

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    class MsgHdr(ctypes.Structure):
        _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                    ("iov", ctypes.POINTER(IoVec)), ("iovlen", ctypes.c_size_t),
                    ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                    ("flags", ctypes.c_int)]

    class MMsgHdr(ctypes.Structure):
        _fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]

    addr = ctypes.create_string_buffer(
        (2).to_bytes(2, "little") + (9443).to_bytes(2, "big") + bytes([192, 0, 2, 1]) + bytes(8))
    data = ctypes.create_string_buffer(b"hello")
    iov = IoVec(ctypes.cast(data, ctypes.c_void_p), 5)
    msg = MMsgHdr(MsgHdr(ctypes.cast(addr, ctypes.c_void_p), 16, ctypes.pointer(iov), 1,
                         None, 0, 0), 0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if libc.sendmmsg(s.fileno(), ctypes.byref(msg), 1, FASTOPEN) < 0:
            err = ctypes.get_errno()
            raise OSError(err, "sendmmsg")


def udp_sendmsg():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendmsg([b"q"], [], 0, ("192.0.2.1", 53))


def loopback():
    # Ordinary datagrams inside the sandbox: unconnected sendto, sendmsg with a name, and
    # send/sendmsg on a connected socket all arrive.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
        a.bind(("127.0.0.1", 0))
        a.settimeout(5)
        b.sendto(b"one", a.getsockname())
        b.sendmsg([b"two"], [], 0, a.getsockname())
        b.sendto(b"three", ("0.0.0.0", a.getsockname()[1]))  # "this host": the sandbox's own
        b.connect(a.getsockname())
        b.send(b"four")
        b.sendmsg([b"five"])
        got = [a.recv(16) for _ in range(5)]
        assert got == [b"one", b"two", b"three", b"four", b"five"], got


for name, fn in [("udp_sendto", udp_sendto), ("udp6_sendto", udp6_sendto),
                 ("fastopen_sendto", fastopen_sendto), ("fastopen_sendmsg", fastopen_sendmsg),
                 ("fastopen_sendmmsg", fastopen_sendmmsg), ("udp_sendmsg", udp_sendmsg),
                 ("loopback", loopback)]:
    attempt(name, fn)
print("SENDS", json.dumps(results))
"""

ENETUNREACH = 101


def receipt(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


def test_datagrams_and_fast_open_to_outside_addresses_are_refused_and_recorded(
    tmp_path: Path, key: Path, outer: IsolatedNet
) -> None:
    repo = make_repo(tmp_path / "r", files={"sends.py": SENDS})
    outer.assert_inside()
    proc, data = run_json(repo, "python3", "sends.py")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith("SENDS "))
    results = json.loads(line.split(" ", 1)[1])
    assert results == {
        "udp_sendto": ENETUNREACH,
        "udp6_sendto": ENETUNREACH,
        "fastopen_sendto": ENETUNREACH,
        "fastopen_sendmsg": ENETUNREACH,
        "fastopen_sendmmsg": ENETUNREACH,
        "udp_sendmsg": ENETUNREACH,
        "loopback": "sent",
    }, results
    network = receipt(repo, data["commit"])["network"]
    seen = {
        (n["host"], n["port"], n["method"])
        for n in network
        if n["category"] == "direct" and n["decision"] == "deny"
    }
    assert seen == {
        ("192.0.2.1", 53, "sendto"),
        ("2001:db8::1", 5353, "sendto"),
        ("192.0.2.1", 443, "fastopen"),
        ("192.0.2.1", 8443, "fastopen"),
        ("192.0.2.1", 9443, "fastopen"),
    }, network
    assert not any(n["host"].startswith("127.") for n in network), network


UDP_ONLY = (
    "import socket\n"
    "try:\n"
    "    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'q', ('192.0.2.1', 123))\n"
    "except OSError as e:\n"
    "    print('CHECK', e.errno)\n"
)


def test_a_datagram_sent_by_a_check_is_recorded_too(
    tmp_path: Path, key: Path, outer: IsolatedNet
) -> None:
    repo = make_repo(tmp_path / "r", files={"udp.py": UDP_ONLY})
    outer.assert_inside()
    proc, data = run_json(repo, "true", extra=["--check", "python3 udp.py"])
    assert proc.returncode == 0, proc.stderr
    network = receipt(repo, data["commit"])["network"]
    assert [(n["host"], n["port"], n["category"], n["decision"], n["method"]) for n in network] == [
        ("192.0.2.1", 123, "direct", "deny", "sendto")
    ], network


WILD = (
    "import ctypes, socket\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "wild = ctypes.c_void_p(0xFFFFFFFFFFFFF000)  # a kernel-half address: unreadable\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "r1 = libc.connect(s.fileno(), wild, 16), ctypes.get_errno()\n"
    "r2 = libc.sendto(s.fileno(), b'q', 1, 0, wild, 16), ctypes.get_errno()\n"
    "print('WILD', r1, r2)\n"
)


def test_an_unreadable_address_is_the_kernels_efault_not_a_supervisor_error(
    tmp_path: Path, key: Path, outer: IsolatedNet
) -> None:
    repo = make_repo(tmp_path / "r", files={"wild.py": WILD})
    outer.assert_inside()
    proc, data = run_json(repo, "python3", "wild.py")
    assert proc.returncode == 0, proc.stderr
    assert "WILD (-1, 14) (-1, 14)" in proc.stderr, proc.stderr  # EFAULT from the kernel
    assert data["supervisor_failed"] is False, proc.stderr
    assert data["network"] == [], data["network"]
