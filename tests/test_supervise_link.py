"""A hard link is judged by both its names: a second name in the write set for a file outside
it is refused and recorded (the mounts refuse it too, across binds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

POLICY = "paths: {read: ['**'], write: ['out/**']}\n"


def test_a_hard_link_to_a_file_outside_the_write_set_is_refused_and_recorded(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "r", policy=POLICY,
                     files={"out/.keep": "", "locked.txt": "locked\n"})  # fmt: skip
    script = (
        "import os\n"
        "for args in (('locked.txt', 'out/a'), ('out/../locked.txt', 'out/b')):\n"
        "    try:\n"
        "        os.link(*args)\n"
        "    except OSError as exc:\n"
        "        print(exc.errno)\n"
    )
    proc, data = run_json(repo, "python3", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "locked.txt" in data["denied_writes"]
    wt = Path(data["worktree"])
    assert not (wt / "out" / "a").exists() and not (wt / "out" / "b").exists()
    assert (wt / "locked.txt").read_text() == "locked\n"
    shown = gk("receipt", "show", "--repo", str(repo), "--json", data["commit"])
    assert shown.returncode == 0, shown.stderr
    writes = json.loads(shown.stdout)[0]["statement"]["predicate"]["writes"]
    links = [w for w in writes if w["op"] == "link"]
    assert links and all(w["decision"] == "deny" for w in links), links
    assert {"locked.txt", "out/a", "out/b"} <= {w["path"] for w in links}
