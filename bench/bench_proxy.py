"""Benchmark the network boundary. Prints ratios against direct baselines measured in one run.

    python bench/bench_proxy.py [--size-mb 100] [--fetches 21] [--repeat 5] [--requests 300]

1. Time to fetch a SIZE MB file from a loopback HTTP server with curl: from inside the
   sandbox through the proxy (plain forwarding, a CONNECT tunnel, and the bridged loopback
   port) against a direct fetch outside it. Target: at most 1.1 times direct.
2. Small requests per second through the proxy from inside the sandbox against direct,
   one connection per request, sequential and with 8 clients. Target: at least 0.7 times
   the direct rate.

Each figure comes with the proxy's own CPU time (this process's, per fetch or per request):
on a machine shared with other work the ratios move with its load, the CPU time far less.

Beside them, the floors: the same fetches and requests through the least a relay can be (a
port forward outside the sandbox, in a process of its own, blocking calls on threads made
at start, no parsing, no policy, no log), written in Python as the proxy is, and the same
relay compiled from C (floor_relay.c, when a C compiler is installed). Any relay pays for
the second loopback connection; the compiled floor shows that cost alone, the Python floor
adds an interpreter's own cost per call, and how far the proxy sits above that is what its
own work (parsing, judging, recording) costs.

Baseline and measured variants run in turn in each round; medians are compared.

Everything stays on this machine: when run as root the whole benchmark first moves into a
network namespace of its own (only loopback), and the proxy's resolver knows no names.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import PYTHON, interpreter_binds, verdict  # noqa: E402

from gatekeeper.policy.model import Policy  # noqa: E402
from gatekeeper.sandbox.net import NetSetup, NetworkSession  # noqa: E402
from gatekeeper.sandbox.net.relay import BULK  # noqa: E402

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
BWRAP = [
    "bwrap",
    "--unshare-all",
    "--unshare-user",
    "--uid",
    "0",
    "--gid",
    "0",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "--tmpfs",
    "/run",
    "--clearenv",
    "--setenv",
    "PATH",
    "/usr/bin:/bin",
]
CLIENT = textwrap.dedent("""
    import http.client, sys, threading, time
    host, port, path, count, workers, proxied = sys.argv[1:7]
    count, workers = int(count), int(workers)
    def worker(n):
        for _ in range(n):
            if proxied == "1":
                conn = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
                conn.request("GET", f"http://{host}:{port}{path}")
            else:
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                conn.request("GET", path, headers={"Connection": "close"})
            body = conn.getresponse().read()
            assert body == b"ok\\n", body
            conn.close()
    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(count // workers,)) for _ in range(workers)]
    for t in threads: t.start()
    for t in threads: t.join()
    print((count // workers) * workers / (time.perf_counter() - start))
""")


def isolate() -> str:
    """Move this process into a fresh network namespace with only loopback, when allowed."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return "loopback of the current namespace (not root: no private namespace)"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return "loopback of the current namespace (unshare failed)"
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    return "a private network namespace with only loopback"


class LoopbackProcess:
    """A listener on a loopback port, served by a process of its own (which dies with this
    one): in this process its threads would take the interpreter lock from the proxy's
    thread, a cost no real run pays."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.pid = os.fork()
        if self.pid == 0:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                self._serve_all()
            finally:
                os._exit(0)
        self.sock.close()

    def _serve_all(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


class Server(LoopbackProcess):
    """HTTP/1.1 on loopback, as a real server runs: /big is the file (sent with sendfile),
    anything else `ok`."""

    def __init__(self, big: Path) -> None:
        self.big = big
        self.size = big.stat().st_size
        super().__init__()

    def _serve_all(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            if head.split(b" ", 2)[1] == b"/big":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.size)
                with open(self.big, "rb") as fh:
                    conn.sendfile(fh)
            else:
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
                )


class Relay(LoopbackProcess):
    """The floor: a port forward to the server's port. Threads made at start each accept a
    connection and serve it to its end, moving whatever either side sends with blocking calls
    (poll, recv_into, sendall): nothing is parsed, judged or logged, no thread or task is made
    per connection."""

    THREADS = 16  # more than the clients at once

    def __init__(self, target: int) -> None:
        self.target = target
        super().__init__()

    def _serve_all(self) -> None:
        for _ in range(self.THREADS):
            threading.Thread(target=self._serve, daemon=True).start()
        signal.pause()

    def _serve(self) -> None:
        buffer = bytearray(BULK)  # as large as the proxy's bulk buffer
        while True:
            client, _ = self.sock.accept()
            try:
                with client, socket.create_connection(("127.0.0.1", self.target)) as upstream:
                    for sock in (client, upstream):
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    _join(client, upstream, buffer)
            except OSError:
                pass


def _join(one: socket.socket, other: socket.socket, buffer: bytearray) -> None:
    """Relay both ways until both sides have ended."""
    peer = {one.fileno(): (one, other), other.fileno(): (other, one)}
    poller = select.poll()
    for fd in peer:
        poller.register(fd, select.POLLIN)
    view = memoryview(buffer)
    while peer:
        for fd, _ in poller.poll():
            src, dst = peer[fd]
            n = src.recv_into(buffer)
            if n:
                dst.sendall(view[:n])
            else:
                dst.shutdown(socket.SHUT_WR)
                poller.unregister(fd)
                del peer[fd]


class CompiledRelay:
    """The floor relay compiled from floor_relay.c, in a process of its own, or nothing when
    no C compiler is installed (then `port` is None)."""

    def __init__(self, target: int, work: Path) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            return
        binary = work / "floor_relay"
        source = Path(__file__).with_name("floor_relay.c")
        subprocess.run([compiler, "-O2", "-pthread", "-o", str(binary), str(source)], check=True)
        with socket.socket() as probe:  # a free port (nothing else binds in this namespace)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.proc = subprocess.Popen([str(binary), str(port), str(target)])
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    self.port = port
                    return
            threading.Event().wait(0.02)
        raise SystemExit("the compiled floor relay did not start listening")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def sandboxed(setup: NetSetup, argv: list[str]) -> list[str]:
    args = [*BWRAP, *interpreter_binds()]
    for host, inside in setup.binds:
        args += ["--ro-bind", str(host), inside]
    for name, value in setup.env.items():
        args += ["--setenv", name, value]
    return [*args, "--", *setup.wrap(argv, PYTHON)]


def cpu_seconds() -> float:
    """User and system time of this process so far: the proxy's threads (and little else)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def curl_time(argv: list[str], expect: int) -> float:
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    if int(out[1]) != expect:
        raise SystemExit(f"fetched {out[1]} bytes, expected {expect}: {argv}")
    return float(out[0])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=100)
    # A fetch of 100 MB over loopback takes some 60 ms, so a few milliseconds of a busy machine
    # are a tenth of it: its medians take more rounds than the small requests' runs of seconds.
    parser.add_argument("--fetches", type=int, default=21)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    for tool in ("bwrap", "curl"):
        if not shutil.which(tool):
            print(f"bench_proxy: {tool} is not installed", file=sys.stderr)
            return 2
    where = isolate()
    work = Path(tempfile.mkdtemp(prefix="gk-bench-net-"))
    try:
        big = work / "big.bin"
        with open(big, "wb") as fh:
            for _ in range(args.size_mb):
                fh.write(os.urandom(1 << 20))
        server = Server(big)
        try:
            relay = Relay(server.port)
            compiled = CompiledRelay(server.port, work)
            try:
                floors = {"Python": relay.port}
                if compiled.port is None:
                    print("bench_proxy: no C compiler: the compiled floor is not measured")
                else:
                    floors["C"] = compiled.port
                return measure(args, server, floors, work, where)
            finally:
                compiled.stop()
                relay.stop()
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(
    args: argparse.Namespace, server: Server, floors: dict[str, int], work: Path, where: str
) -> int:
    """Start a proxy session for the server and report on it."""
    port, size = server.port, server.size
    policy = Policy.model_validate({"network": {"localhost": [port]}})
    session = NetworkSession(
        policy,
        grants=[],
        ask="never",
        run_dir=work / "run",
        env={},
        resolver=lambda host, p: [],
    )
    setup = session.start()
    try:
        return report(args, setup, session, port, floors, size, where)
    finally:
        session.stop()


def report(
    args: argparse.Namespace,
    setup: NetSetup,
    session: NetworkSession,
    port: int,
    floors: dict[str, int],
    size: int,
    where: str,
) -> int:
    url = f"http://localhost:{port}/big"
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{time_total} %{size_download}"]
    rows = [
        ("direct fetch outside the sandbox", [*curl, "--noproxy", "*", url]),
        ("inside, through the proxy (plain HTTP)", sandboxed(setup, [*curl, url])),
        ("inside, through the proxy (CONNECT)", sandboxed(setup, [*curl, "--proxytunnel", url])),
        ("inside, via the bridged loopback port", sandboxed(setup, [*curl, "--noproxy", "*", url])),
        *(
            (f"floor: the minimal relay in {language}",
             [*curl, "--noproxy", "*", f"http://127.0.0.1:{floor_port}/big"])
            for language, floor_port in floors.items()
        ),
    ]  # fmt: skip
    # Rounds interleave the variants, so background load hits them alike; medians are shown.
    # The proxy runs in this process: its CPU time per fetch or request depends far less on
    # the machine's other load than the ratios do.
    times: list[list[float]] = [[] for _ in rows]
    cpu: list[list[float]] = [[] for _ in rows]
    for _ in range(args.fetches):
        for i, (_, argv) in enumerate(rows):
            before = cpu_seconds()
            times[i].append(curl_time(argv, size))
            cpu[i].append(cpu_seconds() - before)
    medians = [statistics.median(t) for t in times]
    print(f"bench_proxy: {args.size_mb} MB over loopback, {where}; median of {args.fetches} rounds")
    for (label, _), seconds, used in zip(rows, medians, cpu, strict=True):
        line = f"  {label:40s} {seconds:7.3f} s   {seconds / medians[0]:4.2f}x direct"
        if "proxy" in label or "bridged" in label:  # the floor's relay is a process of its own
            line += f"   proxy CPU {statistics.median(used) * 1000:5.1f} ms"
        print(line)
    ratio_plain = medians[1] / medians[0]
    methods = {r.method for r in session.recorder.entries}
    assert {"GET", "CONNECT", None} <= methods, methods  # each path really was taken

    print(f"bench_proxy: small requests, {args.requests} per run, one connection each; "
          f"median of {args.repeat} rounds")  # fmt: skip
    ratios = []
    for workers in (1, 8):
        common = ["localhost", str(port), "/small", str(args.requests), str(workers)]
        direct = [PYTHON, "-I", "-c", CLIENT, *common, "0"]
        inside = sandboxed(setup, [PYTHON, "-I", "-c", CLIENT, *common, "1"])
        variants = [direct, inside] + [
            [PYTHON, "-I", "-c", CLIENT, "127.0.0.1", str(floor_port), *common[2:], "0"]
            for floor_port in floors.values()
        ]
        rates: list[list[float]] = [[] for _ in variants]
        used: list[float] = []
        for _ in range(args.repeat):
            for i, argv in enumerate(variants):
                before = cpu_seconds()
                out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
                rates[i].append(float(out))
                if i == 1:
                    used.append(cpu_seconds() - before)
        direct_rps, proxy_rps, *floor_rps = (statistics.median(r) for r in rates)
        ratios.append(proxy_rps / direct_rps)
        per_request = statistics.median(used) / ((args.requests // workers) * workers) * 1e6
        print(
            f"  {workers} client(s): direct {direct_rps:8.0f} req/s   through the proxy "
            f"{proxy_rps:8.0f} req/s   ratio {proxy_rps / direct_rps:4.2f}   "
            f"proxy CPU {per_request:4.0f} us/request"
        )
        for language, rate in zip(floors, floor_rps, strict=True):
            print(
                f"      floor: the minimal relay in {language:6s} {rate:8.0f} req/s, "
                f"ratio {rate / direct_rps:4.2f}"
            )
    ok = verdict("bulk fetch through the proxy, to direct", ratio_plain, 1.1)
    ok &= verdict("small requests through the proxy, rate to direct (1 client)", ratios[0], 0.7,
                  higher_is_better=True)  # fmt: skip
    ok &= verdict("small requests through the proxy, rate to direct (8 clients)", ratios[1], 0.7,
                  higher_is_better=True)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
