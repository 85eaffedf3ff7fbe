"""`gatekeeper hooks install`, and the entry the installed hook scripts call (run_hook)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gatekeeper.errors import Error, UsageError
from gatekeeper.gate.hooks import (
    pre_commit_merge,
    pre_commit_push,
    pre_merge_commit,
    pre_push,
    pre_receive,
    server_protected,
)
from gatekeeper.gate.install import (
    LOCAL_HOOKS,
    SERVER_HOOKS,
    hooks_dir,
    install_hook,
    isolated_import,
    legacy_hook,
)
from gatekeeper.gate.refs import (
    ALLOW_REWIND_KEY,
    DEFAULT_BRANCH_KEY,
    PROTECT_DEFAULT_KEY,
    configured_patterns,
    default_branch,
    detect_default_branch,
    is_protected,
    server_defaults,
    set_patterns,
    set_protect,
)
from gatekeeper.gate.shown import visible_lines
from gatekeeper.git import discover, git, judging_offline, keep_quarantine_env

HOOK_NAMES = LOCAL_HOOKS + SERVER_HOOKS


def install(
    *,
    repo: Path,
    server: Path | None = None,
    protect: list[str] | None = None,
    allow_rewind: list[str] | None = None,
    protect_default: bool | None = None,
    probed: bool = False,
) -> int:
    """Install pre-push, pre-merge-commit and pre-commit in repo, or pre-receive in the server
    repository.

    allow_rewind names protected refs (patterns) whose non-fast-forward updates are allowed;
    every other protected ref only moves forward. On a server, the real default branch is
    found and stored (gatekeeper.defaultBranch); it is protected unless protect_default is
    False.

    probed: the interpreter was found to import gatekeeper as the hooks will (init checks
    that first).

    Raises UsageError when core.hooksPath is set or the interpreter cannot run the hooks,
    GitError when the path is not a repository.
    """
    target = server if server is not None else repo
    paths = discover(target)
    if server is not None and paths.work_tree is not None:
        print(
            f"warning: {server} is not bare; pushes to its checked-out branch are gated too",
            file=sys.stderr,
        )
    directory = hooks_dir(paths.git_dir)
    if not probed:
        isolated_import(work_tree=paths.work_tree)
    for name in SERVER_HOOKS if server is not None else LOCAL_HOOKS:
        done = install_hook(directory, name)
        how = "updated" if done.replaced_own else "installed"
        print(f"hooks:  {how} {done.path}", file=sys.stderr)
        if done.moved_aside:
            print(
                f"hooks:  the hook that was there is kept as {done.moved_aside} "
                "(it runs after the gate passes)",
                file=sys.stderr,
            )
    if protect:
        set_protect(paths.git_dir, protect)
    if allow_rewind:
        set_patterns(paths.git_dir, ALLOW_REWIND_KEY, allow_rewind)
    if server is not None:
        default, why = detect_default_branch(paths.git_dir)
        git("config", DEFAULT_BRANCH_KEY, default, git_dir=paths.git_dir)
        print(f"hooks:  default branch: {default} ({why})", file=sys.stderr)
        names, settled = server_defaults(paths.git_dir)
        if not settled:
            print(
                f"hooks:  until it exists, {', '.join(names)} are each protected, and the first "
                "of them pushed (with .gatekeeper/policy.yaml and trusted_keys) becomes the "
                "default branch",
                file=sys.stderr,
            )
        if protect_default is not None:
            git("config", "--type=bool", PROTECT_DEFAULT_KEY, str(protect_default).lower(),
                git_dir=paths.git_dir)  # fmt: skip
    if server is not None:
        print(
            "hooks:  protected refs: " + ", ".join(server_protected(paths.git_dir)), file=sys.stderr
        )
        patterns = server_protected(paths.git_dir)
        default = default_branch(paths.git_dir)
        print(
            "hooks:  every update of a protected ref must also pass the trust file and policy "
            + (
                f"of {default}'s current tip"
                if is_protected(default, patterns)
                else "of the protected refs it forks from (the default branch is not protected)"
            ),
            file=sys.stderr,
        )
        rewinds = configured_patterns(paths.git_dir, ALLOW_REWIND_KEY)
        print(
            "hooks:  rewinds (non-fast-forward updates) allowed for: "
            + (", ".join(rewinds) if rewinds else "none"),
            file=sys.stderr,
        )
    return 0


def _chain_legacy(name: str, args: list[str], stdin: bytes) -> int:
    """Run the foreign hook kept aside at install time, with the same arguments and input."""
    try:
        directory = hooks_dir(discover(".").git_dir)
    except Error:
        return 0
    legacy = legacy_hook(directory, name)
    if legacy is None:
        return 0
    return subprocess.run([str(legacy), *args], input=stdin, check=False).returncode


def run_hook(name: str, args: list[str], stdin: bytes) -> int:
    """Run one hook in the current folder (git's cwd for hooks); non-zero refuses the operation.

    Fails closed: any error is reported and refuses.
    """
    if name not in HOOK_NAMES:
        print(f"gatekeeper: unknown hook {name!r}", file=sys.stderr)
        return 1
    try:
        with judging_offline():  # every hook judges, and fetches nothing while it does
            if name == "pre-receive":
                # Pushed objects are still in quarantine; every git call must see them.
                keep_quarantine_env(dict(os.environ))
                code = pre_receive(discover(".").git_dir, stdin)
            else:
                cwd = Path.cwd()
                git_dir = discover(cwd).git_dir
                if name == "pre-push":
                    code = pre_push(git_dir, cwd, args, stdin)
                elif name == "pre-commit":
                    code = pre_commit_merge(git_dir, cwd)
                else:
                    code = pre_merge_commit(git_dir, cwd, dict(os.environ))
    except Error as exc:
        shown = visible_lines(exc.diagnostics())  # (it may quote names from the push)
        print(f"gatekeeper: {name} failed, so it refuses:\n{shown}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a hook fails closed
        print(
            f"gatekeeper: {name} failed, so it refuses: {type(exc).__name__}: "
            f"{visible_lines(str(exc))}",
            file=sys.stderr,
        )
        return 1
    if code != 0:
        return code
    return _chain_legacy(name, args, stdin)


def main_hook(argv: list[str]) -> int:
    """`python -m gatekeeper.hookrun NAME [ARGS]`: what the installed hook scripts run."""
    if not argv:
        raise UsageError("usage: python -m gatekeeper.hookrun HOOK-NAME [ARGS...]")
    name, args = argv[0], argv[1:]
    stdin = sys.stdin.buffer.read() if name in ("pre-push", "pre-receive") else b""
    return run_hook(name, args, stdin)


def pre_commit(*, every_branch: bool = False) -> int:
    """`gatekeeper hooks pre-commit`: the entry `.pre-commit-hooks.yaml` names (pre-push stage).

    Fails closed like the installed hooks: an error refuses the push.
    """
    cwd = Path.cwd()
    try:
        with judging_offline():
            return pre_commit_push(discover(cwd).git_dir, cwd, dict(os.environ), every_branch)
    except UsageError:
        raise
    except Error as exc:
        shown = visible_lines(exc.diagnostics())
        print(f"gatekeeper: pre-push failed, so it refuses:\n{shown}", file=sys.stderr)
        return 1
