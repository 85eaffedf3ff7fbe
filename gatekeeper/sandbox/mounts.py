"""The bubblewrap boundary: which paths are visible, which are writable, what the agent's env is.

`plan_sandbox` turns a policy and a worktree into a `MountPlan` (bwrap arguments and an
environment); `launch.py` runs commands under it. Mount order matters: later mounts cover
earlier ones, so the plan goes from broad to narrow and ends with everything that must stay
read-only or hidden.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.errors import PolicyError, SandboxError
from gatekeeper.policy.model import Policy
from gatekeeper.policy.patterns import (
    covers_subtree,
    has_glob,
    is_explicit,
    matches_any,
    normalize,
    static_prefix,
)
from gatekeeper.sandbox.secrets import ETC_SECRETS, is_secret_name

SYSTEM_DIRS = ("usr", "etc", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "nix")

ENV_ALLOW = (
    "PATH", "LANG", "LANGUAGE", "TERM", "COLORTERM", "NO_COLOR", "TZ", "COLUMNS", "LINES",
    # toolchain locations (paths, never credentials)
    "PYENV_ROOT", "PYENV_VERSION", "NVM_DIR", "NVM_BIN", "NVM_INC", "CARGO_HOME",
    "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "GOROOT", "GOPATH", "JAVA_HOME", "VIRTUAL_ENV",
    "SOURCE_DATE_EPOCH",
)  # fmt: skip
# Locale variables by name: a prefix would let LC_ANYTHING carry a secret in.
ENV_ALLOW_LOCALE = (
    "LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES", "LC_NUMERIC", "LC_TIME", "LC_MONETARY",
    "LC_PAPER", "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE", "LC_MEASUREMENT", "LC_IDENTIFICATION",
)  # fmt: skip

# Toolchains that live under the home directory and need a companion folder besides their bin.
HOME_COMPANIONS = {".cargo": (".rustup",), ".rustup": (".cargo",)}
# Version managers shown as a whole (their folders hold toolchains, not projects).
HOME_TOOLCHAINS = (
    ".pyenv", ".nvm", ".cargo", ".rustup", ".rbenv", ".asdf", ".volta", ".bun", ".deno",
    ".sdkman", ".nodenv", ".goenv", ".jenv", ".fnm", ".juliaup", ".ghcup", ".opam", ".elan",
    ".dotnet", ".poetry", ".pixi", "go",
)  # fmt: skip


@dataclass
class MountPlan:
    """bwrap arguments (without the command) and the environment of the sandboxed process."""

    args: list[str]
    env: dict[str, str]
    worktree: Path
    writable: list[str] = field(default_factory=list)  # repo-relative dirs/files bound rw
    hidden: list[str] = field(default_factory=list)  # paths masked as secrets
    watches: dict[str, str] = field(default_factory=dict)  # stand-in -> hidden path
    toolchains: list[str] = field(default_factory=list)


def bwrap_path() -> str:
    """The bwrap executable; raise SandboxError with an install command when it is missing."""
    found = shutil.which("bwrap")
    if not found:
        raise SandboxError(
            "bubblewrap (bwrap) is not installed, so the sandbox cannot be built",
            hint="install it: `sudo apt-get install bubblewrap` (Debian/Ubuntu), "
            "`sudo dnf install bubblewrap` (Fedora), `sudo pacman -S bubblewrap` (Arch)",
        )
    return found


def bwrap_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return "unknown"
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", out.stdout)
    return match.group(1) if match else "unknown"


def _is_within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


@dataclass
class _Tree:
    """One walk of the worktree: files, folders and symlinks by repo-relative path."""

    dirs: list[str]
    files: list[str]
    links: dict[str, str]


def _walk(root: Path) -> _Tree:
    dirs: list[str] = []
    files: list[str] = []
    links: dict[str, str] = {}
    for current, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(current, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        if not rel_dir:
            dirnames[:] = [d for d in dirnames if d != ".git"]
            filenames = [f for f in filenames if f != ".git"]
        keep = []
        for name in dirnames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if os.path.islink(os.path.join(current, name)):
                links[rel] = os.readlink(os.path.join(current, name))
            else:
                dirs.append(rel)
                keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = os.path.join(current, name)
            if os.path.islink(full):
                links[rel] = os.readlink(full)
            else:
                files.append(rel)
    return _Tree(dirs, files, links)


class _Args:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, *items: str | os.PathLike[str]) -> None:
        self.items.extend(os.fspath(i) for i in items)


def _system_mounts(args: _Args) -> None:
    for name in SYSTEM_DIRS:
        path = Path("/") / name
        if path.is_symlink():
            args.add("--symlink", os.readlink(path), path)
        elif path.is_dir():
            args.add("--ro-bind", path, path)
    args.add("--proc", "/proc", "--dev", "/dev")
    args.add("--tmpfs", "/tmp", "--dir", "/var", "--tmpfs", "/var/tmp", "--dir", "/run")
    args.add("--symlink", "../run", "/var/run")


class Masks:
    """Empty, read-only stand-ins for secrets, one per hidden path, so opening one is visible.

    Each stand-in is a distinct file or folder in the launcher's scratch space; the supervisor
    watches them with inotify and records every open as a secret lookup.
    """

    def __init__(self, scratch: Path) -> None:
        self.dir = scratch / "masks"
        self.dir.mkdir(exist_ok=True)
        self.count = 0
        self.watches: dict[str, str] = {}  # stand-in on the host -> the path it hides

    def _new(self) -> Path:
        self.count += 1
        return self.dir / str(self.count)

    def file(self, shown: str) -> Path:
        path = self._new()
        path.write_bytes(b"")
        os.chmod(path, 0o444)
        self.watches[str(path)] = shown
        return path

    def folder(self, shown: str, files: tuple[str, ...] = ()) -> Path:
        path = self._new()
        path.mkdir()
        for name in files:
            inner = path / name
            inner.write_bytes(b"")
            os.chmod(inner, 0o444)
            self.watches[str(inner)] = f"{shown}/{name}"
        os.chmod(path, 0o555)
        self.watches[str(path)] = shown
        return path

    def hide(self, args: _Args, path: Path, hidden: list[str], shown: str | None = None) -> None:
        """Cover an existing path with an empty read-only file or folder."""
        if path.is_symlink() or not path.exists():
            return
        label = shown or str(path)
        stand_in = self.folder(label) if path.is_dir() else self.file(label)
        args.add("--ro-bind", stand_in, path)
        hidden.append(str(path))


# Credentials a tool looks for in a home folder: in the fresh HOME they are empty, read-only
# stand-ins, so a lookup is recorded rather than silently missing.
HOME_DECOYS: dict[str, tuple[str, ...]] = {
    ".ssh": ("id_rsa", "id_ed25519", "id_ecdsa", "id_dsa", "config"),
    ".aws": ("credentials", "config"),
    ".gnupg": (),
    ".docker": ("config.json",),
    ".kube": ("config",),
    ".config/gcloud": ("credentials.db", "application_default_credentials.json"),
}
HOME_DECOY_FILES = (".netrc", ".git-credentials", ".pypirc", ".pgpass")


def _root_of(entry: Path) -> Path:
    """The installation a PATH entry belongs to: `X/bin` or `X/shims` -> X, unless X is a home."""
    parent = entry.parent
    if entry.name not in ("bin", "sbin", "shims") or parent == Path("/"):
        return entry
    if parent == Path("/root") or parent.parent == Path("/home"):
        return entry
    return parent


CREDENTIAL_KEY = re.compile(r"^(credential\..*|http\..*extraheader|.*\.password|.*token.*)$", re.I)
URL_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@]+@", re.I)


def sanitized_git_config(source: Path, target: Path) -> Path:
    """A copy of the repository's config without credentials: no credential.* settings, no
    extra HTTP headers (where CI keeps its token), no user:password@ in remote URLs."""
    shutil.copyfile(source, target)
    out = subprocess.run(["git", "config", "--file", str(target), "--list", "-z"],
                         capture_output=True, check=False).stdout  # fmt: skip
    for record in out.split(b"\0"):
        if not record:
            continue
        key, _, value = record.decode("utf-8", "replace").partition("\n")
        if CREDENTIAL_KEY.match(key):
            subprocess.run(["git", "config", "--file", str(target), "--unset-all", key],
                           capture_output=True, check=False)  # fmt: skip
        elif key.endswith(("url", "pushurl")) and URL_USERINFO.match(value):
            clean = URL_USERINFO.sub(r"\1", value)
            subprocess.run(["git", "config", "--file", str(target), "--replace-all", key, clean,
                            f"^{re.escape(value)}$"], capture_output=True, check=False)  # fmt: skip
    os.chmod(target, 0o444)
    return target


def _secrets_below(root: Path, depth: int, budget: int = 20000) -> list[Path]:
    """Files and folders with credential names under root, searched depth levels deep."""
    found: list[Path] = []
    level = [root] if root.is_dir() else []
    for _ in range(depth):
        following: list[Path] = []
        for folder in level:
            try:
                children = sorted(folder.iterdir())
            except OSError:
                continue
            for child in children:
                budget -= 1
                if budget < 0:
                    return found
                if is_secret_name(child.name) or child.name == "credentials":
                    found.append(child)
                elif child.is_dir() and not child.is_symlink() and child.name != ".git":
                    following.append(child)
        level = following
    return found


def _toolchain_roots(home: Path, path_var: str, skip: list[Path]) -> list[Path]:
    """Folders to show read-only so that every program on PATH keeps working."""
    roots: list[Path] = []

    def add(candidate: Path) -> None:
        if not candidate.exists() or any(_is_within(candidate, s) for s in skip):
            return
        if candidate not in roots:
            roots.append(candidate)

    def add_home_entry(path: Path) -> None:
        rel = path.relative_to(home)
        if not rel.parts:
            return
        top = home / rel.parts[0]
        if rel.parts[0] == ".local":
            for sub in ("bin", "lib"):
                add(home / ".local" / sub)
            return
        if rel.parts[0] in HOME_TOOLCHAINS:
            # A version manager's whole folder: its shims call into the rest of it.
            add(top)
            for companion in HOME_COMPANIONS.get(rel.parts[0], ()):
                add(home / companion)
            return
        # Anything else under HOME: only the installation the PATH entry belongs to, never
        # the top-level folder (which may hold other projects and their secrets).
        root = _root_of(path)
        add(root if root != home else path)

    system = tuple(Path("/") / d for d in SYSTEM_DIRS)
    for entry in path_var.split(":"):
        if not entry or not os.path.isabs(entry):
            continue
        for path in {Path(entry), Path(os.path.realpath(entry))}:
            if not path.is_dir() or any(_is_within(path, s) for s in system):
                continue
            if _is_within(path, home) and path != home:
                add_home_entry(path)
            elif str(path).startswith(("/tmp", "/proc", "/dev", "/run", "/var/run")):
                continue
            else:
                add(_root_of(path))
            # A virtual environment also needs the interpreter it was made from.
            cfg = path.parent / "pyvenv.cfg"
            if cfg.exists():
                for line in cfg.read_text(errors="replace").splitlines():
                    key, _, value = line.partition("=")
                    if key.strip() == "home" and value.strip():
                        base = Path(os.path.realpath(value.strip()))
                        if _is_within(base, home) and base != home:
                            add_home_entry(base)
                        elif not any(_is_within(base, s) for s in system):
                            add(base.parent)
    return roots


def _check_inside(worktree: Path, rel: str, what: str) -> Path:
    """The real path of rel in the worktree; raise PolicyError if it leaves the worktree."""
    target = worktree / rel
    real = Path(os.path.realpath(target))
    if not _is_within(real, worktree) or _is_within(real, worktree / ".git"):
        raise PolicyError(
            f"paths.{what} entry {rel!r} resolves through a symlink to {real}, outside the "
            "repository",
            hint="policy paths must stay inside the repository; remove the entry or the symlink",
        )
    return real


def _worktree_mounts(
    args: _Args, worktree: Path, policy: Policy, tree: _Tree, plan: MountPlan, masks: Masks
) -> None:
    reads = [normalize(p) for p in policy.paths.read]
    writes = [normalize(p) for p in policy.paths.write]
    visible = reads + writes
    whole = any(covers_subtree(p, "") for p in visible)

    if whole:
        args.add("--ro-bind", worktree, worktree)
    else:
        # An empty read-only folder with only the readable parts bound into it.
        args.add("--tmpfs", worktree)
        prefixes = [static_prefix(p) for p in visible]

        def may_hold(rel: str) -> bool:
            return any(not p or p.startswith(rel + "/") or rel.startswith(p) for p in prefixes)

        bound: list[str] = []
        for rel in sorted(tree.dirs + tree.files + list(tree.links)):
            if any(rel.startswith(b + "/") for b in bound):
                continue
            if rel in tree.links:
                if matches_any(visible, rel):
                    args.add("--symlink", tree.links[rel], worktree / rel)
                continue
            is_dir = rel in tree.dirs
            if is_dir and any(covers_subtree(p, rel) for p in visible):
                args.add("--ro-bind", worktree / rel, worktree / rel)
                bound.append(rel)
            elif is_dir and may_hold(rel):
                args.add("--dir", worktree / rel)
            elif not is_dir and matches_any(visible, rel):
                args.add("--ro-bind", worktree / rel, worktree / rel)

    # Writable parts: directory-granular; finer globs are enforced when the result is committed.
    targets: list[str] = []
    for pattern in writes:
        prefix = static_prefix(pattern)
        if prefix and prefix != pattern or (prefix and has_glob(pattern)):
            target = prefix  # a folder the glob lives in
            _check_inside(worktree, target, "write")
            if not (worktree / target).exists():
                (worktree / target).mkdir(parents=True, exist_ok=True)
        elif prefix:
            target = prefix
            while target and not (worktree / target).exists():
                target = target.rpartition("/")[0]
            if target:
                _check_inside(worktree, target, "write")
        else:
            target = ""
        if target in targets:
            continue
        targets.append(target)
    for target in sorted(targets, key=lambda t: (t.count("/"), t)):
        if target and any(t == "" or target.startswith(t + "/") for t in targets if t != target):
            continue
        path = worktree / target if target else worktree
        args.add("--bind", path, path)
        plan.writable.append(target or ".")

    # Read-only again: protected paths the policy does not name explicitly, and the .git link.
    for rel in sorted(tree.dirs + tree.files):
        protected = policy.paths.protected_patterns
        if matches_any(protected, rel) and not any(is_explicit(p, rel, protected) for p in writes):
            parent = rel.rpartition("/")[0]
            if parent and matches_any(policy.paths.protected_patterns, parent):
                continue
            if any(t == "" or rel == t or rel.startswith(t + "/") for t in targets):
                args.add("--ro-bind", worktree / rel, worktree / rel)
    args.add("--ro-bind", worktree / ".git", worktree / ".git")

    extra = tuple(policy.secrets.extra)
    names = tuple(e for e in extra if "/" not in e)
    paths = [e for e in extra if "/" in e]
    masked: list[str] = []
    for rel in sorted(tree.dirs + tree.files):
        if any(rel.startswith(h + "/") for h in masked):
            continue
        if is_secret_name(rel.rpartition("/")[2], names) or matches_any(paths, rel):
            masks.hide(args, worktree / rel, [], shown=str(worktree / rel))
            masked.append(rel)
    plan.hidden.extend(masked)


def build_env(policy: Policy, home: Path, run_id: str) -> dict[str, str]:
    """The agent's environment: an allowlist, a fresh HOME, no way to a credential helper."""
    env: dict[str, str] = {}
    allowed = set(ENV_ALLOW) | set(ENV_ALLOW_LOCALE) | set(policy.secrets.pass_env)
    for name, value in os.environ.items():
        if name in allowed:
            env[name] = value
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "agent"
    env.update(
        HOME=str(home), USER=user, LOGNAME=user, SHELL="/bin/sh", TMPDIR="/tmp",
        GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0",
        # An empty credential.helper resets the list, so no configured helper is ever asked.
        GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="credential.helper", GIT_CONFIG_VALUE_0="",
        GATEKEEPER_RUN_ID=run_id, GATEKEEPER_SANDBOX="1",
    )  # fmt: skip
    return env


def plan_sandbox(
    *,
    worktree: Path,
    git_common_dir: Path,
    policy: Policy,
    run_id: str,
    scratch: Path,
    private_dirs: list[Path],
    user_checkout: Path | None = None,
    extra_args: list[str] | None = None,
    programs: list[Path] | None = None,
) -> MountPlan:
    """Build the mount plan for a run in worktree.

    private_dirs (the key folder, the launcher's state) are never shown, even when they lie
    beneath a folder that is. Raises PolicyError when a policy path leaves the repository.
    """
    home = Path(os.path.realpath(os.environ.get("HOME") or "/root"))
    worktree = Path(os.path.realpath(worktree))
    git_common_dir = Path(os.path.realpath(git_common_dir))
    masks = Masks(scratch)
    env = build_env(policy, home, run_id)
    plan = MountPlan(args=[], env=env, worktree=worktree)
    args = _Args()
    _system_mounts(args)
    for secret in ETC_SECRETS:
        masks.hide(args, Path(secret), [])

    args.add("--tmpfs", home)
    for folder, names in HOME_DECOYS.items():
        args.add("--ro-bind", masks.folder(str(home / folder), names), home / folder)
    for name in HOME_DECOY_FILES:
        args.add("--ro-bind", masks.file(str(home / name)), home / name)
    skip = [Path(os.path.realpath(p)) for p in private_dirs]
    if user_checkout is not None:
        skip.append(Path(os.path.realpath(user_checkout)))
    roots = _toolchain_roots(home, env["PATH"], skip)
    # The agent's own installation, wherever it lives (see sandbox/programs.py).
    roots += [r for r in programs or [] if r not in roots and r.exists()]
    for root in roots:
        args.add("--ro-bind", root, root)
        plan.toolchains.append(str(root))
        # Credential files that sit in a toolchain folder (e.g. ~/.cargo/credentials.toml).
        depth = 1 if root.name in HOME_TOOLCHAINS else 4
        for secret in _secrets_below(root, depth):
            masks.hide(args, secret, plan.hidden)

    # The user's checkout is a read-only empty folder: nothing of it shows, nothing lands in it.
    if user_checkout is not None:
        shadow = scratch / "checkout"
        (shadow / ".git").mkdir(parents=True)
        os.chmod(shadow, 0o555)
        checkout = Path(os.path.realpath(user_checkout))
        args.add("--ro-bind", shadow, checkout)
    # The repository's git dir, read-only: log, diff and status work; nothing can be changed.
    args.add("--ro-bind", git_common_dir, git_common_dir)
    config = git_common_dir / "config"
    if config.is_file() and not config.is_symlink():
        args.add("--ro-bind", sanitized_git_config(config, scratch / "git-config"), config)
    tree = _walk(worktree)
    _worktree_mounts(args, worktree, policy, tree, plan, masks)
    args.add(*(extra_args or []))
    if not any(covers_subtree(p, "") for p in [*policy.paths.read, *policy.paths.write]):
        args.add("--remount-ro", worktree)

    # Whatever lies under a shown folder but is private to the launcher stays hidden.
    shown = [home, git_common_dir, worktree, *roots, Path("/etc"), Path("/usr"), Path("/opt")]
    for private in skip:
        if _is_within(worktree, private) or not private.exists():
            continue
        if any(_is_within(private, s) for s in shown if s != home):
            args.add("--tmpfs", private, "--remount-ro", private)
            plan.hidden.append(str(private))

    args.add("--remount-ro", "/", "--chdir", worktree)
    plan.args = args.items
    plan.watches = masks.watches
    return plan


def namespace_args() -> list[str]:
    """Namespaces and process hygiene that every sandboxed process inherits."""
    return [
        "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
        "--new-session", "--cap-drop", "ALL", "--hostname", "gatekeeper",
    ]  # fmt: skip
