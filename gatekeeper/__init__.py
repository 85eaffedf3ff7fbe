"""gatekeeper: sandboxed agent runs, signed receipts, and a pre-merge gate that checks them."""

from __future__ import annotations

import os

__version__ = "0.1.0"

# Pydantic would load every plugin any installed package registers, and let it watch the
# validation of policies, receipts and approvals; gatekeeper takes none (and skips the scan
# of every installed package's metadata that finding them costs).
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
