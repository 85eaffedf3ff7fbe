"""`gatekeeper init`: policy, trust file, notes refspecs and local hooks for a repository."""

from __future__ import annotations

import sys
from pathlib import Path

from gatekeeper.commands.checkout_file import (
    checkout_file_exists,
    read_checkout_file,
    write_checkout_file,
)
from gatekeeper.commands.trust import add as trust_add
from gatekeeper.errors import UsageError
from gatekeeper.gate.install import isolated_import
from gatekeeper.git import discover, git
from gatekeeper.policy.model import POLICY_PATH, TRUST_PATH, builtin_policy
from gatekeeper.receipt.keys import load_key
from gatekeeper.receipt.notes import NOTES_REF
from gatekeeper.receipt.trust import parse_trust_file


def configure_notes(git_dir: Path) -> list[str]:
    """Make receipts travel: fetch them beside local ones, push them with `git push`."""
    done: list[str] = []
    remotes = git("remote", git_dir=git_dir).decode().split()
    git("config", "notes.gatekeeper.mergeStrategy", "cat_sort_uniq", git_dir=git_dir)
    # Receipts follow `git rebase` and `git commit --amend` locally (the gate does not need it:
    # it finds a rewritten commit's receipts by content); a squash keeps every run's receipt.
    rewrite_refs = git("config", "--get-all", "notes.rewriteRef", git_dir=git_dir,
                       check=False).decode().split()  # fmt: skip
    if NOTES_REF not in rewrite_refs:
        git("config", "--add", "notes.rewriteRef", NOTES_REF, git_dir=git_dir)
        done.append(f"notes.rewriteRef += {NOTES_REF}")
    if not git("config", "--get", "notes.rewriteMode", git_dir=git_dir, check=False).strip():
        git("config", "notes.rewriteMode", "cat_sort_uniq", git_dir=git_dir)
        done.append("notes.rewriteMode = cat_sort_uniq")
    for remote in remotes:
        fetch_spec = f"+{NOTES_REF}:refs/notes/remotes/{remote}/gatekeeper"
        fetches = git("config", "--get-all", f"remote.{remote}.fetch", git_dir=git_dir,
                      check=False).decode().split()  # fmt: skip
        if fetch_spec not in fetches:
            git("config", "--add", f"remote.{remote}.fetch", fetch_spec, git_dir=git_dir)
            done.append(f"remote.{remote}.fetch += {fetch_spec}")
        pushes = git("config", "--get-all", f"remote.{remote}.push", git_dir=git_dir,
                     check=False).decode().split()  # fmt: skip
        # Once any push refspec is configured, a bare `git push` pushes only those; keep the
        # current branch in the list so plain `git push` still pushes it, with its receipts.
        for spec in ([] if pushes else ["HEAD"]) + [NOTES_REF]:
            if spec not in pushes:
                git("config", "--add", f"remote.{remote}.push", spec, git_dir=git_dir)
                done.append(f"remote.{remote}.push += {spec}")
    return done


def init(*, repo: Path, policy_name: str = "default", install_hooks: bool = True) -> int:
    paths = discover(repo)
    if paths.checkout is None:
        raise UsageError(
            f"{repo} is a bare repository",
            hint="run `gatekeeper init` in a clone; on a server use "
            "`gatekeeper hooks install --server`",
        )
    if install_hooks:
        # Before anything is written: hooks that cannot run are of no use.
        isolated_import(work_tree=paths.work_tree)
    # The files go into the checkout the user is in (a linked worktree's own), on its branch.
    top = paths.checkout
    # Everything that can refuse does so before anything is written.
    key = load_key()
    trust = read_checkout_file(top, TRUST_PATH)
    if trust is not None:
        parse_trust_file(trust.decode("utf-8", "surrogateescape"), str(top / TRUST_PATH))
    if checkout_file_exists(top, POLICY_PATH):
        print(f"policy: {POLICY_PATH} exists, left as it is", file=sys.stderr)
    else:
        write_checkout_file(top, POLICY_PATH, builtin_policy(policy_name).raw)
        print(
            f"policy: wrote {POLICY_PATH} (from the built-in {policy_name!r} policy)",
            file=sys.stderr,
        )

    for approver in (False, True):
        trust_add(repo=top, line=key.public.line, approver=approver)

    for line in configure_notes(paths.git_dir):
        print(f"notes:  {line}", file=sys.stderr)

    if install_hooks:
        from gatekeeper.commands.hooks import install

        install(repo=top, server=None, protect=[], probed=True)
    print(f"next: commit {POLICY_PATH} and {TRUST_PATH}; the gate reads them from the target "
          "branch",
          file=sys.stderr)  # fmt: skip
    return 0
