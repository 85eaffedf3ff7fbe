"""gatekeeper: sandboxed agent runs, signed receipts, and a pre-merge gate that checks them."""

from __future__ import annotations

__version__ = "0.1.0"
