"""One decision per attempt: judge the name, ask if needed, resolve once, judge each address."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

from gatekeeper.policy.model import Decision
from gatekeeper.sandbox.net.asking import Asker
from gatekeeper.sandbox.net.classify import (
    Category,
    IPAddress,
    Rules,
    Verdict,
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
            names = await asyncio.wait_for(
                loop.run_in_executor(None, self.resolver, host, port), self.resolve_timeout
            )
        except (TimeoutError, OSError) as exc:
            raise ResolveError(f"could not resolve {host}: {exc or 'timed out'}") from None
        addresses = [a for a in (ip_literal(n) for n in names) if a is not None]
        if not addresses:
            raise ResolveError(f"{host} resolved to no address")
        return addresses

    async def judge(self, host: str, port: int) -> Judgement:
        """Decide on host:port; raise ResolveError when a name that must be resolved does not.

        A lookup alone can carry data out (the name is the message), so a name is resolved
        only when the policy allows it by name, or when internal services are allowed
        outright and only the address can tell. A name that could be an internal service
        under `internal_services: ask` is asked about first, by name, and resolved only once
        approved; refused or pending, it is never looked up.
        """
        by_name = self.rules.for_name(host, port)
        literal = ip_literal(host)
        if literal is not None:
            return await self._by_address(host, port, [literal], None)
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
            addresses = await self._resolve(host, port)
        except ResolveError as exc:
            raise ResolveError(str(exc), by_name.category.value) from None
        return await self._by_address(host, port, addresses, by_name)

    async def _by_address(
        self, host: str, port: int, addresses: list[IPAddress], by_name: Verdict | None
    ) -> Judgement:
        verdicts = [(a, self.rules.for_address(host, port, a, by_name)) for a in addresses]
        allowed = [a for a, v in verdicts if v.decision is Decision.allow]
        if allowed:
            return Judgement(next(v for a, v in verdicts if a == allowed[0]), allowed)
        asking = [(a, v) for a, v in verdicts if v.decision is Decision.ask]
        if asking:
            first = asking[0][1]
            if first.category is Category.internal_services and host in self.approved_internal:
                why = f"{first.reason}; {host} approved at the prompt"
                settled = dataclasses.replace(first, decision=Decision.allow, reason=why)
            else:
                settled = await self._settle(host, first)
            return Judgement(settled, [a for a, _ in asking] if settled.allowed else [])
        return Judgement(verdicts[0][1], [])
