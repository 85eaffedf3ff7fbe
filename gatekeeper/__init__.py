"""gatekeeper: sandboxed agent runs, signed receipts, and a pre-merge gate that checks them."""

from __future__ import annotations

import os
import sys
import types

__version__ = "0.1.0"

# Pydantic would load every plugin any installed package registers, and let it watch the
# validation of policies, receipts and approvals; gatekeeper takes none (and skips the scan
# of every installed package's metadata that finding them costs).
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"


def _without_plugin_loader() -> None:
    """Stand in for pydantic's plugin loader, which plugins being off leaves with nothing to
    do but import importlib.metadata (about a tenth of a `check` on a large change, before
    any work). What the loader is asked for other than its plugins (none) comes from the real
    one, loaded then."""
    name = "pydantic.plugin._loader"
    if name in sys.modules:
        return
    stub = types.ModuleType(name)

    def get_plugins() -> tuple[()]:
        return ()

    def real(attribute: str) -> object:
        if attribute.startswith("__"):  # what the import system looks for (`__path__`)
            raise AttributeError(attribute)
        import importlib.machinery
        import importlib.util

        import pydantic.plugin

        spec = importlib.machinery.PathFinder.find_spec(name, list(pydantic.plugin.__path__))
        if spec is None or spec.loader is None:
            raise AttributeError(attribute)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, attribute)

    stub.get_plugins = get_plugins  # type: ignore[attr-defined]
    stub.__getattr__ = real  # type: ignore[method-assign]
    sys.modules[name] = stub


_without_plugin_loader()
