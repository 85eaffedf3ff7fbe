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

    def get_plugins() -> tuple[()]:
        return ()

    loaded: list[types.ModuleType] = []  # the real loader, once something asked for it

    def real(attribute: str) -> object:
        if attribute.startswith("__"):  # what the import system looks for (`__path__`)
            raise AttributeError(attribute)
        if not loaded:
            import importlib.machinery
            import importlib.util

            import pydantic.plugin

            path = list(pydantic.plugin.__path__)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                raise AttributeError(attribute)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            loaded.append(module)
        return getattr(loaded[0], attribute)

    class StandIn:
        """Found before pydantic's own module when that is imported: an import of it goes the
        usual way (its package first, the module bound on it, a spec), so `import
        pydantic.plugin._loader` works as with the real one (a module put in sys.modules
        ahead of its package broke that: pydantic.plugin was never imported)."""

        @staticmethod
        def find_spec(fullname: str, path: object = None, target: object = None) -> object:
            if fullname != name:
                return None
            import importlib.machinery

            # The class is the loader (its static methods), as it is the finder below.
            return importlib.machinery.ModuleSpec(name, StandIn, origin="gatekeeper")  # type: ignore[arg-type]

        @staticmethod
        def create_module(spec: object) -> None:
            return None  # the default module

        @staticmethod
        def exec_module(module: types.ModuleType) -> None:
            module.get_plugins = get_plugins  # type: ignore[attr-defined]
            module.__getattr__ = real  # type: ignore[method-assign]

    sys.meta_path.insert(0, StandIn)  # type: ignore[arg-type]


_without_plugin_loader()
