"""Categories, grants and verdicts: pure functions, no network."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper.errors import UsageError
from gatekeeper.policy.model import Decision, Network
from gatekeeper.sandbox.net.classify import (
    Category,
    HostRule,
    Rules,
    address_category,
    embedded_ipv4,
    ip_literal,
    parse_host_port,
)
from gatekeeper.sandbox.net.session import parse_grants


@pytest.mark.parametrize(
    ("address", "category"),
    [
        ("127.0.0.1", Category.localhost),
        ("127.8.9.10", Category.localhost),
        ("0.0.0.0", Category.localhost),
        ("::1", Category.localhost),
        ("::", Category.localhost),
        ("::ffff:127.0.0.1", Category.localhost),
        ("10.1.2.3", Category.internal_services),
        ("172.16.0.1", Category.internal_services),
        ("172.31.255.255", Category.internal_services),
        ("192.168.1.1", Category.internal_services),
        ("100.64.0.1", Category.internal_services),
        ("169.254.169.254", Category.internal_services),
        ("fe80::1", Category.internal_services),
        ("fd12:3456::1", Category.internal_services),
        ("fc00::1", Category.internal_services),
        ("::ffff:10.0.0.1", Category.internal_services),
        ("::ffff:169.254.169.254", Category.internal_services),
        ("64:ff9b::a9fe:a9fe", Category.internal_services),  # NAT64 of 169.254.169.254
        ("2002:a00:1::1", Category.internal_services),  # 6to4 of 10.0.0.1
        ("::10.0.0.1", Category.internal_services),  # IPv4-compatible
        ("224.0.0.1", Category.internal_services),
        ("255.255.255.255", Category.internal_services),
        ("172.32.0.1", None),
        ("100.128.0.1", None),
        ("192.88.99.7", None),
        ("2620:4f:8000::7", None),
        # Never routed on the internet: what answers there is on a network of its own (this
        # machine's LAN may be 192.0.2.0/24; fake-IP DNS hands out 198.18.0.0/15).
        ("198.51.100.7", Category.internal_services),
        ("192.0.2.1", Category.internal_services),
        ("198.18.0.2", Category.internal_services),
        ("2001:db8::1", Category.internal_services),
        ("2001:db8:18::2", Category.internal_services),
        ("::ffff:0:7f00:1", Category.localhost),  # IPv4-translated (SIIT) 127.0.0.1
        ("::ffff:0:a00:1", Category.internal_services),  # IPv4-translated 10.0.0.1
        # IPv6 outside global unicast space, or in its new documentation prefix, which this
        # Python's ipaddress may count as global.
        ("3fff::1", Category.internal_services),
        ("5f00::1", Category.internal_services),
        ("100:0:0:1::1", Category.internal_services),
        ("4000::1", Category.internal_services),
    ],
)
def test_address_categories(address: str, category: Category | None) -> None:
    assert address_category(ipaddress.ip_address(address)) is category


def test_wildcard_matches_subdomains_only() -> None:
    rule = parse_host_port("*.example.com")
    assert rule.matches("a.example.com", 443)
    assert rule.matches("deep.a.example.com", 80)
    assert not rule.matches("example.com", 443)
    assert not rule.matches("badexample.com", 443)
    assert not rule.matches("a.example.com.evil.test", 443)


@pytest.mark.parametrize(
    ("text", "host", "ports"),
    [
        ("api.example.com", "api.example.com", None),
        ("API.Example.com.:443", "api.example.com", {443}),
        ("10.0.0.5", "10.0.0.5", None),
        ("[2001:db8::5]:8443", "2001:db8::5", {8443}),
        ("2001:db8::5", "2001:db8::5", None),
        ("localhost:5432", "localhost", {5432}),
        ("*.example.com:443", "*.example.com", {443}),
    ],
)
def test_parse_host_port(text: str, host: str, ports: set[int] | None) -> None:
    rule = parse_host_port(text)
    assert rule.host == host
    assert rule.ports == (frozenset(ports) if ports else None)


@pytest.mark.parametrize("text", ["", "host:0", "host:99999", "host:http", "bad host", "[::1", "*"])
def test_parse_host_port_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_host_port(text)


def test_cli_grants_keep_only_network_kinds_and_explain_mistakes() -> None:
    rules, texts = parse_grants(["network=api.example.com:443", "command=make", "10.0.0.5"])
    assert [r.host for r in rules] == ["api.example.com", "10.0.0.5"]
    assert texts == ["api.example.com:443", "10.0.0.5"]
    with pytest.raises(UsageError, match="not a host name") as caught:
        parse_grants(["network=not a host"])
    assert "network=HOST[:PORT]" in str(caught.value.hint)


def rules(**network: object) -> Rules:
    registries = [HostRule("registry.test", frozenset({443}))]
    return Rules(Network.model_validate(network), cli_grants=[], registries=registries)


def test_name_verdicts_by_category() -> None:
    r = rules(package_registry="allow", arbitrary_web="deny", internal_services="ask")
    assert r.for_name("registry.test", 443).decision is Decision.allow
    assert r.for_name("registry.test", 443).category is Category.package_registry
    assert r.for_name("registry.test", 22).category is Category.arbitrary_web  # port not listed
    assert r.for_name("web.test", 443).decision is Decision.deny
    assert r.for_name("db.internal", 5432).category is Category.internal_services
    assert r.for_name("printer.local", 631).decision is Decision.ask
    assert r.for_name("10.0.0.1", 80).category is Category.internal_services


def test_grants_override_categories_but_not_for_rebound_addresses() -> None:
    r = rules(
        arbitrary_web="deny",
        internal_services="deny",
        grants=[{"host": "api.example.com", "ports": [443]}, {"host": "10.0.0.5"}],
    )
    by_name = r.for_name("api.example.com", 443)
    assert by_name.decision is Decision.allow
    assert r.for_name("api.example.com", 80).decision is Decision.deny
    public = ipaddress.ip_address("192.88.99.7")
    assert r.for_address("api.example.com", 443, public, by_name).decision is Decision.allow
    # The granted name now resolves to an internal address: the grant does not carry over.
    rebound = r.for_address("api.example.com", 443, ipaddress.ip_address("10.9.9.9"), by_name)
    assert (rebound.decision, rebound.category) == (Decision.deny, Category.internal_services)
    assert "resolves to 10.9.9.9" in rebound.reason and rebound.grant_hint == "10.9.9.9:443"
    loop = r.for_address("api.example.com", 443, ipaddress.ip_address("127.0.0.1"), by_name)
    assert (loop.decision, loop.category) == (Decision.deny, Category.localhost)
    # An IP grant opens that internal address, whichever name led to it.
    ip_granted = r.for_address("db.test", 5432, ipaddress.ip_address("10.0.0.5"), None)
    assert ip_granted.decision is Decision.allow


def test_localhost_ports() -> None:
    listed = rules(localhost=[5432])
    assert listed.bridged_ports == {5432}
    assert listed.for_name("localhost", 5432).decision is Decision.allow
    assert listed.for_name("127.0.0.1", 6379).decision is Decision.deny
    granted = Rules(
        Network.model_validate({"localhost": "deny"}),
        cli_grants=[parse_host_port("localhost:8080")],
        registries=[],
    )
    assert granted.bridged_ports == {8080}
    assert granted.for_name("[::1]", 8080).decision is Decision.allow
    assert granted.for_name("localhost", 8081).decision is Decision.deny
    asking = rules(localhost="ask")
    assert asking.for_name("localhost", 3000).decision is Decision.ask
    assert asking.bridged_ports == frozenset()


def test_internal_names_may_be_allowed_by_category() -> None:
    r = rules(internal_services="allow", arbitrary_web="deny")
    by_name = r.for_name("git.corp.test", 443)
    assert by_name.decision is Decision.deny and r.address_may_matter(by_name)
    inside = r.for_address("git.corp.test", 443, ipaddress.ip_address("10.1.1.1"), by_name)
    assert inside.decision is Decision.allow
    outside = r.for_address("git.corp.test", 443, ipaddress.ip_address("192.88.99.1"), by_name)
    assert outside.decision is Decision.deny
    assert not rules(internal_services="deny").address_may_matter(by_name)


def test_a_name_with_a_trailing_newline_is_not_a_name() -> None:
    from gatekeeper.sandbox.net.classify import is_valid_name

    assert is_valid_name("example.com")
    assert not is_valid_name("example.com\n")


def _reference_ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """ip_literal without its shortcut for names: the standard library alone decides."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@settings(max_examples=3000, deadline=None)
@given(
    st.one_of(
        st.text(alphabet="0123456789abcdefABCDEFxyz:.%[] \t\n٣１", max_size=45),
        st.ip_addresses().map(str),
        st.ip_addresses(v=6).map(lambda ip: f"[{ip}%eth0]"),
        st.text(max_size=30),
    )
)
def test_ip_literal_reads_exactly_what_the_standard_library_reads(host: str) -> None:
    # The shortcut that turns names away before parsing must never turn an address away.
    assert ip_literal(host) == _reference_ip_literal(host)


def test_the_hosts_own_addresses_count_also_mapped_and_loopback_asks_no_route() -> None:
    own = ipaddress.ip_address("192.88.99.7")
    asked: list[object] = []

    class Own:
        def __contains__(self, ip: object) -> bool:
            asked.append(ip)
            return ip == own

    r = Rules(Network.model_validate({}), cli_grants=[], registries=[], host_addresses=Own())
    assert r.address_category(own) is Category.localhost
    assert r.address_category(ipaddress.ip_address("::ffff:192.88.99.7")) is Category.localhost
    assert r.address_category(ipaddress.ip_address("192.88.99.8")) is None
    assert r.address_category(ipaddress.ip_address("10.0.0.1")) is Category.internal_services
    asked.clear()
    # Loopback is localhost whoever owns it: no route lookup for it on every request.
    for loopback in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        assert r.address_category(ipaddress.ip_address(loopback)) is Category.localhost
    assert asked == []


# --- the lane's decision (Decider.judge_now) ---------------------------------------------------


class _Addresses:
    """The host's own addresses, which may change during a run."""

    def __init__(self) -> None:
        self.own: set[object] = set()

    def __contains__(self, ip: object) -> bool:
        return ip in self.own


def _decider(network: dict[str, object], resolver: object, own: _Addresses) -> object:
    from gatekeeper.sandbox.net.asking import Asker
    from gatekeeper.sandbox.net.decide import Decider
    from gatekeeper.sandbox.net.record import Recorder

    rules = Rules(Network.model_validate(network), cli_grants=[], registries=[],
                  host_addresses=own)  # fmt: skip
    return Decider(rules, Asker("never", Recorder()), resolver)  # type: ignore[arg-type]


def test_judge_now_does_not_keep_an_allow_for_an_address_that_becomes_the_hosts_own() -> None:
    own = _Addresses()
    decider = _decider({"arbitrary_web": "allow", "localhost": "deny"}, lambda h, p: [], own)
    first = decider.judge_now("192.88.99.7", 80)  # type: ignore[attr-defined]
    assert first is not None and first.allowed
    own.own.add(ipaddress.ip_address("192.88.99.7"))  # a VPN comes up, say
    # Not allowed outright any more: left to the event loop's judge, which refuses it.
    assert decider.judge_now("192.88.99.7", 80) is None  # type: ignore[attr-defined]
    # Loopback stays loopback: that answer is kept.
    decider = _decider({"localhost": [80]}, lambda h, p: [], own)
    assert decider.judge_now("localhost", 80) is decider.judge_now("localhost", 80)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "literal",
    ["2002:7f00:1::2", "64:ff9b::7f00:1", "::ffff:0:7f00:1", "::7f00:1",
     "2002:c058:6307::2", "::ffff:192.88.99.7"],
)  # fmt: skip
def test_an_ipv6_spelling_of_this_hosts_address_is_reached_at_that_address(literal: str) -> None:
    """Judged localhost by the IPv4 address it carries, an IPv6 address was connected to as
    IPv6: to whatever the host routes 6to4, NAT64 or SIIT to, another machine, recorded as
    localhost. It is reached at the IPv4 address its verdict is about."""
    own = _Addresses()
    own.own.add(ipaddress.ip_address("192.88.99.7"))
    decider = _decider({"localhost": [8080], "arbitrary_web": "deny"}, lambda h, p: [], own)
    judgement = decider.judge_now(f"[{literal}]", 8080)  # type: ignore[attr-defined]
    assert judgement is not None and judgement.allowed
    inner = embedded_ipv4(ipaddress.ip_address(literal))
    assert judgement.addresses == [inner], judgement.addresses
    assert judgement.verdict.category is Category.localhost


def test_judge_now_names_the_category_of_a_name_that_does_not_resolve() -> None:
    from gatekeeper.sandbox.net.decide import ResolveError

    def fails(host: str, port: int) -> list[str]:
        raise OSError("no such name")

    decider = _decider({"arbitrary_web": "allow"}, fails, _Addresses())
    with pytest.raises(ResolveError) as caught:
        decider.judge_now("nx.example.test", 8080)  # type: ignore[attr-defined]
    assert caught.value.category == "arbitrary_web"


def test_a_name_judge_now_looked_up_is_not_looked_up_again_by_judge() -> None:
    import asyncio

    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["10.1.2.3"]  # internal: not allowed outright by arbitrary_web

    decider = _decider({"arbitrary_web": "allow", "internal_services": "deny"}, resolver,
                       _Addresses())  # fmt: skip
    assert decider.judge_now("web.example.test", 80) is None  # type: ignore[attr-defined]
    judgement = asyncio.run(decider.judge("web.example.test", 80))  # type: ignore[attr-defined]
    assert not judgement.allowed and judgement.verdict.category.value == "internal_services"
    assert asked == ["web.example.test"]


@pytest.mark.root
def test_an_address_of_a_local_route_is_the_hosts_own() -> None:
    # A host may take whole ranges as its own with `local` routes (AnyIP): no interface holds
    # such an address, yet every service on a wildcard address answers it. Counted as the
    # web, `GET http://203.0.113.7:PORT/` reached the host's services under `localhost: deny`.
    import shutil
    import subprocess
    import sys
    import textwrap

    if shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("needs ip (iproute2) and unshare")
    script = textwrap.dedent("""
        import ipaddress, subprocess
        from gatekeeper.sandbox.net.local import HostAddresses, host_addresses
        for args in (["link", "set", "lo", "up"],
                     ["route", "add", "local", "203.0.113.0/24", "dev", "lo"],
                     ["-6", "route", "add", "local", "2001:db8:1::/64", "dev", "lo"]):
            subprocess.run(["ip", *args], check=True)
        own = HostAddresses(host_addresses())
        for address in ("203.0.113.7", "2001:db8:1::5", "127.0.0.1", "::1", "198.51.100.1"):
            print(address, ipaddress.ip_address(address) in own)
    """)  # fmt: skip
    proc = subprocess.run(["unshare", "--net", sys.executable, "-c", script],
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = dict(line.split() for line in proc.stdout.splitlines())
    assert said == {"203.0.113.7": "True", "2001:db8:1::5": "True", "127.0.0.1": "True",
                    "::1": "True", "198.51.100.1": "False"}, said  # fmt: skip


def test_the_hosts_own_address_with_a_zone_index_is_still_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`[own-address%1]`: a zone index makes an address unequal to itself without one; with
    the kernel's route lookup unavailable it was not the host's own, and not localhost."""
    import ipaddress

    from gatekeeper.sandbox.net import local

    monkeypatch.setattr(local, "_route_type", lambda ip: None)  # no netlink: the fallback
    own = ipaddress.ip_address("2001:db8:7::5")
    hosts = local.HostAddresses(frozenset({own}))
    assert own in hosts
    assert ipaddress.ip_address("2001:db8:7::5%1") in hosts
    assert ipaddress.ip_address("2001:db8:7::6%1") not in hosts
