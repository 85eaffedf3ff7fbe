"""The agent's own program: found before the run, shown read-only inside wherever it lives.

An agent installed under /tmp, in a project folder or anywhere outside the system folders is
invisible in the sandbox's fresh filesystem. The launcher resolves the command as the sandbox
will (PATH, symlinks, the `#!` interpreter, a virtual environment's base interpreter) and
shows the installation it belongs to, read-only, never its neighbours: an npm prefix's
`node_modules`, a virtual environment, an `X/bin` prefix with its `lib`, or the file alone.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.errors import UsageError
from gatekeeper.sandbox.mounts import SYSTEM_DIRS as SYSTEM_DIR_NAMES

SYSTEM_DIRS = tuple(Path("/") / d for d in SYSTEM_DIR_NAMES)
MAX_DEPTH = 4  # interpreter chains followed (script -> env -> interpreter -> ...)


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@dataclass
class Program:
    """The resolved command and the installations to show for it."""

    path: Path  # as the sandbox will find it
    real: Path
    roots: list[Path] = field(default_factory=list)


def _is_file(path: Path) -> bool:
    """path is a regular file (links followed); False where this user cannot look (EACCES)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _is_executable(path: Path) -> bool:
    return _is_file(path) and os.access(path, os.X_OK)


def unreadable_path_entries(path_var: str) -> list[str]:
    """Folders on path_var this user may not search (a shell skips them, and so does run)."""
    entries = [e for e in path_var.split(":") if e and os.path.isabs(e)]
    return [e for e in entries if os.path.isdir(e) and not os.access(e, os.X_OK)]


def find_on_path(name: str, path_var: str) -> Path | None:
    """The first executable file name on path_var, as execvp finds it: a folder this user
    cannot search is skipped, never an error."""
    for entry in path_var.split(":"):
        if not entry or not os.path.isabs(entry):
            continue
        candidate = Path(entry) / name
        if _is_executable(candidate):
            return candidate
    return None


def installation_of(real: Path) -> Path:
    """The folder that holds everything a program needs, and nothing of its neighbours."""
    parts = real.parts
    if "node_modules" in parts:
        return Path(*parts[: parts.index("node_modules") + 1])
    for folder in real.parents:
        if _is_file(folder / "pyvenv.cfg") and os.path.exists(folder / "bin" / "python"):
            return folder
        if folder.parent == folder:
            break
    parent = real.parent
    if parent.name in ("bin", "sbin") and os.path.isdir(parent.parent / "lib"):
        prefix = parent.parent
        if prefix not in (Path("/"), Path("/root"), Path.home()) and prefix.parent != Path("/home"):
            return prefix
    return real


def _interpreter(real: Path) -> list[str]:
    try:
        with open(real, "rb") as f:
            head = f.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    return line.split()


def _venv_base(root: Path) -> Path | None:
    cfg = root / "pyvenv.cfg"
    try:
        text = cfg.read_text(errors="replace") if _is_file(cfg) else ""
    except OSError:
        return None  # a virtual environment this user may not read: nothing to add
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            base = Path(os.path.realpath(value.strip()))
            # Only an interpreter's folder: the file may name anything.
            return base if any(_is_file(base / n) for n in ("python3", "python")) else None
    return None


def resolve_program(argv0: str, *, path_var: str, cwd: Path, private: list[Path]) -> Program:
    """Resolve the command the sandbox will start; raise UsageError when it cannot start.

    private folders (the key folder, the launcher's state) are never shown: a program that
    lives there is refused.
    """
    if "/" in argv0 and not os.path.isabs(argv0):
        # A path inside the worktree: the files are the base revision's, visible inside.
        return Program(path=Path(argv0), real=Path(argv0))
    if "/" in argv0:
        found = Path(argv0)
        if not _is_executable(found):
            raise UsageError(f"cannot run {argv0!r}: no executable file there, or one you "
                             "may not read", hint="give the path of an installed program, or "
                             "its name on PATH")  # fmt: skip
    else:
        located = find_on_path(argv0, path_var)
        if located is None:
            closed = unreadable_path_entries(path_var)
            also = (f" (skipped PATH folders you may not read: {', '.join(closed)})"
                    if closed else "")  # fmt: skip
            raise UsageError(f"cannot run {argv0!r}: no such program on PATH{also}",
                             hint="install it, or give its full path")  # fmt: skip
        found = located
    program = Program(path=found, real=Path(os.path.realpath(found)))
    _add(program, found, path_var, cwd, private, depth=0)
    return program


def _add(program: Program, found: Path, path_var: str, cwd: Path, private: list[Path],
         depth: int) -> None:  # fmt: skip
    real = Path(os.path.realpath(found))
    for folder in private:
        if _within(real, folder) or _within(found, folder):
            raise UsageError(f"cannot run {found}: it lives in gatekeeper's private folder "
                             f"{folder}, which the sandbox never shows")  # fmt: skip
    # A program in the user's checkout (a folder of it on PATH) is the repository's own file,
    # possibly an agent's committed symlink: it never picks an installation to show.
    in_checkout = _within(real, cwd) or _within(Path(os.path.abspath(found)), cwd)
    if not (in_checkout or any(_within(real, s) for s in SYSTEM_DIRS)):
        # The installation, and the file itself: the mount plan refuses an installation that
        # would show HOME or a shared folder of it, and then shows the file alone.
        for candidate in (installation_of(real), installation_of(Path(os.path.abspath(found))),
                          real):  # fmt: skip
            if candidate not in program.roots:
                program.roots.append(candidate)
        base = _venv_base(installation_of(real))
        if base is not None and not any(_within(base, s) for s in SYSTEM_DIRS):
            program.roots.append(installation_of(base / "python3"))
    if depth >= MAX_DEPTH:
        return
    words = _interpreter(real)
    if not words:
        return
    interpreter = words[0]
    if Path(interpreter).name == "env" and len(words) > 1:
        rest = [w for w in words[1:] if not w.startswith("-")]
        located = find_on_path(rest[0], path_var) if rest else None
        if located is None:
            raise UsageError(f"cannot run {found}: its interpreter {rest[0] if rest else '?'!r} "
                             "is not on PATH")  # fmt: skip
        _add(program, located, path_var, cwd, private, depth + 1)
    elif os.path.isabs(interpreter) and os.access(interpreter, os.X_OK):
        _add(program, Path(interpreter), path_var, cwd, private, depth + 1)
    else:
        raise UsageError(f"cannot run {found}: its interpreter {interpreter!r} does not exist")
