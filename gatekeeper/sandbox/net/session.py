"""The network side of one run: start the proxy, tell the sandbox how to reach it, collect the log.

session = NetworkSession(policy, grants=["network=pkgs.example.org"], ask="never", run_dir=d)
setup = session.start()          # binds, env and wrap() for the bwrap command line
...run argv = setup.wrap(argv, python) under bwrap with setup.binds and setup.env...
requests, escalations = session.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.errors import SandboxError, UsageError
from gatekeeper.policy.model import Policy
from gatekeeper.receipt.models import Escalation, NetworkRequest
from gatekeeper.sandbox.net.asking import ASK_MODES, Asker
from gatekeeper.sandbox.net.classify import HostRule, Rules, parse_host_port
from gatekeeper.sandbox.net.decide import Decider, Resolver, system_resolver
from gatekeeper.sandbox.net.handoff import Handler, serve, unix_listener
from gatekeeper.sandbox.net.lane import MAX_CLIENTS, Lane
from gatekeeper.sandbox.net.local import HostAddresses, host_addresses
from gatekeeper.sandbox.net.proxy import Proxy, ProxyLimits
from gatekeeper.sandbox.net.record import Entry, Recorder

SANDBOX_DIR = "/run/gatekeeper"
PROXY_PORT = 3128
BRIDGE = Path(__file__).with_name("bridge.py")
WANTED_NOFILE = 16384  # the proxy holds up to six descriptors per tunnel


@dataclass
class NetSetup:
    """What the launcher adds to the sandbox: binds (host path -> sandbox path), env, argv."""

    binds: list[tuple[Path, str]]  # bind read-only: connecting to a socket works on a ro mount
    env: dict[str, str]
    bridge_args: list[str] = field(default_factory=list)

    def wrap(self, argv: list[str], python: str) -> list[str]:
        """argv behind the bridge, run by python (an interpreter visible inside the sandbox)."""
        return [python, "-I", "-S", f"{SANDBOX_DIR}/bridge.py", *self.bridge_args, "--", *argv]


def parse_grants(grants: list[str]) -> tuple[list[HostRule], list[str]]:
    """Network rules and their texts from `--grant` values (`network=HOST[:PORT]` or `HOST[:PORT]`).

    Grants of other kinds are skipped; raise UsageError for a malformed network grant.
    """
    rules: list[HostRule] = []
    texts: list[str] = []
    for grant in grants:
        kind, sep, value = grant.partition("=")
        if sep and kind != "network":
            continue
        value = value if sep else grant
        try:
            rules.append(parse_host_port(value))
        except ValueError as exc:
            raise UsageError(
                f"--grant network={value}: {exc}",
                hint="write --grant network=HOST[:PORT], e.g. network=api.example.com:443 "
                "or network=localhost:5432",
            ) from None
        texts.append(value.strip())
    return rules, texts


class _LoopThread:
    """The proxy's event loop, in its own daemon thread, serving a set of listening sockets."""

    def __init__(
        self, proxy: Proxy, lane: Lane,
        listeners: list[tuple[socket.socket, Handler, Callable[[socket.socket], bytes | None]]],
        bridge_ports: frozenset[int] = frozenset(),
    ) -> None:  # fmt: skip
        self.proxy = proxy
        self.lane = lane
        self.listeners = listeners
        self.bridge_ports = bridge_ports  # where the bridge listens inside the sandbox
        self.channel_ends: list[float] = []  # when each of the bridge's channels ended
        self.loop = asyncio.new_event_loop()
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gatekeeper-net")
        self.loop.set_default_executor(self.executor)
        self.ready = threading.Event()
        self.stopping: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, name="gatekeeper-proxy", daemon=True)

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(10):
            raise SandboxError("the network proxy did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    def _turned_away(self) -> None:
        """Record a connection the proxy closed unserved, being full (one entry, counted)."""
        most = self.proxy.limits.max_connections
        self.proxy.recorder.turn_away(
            f"more connections at once than the proxy serves ({most} on its event loop, "
            f"{MAX_CLIENTS} more on its lanes): closed unanswered"
        )

    async def _main(self) -> None:
        self.stopping = asyncio.Event()
        connections: set[asyncio.Task[None]] = set()
        limits = self.proxy.limits
        servers = [
            asyncio.ensure_future(
                serve(
                    sock,
                    handler,
                    connections,
                    max_connections=limits.max_connections,
                    first_bytes_timeout=limits.header_timeout,
                    channel_ends=self.channel_ends,
                    bridge_ports=self.bridge_ports,
                    lane=lane,
                    turned_away=self._turned_away,
                    handed_late=self.lane.handed_late,
                )
            )
            for sock, handler, lane in self.listeners
        ]
        self.ready.set()
        await self.stopping.wait()
        for task in servers:
            task.cancel()
        for sock, _, _ in self.listeners:
            sock.close()
        self.proxy.closing = True
        for tunnel in list(self.proxy.tunnels):
            tunnel.close()
        for task in list(connections):
            task.cancel()
        await asyncio.gather(*servers, *connections, return_exceptions=True)

    def stop(self) -> None:
        self.proxy.closing = True  # (the loop connects nothing more meanwhile)
        self.lane.stop()  # first: what the lanes serve ends, and its records are final
        if self.stopping is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(10)
        self.lane.settle_handed()  # what the loop never took of what the lanes gave back
        self.proxy.decider.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        if not self.thread.is_alive():
            self.loop.close()


class NetworkSession:
    """The proxy and loopback forwards for one run, and the log they keep."""

    def __init__(
        self,
        policy: Policy,
        *,
        grants: list[str],
        ask: str,
        run_dir: Path,
        project: Path | None = None,
        avoid: list[Path] | None = None,
        sources: dict[str, list[HostRule]] | None = None,
        resolver: Resolver | None = None,
        limits: ProxyLimits | None = None,
        env: Mapping[str, str] | None = None,
        tty_path: str = "/dev/tty",
        record_grants: bool = True,
    ) -> None:
        """Validate grants and ask mode (UsageError) and read the registry configuration.

        record_grants=False leaves the "granted" escalations of `--grant network=...` to a
        caller that records every kind of grant itself. project (the worktree) and the folders
        in avoid (the user's checkout, the git dir, the worktrees) are not read, and no package
        manager found in them is asked: files an agent can commit never widen the network
        policy, and nothing an agent wrote is ever run outside the sandbox.
        """
        if ask not in ASK_MODES:
            raise UsageError(f"--ask {ask}: expected one of {', '.join(ASK_MODES)}")
        self.policy = policy
        self.grant_rules, self.grant_texts = parse_grants(grants)
        self.net_dir = Path(run_dir) / "net"
        self.recorder = Recorder()
        self.asker = Asker(ask, self.recorder, tty_path=tty_path)
        # Where each registry came from, for a person reading how the run was set up. The
        # worktree's files are never read and its programs never asked (see registries.py).
        # sources: found already by the caller (a run looks them up once, for its checks too).
        shunned = [*(avoid or []), *([project] if project is not None else [])]
        if sources is None:
            from gatekeeper.sandbox.net.registries import registry_sources

            sources = registry_sources(policy.network.registries, env, shunned)
        self.registry_sources = sources
        registries: list[HostRule] = []
        for found in self.registry_sources.values():
            registries += [rule for rule in found if rule not in registries]
        try:
            local = host_addresses()
        except OSError as exc:
            raise SandboxError(str(exc)) from exc
        self.rules = Rules(
            policy.network,
            cli_grants=self.grant_rules,
            registries=registries,
            host_addresses=HostAddresses(local),
        )
        self.resolver = resolver or system_resolver
        self.limits = limits or ProxyLimits()
        self.proxy: Proxy | None = None
        self._thread: _LoopThread | None = None
        self._nofile: tuple[int, int] | None = None
        self._record_grants = record_grants

    def bridge_lost(self, sandbox_ended: float, margin: float = 2.0) -> float | None:
        """When the bridge inside the sandbox ended, if that was more than margin seconds
        before the sandbox did (killed mid-run: the agent had no network from then), else None.
        At a normal end the bridge dies with the sandbox, never before it."""
        thread = self._thread
        ends = list(thread.channel_ends) if thread is not None else []
        early = [t for t in ends if t < sandbox_ended - margin]
        return min(early) if early else None

    def registries_found(self) -> list[str]:
        """One line per source of package registries (`pip: host:80/443, ...`)."""
        from gatekeeper.sandbox.net.registries import describe

        return describe(self.registry_sources)

    @property
    def forwarded_ports(self) -> list[int]:
        """Host loopback ports bridged into the sandbox's own loopback at the same port."""
        return sorted(self.rules.bridged_ports)

    def start(self) -> NetSetup:
        """Start the proxy and loopback forwards; raise SandboxError if they cannot listen."""
        self.net_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.net_dir, 0o700)
        self._raise_nofile()
        decider = Decider(self.rules, self.asker, self.resolver)
        self.proxy = Proxy(decider, self.recorder, self.limits)
        lane = Lane(self.proxy)
        listeners: list[tuple[socket.socket, Handler, Callable[[socket.socket], bytes | None]]]
        listeners = []
        try:
            listeners.append(
                (unix_listener(self.net_dir / "proxy.sock"), self.proxy.handle, lane.serve)
            )
            for port in self.forwarded_ports:
                path = self.net_dir / f"localhost-{port}.sock"
                listeners.append(
                    (unix_listener(path), self.proxy.forwarder(port), lane.forwarder(port))
                )
            bridge = self.net_dir / "bridge.py"
            bridge.unlink(missing_ok=True)
            shutil.copyfile(BRIDGE, bridge)
            bridge.chmod(0o444)
        except OSError as exc:
            for sock, _, _ in listeners:
                sock.close()
            raise SandboxError(
                f"could not set up the network proxy in {self.net_dir}: {exc}"
            ) from exc
        bridge_ports = frozenset({self._proxy_port(), *self.forwarded_ports})
        self._thread = _LoopThread(self.proxy, lane, listeners, bridge_ports)
        self._thread.start()
        for text in self.grant_texts if self._record_grants else []:
            self.recorder.escalate(text, "granted")
        return NetSetup(
            binds=[(self.net_dir, SANDBOX_DIR)], env=self._env(), bridge_args=self._bridge_args()
        )

    def _proxy_port(self) -> int:
        port = PROXY_PORT
        while port in self.rules.bridged_ports:
            port += 1
        return port

    def _bridge_args(self) -> list[str]:
        args = [
            "--proxy-socket",
            f"{SANDBOX_DIR}/proxy.sock",
            "--listen",
            f"127.0.0.1:{self._proxy_port()}",
        ]
        for port in self.forwarded_ports:
            args += ["--forward", f"{port}={SANDBOX_DIR}/localhost-{port}.sock"]
        if self._nofile is not None:
            args += ["--nofile", str(self._nofile[0])]
        return args

    def _env(self) -> dict[str, str]:
        http = f"http://127.0.0.1:{self._proxy_port()}"
        socks = f"socks5h://127.0.0.1:{self._proxy_port()}"
        env: dict[str, str] = {}
        for name, value in (
            ("http_proxy", http),
            ("https_proxy", http),
            ("all_proxy", socks),
            ("no_proxy", ""),
        ):
            env[name] = env[name.upper()] = value
        # Tools that read their own settings rather than the standard variables.
        env.update(
            npm_config_proxy=http,
            npm_config_https_proxy=http,
            YARN_HTTP_PROXY=http,
            YARN_HTTPS_PROXY=http,
            CARGO_HTTP_PROXY=http,
            GATEKEEPER_PROXY=http,
        )
        return env

    def _raise_nofile(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            wanted = WANTED_NOFILE if hard == resource.RLIM_INFINITY else min(WANTED_NOFILE, hard)
            if soft != resource.RLIM_INFINITY and soft < wanted:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
                self._nofile = (soft, hard)

    def record_direct_attempt(
        self,
        host: str,
        port: int,
        pid: int | None,
        method: str | None = None,
        *,
        time: str | None = None,
        count: int = 1,
        last_time: str | None = None,
    ) -> None:
        """Log an attempt the supervisor saw bypassing the proxy (it failed: there is no route):
        count attempts at one destination, the first at time (when the supervisor saw it),
        the last at last_time.

        method names the call when it was not a connect(): sendto, sendmsg, fastopen.
        """
        what = f"a direct {method}" if method else "a direct connection"
        entry = Entry(host, port, "deny", "direct", method=method, pid=pid,
                      reason=f"{what} outside the proxy (no route)", count=max(1, count),
                      last_time=last_time if count > 1 else None)  # fmt: skip
        if time:
            entry.time = time
        self.recorder.add(entry)

    def count_unlisted_attempts(self, count: int, first: str | None, last: str | None) -> None:
        """Count direct attempts the supervisor's record only counted (past its listed ones),
        the first at first and the last at last, in the log's overflow entry."""
        self.recorder.count_overflow(count, first, last)

    def denied_summary(self) -> list[str]:
        """One line per refused or failed destination, for the run summary (bounded)."""
        return self.recorder.summary()

    def stop(self) -> tuple[list[NetworkRequest], list[Escalation]]:
        """Stop the proxy (closing open tunnels) and return the log; safe to call more than once."""
        self.asker.close()
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._nofile is not None:
            # Back to the limit it had, unless the launcher now holds more descriptors than
            # that allows (a mount plan's binds, open until the sandbox is closed).
            with contextlib.suppress(ValueError, OSError):
                if len(os.listdir("/proc/self/fd")) + 256 <= self._nofile[0]:
                    resource.setrlimit(resource.RLIMIT_NOFILE, self._nofile)
            self._nofile = None
        for path in self.net_dir.glob("*.sock"):
            path.unlink(missing_ok=True)
        return self.recorder.snapshot()
