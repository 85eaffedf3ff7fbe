"""Fixtures for the network tests (loaded with `pytest_plugins = ["net_fixtures"]`).

`outer` puts the test thread in an isolated namespace pair for the test (see net_ns.py);
`start_session` starts NetworkSessions that are stopped after the test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from net_ns import IsolatedNet
from net_sandbox import SessionFactory, mapping_resolver

from gatekeeper.policy.model import Policy
from gatekeeper.sandbox.net import NetSetup, NetworkSession
from gatekeeper.sandbox.net.proxy import ProxyLimits


@pytest.fixture(scope="session")
def testnet() -> Iterator[IsolatedNet]:
    net = IsolatedNet(str(os.getpid()))
    try:
        net.create()
    except RuntimeError as exc:
        net.delete()
        pytest.skip(f"cannot create network namespaces: {exc}")
    yield net
    net.delete()


@pytest.fixture
def outer(testnet: IsolatedNet) -> Iterator[IsolatedNet]:
    """The test runs (and starts its proxy and sandboxes) in the isolated outer namespace."""
    with testnet.inside("outer"):
        yield testnet


@pytest.fixture
def start_session(tmp_path: Path, outer: IsolatedNet) -> Iterator[SessionFactory]:
    """start_session(network={...}, grants=[...], names={...}, ask="never") -> (session, setup).

    resolver=, when given, takes the place of the one that knows only names.

    It depends on `outer`: a proxy is only ever started inside the isolated namespace.
    """
    sessions: list[NetworkSession] = []

    def start(
        network: dict[str, Any] | None = None,
        *,
        grants: list[str] | None = None,
        names: dict[str, list[str]] | None = None,
        ask: str = "never",
        limits: ProxyLimits | None = None,
        **kwargs: Any,
    ) -> tuple[NetworkSession, NetSetup]:
        outer.assert_inside()
        policy = Policy.model_validate({"network": network or {}})
        run_dir = tmp_path / f"run{len(sessions)}"
        session = NetworkSession(
            policy,
            grants=grants or [],
            ask=ask,
            run_dir=run_dir,
            resolver=kwargs.pop("resolver", None) or mapping_resolver(names or {}),
            limits=limits,
            env=kwargs.pop("env", {}),
            **kwargs,
        )
        sessions.append(session)
        return session, session.start()

    yield start
    for session in sessions:
        session.stop()
