"""Git plumbing for the launcher and the gate: clean environment, no hooks, NUL-separated output."""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gatekeeper.errors import GitError
from gatekeeper.proc import CalledProcessError, cmd_output_b

if TYPE_CHECKING:
    import pygit2

ZERO_OID = "0" * 40

# Options that keep repository configuration from running programs while the launcher works:
# no hooks, no fsmonitor daemon, no external diff or textconv drivers.
SAFE_CONFIG = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false",
    "-c", "diff.external=",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    # Never look inside submodules: their config (filters, fsmonitor) is not the user's.
    "-c", "diff.ignoreSubmodules=all",
    "-c", "submodule.recurse=false",
    "-c", "status.submoduleSummary=false",
    "-c", "core.sparseCheckout=false",
    # Every part of a file's stat data counts when the launcher asks what changed: the change
    # time is the one the agent cannot put back after a same-size rewrite, and a repository's
    # setting that trusts less of it (or none) would let such a change go unseen.
    "-c", "core.trustctime=true",
    "-c", "core.checkStat=default",
    "-c", "core.ignoreStat=false",
    # Real objects only: no replace refs, no grafts, no commit-graph cache (a crafted one could
    # lie about parents), and no signature checks that would run gpg.program from config.
    "-c", "core.useReplaceRefs=false",
    "-c", "core.commitGraph=false",
    "-c", "advice.graftFileDeprecated=false",
    "-c", "log.showSignature=false",
)  # fmt: skip

# Environment every git call gets: replace refs off, the graft file an empty one.
REAL_OBJECTS_ENV = {"GIT_NO_REPLACE_OBJECTS": "1", "GIT_GRAFT_FILE": os.devnull}


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The current environment without inherited GIT_* variables (they would redirect git)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    env.update(_kept_env)
    env.update(_judging_env.get())
    if extra:
        env.update(extra)
    env.update(REAL_OBJECTS_ENV)  # after extra: no caller may turn replace refs or grafts back on
    return env


def git(
    *args: str,
    git_dir: str | os.PathLike[str] | None = None,
    work_tree: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
    large: bool = False,
) -> bytes:
    """Run git with a clean environment and return stdout; raise GitError on failure.

    large: the output may be megabytes (see proc.cmd_output_b)."""
    argv = ["git", *SAFE_CONFIG]
    if git_dir is not None:
        argv.append(f"--git-dir={os.fspath(git_dir)}")
    if work_tree is not None:
        argv.append(f"--work-tree={os.fspath(work_tree)}")
    argv.extend(args)
    try:
        _, out, _ = cmd_output_b(
            *argv, env=clean_env(env), cwd=cwd, input=input, check=check, large=large
        )
    except CalledProcessError as exc:
        raise GitError(exc.message) from exc
    return out


def git_ok(*args: str, git_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when the git command exits 0."""
    argv = ["git", *SAFE_CONFIG]
    if git_dir is not None:
        argv.append(f"--git-dir={os.fspath(git_dir)}")
    rc, _, _ = cmd_output_b(*argv, *args, env=clean_env(), check=False)
    return rc == 0


@dataclass(frozen=True)
class RepoPaths:
    """Where a repository lives: its common git dir and, if any, its main work tree."""

    git_dir: Path  # the common dir: objects, refs, config, hooks
    work_tree: Path | None
    checkout: Path | None  # the checkout path is in: a linked worktree's own, else work_tree


def discover(path: str | os.PathLike[str]) -> RepoPaths:
    """Find the repository containing path; raise GitError if there is none."""
    path = Path(path)
    if not path.exists():
        raise GitError(f"{path} does not exist", hint="pass --repo with a git repository")
    if not path.is_dir():  # git cannot even start there (a traceback, not an error, before)
        raise GitError(f"{path} is not a directory", hint="pass --repo with a git repository")
    query = ("rev-parse", "--path-format=absolute", "--git-common-dir", "--git-dir",
             "--is-bare-repository", "--show-object-format")  # fmt: skip
    # One call in a checkout; git refuses --show-toplevel in a bare repository or in the git
    # dir itself, and then each question is asked on its own.
    # Paths are bytes, not always UTF-8: read as the file system's names (os.fsdecode).
    lines = os.fsdecode(git(*query, "--show-toplevel", cwd=path, check=False)).splitlines()
    if len(lines) != 5:
        try:
            lines = os.fsdecode(git(*query, cwd=path)).splitlines()
        except GitError as exc:
            if "dubious ownership" in str(exc):  # git's safe.directory check
                import shlex  # (only here: `check` loads this module early)

                said = re.search(r"safe\.directory (.+)", str(exc))  # git names the folder
                refused = said.group(1).strip() if said else str(path.resolve())
                raise GitError(
                    f"git refuses to work in {refused}: the repository belongs to another user",
                    hint="run gatekeeper as the repository's owner, or, if you trust it, "
                    f"`git config --global --add safe.directory {shlex.quote(refused)}`",
                ) from exc
            stderr = exc.__cause__.stderr if isinstance(exc.__cause__, CalledProcessError) else b""
            why = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()
                   if line.startswith(("fatal:", "error:"))]  # fmt: skip
            if not why or any("not a git repository" in line for line in why):
                raise GitError(f"{path} is not inside a git repository",
                               hint="run it in a repository or pass --repo") from exc  # fmt: skip
            # A repository git itself cannot open (an unknown extension, a broken config):
            # what git says is the way to fix it.
            reason = "; ".join(why)
            raise GitError(f"git cannot open the repository at {path}: {reason}",
                           hint="repair the repository's .git/config, or use another "
                           "clone") from exc  # fmt: skip
        if len(lines) != 4:  # one answer a line: a line break in a path shifts the others
            raise GitError(
                f"cannot tell where the repository of {path} is: a line break in its path?",
                hint="use a repository without one in its path",
            )
    common, own = Path(lines[0]), Path(lines[1])
    bare = lines[2] == "true"
    if lines[3] != "sha1":  # every object id read and signed is 40 hex digits
        raise GitError(
            f"{common} names its objects with {lines[3]}: gatekeeper works with sha1 "
            "repositories only",
            hint="run agents in a clone made with `git init --object-format=sha1` (git's default)",
        )
    work_tree: Path | None = None
    top: Path | None = None  # git's top level of the checkout path is in
    if not bare:
        # The main checkout's top level is git's own answer, wherever its git dir is (a `.git`
        # symlink, --separate-git-dir). A linked worktree's top level is not the main checkout;
        # as for git itself, the main one is the parent of a common dir named .git (also where
        # path is inside the git dir, which has no top level).
        top = Path(lines[4].strip()) if len(lines) == 5 else None
        if common.name == ".git" and (top is None or own != common):
            work_tree = common.parent
        elif top is not None:
            work_tree = top
        else:
            raise GitError(
                f"{path} is inside the git directory {common}, not in a checkout",
                hint="pass --repo with the repository's checkout (the folder its files are in)",
            )
    return RepoPaths(git_dir=common.resolve(), work_tree=work_tree, checkout=top or work_tree)


HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX_ABBREV = re.compile(r"[0-9a-f]{4,39}")
# NAME~N and NAME^N, chained: the only revision expressions accepted, after a plain name.
_SUFFIX = re.compile(r"(?:[~^][0-9]*)*\Z")
# What a name may not contain: other rev syntax (@{..}, :path, A..B, ^{type}) and globs.
_FORBIDDEN = ("@{", ":", "..", "^", "~", "*", "?", "[", "\\", " ", "\t", "\n")
FULL_NAME_HINT = (
    "name it by its full ref name (refs/heads/main, refs/remotes/origin/main, refs/tags/v1) "
    "or by its 40-hex commit id"
)


def exact_refs(
    refs: list[str], git_dir: Path | None = None, cwd: Path | None = None
) -> dict[str, str]:
    """Full ref name -> object id, for those of refs that exist under exactly that name."""
    if not refs:
        return {}
    out = git("for-each-ref", "--format=%(objectname) %(refname)", "--", *refs,
              git_dir=git_dir, cwd=cwd)  # fmt: skip
    wanted = set(refs)
    found: dict[str, str] = {}
    for line in out.decode("utf-8", "surrogateescape").splitlines():
        oid, _, name = line.partition(" ")
        if name in wanted:
            found[name] = oid
    return found


def exact_ref(ref: str, git_dir: Path | None = None, cwd: Path | None = None) -> str | None:
    """The object the full ref name ref points at, looked up by that exact name only.

    `git rev-parse refs/heads/x` would fall back to refs/tags/refs/heads/x and others when the
    ref is missing; this never does.
    """
    return exact_refs([ref], git_dir, cwd).get(ref)


def _short_name_candidates(name: str) -> list[str]:
    return [
        f"refs/heads/{name}",
        f"refs/remotes/{name}",
        f"refs/tags/{name}",
        f"refs/{name}",
        f"refs/remotes/{name}/HEAD",
    ]


def _abbreviated_objects(name: str, git_dir: Path | None, cwd: Path | None) -> list[str]:
    if not _HEX_ABBREV.fullmatch(name):
        return []
    out = git("rev-parse", f"--disambiguate={name}", git_dir=git_dir, cwd=cwd, check=False)
    return [o for o in out.decode().split() if HEX40.fullmatch(o)]


def _resolve_name(name: str, git_dir: Path | None, cwd: Path | None) -> str | None:
    """The object a plain name (no suffix) stands for; raise GitError when it is ambiguous."""
    if HEX40.fullmatch(name):
        return name  # a full object id names the object itself, never a ref
    if name == "HEAD":
        # HEAD is the file in the git dir (the worktree's own with cwd); git reads it first.
        out = git("rev-parse", "--verify", "--quiet", "HEAD", git_dir=git_dir, cwd=cwd,
                  check=False)  # fmt: skip
        oid = out.decode().strip()
        return oid if HEX40.fullmatch(oid) else None
    if not name or name.startswith("-") or any(bad in name for bad in _FORBIDDEN) or name == "@":
        raise GitError(
            f"revision {name!r} is not a name gatekeeper resolves",
            hint="accepted: a full ref name, a branch, remote-tracking branch or tag name that "
            "is unambiguous, HEAD, a commit id, each optionally followed by ~N or ^N; "
            + FULL_NAME_HINT,
        )
    if name.startswith("refs/"):
        return exact_ref(name, git_dir, cwd)
    found = exact_refs(_short_name_candidates(name), git_dir, cwd)
    matches = [f"{ref} ({oid[:12]})" for ref, oid in found.items()]
    objects = _abbreviated_objects(name, git_dir, cwd)
    matches += [f"object {oid}" for oid in objects]
    if len(matches) > 1:
        raise GitError(
            f"{name!r} is ambiguous: it names " + ", ".join(matches),
            hint=FULL_NAME_HINT,
        )
    if found:
        return next(iter(found.values()))
    return objects[0] if objects else None


def resolve_object(
    git_dir: Path | None, rev: str, kind: str = "commit", cwd: Path | None = None
) -> str | None:
    """The full id of the object of the given kind rev names, or None when there is none.

    rev is a full ref name, an unambiguous short name (refs/heads/X, refs/remotes/X,
    refs/tags/X: exactly one may exist, and X may not also abbreviate an object id), HEAD or
    an object id, optionally followed by ~N / ^N. Raises GitError for an ambiguous name or other
    revision syntax. With cwd instead of git_dir, rev is read in that worktree (its own HEAD).
    """
    suffix = _SUFFIX.search(rev)
    assert suffix is not None  # the pattern matches the empty string at the end
    name, tail = rev[: suffix.start()], suffix.group(0)
    # HEAD (git reads the file in the git dir first) and a full id need no lookup of their own:
    # one call resolves and peels them.
    oid = name if name == "HEAD" else _resolve_name(name, git_dir, cwd)
    if oid is None:
        return None
    out = git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{oid}{tail}^{{{kind}}}",
              git_dir=git_dir, cwd=cwd, check=False)  # fmt: skip
    result = out.decode().strip()
    return result if HEX40.fullmatch(result) else None


def rev_parse(git_dir: Path | None, rev: str, kind: str = "commit", cwd: Path | None = None) -> str:
    """Resolve rev to a full object id of the given kind (see resolve_object).

    Raises GitError naming the revision when it names nothing or is ambiguous.
    """
    oid = resolve_object(git_dir, rev, kind, cwd)
    if oid is None:
        raise GitError(
            f"revision {rev!r} does not name a {kind} in {git_dir or cwd}",
            hint="check the name with `git log --oneline -1 REV`; " + FULL_NAME_HINT,
        )
    return oid


def is_shallow(git_dir: Path) -> bool:
    """True for a shallow repository, where git pretends the boundary commits have no parents."""
    out = git("rev-parse", "--is-shallow-repository", git_dir=git_dir, check=False)
    return out.strip() == b"true"


def tree_of(git_dir: Path, commit: str) -> str:
    return rev_parse(git_dir, commit, "tree")


def read_blob_at(git_dir: Path, commit: str, path: str) -> bytes | None:
    """The bytes of path in commit's tree, or None when the path is absent there."""
    rc, out, _ = cmd_output_b(
        "git", *SAFE_CONFIG, f"--git-dir={git_dir}", "cat-file", "blob", f"{commit}:{path}",
        env=clean_env(), check=False,
    )  # fmt: skip
    return out if rc == 0 else None


def is_ancestor(git_dir: Path, ancestor: str, descendant: str) -> bool:
    return git_ok("merge-base", "--is-ancestor", ancestor, descendant, git_dir=git_dir)


# A server hook runs while the pushed objects sit in quarantine; git says where through these
# variables, which every git call the hook makes must keep (clean_env adds them back).
QUARANTINE_VARS = (
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_QUARANTINE_PATH",
)
_kept_env: dict[str, str] = {}
# Set by judging_offline, for the thread (or task) that judges and what it starts in a copy
# of its context (gate.later): another thread of the process (a `receipt sync` beside a
# check) goes on as before.
_judging_env: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "gatekeeper_judging_env", default=()
)


@contextmanager
def judging_offline() -> Iterator[None]:
    """While it lasts, no git call of this thread fetches anything (the gate judges; a
    command that fetches, `receipt sync`, runs outside it): in a partial clone git would
    fetch a missing object from its promisor remote while the gate reads it, running what the
    repository's config names for that remote (`remote.X.uploadpack`, `core.sshCommand`) and
    waiting on the network with no bound. git 2.39.4, 2.44 and later honour GIT_NO_LAZY_FETCH;
    for older ones every transport is refused (an empty GIT_ALLOW_PROTOCOL, which the fetch git
    starts inherits and no `protocol.*` setting of the repository's overrides), so the read
    fails at once and the gate blocks, saying so (gate.judgement)."""
    token = _judging_env.set(
        (*_judging_env.get(), ("GIT_NO_LAZY_FETCH", "1"), ("GIT_ALLOW_PROTOCOL", ""))
    )
    try:
        yield
    finally:
        _judging_env.reset(token)


_C_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}


def split_alternates(value: str) -> list[str]:
    """The folders of a GIT_ALTERNATE_OBJECT_DIRECTORIES value, as git reads it: separated by
    `:`, each C-quoted by git (in double quotes, escapes and octal bytes) where it holds a
    `:` or begins with a double quote."""
    raw = os.fsencode(value)
    folders: list[str] = []
    i = 0
    while i < len(raw):
        if raw[i : i + 1] != b'"':
            end = raw.find(b":", i)
            end = len(raw) if end < 0 else end
            if end > i:
                folders.append(os.fsdecode(raw[i:end]))
            i = end + 1
            continue
        out, i = bytearray(), i + 1
        while i < len(raw) and raw[i : i + 1] != b'"':
            if raw[i : i + 1] == b"\\" and i + 1 < len(raw):
                nxt = chr(raw[i + 1])
                if nxt in "0123":
                    out.append(int(raw[i + 1 : i + 4], 8))
                    i += 4
                    continue
                out.append(_C_ESCAPES.get(nxt, raw[i + 1]))
                i += 2
                continue
            out.append(raw[i])
            i += 1
        folders.append(os.fsdecode(bytes(out)))
        end = raw.find(b":", i)
        i = len(raw) if end < 0 else end + 1
    return folders


def quote_alternate(folder: str) -> str:
    """folder C-quoted as git reads an alternate (in the variable, or a line of
    objects/info/alternates): every byte that is not plain printable ASCII in octal."""
    quoted = "".join(
        "\\" + chr(b) if b in (34, 92) else chr(b) if 32 <= b < 127 else f"\\{b:03o}"
        for b in os.fsencode(folder)
    )
    return f'"{quoted}"'


def keep_quarantine_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """Keep a hook's object-directory variables (made absolute) for every later git call."""
    kept: dict[str, str] = {}
    for name in QUARANTINE_VARS:
        value = environ.get(name)
        if not value:
            continue
        if name == "GIT_ALTERNATE_OBJECT_DIRECTORIES":
            folders = [os.path.abspath(p) for p in split_alternates(value)]
            value = os.pathsep.join(
                quote_alternate(f) if os.pathsep in f or f.startswith('"') else f for f in folders
            )
        else:
            value = os.path.abspath(value)
        kept[name] = value
    _kept_env.clear()
    _kept_env.update(kept)
    return kept


def open_repository(git_dir: str | os.PathLike[str]) -> pygit2.Repository:
    """The repository at git_dir through libgit2, reading its own config only.

    libgit2 would read the user's and the system's config as well (from HOME, which may be
    unreadable for this user, or hold settings that change a checkout): as the git command
    line here, the launcher reads none of them. Raises pygit2.GitError.
    """
    import pygit2
    from pygit2.enums import ConfigLevel

    for level in (ConfigLevel.GLOBAL, ConfigLevel.XDG, ConfigLevel.SYSTEM,
                  ConfigLevel.PROGRAMDATA):  # fmt: skip
        pygit2.settings.search_path[level] = os.devnull  # "/dev/null/.gitconfig": none there
    return pygit2.Repository(os.fspath(git_dir))
