"""Install gatekeeper's git hooks under the common git dir, keeping any foreign hook aside.

Each shipped hook carries an ID line; a file with that line is ours and is replaced, any other
file is moved to `<name>.legacy` (the gate runs it after passing), never overwritten.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import UsageError
from gatekeeper.git import git
from gatekeeper.resources import resource_path

HOOK_ID = "gatekeeper-hook-id: 6a1d3c9e-gatekeeper"
LOCAL_HOOKS = ("pre-push", "pre-merge-commit", "pre-commit")
SERVER_HOOKS = ("pre-receive",)


@dataclass(frozen=True)
class Installed:
    """What installing one hook did."""

    path: Path
    replaced_own: bool = False
    moved_aside: Path | None = None


def hooks_dir(git_dir: Path) -> Path:
    """The hooks folder of the common git dir; raise UsageError when core.hooksPath is set."""
    out = git(
        "config", "--show-origin", "--get-all", "core.hooksPath", git_dir=git_dir, check=False
    ).decode("utf-8", "replace")
    # The git chokepoint passes `-c core.hooksPath=/dev/null` itself; only files count here.
    set_in = [
        line.split("\t", 1) for line in out.splitlines() if not line.startswith("command line:")
    ]
    if set_in:
        origin, value = set_in[0] if len(set_in[0]) == 2 else (set_in[0][0], "")
        raise UsageError(
            f"Cowardly refusing to install hooks with `core.hooksPath` set ({value} in {origin})",
            hint="`git config --unset-all core.hooksPath` (in the file named above), "
            "then try again",
        )
    return git_dir / "hooks"


def is_ours(path: Path) -> bool:
    try:
        return HOOK_ID in path.read_text(errors="replace")
    except OSError:
        return False


def hook_text(name: str, python: str | None = None) -> str:
    """The shipped hook script with the interpreter that installs it written in."""
    template = (resource_path("hooks") / name).read_text()
    return template.replace("@PYTHON@", shlex.quote(python or sys.executable))


def isolated_import(python: str | None = None, work_tree: Path | None = None) -> None:
    """Check that the hooks' interpreter imports gatekeeper as they run it (`-I`: no
    PYTHONPATH, no user site folder, not the current folder), and this gatekeeper; raise
    UsageError when it cannot, before any hook is written, rather than leave hooks that fail
    at every push. A different copy of gatekeeper is only warned about.

    An interpreter whose environment (or gatekeeper) lies in work_tree is refused too: a
    merge writes the branch's files there before pre-merge-commit runs, and `-I` does not
    stop a virtual environment's `.pth` files, so a branch could put code in the gate's place.
    """
    python = python or sys.executable
    probe = ("import os, sys, gatekeeper.hookrun; "
             "print(sys.prefix); print(os.path.dirname(gatekeeper.__file__))")  # fmt: skip
    try:
        done = subprocess.run([python, "-I", "-c", probe], capture_output=True, timeout=60,
                              stdin=subprocess.DEVNULL, cwd="/")  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"the hooks would run {python}, which cannot be started: {exc}",
                         hint="install gatekeeper into a Python environment and run "
                         "`gatekeeper hooks install` from it") from None  # fmt: skip
    if done.returncode != 0:
        why = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        raise UsageError(
            f"the hooks would run `{python} -I -m gatekeeper.hookrun`, and that interpreter "
            f"cannot import gatekeeper in isolated mode ({why})",
            hint="hooks run isolated (-I ignores PYTHONPATH and the user's site folder), so "
            "that a branch under review cannot put its own code in the gate's place: install "
            "gatekeeper into that interpreter's environment (`pip install` it there) rather "
            "than running it from PYTHONPATH",
        )
    # (the last two lines: a .pth file or sitecustomize may print before)
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if len(lines) < 2:
        raise UsageError(f"the hooks would run {python}, which imported gatekeeper but did not "
                         "say where from (something in its start-up ended it early)",
                         hint="check that interpreter's environment (its .pth files, "
                         "sitecustomize), or install gatekeeper into a fresh one")  # fmt: skip
    prefix, theirs = lines[-2:]
    if work_tree is not None:
        top = work_tree.resolve()
        for what, place in (("environment", prefix), ("gatekeeper", theirs)):
            if place and Path(place).resolve().is_relative_to(top):
                raise UsageError(
                    f"the hooks would run {python}, whose {what} ({place}) lies in the "
                    f"repository's work tree ({top}): a merge writes the branch's files there "
                    "before the pre-merge-commit hook runs, so a branch could put code in the "
                    "gate's place (a .pth file in that environment runs even under -I)",
                    hint="install gatekeeper outside the repository (its own virtual "
                    "environment elsewhere, or pipx) and run `gatekeeper hooks install` from it",
                )
    ours = str(Path(__file__).resolve().parent.parent)
    if theirs and Path(theirs).resolve() != Path(ours):
        print(f"warning: the hooks will run the gatekeeper installed for {python} ({theirs}), "
              f"not this one ({ours})", file=sys.stderr)  # fmt: skip


def _aside(path: Path) -> Path:
    candidate = path.with_name(path.name + ".legacy")
    n = 1
    while candidate.exists() or candidate.is_symlink():
        candidate = path.with_name(f"{path.name}.legacy.{n}")
        n += 1
    return candidate


def install_hook(directory: Path, name: str, python: str | None = None) -> Installed:
    """Write one hook (mode 0755); a foreign hook already there is moved aside first."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    moved: Path | None = None
    own = False
    if path.exists() or path.is_symlink():
        if is_ours(path) and not path.is_symlink():
            own = True
        else:
            moved = _aside(path)
            os.replace(path, moved)
    tmp = path.with_name(f".{name}.gatekeeper-tmp")
    tmp.write_text(hook_text(name, python))
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return Installed(path, replaced_own=own, moved_aside=moved)


def legacy_hook(directory: Path, name: str) -> Path | None:
    """The foreign hook kept aside at install time, if it is still there and executable."""
    path = directory / f"{name}.legacy"
    return path if path.is_file() and os.access(path, os.X_OK) else None
