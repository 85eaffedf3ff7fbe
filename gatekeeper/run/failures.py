"""Which commands count as failed: a command that ended with a non-zero code, or was killed,
unless it is a predicate that answered "no".

A predicate is a command whose exit code 1 is an answer, not an error: `test` and `[`
(false), `grep` and its kin (nothing matched), `cmp` and `diff` (the files differ),
`git check-ignore` (not ignored), `git diff --quiet` (there are changes), `git merge-base
--is-ancestor` (not an ancestor), `which` (not found), `readlink` (not a link), and the
others in PREDICATES and GIT_PREDICATES below. Any
other code from them (2 and up: an error, a missing file) is a failure as usual.
"""

from __future__ import annotations

import os

# Programs whose exit code 1 always means "no" (readlink: not a symbolic link, which
# version-manager shims such as pyenv's ask of every file on their way).
PREDICATES = frozenset(
    "test [ grep egrep fgrep zgrep rg cmp diff which expr pgrep pidof readlink".split()
)
# git subcommands whose exit code 1 means "no", and the option that makes it so (None: always).
GIT_PREDICATES: dict[str, tuple[str, ...] | None] = {
    "check-ignore": None,
    "check-attr": None,
    "show-ref": None,
    "merge-base": ("--is-ancestor",),
    "diff": ("--quiet", "--exit-code"),
    "diff-index": ("--quiet", "--exit-code"),
    "diff-files": ("--quiet", "--exit-code"),
    "diff-tree": ("--quiet", "--exit-code"),
    "rev-parse": ("-q", "--quiet"),
    "cat-file": ("-e",),
    "config": ("--get", "--get-all", "--get-regexp"),
    "ls-remote": ("--exit-code",),
}
# git's global options that take the next word as their value (`git -C dir status`).
_GIT_VALUE_OPTIONS = frozenset(("-C", "-c", "--git-dir", "--work-tree", "--namespace"))


def _git_subcommand(args: list[str]) -> tuple[str | None, list[str]]:
    i = 0
    while i < len(args):
        word = args[i]
        if word in _GIT_VALUE_OPTIONS:
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            return word, args[i + 1 :]
    return None, []


def is_predicate(argv: list[str]) -> bool:
    """True when argv runs a known predicate, whose exit code 1 answers no."""
    if not argv:
        return False
    name = os.path.basename(argv[0])
    if name in PREDICATES:
        return True
    if name != "git":
        return False
    sub, rest = _git_subcommand(argv[1:])
    if sub not in GIT_PREDICATES:
        return False
    options = GIT_PREDICATES[sub]
    return options is None or any(w in options for w in rest)


def is_failed(argv: list[str], exit_code: int | None, killed: bool = False) -> bool:
    """True for a command that failed: killed, or a non-zero exit that is not a predicate's
    exit code 1 (None, not finished, is counted by whoever knows why: a timeout, a kill)."""
    if killed:
        return True
    if exit_code in (0, None):
        return False
    return not (exit_code == 1 and is_predicate(argv))
