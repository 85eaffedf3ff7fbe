"""The bubblewrap boundary: which paths are visible, which are writable, what the agent's env is.

`plan_sandbox` turns a policy and a worktree into a `MountPlan` (bwrap arguments and an
environment); `launch.py` runs commands under it. Mount order matters: later mounts cover
earlier ones, so the plan goes from broad to narrow and ends with everything that must stay
read-only or hidden.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from gatekeeper.errors import PolicyError, SandboxError
from gatekeeper.policy import patterns as patterns_module
from gatekeeper.policy.model import Policy
from gatekeeper.policy.patterns import (
    covers_subtree,
    explicit_rule,
    has_glob,
    is_protected,
    matches_any,
    normalize,
    static_prefix,
    subtree_rule,
)
from gatekeeper.sandbox import secrets as secrets_module
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
    # O_PATH descriptors bwrap binds from (--bind-fd): inherited by bwrap, closed by close().
    fds: list[int] = field(default_factory=list)
    # Paths the launcher created so that a write entry naming them can be bound: (rel, kind).
    created: list[tuple[str, str]] = field(default_factory=list)
    # Empty read-only stand-ins for protected paths that did not exist (repo-relative).
    stand_ins: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Close the descriptors the plan holds; the plan cannot be run afterwards."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()


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


@lru_cache(maxsize=8)
def bwrap_version(path: str) -> str:
    """The version bubblewrap at path gives (asked once per process and path)."""
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
    cache: Path | None = None  # the launcher-private file this walk was read from

    def scan(
        self, protected: tuple[str, ...], names: tuple[str, ...], paths: tuple[str, ...]
    ) -> tuple[list[str], list[str]]:
        """The folders and files (in byte order) that are protected, and those that are
        secrets by name or by one of paths.

        Asked of every path of the tree, which for 10,000 files is most of a plan's time; a
        walk read from its cache keeps the answer beside it for the same patterns (a base's
        tree never changes).
        """
        memo: Path | None = None
        if self.cache is not None and _scan_code():
            key = json.dumps([_scan_code(), protected, names, paths]).encode()
            memo = self.cache.with_name(f"scan-{hashlib.sha256(key).hexdigest()[:32]}.json")
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                data = json.loads(memo.read_text())
                return [str(p) for p in data["protected"]], [str(p) for p in data["secrets"]]
        every = sorted(self.dirs + self.files)
        hits = [rel for rel in every if is_protected(protected, rel)]
        secrets = [rel for rel in every if is_secret_name(rel.rpartition("/")[2], names)
                   or matches_any(paths, rel)]  # fmt: skip
        if memo is not None:
            _write_private(memo, {"protected": hits, "secrets": secrets})
        return hits, secrets


@lru_cache(maxsize=1)
def _scan_code() -> str:
    """A digest of the code that decides what is protected or secret: a kept scan made by
    another version of it is never used."""
    digest = hashlib.sha256()
    try:
        for module in (patterns_module, secrets_module):
            digest.update(Path(module.__file__ or "").read_bytes())
    except OSError:
        return ""  # not readable: nothing is kept
    return digest.hexdigest()


def _write_private(path: Path, data: object) -> None:
    """data as JSON at path, whole or not at all (a launcher-private cache; errors ignored)."""
    with contextlib.suppress(OSError):
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)


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


def _cached_walk(root: Path, cache: Path | None) -> _Tree:
    """_walk(root), kept in cache (see plan_sandbox) and read from it when it is there."""
    if cache is not None:
        try:
            data = json.loads(cache.read_text())
            return _Tree(list(data["dirs"]), list(data["files"]), dict(data["links"]), cache)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, or unreadable: walk
    tree = _walk(root)
    if cache is not None:
        _write_private(cache, {"dirs": tree.dirs, "files": tree.files, "links": tree.links})
        tree.cache = cache
    return tree


class _Args:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.fds: list[int] = []

    def add(self, *items: str | os.PathLike[str]) -> None:
        self.items.extend(os.fspath(i) for i in items)

    def bind_fd(self, fd: int, dest: str | os.PathLike[str], *, writable: bool) -> None:
        """Bind the object fd refers to; bwrap never resolves a source path for it."""
        self.fds.append(fd)
        self.add("--bind-fd" if writable else "--ro-bind-fd", str(fd), dest)


_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def open_beneath(root_fd: int, rel: str) -> int | None:
    """An O_PATH descriptor of rel below the folder root_fd, reached without following links.

    Each component is opened with O_NOFOLLOW relative to the one before, so a symlink anywhere
    on the way (planted by the agent, or committed) is never followed. None when a component is
    a symlink, is missing, or is not a folder where one is needed.
    """
    parts = [p for p in rel.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return None
    fd = os.dup(root_fd)
    try:
        for part in parts:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise NotADirectoryError(part)
            following = os.open(part, _PATH, dir_fd=fd)
            os.close(fd)
            fd = following
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise IsADirectoryError(rel)  # any OSError: a link is never a bind source
    except OSError:
        os.close(fd)
        return None
    return fd


def open_root(path: Path) -> int:
    """An O_PATH descriptor of a folder the launcher made (its last component is no link)."""
    return os.open(path, _PATH | os.O_DIRECTORY)


# Descriptors kept free for the launcher beside the bind mounts' (git, the proxy, the
# supervisor's pipes, the receipt).
FD_RESERVE = 256


def _ensure_fd_room(count: int, required: bool = True) -> None:
    """Raise the soft limit on open files so that count bind descriptors fit, or fail (only
    when required: otherwise as far as the hard limit lets it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = count + FD_RESERVE
    if need <= soft or soft == resource.RLIM_INFINITY:
        return
    if hard != resource.RLIM_INFINITY and need > hard:
        if not required:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return
        raise SandboxError(
            f"the open-file limit ({hard}) is too low for this run: its mount plan holds "
            f"{count} bind mount(s), and the launcher {FD_RESERVE} descriptors more",
            hint="name folders in paths.write (`src/**`) rather than many single files"
            if count > FD_RESERVE
            else "raise the limit, `ulimit -n 4096` (LimitNOFILE= for a service)",
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _system_mounts(args: _Args) -> None:
    for name in SYSTEM_DIRS:
        path = Path("/") / name
        if path.is_symlink():
            args.add("--symlink", os.readlink(path), path)
        elif path.is_dir():
            args.add("--ro-bind", path, path)
    # /proc read-only: the kernel opens nothing there for writing (EROFS), /proc/PID/mem
    # included, through which one process of the sandbox could write over another's memory
    # (its argv after the supervisor's check, say) with no ptrace at all.
    args.add("--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev")
    args.add("--tmpfs", "/tmp", "--dir", "/var", "--tmpfs", "/var/tmp", "--dir", "/run")
    args.add("--symlink", "../run", "/var/run")


def _empty_file(path: Path) -> None:
    """A new, empty, read-only file at path (never one that was there, nor a link's target)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    try:
        os.fchmod(fd, 0o444)  # whatever the umask took away
    finally:
        os.close(fd)


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
        _empty_file(path)
        self.watches[str(path)] = shown
        return path

    def folder(self, shown: str, files: tuple[str, ...] = ()) -> Path:
        path = self._new()
        path.mkdir(0o700)
        for name in files:
            inner = path / name
            _empty_file(inner)
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


URL_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", re.I)
_REMOTE_KEY = re.compile(r"^remote\.([A-Za-z0-9_][A-Za-z0-9._-]{0,99})\.(url|pushurl|fetch)$")
_REFSPEC = re.compile(r"^\+?[A-Za-z0-9_./*-]+(:[A-Za-z0-9_./*-]+)?$")
_WORD = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
# Settings that change how git compares the worktree with the index; nothing else is copied.
_CORE_KEYS = (
    "core.autocrlf", "core.eol", "core.safecrlf", "core.ignorecase", "core.precomposeunicode",
    "core.symlinks", "core.checkstat", "core.trustctime", "core.quotepath",
)  # fmt: skip


def _config_value(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _clean_url(url: str) -> str | None:
    """A remote URL without user:password@ and without a query; None if it still looks secret."""
    clean = URL_USERINFO.sub(r"\1", url).partition("?")[0].partition("#")[0]
    if any(c in clean for c in "\n\0") or re.search(r"token|passw|secret|apikey", clean, re.I):
        return None
    return clean


def agent_git_config(source: Path, limit: int = 1 << 20) -> str:
    """The settings of the repository's config that the agent's git may see, as config text.

    An allowlist, read with includes resolved: remote names, URLs (without credentials) and
    fetch refspecs, a few worktree-comparison settings and the object format. Everything else
    (credential.*, http.*extraHeader, url.<base>.insteadOf whose name may carry a token,
    includeIf, core.sshCommand, core.askPass, hooks, filters, aliases) is left out.
    """
    if not source.is_file() or source.is_symlink() or source.stat().st_size > limit:
        return ""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    out = subprocess.run(["git", "config", "--file", str(source), "--includes", "--list", "-z"],
                         capture_output=True, check=False, env=env).stdout  # fmt: skip
    sections: dict[str, list[str]] = {}
    for record in out[: 4 * limit].split(b"\0"):
        key, _, value = record.decode("utf-8", "replace").partition("\n")
        remote = _REMOTE_KEY.match(key)
        if remote:
            name, field_name = remote.groups()
            shown = _clean_url(value) if field_name != "fetch" else value
            if shown is None or (field_name == "fetch" and not _REFSPEC.match(value)):
                continue
            header = f'[remote "{name}"]'
            sections.setdefault(header, []).append(f"\t{field_name} = {_config_value(shown)}")
        elif key.lower() in _CORE_KEYS and _WORD.match(value):
            sections.setdefault("[core]", []).append(f"\t{key.split('.', 1)[1]} = {value}")
        elif key.lower() == "extensions.objectformat" and value in ("sha1", "sha256"):
            sections.setdefault("[extensions]", []).append(f"\tobjectformat = {value}")
    return "".join(f"{header}\n" + "".join(f"{line}\n" for line in lines)
                   for header, lines in sections.items())  # fmt: skip


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


# System folders shown whole that are searched for what a run must not read (see
# _search_system_folders): what an administrator keeps. The rest of /usr and the library
# folders hold what packages install, and are shown as they are.
SEARCHED_SYSTEM_DIRS = ("/etc", "/opt", "/usr/local")
SYSTEM_SEARCH_SECONDS = 60
NOT_SECRETS = (".env.example", ".env.sample", ".env.template")  # as is_secret_name


_started_search: list[subprocess.Popen[bytes] | None] = []


def start_system_search(repo: Path) -> None:
    """Start the next plan's search of the system folders now (_search_system_folders), past
    the repository at repo: a launcher calls it first thing, so that find runs while the run
    is being prepared."""
    if not _started_search:
        _started_search.append(_search_system_folders([Path(os.path.realpath(repo))]))


def _glob_escaped(path: Path) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", os.fspath(path))


def _search_system_folders(skip: list[Path]) -> subprocess.Popen[bytes] | None:
    """find(1), started on SEARCHED_SYSTEM_DIRS, printing what a run must not read there: each
    file or folder with a credential's name, each folder not every user may list and enter,
    and each file not every user may read (a run as root would read them: the sandbox's root
    is the host's). Neither kind of folder is entered, nor the folders in skip (a repository
    there, the launcher's own: the plan shows them otherwise, or not at all). None when there
    is no find."""
    folders = [d for d in SEARCHED_SYSTEM_DIRS if os.path.isdir(d)]
    finder = shutil.which("find", path="/usr/bin:/bin")
    if not folders or finder is None:
        return None
    skipped: list[str] = []
    for folder in skip:
        if any(_is_within(folder, Path(d)) for d in folders):
            skipped += [*(["-o"] if skipped else []), "-path", _glob_escaped(folder)]
    names: list[str] = []
    for name in (*secrets_module.SECRET_NAMES, "credentials"):
        names += [*(["-o"] if names else []), "-name", name]
    for name in NOT_SECRETS:
        names += ["!", "-name", name]
    expression = [
        *(["(", *skipped, ")", "-prune", "-o"] if skipped else []),
        "(", "(", *names, ")", ")", "-prune", "-print0",
        "-o", "-type", "d", "!", "-perm", "-o=rx", "-prune", "-print0",
        "-o", "-type", "f", "!", "-perm", "-o=r", "-print0",
    ]  # fmt: skip
    return subprocess.Popen(
        [finder, "-H", *folders, "-mindepth", "1", *expression],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
    )  # fmt: skip


def _system_folders_found(search: subprocess.Popen[bytes] | None) -> list[Path]:
    """What _search_system_folders printed."""
    if search is None:
        return []
    try:
        out, _ = search.communicate(timeout=SYSTEM_SEARCH_SECONDS)
    except subprocess.TimeoutExpired:
        search.kill()
        search.wait()
        raise SandboxError(
            f"searching {', '.join(SEARCHED_SYSTEM_DIRS)} for what a run must not read took "
            f"over {SYSTEM_SEARCH_SECONDS} s",
            hint="a network or very large file system may be mounted there",
        ) from None
    return [Path(os.fsdecode(p)) for p in out.split(b"\0") if p]


# Variables that name a tool's installation (passed through by the environment allowlist).
TOOL_HOME_VARS = ("RUSTUP_HOME", "CARGO_HOME", "GOROOT", "JAVA_HOME", "PYENV_ROOT", "NVM_DIR")
SCRATCH_PREFIXES = ("/tmp/", "/var/tmp/")


# Folders of HOME that hold many things besides an installation.
HOME_SHARED = (".local", ".local/share", ".local/state", ".local/lib", ".config", ".cache")


def _shows_itself_only(root: Path, home: Path, skip: list[Path]) -> bool:
    """False when showing root (as named, or where it leads) would show HOME or a folder above
    it, a private folder, a folder holding one, or the whole filesystem."""
    for form in (Path(os.path.normpath(root)), Path(os.path.realpath(root))):
        if form == Path("/") or _is_within(home, form):
            return False
        if any(_is_within(form, s) or _is_within(s, form) for s in skip):
            return False
    return True


def _program_root(root: Path, home: Path, skip: list[Path]) -> Path | None:
    """root, or None when showing it would show HOME, a folder above it, a shared folder of
    HOME or a private folder (then the program is not shown; `run` said what it found)."""
    if not root.exists() or not _shows_itself_only(root, home, skip):
        return None
    for form in (Path(os.path.normpath(root)), Path(os.path.realpath(root))):
        if _is_within(form, home):
            rel = form.relative_to(home)
            if rel.as_posix() in HOME_SHARED:
                return None
            if len(rel.parts) == 1 and form.is_dir() and rel.parts[0] not in HOME_TOOLCHAINS:
                return None  # a top-level folder of HOME: other projects, other secrets
    return Path(os.path.normpath(root))


def _toolchain_roots(
    home: Path, path_var: str, skip: list[Path], env: dict[str, str] | None = None
) -> list[Path]:
    """Folders to show read-only so that every program on PATH keeps working.

    Never HOME itself, a folder that holds HOME (`/`, `/home`, an entry of `$HOME` on PATH)
    or one of the launcher's private folders: an installation is shown, never its neighbours.
    """
    roots: list[Path] = []
    system = tuple(Path("/") / d for d in SYSTEM_DIRS)

    def add(candidate: Path) -> None:
        try:
            if not candidate.exists():
                return
        except OSError:
            return
        candidate = Path(os.path.normpath(candidate))  # `$HOME/..` is HOME's parent
        if candidate in roots or not _shows_itself_only(candidate, home, skip):
            return
        if str(candidate) + "/" in SCRATCH_PREFIXES:
            return
        roots.append(candidate)
        for companion in HOME_COMPANIONS.get(candidate.name, ()):
            add(candidate.parent / companion)

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

    def add_entry(path: Path) -> None:
        try:
            if not path.is_dir() or any(_is_within(path, s) for s in system):
                return
        except OSError:
            return  # a PATH entry this user cannot read: nothing to show
        if any(_is_within(path, s) or _is_within(Path(os.path.realpath(path)), s) for s in skip):
            return  # in the user's checkout or a private folder: nothing of it, no pyvenv.cfg
        if _is_within(path, home):
            if path != home:
                add_home_entry(path)
        elif str(path).startswith(("/proc", "/dev", "/run", "/var/run")):
            return
        else:
            # Under /tmp too: the installation (X for X/bin), never /tmp itself.
            add(_root_of(path))
        # A virtual environment also needs the interpreter it was made from.
        cfg = path.parent / "pyvenv.cfg"
        try:
            lines = cfg.read_text(errors="replace").splitlines() if cfg.is_file() else []
        except OSError:
            lines = []
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                base = Path(os.path.realpath(value.strip()))
                if not any((base / n).is_file() for n in ("python3", "python")):
                    continue  # not an interpreter's folder: the file names nothing to show
                if _is_within(base, home) and base != home:
                    add_home_entry(base)
                elif not any(_is_within(base, s) for s in system):
                    add(base.parent)

    for entry in path_var.split(":"):
        if not entry or not os.path.isabs(entry):
            continue
        for path in {Path(entry), Path(os.path.realpath(entry))}:
            add_entry(path)
    for name in TOOL_HOME_VARS:
        value = (env or {}).get(name)
        if value and os.path.isabs(value):
            folder = Path(os.path.realpath(value))
            if _is_within(folder, home) and folder != home:
                add_home_entry(folder)
            elif not any(_is_within(folder, s) for s in system):
                add(folder)
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


def _looks_like_file(name: str) -> bool:
    """A write entry's last segment with an extension (`todo.md`) names a file, else a folder."""
    stem, ext = os.path.splitext(name)
    return bool(stem) and bool(ext)


def _create_write_targets(root_fd: int, worktree: Path, writes: list[str], plan: MountPlan,
                          files: frozenset[str] = frozenset()) -> None:  # fmt: skip
    """Create what write entries name but the worktree lacks, so it can be bound writable.

    `notes/todo.md` becomes an empty file (its folders created as needed, read-only), `build`
    and `out/**` empty folders; an entry in files (an approved write of a file: `Makefile`)
    an empty file too. A glob that does not cover a whole folder (`src/*.py`) creates
    nothing: new files it matches cannot be created (the folder stays read-only). Nothing is
    created through a symlink. What was created is listed in plan.created.
    """
    for pattern in writes:
        prefix = static_prefix(pattern)
        glob = has_glob(pattern)
        if not prefix or (glob and not covers_subtree(pattern, prefix)):
            continue
        _check_inside(worktree, prefix, "write")
        parts = prefix.split("/")
        fd = os.dup(root_fd)
        try:
            for depth, part in enumerate(parts, 1):
                rel = "/".join(parts[:depth])
                try:
                    following = os.open(part, _PATH, dir_fd=fd)
                except FileNotFoundError:
                    if (
                        depth == len(parts)
                        and not glob
                        and (prefix in files or _looks_like_file(part))
                    ):
                        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                         | os.O_CLOEXEC, 0o644, dir_fd=fd))  # fmt: skip
                        plan.created.append((rel, "file"))
                    else:
                        os.mkdir(part, 0o755, dir_fd=fd)
                        plan.created.append((rel, "dir"))
                    following = os.open(part, _PATH, dir_fd=fd)
                os.close(fd)
                fd = following
                if depth < len(parts) and not stat.S_ISDIR(os.fstat(fd).st_mode):
                    break  # a file or a link on the way: nothing beneath it is created
        finally:
            os.close(fd)


def _protected_stand_ins(
    root_fd: int, writes: list[str], protected: tuple[str, ...], existing: set[str],
    dirs: set[str], in_folder: Callable[[str], bool], plan: MountPlan,
) -> list[str]:  # fmt: skip
    """Create an empty stand-in folder for each protected folder missing inside a writable one.

    Only for protected entries that name one folder (`.github/**`, `.vscode/**`): an empty
    folder is made there (its missing folders too) and then bound read-only, so nothing can be
    created in it. A missing protected file (`.gitlab-ci.yml`, `.mcp.json`, `.aider.conf.yml`)
    gets no stand-in: tools read those names, and an empty one breaks them (aider refuses an
    empty `.aider.conf.yml`); creating one is refused by the supervisor, never committed and
    blocked by the gate. Entries that match at any depth (`**/.gitattributes`) cannot be held
    this way either. Returns the stand-ins; they are listed in plan.created and plan.stand_ins.
    """
    made: list[str] = []
    named_explicitly = explicit_rule(tuple(writes), tuple(protected))
    for pattern in protected:
        pattern = normalize(pattern)
        target = static_prefix(pattern)
        if not target or pattern != f"{target}/**" or target in existing:
            continue
        if named_explicitly(target):
            continue
        parts = target.split("/")
        # The nearest folder that exists must be a real, writable one; otherwise nothing can be
        # created there anyway.
        depth = 0
        while depth < len(parts) - 1 and "/".join(parts[: depth + 1]) in existing:
            depth += 1
        nearest = "/".join(parts[:depth])
        if (nearest and nearest not in dirs) or not in_folder(nearest):
            continue  # a file or a link on the way, or a read-only folder: nothing to hold
        fd = open_beneath(root_fd, nearest)
        if fd is None:
            continue
        try:
            for index in range(depth, len(parts)):
                rel = "/".join(parts[: index + 1])
                last = index == len(parts) - 1
                if last and pattern == target:
                    os.close(os.open(parts[index], os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                     | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444, dir_fd=fd))  # fmt: skip
                    plan.created.append((rel, "file"))
                else:
                    os.mkdir(parts[index], 0o755 if not last else 0o555, dir_fd=fd)
                    plan.created.append((rel, "dir"))
                if last:
                    made.append(rel)
                    plan.stand_ins.append(rel)
                else:
                    following = os.open(parts[index], _PATH | os.O_DIRECTORY, dir_fd=fd)
                    os.close(fd)
                    fd = following
        except OSError:
            pass
        finally:
            os.close(fd)
    return made


def remove_placeholders(plan: MountPlan) -> list[str]:
    """Remove what the plan created for write entries and the agent left empty; returns them.

    Called after the run, before the commit: the commit must not hold a file the agent did not
    create. Works through descriptors, so nothing the agent planted is followed.
    """
    removed: list[str] = []
    try:
        root_fd = open_root(plan.worktree)
    except OSError:
        return removed
    try:
        for rel, kind in reversed(plan.created):
            parent, _, name = rel.rpartition("/")
            pfd = open_beneath(root_fd, parent)
            if pfd is None:
                continue
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                if kind == "file" and stat.S_ISREG(st.st_mode) and st.st_size == 0:
                    os.unlink(name, dir_fd=pfd)
                    removed.append(rel)
                elif kind == "dir" and stat.S_ISDIR(st.st_mode):
                    os.rmdir(name, dir_fd=pfd)  # only when empty
                    removed.append(rel)
            except OSError:
                pass
            finally:
                os.close(pfd)
    finally:
        os.close(root_fd)
    return removed


# Binds of single paths of the worktree: three of bubblewrap's at most 9000 arguments each,
# with room left for the rest of the plan, and a descriptor each (see _ensure_fd_room).
MAX_WORKTREE_BINDS = 2000


def _worktree_mounts(
    args: _Args, worktree: Path, root_fd: int, policy: Policy, tree: _Tree, plan: MountPlan,
    masks: Masks,
) -> None:  # fmt: skip
    """The worktree: readable parts read-only, the write set writable, the rest hidden.

    Every source is a descriptor opened from the worktree's root without following links. The
    mount layer alone keeps writes inside the write set: only folders whose whole subtree is in
    it are bound writable; in any other folder only the existing files the write set names are.
    """
    reads = [normalize(p) for p in policy.paths.read]
    writes = [normalize(p) for p in policy.paths.write]
    visible = reads + writes
    covers_visible = subtree_rule(tuple(visible))
    whole = covers_visible("")

    def bind(rel: str, *, writable: bool) -> bool:
        if len(args.fds) >= MAX_WORKTREE_BINDS:
            # bubblewrap takes 9000 arguments at most, and each bind holds a descriptor open.
            raise PolicyError(
                f"the policy's paths make the sandbox bind more than {MAX_WORKTREE_BINDS} "
                f"files and folders of the worktree one by one (e.g. {rel!r})",
                hint="name whole folders in paths.read and paths.write (`src/**` rather than "
                "`src/*.py`): a folder is bound once",
            )
        fd = open_beneath(root_fd, rel)
        if fd is None:
            return False
        args.bind_fd(fd, worktree / rel if rel else worktree, writable=writable)
        return True

    if whole:
        bind("", writable=False)
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
            if is_dir and covers_visible(rel):
                bind(rel, writable=False)
                bound.append(rel)
            elif is_dir and may_hold(rel):
                args.add("--dir", worktree / rel)
            elif not is_dir and matches_any(visible, rel):
                bind(rel, writable=False)

    # Writable: folders wholly in the write set, then single files elsewhere. A folder that
    # holds both stays read-only, so nothing new can be created in it.
    whole_folder = subtree_rule(tuple(writes))

    folders: list[str] = [""] if whole_folder("") else []
    if not folders:
        for rel in sorted(tree.dirs):
            if not any(rel.startswith(f + "/") for f in folders) and whole_folder(rel):
                folders.append(rel)

    def in_folder(rel: str) -> bool:
        return any(f == "" or rel == f or rel.startswith(f + "/") for f in folders)

    for rel in folders:
        if bind(rel, writable=True):
            plan.writable.append(rel or ".")
    # (With the whole worktree writable there is no single file left to bind.)
    for rel in sorted(tree.files) if "" not in folders else ():
        if not in_folder(rel) and policy.allows_write(rel) and bind(rel, writable=True):
            plan.writable.append(rel)

    # Read-only again inside writable folders: protected paths the policy does not name, and
    # stand-ins where a protected path does not exist yet, so that it cannot be created.
    protected = policy.paths.protected_patterns
    extra = tuple(policy.secrets.extra)
    names = tuple(e for e in extra if "/" not in e)
    paths = tuple(e for e in extra if "/" in e)
    protected_hits, secret_hits = tree.scan(tuple(protected), names, paths)
    named_explicitly = explicit_rule(tuple(writes), tuple(protected))
    keep: list[str] = []
    for rel in protected_hits:
        if not named_explicitly(rel):
            parent = rel.rpartition("/")[0]
            if parent and matches_any(protected, parent):
                continue
            if in_folder(rel):
                keep.append(rel)
    tree_dirs, tree_files = set(tree.dirs), set(tree.files)
    existing = tree_dirs | tree_files | set(tree.links)
    keep += _protected_stand_ins(root_fd, writes, protected, existing, tree_dirs, in_folder,
                                 plan)  # fmt: skip
    # Each folder between a writable bind and a kept path becomes a mount point of its own, so
    # it cannot be renamed away to make room for a new path of that name. Bound before the
    # kept paths: a later bind of a folder would cover them.
    pinned: list[str] = []
    for rel in keep:
        parts = rel.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            if folder not in folders and folder not in pinned and in_folder(folder):
                pinned.append(folder)
    for folder in sorted(pinned, key=lambda f: f.count("/")):
        bind(folder, writable=True)
    for rel in keep:
        bind(rel, writable=False)
    # A file the write set opens explicitly inside a kept folder (`.github/workflows/ci.yml`,
    # `.github/**` protected) is bound writable again over it. Only files, each as the policy
    # judges it: a folder bound writable would let a name the policy refuses be made in it
    # (a case variant of a protected folder, say), with only the supervisor's check between.
    kept_dirs = [rel for rel in keep if rel in tree_dirs]
    for rel in protected_hits if kept_dirs else ():
        if (
            rel in tree_files
            and any(rel.startswith(f"{k}/") for k in kept_dirs)
            and policy.allows_write(rel)
        ):
            bind(rel, writable=True)
    bind(".git", writable=False)

    masked: list[str] = []
    dirs = set(tree.dirs)
    for rel in secret_hits:
        if any(rel.startswith(h + "/") for h in masked):
            continue
        # The kind comes from the walk (no link followed), not from the path again.
        stand_in = masks.folder(str(worktree / rel)) if rel in dirs else masks.file(
            str(worktree / rel))  # fmt: skip
        args.add("--ro-bind", stand_in, worktree / rel)
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
    # Each folder once: a PATH search tries folder after folder, and each try is an exec the
    # supervisor judges; a folder named again finds nothing the first try did not.
    env["PATH"] = ":".join(dict.fromkeys(env["PATH"].split(":")))
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "agent"
    env.update(
        HOME=str(home), USER=user, LOGNAME=user, SHELL="/bin/sh", TMPDIR="/tmp",
        GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0",
        # An empty credential.helper resets the list, so no configured helper is ever asked.
        GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="credential.helper", GIT_CONFIG_VALUE_0="",
        GATEKEEPER_RUN_ID=run_id, GATEKEEPER_SANDBOX="1",
    )  # fmt: skip
    # Tools' own update checks are requests nobody asked for: each would be a refused request
    # or a decision point in every run's record.
    env.setdefault("npm_config_update_notifier", "false")
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
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
    walk_cache: Path | None = None,
    write_files: list[str] | None = None,
) -> MountPlan:
    """Build the mount plan for a run in worktree.

    private_dirs (the key folder, the launcher's state) are never shown, even when they lie
    beneath a folder that is. walk_cache: a launcher-private file that holds (or is to hold)
    the walk of exactly this worktree's content, for worktrees that start as one shared,
    unchanging checkout; not used when the plan creates anything in the worktree.
    write_files: write entries that name files (approved writes of files), made as files.
    Raises PolicyError when a policy path leaves the repository.
    """
    home = Path(os.path.realpath(os.environ.get("HOME") or "/root"))
    worktree = Path(os.path.realpath(worktree))
    git_common_dir = Path(os.path.realpath(git_common_dir))
    masks = Masks(scratch)
    env = build_env(policy, home, run_id)
    plan = MountPlan(args=[], env=env, worktree=worktree)
    args = _Args()
    # find runs while the rest of the plan is made (or the run is prepared: start_system_search)
    if _started_search:
        search = _started_search.pop()
    else:
        search = _search_system_folders(
            [worktree, git_common_dir, *(Path(os.path.realpath(p)) for p in private_dirs)]
            + ([Path(os.path.realpath(user_checkout))] if user_checkout is not None else [])
        )
    try:
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
        roots = _toolchain_roots(home, env["PATH"], skip, env)
        # The agent's own installation, wherever it lives (see sandbox/programs.py), under the
        # same rules: never HOME, a folder above it or a private folder.
        for program_root in programs or []:
            shown = _program_root(program_root, home, skip)
            if shown is not None and shown not in roots:
                roots.append(shown)
        for root in roots:
            args.add("--ro-bind", root, root)
            plan.toolchains.append(str(root))
            # Credential files that sit in a toolchain folder (e.g. ~/.cargo/credentials.toml).
            depth = 1 if root.name in HOME_TOOLCHAINS else 4
            for found in _secrets_below(root, depth):
                masks.hide(args, found, plan.hidden)
        # What not every user may read under SEARCHED_SYSTEM_DIRS, and credentials by name there:
        # after the toolchains, some of which lie there and would show it again.
        covered = [home, *skip, *(Path(p) for p in ETC_SECRETS)]  # shown otherwise, or hidden
        for found in _system_folders_found(search):
            if str(found) not in plan.hidden and not any(_is_within(found, c) for c in covered):
                masks.hide(args, found, [])

        # The user's checkout is a read-only empty folder: nothing of it shows, nothing lands in it.
        if user_checkout is not None:
            shadow = scratch / "checkout"
            (shadow / ".git").mkdir(parents=True)
            checkout_real = Path(os.path.realpath(user_checkout))
            if _is_within(git_common_dir, checkout_real) and git_common_dir != checkout_real:
                # A mount point for the object store, which lives beneath the checkout.
                (shadow / git_common_dir.relative_to(checkout_real) / "objects").mkdir(
                    parents=True, exist_ok=True)  # fmt: skip
            os.chmod(shadow, 0o555)
            checkout = Path(os.path.realpath(user_checkout))
            args.add("--ro-bind", shadow, checkout)
        # Of the repository's git dir only the object store, read-only: the agent's private git
        # dir borrows it as an alternate. Config, hooks, info/, logs/, refs and anything else kept
        # there (an included credentials file, git-crypt's key) stay out of sight.
        git_fd = open_root(git_common_dir)
        objects_fd = open_beneath(git_fd, "objects")
        os.close(git_fd)
        if objects_fd is not None:
            args.bind_fd(objects_fd, git_common_dir / "objects", writable=False)
        root_fd = open_root(worktree)
        try:
            _create_write_targets(root_fd, worktree, [normalize(p) for p in policy.paths.write],
                                  plan, frozenset(write_files or ()))  # fmt: skip
            tree = _cached_walk(worktree, walk_cache if not plan.created else None)
            _ensure_fd_room(MAX_WORKTREE_BINDS, required=False)
            _worktree_mounts(args, worktree, root_fd, policy, tree, plan, masks)
        finally:
            os.close(root_fd)
        args.add(*(extra_args or []))
        if not any(covers_subtree(p, "") for p in [*policy.paths.read, *policy.paths.write]):
            args.add("--remount-ro", worktree)

        # Whatever lies under a shown folder but is private to the launcher stays hidden.
        shown_folders = [
            home,
            git_common_dir / "objects",
            worktree,
            *roots,
            Path("/etc"),
            Path("/usr"),
            Path("/opt"),
        ]
        for private in skip:
            if _is_within(worktree, private) or not private.exists():
                continue
            if any(_is_within(private, s) for s in shown_folders if s != home):
                args.add("--tmpfs", private, "--remount-ro", private)
                plan.hidden.append(str(private))

        args.add("--remount-ro", "/", "--chdir", worktree)
        plan.args = args.items
        plan.fds = args.fds
        _ensure_fd_room(len(plan.fds))
        plan.watches = masks.watches
    except BaseException:
        for fd in args.fds:
            os.close(fd)
        raise
    finally:
        if search is not None and search.poll() is None:
            search.kill()
            search.wait()
    return plan


def namespace_args() -> list[str]:
    """Namespaces and process hygiene that every sandboxed process inherits."""
    return [
        "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
        "--new-session", "--cap-drop", "ALL", "--hostname", "gatekeeper",
    ]  # fmt: skip
