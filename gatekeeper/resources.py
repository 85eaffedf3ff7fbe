"""Files shipped with the package: templates, hooks and policies."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def resource_path(kind: str) -> Path:
    """The folder of shipped `templates`, `hooks` or `policies` (installed or in a checkout)."""
    try:
        found = resources.files(f"gatekeeper.{kind}")
        path = Path(str(found))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parent.parent / kind
