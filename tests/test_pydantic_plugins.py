"""gatekeeper validates policies, receipts and approvals with pydantic, and lets no pydantic
plugin (any installed package may register one) watch or change that validation; nor does it
pay for looking for them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN = """
from pathlib import Path

Path({marker!r}).write_text("loaded")


class Plugin:
    def new_schema_validator(self, *args, **kwargs):
        return None, None, None


plugin = Plugin()
"""

VALIDATE = """
import sys
{first}
from gatekeeper.receipt.changes import validate_records
from gatekeeper.receipt.models import Base

validate_records(
    [{{"status": "A", "path": "a", "old_mode": "000000", "new_mode": "100644",
      "old_blob": "0", "new_blob": "1"}}]
)
Base.model_validate_json('{{"commit": "c", "tree": "t"}}')
print("importlib.metadata" in sys.modules)
"""


def _installed_plugin(tmp_path: Path) -> tuple[Path, Path]:
    """A folder for PYTHONPATH holding a package that registers a pydantic plugin, which
    leaves a marker file when it is loaded."""
    site = tmp_path / "site"
    (site / "spy_plugin-1.0.dist-info").mkdir(parents=True)
    marker = tmp_path / "loaded"
    (site / "spy_plugin.py").write_text(PLUGIN.format(marker=str(marker)))
    info = site / "spy_plugin-1.0.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: spy-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pydantic]\nspy = spy_plugin:plugin\n")
    return site, marker


def _validate(site: Path, first: str) -> str:
    code = textwrap.dedent(VALIDATE.format(first=first))
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_an_installed_pydantic_plugin_is_never_loaded(tmp_path: Path) -> None:
    site, marker = _installed_plugin(tmp_path)
    # The package is seen: pydantic alone loads it (so this test can fail).
    _validate(site, "import pydantic.plugin._loader as L; L.get_plugins()")
    assert marker.exists()
    marker.unlink()
    assert _validate(site, "") == "False"  # nor is installed packages' metadata read
    assert not marker.exists()


def test_the_loaders_other_names_still_come_from_pydantic() -> None:
    code = (
        "import gatekeeper\n"
        "from pydantic.plugin._loader import PYDANTIC_ENTRY_POINT_GROUP, get_plugins\n"
        "print(PYDANTIC_ENTRY_POINT_GROUP, tuple(get_plugins()))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "pydantic ()"
