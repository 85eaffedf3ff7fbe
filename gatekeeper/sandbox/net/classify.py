"""Which policy category a destination falls in, and what the policy decides for it.

A destination is judged twice: by its name before any lookup (so a denied name is never even
resolved), then by each address the proxy resolved it to (so a name cannot be rebound to a
loopback or internal address). Named grants override categories, except that a grant on a
public name never opens the host's loopback or an internal address it happens to resolve to.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Container
from dataclasses import dataclass
from enum import StrEnum

from gatekeeper.policy.model import Decision, Network

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Category(StrEnum):
    localhost = "localhost"
    package_registry = "package_registry"
    internal_services = "internal_services"
    arbitrary_web = "arbitrary_web"


# Where an address leads: the host itself, or a network that is not the public internet. Every
# address Python's ipaddress does not count as global is the latter too (documentation and
# benchmarking ranges, 192.0.2.0/24 or 198.18.0.0/15, say: never routed on the internet, so
# whatever answers there is on a network of its own, a machine's own LAN among them).
_LOOPBACK = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "0.0.0.0/8", "::1/128", "::/128")]
_INTERNAL = [
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",  # private (RFC 1918)
        "100.64.0.0/10",  # carrier-grade NAT
        "169.254.0.0/16",  # link-local, cloud metadata (169.254.169.254)
        "192.0.0.0/24",  # IETF protocol assignments (some metadata services live here)
        "224.0.0.0/4",
        "240.0.0.0/4",  # multicast, reserved and broadcast
        "fe80::/10",
        "fec0::/10",  # link-local, old site-local
        "fc00::/7",  # unique-local
        "ff00::/8",  # multicast
        "64:ff9b:1::/48",  # local-use NAT64
    )
]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPAT = ipaddress.ip_network("::/96")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT's IPv4-translated (RFC 2765)
# IPv6 reaches the internet only in global unicast space, and not in its documentation prefix
# (RFC 9637), which Python's ipaddress may not know yet.
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
_DOCUMENTATION_V6 = ipaddress.ip_network("3fff::/20")

INTERNAL_SUFFIXES = (".internal", ".local", ".home.arpa")
# A character no address has before its IPv6 zone (`%eth0`): IPv4 is digits and dots, IPv6
# hex digits and colons (and dots in an embedded IPv4 address).
_NOT_AN_ADDRESS = re.compile(r"[^0-9A-Fa-f:.]")
_NAME_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")


@functools.lru_cache(maxsize=1024)  # asked several times per request, mostly of a few hosts
def ip_literal(host: str) -> IPAddress | None:
    """host as an address when it is an IPv4 or IPv6 literal (brackets allowed), else None."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if _NOT_AN_ADDRESS.search(text.partition("%")[0]):
        # A name, the usual case: the parse below would fail, at the cost of two exceptions
        # (it runs several times per request).
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def normalize_host(host: str) -> str:
    """Lower-case, without a trailing dot or IPv6 brackets; an IP literal in canonical form."""
    ip = ip_literal(host)
    if ip is not None:
        return str(ip)
    return host.strip().lower().rstrip(".")


@functools.lru_cache(maxsize=1024)
def is_valid_name(host: str) -> bool:
    """True for a syntactically valid DNS name (already normalized) or IP literal."""
    return ip_literal(host) is not None or bool(_NAME_RE.fullmatch(host))


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, translated, compatible, NAT64,
    6to4), if any."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or ip in _TRANSLATED or (ip in _COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


@functools.lru_cache(maxsize=1024)  # asked several times per request, of a few addresses
def address_category(ip: IPAddress) -> Category | None:
    """localhost or internal_services for an address that is not on the public internet."""
    inner = embedded_ipv4(ip)
    if inner is not None:
        return address_category(inner)
    if any(ip in net for net in _LOOPBACK if net.version == ip.version):
        return Category.localhost
    if not ip.is_global or any(ip in net for net in _INTERNAL if net.version == ip.version):
        return Category.internal_services
    if isinstance(ip, ipaddress.IPv6Address) and (
        ip not in _GLOBAL_UNICAST or ip in _DOCUMENTATION_V6
    ):
        return Category.internal_services
    return None


def is_loopback_name(host: str) -> bool:
    return host == "localhost" or host.endswith(".localhost")


def is_internal_name(host: str) -> bool:
    return host.endswith(INTERNAL_SUFFIXES) or host in ("internal", "local")


@dataclass(frozen=True)
class HostRule:
    """A grant or registry entry: a name, `*.domain`, or an IP literal, with optional ports."""

    host: str
    ports: frozenset[int] | None = None

    @property
    def ip(self) -> IPAddress | None:
        return ip_literal(self.host)

    def matches(self, host: str, port: int) -> bool:
        """True when host (normalized) and port fall under this rule."""
        if self.ports is not None and port not in self.ports:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host

    @property
    def is_loopback(self) -> bool:
        ip = self.ip
        return is_loopback_name(self.host) or (
            ip is not None and address_category(ip) is Category.localhost
        )


def parse_host_port(text: str) -> HostRule:
    """`HOST`, `HOST:PORT`, `[V6]:PORT` or a bare IPv6 literal; raise ValueError when malformed."""
    text = text.strip()
    host, port = text, None
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"{text!r}: unclosed '[' in an IPv6 address")
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{text!r}: expected ':PORT' after ']'")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    host = normalize_host(host)
    wildcard = host.startswith("*.")
    if not host or not is_valid_name(host[2:] if wildcard else host):
        raise ValueError(f"{text!r}: not a host name, IP literal or '*.domain' pattern")
    if port is None:
        return HostRule(host)
    # (at most 5 ASCII digits before int(): past 4,300 digits it raises, and isdigit takes
    # other scripts' digits)
    if not (port.isascii() and port.isdigit() and len(port) <= 5) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return HostRule(host, frozenset({int(port)}))


@dataclass(frozen=True)
class Verdict:
    """What the policy says about one destination, and why, in words a person can act on."""

    decision: Decision
    category: Category
    reason: str
    grant_hint: str  # the HOST:PORT to name in `--grant network=...` to allow it

    @property
    def allowed(self) -> bool:
        return self.decision is Decision.allow


def _hint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Rules:
    """The run's network policy: categories, grants (policy and command line), registries."""

    def __init__(
        self,
        network: Network,
        *,
        cli_grants: list[HostRule],
        registries: list[HostRule],
        host_addresses: Container[IPAddress] = frozenset(),
    ) -> None:
        """host_addresses: the host's own interface addresses, which are `localhost` too."""
        self.network = network
        self.host_addresses = host_addresses
        policy_grants = [
            HostRule(normalize_host(g.host), frozenset(g.ports) if g.ports else None)
            for g in network.grants
        ]
        self.grants = policy_grants + list(cli_grants)
        self.registries = registries
        listed = network.localhost if isinstance(network.localhost, list) else []
        granted = [p for g in self.grants if g.is_loopback and g.ports for p in g.ports]
        self.bridged_ports = frozenset(listed) | frozenset(granted)
        self.any_loopback_port = any(g.is_loopback and g.ports is None for g in self.grants)

    def _decision(self, category: Category) -> Decision:
        value = getattr(self.network, category.value)
        return value if isinstance(value, Decision) else Decision.deny

    def _granted(self, host: str, port: int) -> bool:
        return any(g.matches(host, port) for g in self.grants)

    def localhost_verdict(self, host: str, port: int) -> Verdict:
        """The host's loopback at port: allowed for bridged ports, else per network.localhost."""
        hint = _hint("localhost", port)
        if port in self.bridged_ports or self.any_loopback_port:
            return Verdict(
                Decision.allow, Category.localhost, f"loopback port {port} is granted", hint
            )
        policy = self.network.localhost
        if isinstance(policy, list):
            shown = ", ".join(str(p) for p in policy) or "none"
            why = f"loopback port {port} is not in network.localhost (ports {shown})"
            return Verdict(Decision.deny, Category.localhost, why, hint)
        why = f"network.localhost: {policy.value} (loopback port {port} is not granted)"
        return Verdict(policy, Category.localhost, why, hint)

    def name_category(self, host: str, port: int) -> Category:
        if is_loopback_name(host):
            return Category.localhost
        if is_internal_name(host):
            return Category.internal_services
        if any(r.matches(host, port) for r in self.registries):
            return Category.package_registry
        return Category.arbitrary_web

    def address_category(self, ip: IPAddress) -> Category | None:
        """address_category, with the host's own interface addresses counted as localhost."""
        category = address_category(ip)
        if category is Category.localhost:
            return category  # loopback either way: no need to ask whose address it is
        inner = embedded_ipv4(ip) or ip
        if ip in self.host_addresses or (inner != ip and inner in self.host_addresses):
            return Category.localhost
        return category

    def internal_decision(self) -> Decision:
        return self._decision(Category.internal_services)

    def address_may_matter(self, by_name: Verdict) -> bool:
        """True when a name refused or asked by category could still be allowed as internal."""
        return (
            by_name.category in (Category.arbitrary_web, Category.package_registry)
            and self._decision(Category.internal_services) is not Decision.deny
        )

    def for_name(self, host: str, port: int) -> Verdict:
        """The verdict on a requested name (normalized) before it is resolved."""
        ip = ip_literal(host)
        if ip is not None:
            return self.for_address(host, port, ip, None)
        category = self.name_category(host, port)
        if category is Category.localhost:
            return self.localhost_verdict(host, port)
        hint = _hint(host, port)
        if self._granted(host, port):
            return Verdict(Decision.allow, category, f"{hint} is granted", hint)
        decision = self._decision(category)
        return Verdict(decision, category, f"network.{category.value}: {decision.value}", hint)

    def for_address(self, host: str, port: int, ip: IPAddress, by_name: Verdict | None) -> Verdict:
        """The verdict on connecting to ip for host; by_name is the name's own verdict, if any."""
        ip_granted = any(
            g.ip is not None and g.ip == ip and g.matches(str(ip), port) for g in self.grants
        )
        category = self.address_category(ip)
        if category is Category.localhost:
            if ip_granted and address_category(ip) is not Category.localhost:
                # A grant that names one of the host's own public addresses means what it says.
                where = _hint(str(ip), port)
                return Verdict(Decision.allow, category, f"{where} is granted", where)
            verdict = self.localhost_verdict(host, port)
            if by_name is not None and by_name.category is not Category.localhost:
                why = f"{host} resolves to {ip}, the host's loopback; {verdict.reason}"
                return Verdict(verdict.decision, Category.localhost, why, verdict.grant_hint)
            return verdict
        if by_name is not None and by_name.category is Category.localhost:
            why = f"{host} does not resolve to a loopback address ({ip})"
            return Verdict(Decision.deny, Category.localhost, why, by_name.grant_hint)
        if category is Category.internal_services:
            where = _hint(str(ip), port)
            if ip_granted:
                return Verdict(Decision.allow, category, f"{where} is granted", where)
            if by_name is not None and by_name.category is Category.internal_services:
                return by_name
            decision = self._decision(category)
            prefix = f"{host} resolves to {ip}, an internal address; " if by_name else ""
            why = f"{prefix}network.internal_services: {decision.value}"
            return Verdict(decision, category, why, where)
        if by_name is not None:
            return by_name
        where = _hint(str(ip), port)
        if ip_granted:
            return Verdict(Decision.allow, Category.arbitrary_web, f"{where} is granted", where)
        category = self.name_category(str(ip), port)
        decision = self._decision(category)
        return Verdict(decision, category, f"network.{category.value}: {decision.value}", where)
