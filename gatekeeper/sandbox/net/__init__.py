"""The network boundary: the launcher's proxy, its per-destination policy and its log.

The sandbox has only loopback; `bridge.py` (run inside) hands each connection made to its
loopback ports over a Unix socket to the proxy (`proxy.py`), which alone resolves names,
classifies the destination (`classify.py`) and records every attempt. `session.py` is what a
run starts and stops.
"""

from __future__ import annotations

from gatekeeper.sandbox.net.session import NetSetup, NetworkSession

__all__ = ["NetSetup", "NetworkSession"]
