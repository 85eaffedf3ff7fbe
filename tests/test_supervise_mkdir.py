"""mkdir of an existing folder is EEXIST, decided in the process's own view, never the host's."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox, pytest.mark.slow]

RACE = """
import errno, os, threading, time
os.makedirs("R", exist_ok=True)
# The real folder, by descriptor: it stays the same folder whatever name the flips give it.
real = os.open("R", os.O_RDONLY | os.O_DIRECTORY)
stop = False
def flip():
    while not stop:
        try:
            os.rename("R", "d"); os.rename("d", "R")
            os.symlink("{hostonly}", "d"); os.unlink("d")
        except OSError:
            pass
t = threading.Thread(target=flip); t.start()
ghost = 0
end = time.time() + 10
while time.time() < end:
    try:
        os.mkdir("d/PRESENT_ON_HOST")
    except OSError as e:
        # EEXIST while the folder does not exist in the sandbox: learnt from the host.
        if e.errno == errno.EEXIST:
            try:
                os.stat("PRESENT_ON_HOST", dir_fd=real)
            except FileNotFoundError:
                ghost += 1
    try:
        os.rmdir("PRESENT_ON_HOST", dir_fd=real)
    except OSError:
        pass
stop = True; t.join()
print("GHOST", ghost)
"""


def test_a_symlink_swapped_in_never_lets_mkdir_probe_the_host(tmp_path: Path, key: Path) -> None:
    hostonly = tmp_path / "hostonly"
    (hostonly / "PRESENT_ON_HOST").mkdir(parents=True)  # exists on the host only
    repo = make_repo(tmp_path / "repo")
    proc, _ = run_json(repo, "python3", "-c", RACE.format(hostonly=hostonly), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "GHOST 0" in proc.stderr, proc.stderr[-2000:]
