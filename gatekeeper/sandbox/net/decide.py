"""One decision per attempt: judge the name, ask if needed, resolve once, judge each address."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass

from gatekeeper.policy.model import Decision
from gatekeeper.sandbox.net.asking import Asker
from gatekeeper.sandbox.net.classify import (
    Category,
    IPAddress,
    Rules,
    Verdict,
    embedded_ipv4,
    ip_literal,
    is_loopback_name,
)

_LOOPBACK_ADDRESSES = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))

# Blocking, run off the event loop: host and port to addresses; raises OSError when it cannot.
Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """getaddrinfo, outside the sandbox: every distinct address for host, in the order given."""
    found: list[str] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = str(sockaddr[0])
        if address not in found:
            found.append(address)
    return found


def unscoped(ip: IPAddress) -> IPAddress:
    """ip without an IPv6 zone index (`%eth0`): the address is judged, and reached, as it is
    without one (an address compares unequal to itself with a zone, so `[HOST-ADDRESS%1]`
    would not be the host's own, and for any but a link-local address the kernel ignores the
    zone anyway)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return ipaddress.IPv6Address(int(ip))
    return ip


def _addresses(host: str, names: list[str]) -> list[IPAddress]:
    addresses = [unscoped(a) for a in (ip_literal(n) for n in names) if a is not None]
    if not addresses:
        raise ResolveError(f"{host} resolved to no address")
    return addresses


class ResolveError(Exception):
    """The name did not resolve (or resolved to nothing usable); category is the name's."""

    def __init__(self, message: str, category: str | None = None) -> None:
        super().__init__(message)
        self.category = category


@dataclass(frozen=True)
class Judgement:
    """The final word on one attempt: the verdict that decided it and the addresses to try."""

    verdict: Verdict
    addresses: list[IPAddress]

    @property
    def allowed(self) -> bool:
        return self.verdict.decision is Decision.allow and bool(self.addresses)


class Decider:
    """Rules plus the resolver and the asker; the only code that looks names up."""

    def __init__(
        self, rules: Rules, asker: Asker, resolver: Resolver, *, resolve_timeout: float = 10.0
    ) -> None:
        self.rules = rules
        self.asker = asker
        self.resolver = resolver
        self.resolve_timeout = resolve_timeout
        # Names approved, by name, as internal services (internal_services: ask).
        self.approved_internal: set[str] = set()
        # judge_now's allows of loopback addresses and names (no lookup, no prompt).
        self._loopback_allowed: dict[tuple[str, int], Judgement] = {}
        # Addresses judge_now looked up for a name it left to judge (none allowed outright).
        self._looked_up: dict[tuple[str, int], list[IPAddress]] = {}
        # Lookups made for threads that serve a connection themselves (lane.py): on threads
        # of their own, so that a resolver that hangs costs the wait, not the thread; the
        # session's own (close), so that lookups a run left hanging never hold up the next.
        self._lookups = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gatekeeper-resolve")

    def close(self) -> None:
        """No more lookups: those queued are dropped, those under way left to end alone."""
        self._lookups.shutdown(wait=False, cancel_futures=True)

    async def _settle(self, host: str, verdict: Verdict) -> Verdict:
        """An `ask` verdict becomes allow or deny (prompting off the loop); others pass through."""
        if verdict.decision is not Decision.ask:
            return verdict
        loop = asyncio.get_running_loop()
        yes = await loop.run_in_executor(None, self.asker.ask, host, verdict)
        decision = Decision.allow if yes else Decision.deny
        why = verdict.reason + ("; approved at the prompt" if yes else "; not approved")
        return dataclasses.replace(verdict, decision=decision, reason=why)

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        if is_loopback_name(host):  # RFC 6761: never asked of a resolver
            return list(_LOOPBACK_ADDRESSES)
        loop = asyncio.get_running_loop()
        try:
            # (asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancel that
            # comes as the lookup ends, and the handler would go on past the session's stop)
            async with asyncio.timeout(self.resolve_timeout):
                names = await loop.run_in_executor(None, self.resolver, host, port)
        except (TimeoutError, OSError) as exc:
            raise ResolveError(f"could not resolve {host}: {exc or 'timed out'}") from None
        return _addresses(host, names)

    def _resolve_now(self, host: str, port: int) -> list[IPAddress]:
        """_resolve on the calling thread, which waits at most resolve_timeout for it."""
        if is_loopback_name(host):
            return list(_LOOPBACK_ADDRESSES)
        try:
            lookup = self._lookups.submit(self.resolver, host, port)
        except RuntimeError:  # closed: the session is over
            raise ResolveError(f"could not resolve {host}: the run has ended") from None
        try:
            names = lookup.result(self.resolve_timeout)
        except CancelledError:  # dropped by close()
            raise ResolveError(f"could not resolve {host}: the run has ended") from None
        except (TimeoutError, OSError) as exc:
            lookup.cancel()  # still queued behind hung lookups: never made
            raise ResolveError(f"could not resolve {host}: {exc or 'timed out'}") from None
        return _addresses(host, names)

    async def judge(self, host: str, port: int) -> Judgement:
        """Decide on host:port; raise ResolveError when a name that must be resolved does not.

        A lookup alone can carry data out (the name is the message), so a name is resolved
        only when the policy allows it by name, or when internal services are allowed
        outright and only the address can tell. A name that could be an internal service
        under `internal_services: ask` is asked about first, by name, and resolved only once
        approved; refused or pending, it is never looked up.
        """
        literal = ip_literal(host)
        if literal is not None:
            return await self._by_address(host, port, [unscoped(literal)], None)
        by_name = self.rules.for_name(host, port)
        if by_name.decision is not Decision.allow:
            may_be_internal = self.rules.address_may_matter(by_name)
            if may_be_internal and self.rules.internal_decision() is Decision.allow:
                pass  # only the address can tell (see the docstring)
            elif may_be_internal and by_name.decision is Decision.deny:
                maybe = Verdict(
                    Decision.ask,
                    Category.internal_services,
                    f"{host} may be an internal service (network.internal_services: ask); "
                    f"it is looked up only once approved",
                    by_name.grant_hint,
                )
                if not (await self._settle(host, maybe)).allowed:
                    why = f"{by_name.reason}; not looked up (not approved as an internal service)"
                    return Judgement(dataclasses.replace(by_name, reason=why), [])
                self.approved_internal.add(host)  # its internal addresses are not asked again
            else:
                by_name = await self._settle(host, by_name)
                if not by_name.allowed:
                    return Judgement(by_name, [])
        try:
            addresses = self._looked_up.pop((host, port), None) or await self._resolve(host, port)
        except ResolveError as exc:
            raise ResolveError(str(exc), by_name.category.value) from None
        return await self._by_address(host, port, addresses, by_name)

    def judge_now(self, host: str, port: int) -> Judgement | None:
        """judge's answer when it is an allow that needs no prompt, else None (judge, on the
        event loop, then decides, records and asks). A name is resolved on the calling
        thread, and only when the policy allows it by name; raise ResolveError."""
        known = self._loopback_allowed.get((host, port))
        if known is not None:
            return known
        literal = ip_literal(host)
        by_name: Verdict | None = None
        if literal is not None:
            addresses = [unscoped(literal)]
        else:
            by_name = self.rules.for_name(host, port)
            if by_name.decision is not Decision.allow:
                return None
            try:
                addresses = self._resolve_now(host, port)
            except ResolveError as exc:
                raise ResolveError(str(exc), by_name.category.value) from None
        judgement = self._by_address_now(host, port, addresses, by_name)[1]
        if judgement is None and by_name is not None and len(self._looked_up) < 1024:
            self._looked_up[(host, port)] = addresses  # judge takes them: one lookup
        if judgement is not None and all(a.is_loopback for a in addresses):
            # Loopback is localhost whatever the host's addresses do during the run, and the
            # rules do not change: the same answer (any other address may become the host's
            # own, and localhost, at any time).
            if len(self._loopback_allowed) < 1024:
                self._loopback_allowed[(host, port)] = judgement
        return judgement

    def _by_address_now(
        self, host: str, port: int, addresses: list[IPAddress], by_name: Verdict | None
    ) -> tuple[list[tuple[IPAddress, Verdict]], Judgement | None]:
        """Each address's verdict, and the judgement when one of them is allowed."""
        verdicts = [(a, self.rules.for_address(host, port, a, by_name)) for a in addresses]
        allowed = [a for a, v in verdicts if v.decision is Decision.allow]
        if allowed:
            first = next(v for a, v in verdicts if a == allowed[0])
            return verdicts, Judgement(first, [self._reached(a) for a in allowed])
        return verdicts, None

    def _reached(self, ip: IPAddress) -> IPAddress:
        """Where a connection to ip goes: an IPv6 address that carries an IPv4 one judged as
        this host's (loopback, or an address of its own: 6to4, NAT64, SIIT, compatible) is
        reached at that IPv4 address, which its verdict is about; sent as IPv6, it would go
        to whatever the host routes that prefix to."""
        inner = embedded_ipv4(ip)
        if inner is not None and self.rules.address_category(inner) is Category.localhost:
            return inner
        return ip

    async def _by_address(
        self, host: str, port: int, addresses: list[IPAddress], by_name: Verdict | None
    ) -> Judgement:
        verdicts, allowed = self._by_address_now(host, port, addresses, by_name)
        if allowed is not None:
            return allowed
        asking = [(a, v) for a, v in verdicts if v.decision is Decision.ask]
        if asking:
            first = asking[0][1]
            if first.category is Category.internal_services and host in self.approved_internal:
                why = f"{first.reason}; {host} approved at the prompt"
                settled = dataclasses.replace(first, decision=Decision.allow, reason=why)
            else:
                settled = await self._settle(host, first)
            return Judgement(
                settled, [self._reached(a) for a, _ in asking] if settled.allowed else []
            )
        return Judgement(verdicts[0][1], [])
