"""Files shipped with the package: templates, hooks and policies."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def resource_path(kind: str) -> Path:
    """The folder of shipped `templates`, `hooks` or `policies`.

    Installed, they live inside the package (gatekeeper/templates); in a source checkout or an
    editable install, at the top of the repository (templates/).
    """
    for candidate in (PACKAGE / kind, PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"gatekeeper's {kind} folder is missing next to {PACKAGE}")
