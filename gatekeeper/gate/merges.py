"""Merge commits' own content: what a merge's tree holds that none of its parents does.

A merge needs no receipt, and the range's diff is compared with the runs' claims only at its
ends, so a merge that brings in a file (an "evil merge") and a later merge that drops it again
would leave the ends clean while the history holds content no run made. A merge is therefore
judged on its own as well: at every path its tree must hold the state of one of its parents,
or be git's own clean merge of its two parents (both sides' edits to one file, combined).

Such a combined file is no run's result, so where the range's diff and the runs' claims
disagree at a path a clean merge combined, the path is accounted for through the merges
(accounted_paths): its state at head must be one a run or the target made, or git's clean
merge of such states.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.errors import GitError
from gatekeeper.gate.compare import State
from gatekeeper.gate.diffread import DiffTooLarge, read_git
from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.gate.history import EMPTY_TREE, CommitInfo
from gatekeeper.git import clean_env, git, quote_alternate, split_alternates

MAX_NAMED = 5  # paths named in a finding's message
# Findings at a path a clean merge combined that the merges may account for.
MERGED_KINDS = frozenset({Kind.change_differs, Kind.unclaimed_change, Kind.missing_change})
# Commits whose files accounted_paths reads, at most (merges, and parents outside the range):
# past it, the findings stand.
MAX_MERGE_READS = 1000
# Files a clean merge combined that accounted_paths merges again (each at most this many bytes
# in each of its states); past either, those paths stay unaccounted.
MAX_CONTENT_MERGES = 256
MAX_MERGED_BYTES = 8 << 20
FILE_MODES = frozenset({"100644", "100755", "120000"})


@dataclass
class MergeCheck:
    """What the merges of a range hold: findings for those with content of their own, and,
    for each clean merge that combined both parents' edits to a file, those paths."""

    findings: list[Finding] = field(default_factory=list)
    combined: dict[str, list[str]] = field(default_factory=dict)  # merge id -> paths


def combined_paths(git_dir: Path, commit: CommitInfo) -> tuple[list[str], bool]:
    """Paths where merge commit's tree differs from every parent, and whether the merge is
    git's clean automatic merge of its two parents (then those paths are where it combined
    both sides' edits). Raises GitError when git cannot read the commit, and DiffTooLarge
    past the bounds of gate.diffread (a merge adding hundreds of thousands of files, or paths
    kilobytes long, is a few kilobytes of pack)."""
    what = f"the paths merge {commit.short} changes from every parent"
    out = read_git(
        git_dir,
        ["diff-tree", "-r", "-c", "--no-commit-id", "--name-only", "-z", commit.oid],
        what,
    )
    paths = [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
    if not paths:
        return paths, True
    return paths, _is_clean_merge(git_dir, commit)


# git reads a repository's objects/info/alternates, and each store's own in turn, to this depth
# (its own file is read at depth 0); a store named in a file at this depth is the last it reads.
LAST_ALTERNATES_DEPTH = 5
MAX_ALTERNATES_BYTES = 1 << 20
OBJECT_FOLDER = re.compile(r"[0-9a-f]{2}|pack")


def _regular_file(path: str) -> bytes:
    """The first MAX_ALTERNATES_BYTES of the regular file at path; nothing for anything else
    (a fifo is not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as file:
        try:
            return file.read(MAX_ALTERNATES_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        except OSError:
            return b""


def _alternates(store: str) -> Iterator[str]:
    """The folders store's objects/info/alternates names, as git reads them: a comment, a
    C-quoted folder, or a folder as it is, relative to the store's real path; normalised as
    git compares them."""
    for line in _regular_file(os.path.join(store, "info", "alternates")).split(b"\n"):
        if not line or line.startswith(b"#"):
            continue
        entry = os.fsdecode(line)
        if entry.startswith('"') and entry.endswith('"'):
            entry = split_alternates(entry)[0]  # (git takes a broken quote as it is, too)
        if not os.path.isabs(entry):
            entry = os.path.join(os.path.realpath(store), entry)
        yield os.path.normpath(entry)


def last_stores(objects: str, others: Iterable[str]) -> list[str]:
    """The object stores git reads for a repository whose own store is objects (beside others,
    its environment's alternates) at the last depth it follows alternates to: those named by an
    alternates file read at LAST_ALTERNATES_DEPTH, whose own alternates it no longer reads.

    A repository that reads objects through one more level of alternates (the scratch one)
    does not reach these: it is given stand-ins for them (scratch_repository)."""
    seen = {os.path.normpath(os.path.abspath(s)) for s in (objects, *others)}
    last: list[str] = []

    def read(store: str, depth: int) -> None:  # git's order: each store's chain in turn
        for entry in _alternates(store):
            if entry in seen or not os.path.isdir(entry):
                continue
            seen.add(entry)
            if depth == LAST_ALTERNATES_DEPTH:
                last.append(entry)
            else:
                read(entry, depth + 1)

    read(os.path.abspath(objects), 0)
    return last


def _stand_in(store: str, folder: Path) -> str:
    """A folder that holds store's objects (links to its loose-object and pack folders) and no
    alternates of its own: git reads exactly that store there."""
    folder.mkdir()
    try:
        names = os.listdir(store)
    except OSError:
        names = []
    for name in names:
        if OBJECT_FOLDER.fullmatch(name):
            os.symlink(os.path.join(store, name), folder / name)
    return os.fspath(folder)


@contextmanager
def scratch_repository(git_dir: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A bare repository in a temporary folder that reads git_dir's objects (a hook's
    quarantined ones too) and writes its own there, with none of the user's or the system's
    config or attributes, and the environment its git calls take: (its git dir, env).

    git's merge is judged here: with git's defaults, not a merge driver, union or
    renormalisation that this machine's config or attributes choose (and runs none of their
    programs), and without writing the trees it makes into git_dir (read-only to this user,
    or a server's quarantine)."""
    import tempfile  # (loaded only for a check whose range holds a merge to judge)

    with tempfile.TemporaryDirectory(prefix="gatekeeper-merge-") as folder:
        scratch = Path(folder, "scratch.git")
        objects = scratch / "objects"
        (objects / "info").mkdir(parents=True)
        (scratch / "refs").mkdir()
        (scratch / "HEAD").write_text("ref: refs/heads/scratch\n")
        (scratch / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
        kept = clean_env()
        own = kept.get("GIT_OBJECT_DIRECTORY") or os.fspath(git_dir.resolve() / "objects")
        others = split_alternates(kept.get("GIT_ALTERNATE_OBJECT_DIRECTORIES", ""))
        # The repository's own store is read here one level of alternates deeper than in the
        # repository: the stores git reads there last are listed here as stand-ins.
        sources = [own, *others] + [
            _stand_in(store, Path(folder, f"store{n}"))
            for n, store in enumerate(last_stores(own, others))
        ]
        (objects / "info" / "alternates").write_text(
            "".join(quote_alternate(os.path.abspath(s)) + "\n" for s in sources)
        )
        env = {
            "GIT_OBJECT_DIRECTORY": os.fspath(objects),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": "",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "core.attributesFile",
            "GIT_CONFIG_VALUE_0": os.devnull,
            **{f"GIT_{role}_{what}": value for role in ("AUTHOR", "COMMITTER")
               for what, value in (("NAME", "gatekeeper"), ("EMAIL", "gatekeeper@invalid"),
                                   ("DATE", "@0 +0000"))},
        }  # fmt: skip
        yield scratch, env


def _is_clean_merge(git_dir: Path, commit: CommitInfo) -> bool:
    """Whether commit's tree is git's clean merge of its two parents (with git's defaults: see
    scratch_repository); raises as combined_paths."""
    if len(commit.parents) != 2:
        return False
    # Both sides edited the same file and git combined them: the merge adds nothing of its own.
    # (A conflicted merge lists its conflicts: bounded in bytes as well.)
    try:
        with scratch_repository(git_dir) as (scratch, env):
            merged = read_git(
                scratch, ["merge-tree", "--write-tree", "--no-messages", *commit.parents],
                f"git's merge of the parents of {commit.short}", limit=None, env=env,
            )  # fmt: skip
    except GitError:  # a conflict is exit status 1: its tree is not the merge's
        return False
    # A clean merge prints its tree alone; a conflicted one also lists the conflicted files (its
    # tree holds conflict markers, which no run wrote either).
    return merged.decode("utf-8", "replace").splitlines() == [commit.tree]


def check_merges(git_dir: Path, commits: list[CommitInfo]) -> MergeCheck:
    """`uncovered-commit` for each merge of commits that holds content of its own (a merge
    the agent made inside a run is the run's: leave it out of commits), and the paths each
    clean one combined. Raises GitError, and DiffTooLarge naming the merge."""
    check = MergeCheck()
    findings = check.findings
    for commit in commits:
        if not commit.is_merge:
            continue
        try:
            paths, clean = combined_paths(git_dir, commit)
        except DiffTooLarge as exc:
            raise exc.naming(exc.what, commit.oid) from None
        if clean:
            if paths:
                check.combined[commit.oid] = paths
            continue
        named = ", ".join(repr(p) for p in paths[:MAX_NAMED])
        more = f" and {len(paths) - MAX_NAMED} more" if len(paths) > MAX_NAMED else ""
        findings.append(
            Finding(
                Kind.uncovered_commit,
                f"merge {commit.short} ({commit.subject!r}) holds content none of its parents "
                f"has, at {named}{more}, and is not git's clean merge of them: "
                + (
                    f"an octopus merge ({len(commit.parents)} parents) that combines edits to "
                    "one file is never taken for git's clean merge (merge one branch at a time)"
                    if len(commit.parents) > 2
                    else "a hand edit or conflict resolution in a merge is no run's work (merge "
                    "without editing, and let a run or a person's signed commit make the change)"
                ),
                path=paths[0],
                commit=commit.oid,
            )
        )
    return check


def states_at(git_dir: Path, commit: str, paths: Collection[str]) -> dict[str, State]:
    """The (mode, object id) at each of paths in commit's tree (a folder's too); a path the
    tree does not hold is left out. Read with the bounds of gate.diffread; raises GitError
    and DiffTooLarge."""
    states: dict[str, State] = {}
    wanted = sorted(paths)
    for start in range(0, len(wanted), 1000):  # (each path is an argument)
        out = read_git(
            git_dir,
            ["ls-tree", "-r", "-t", "-z", "--full-tree", commit, "--", *wanted[start:start + 1000]],
            f"the files of {commit[:12]} at the paths a merge combined",
            env={"GIT_LITERAL_PATHSPECS": "1"},
        )  # fmt: skip
        for entry in out.split(b"\0"):
            head, tab, name = entry.partition(b"\t")
            if not tab:
                continue
            mode, _, oid = head.decode("ascii", "replace").split(" ")
            path = name.decode("utf-8", "surrogateescape")
            if path in paths:
                states[path] = (mode, oid)
    return states


def accounted_paths(
    git_dir: Path,
    base: str | None,
    commits: list[CommitInfo],
    combined: Mapping[str, list[str]],
    findings: Iterable[Finding],
    made: Mapping[str, set[State]],
) -> set[str]:
    """The paths of findings (of MERGED_KINDS) that the range's clean merges account for.

    The runs' claims are composed in a line, so where git's clean merge combined both sides'
    edits to a file, the range's diff and the claims disagree there although nothing is
    no one's. A path is accounted for when a clean merge of commits combined it, every merge
    of commits is git's clean merge of its two parents (so none drops an edit or adds one), and
    its state at head is accounted: its state at base or in any parent outside the range (the
    target's history), a state made there (made: a run's result, a signed person's commit),
    or a clean merge's state there when both its parents' are accounted (git's merge adds no
    line of its own). Each commit of the range is judged on its own as before: a commit no
    receipt or person covers is `uncovered-commit` whatever this finds.

    commits: the range, oldest first, its head last. Raises GitError and DiffTooLarge.
    """
    touched = {p for paths in combined.values() for p in paths}
    asked = {f.path for f in findings if f.kind in MERGED_KINDS and f.path in touched}
    if not asked:
        return set()
    merges = [c for c in commits if c.is_merge]
    in_range = {c.oid for c in commits}
    outside = {parent for c in commits for parent in c.parents if parent not in in_range}
    if len(merges) + len(outside) > MAX_MERGE_READS:
        return set()
    if not all(c.oid in combined or _is_clean_merge(git_dir, c) for c in merges):
        return set()
    at: dict[str, dict[str, State]] = {}

    def state(commit: str | None, path: str) -> State:
        if commit is None:  # (a range from the root: nothing before it)
            return None
        if commit not in at:
            at[commit] = states_at(git_dir, commit, asked)
        return at[commit].get(path)

    accounted = {p: {state(base, p), *made.get(p, ())} for p in asked}
    for parent in sorted(outside):
        for path in asked:
            accounted[path].add(state(parent, path))
    in_place = _InPlace(git_dir, state)
    for commit in merges:
        for path in combined.get(commit.oid, ()):
            if (
                path in asked
                and all(state(p, path) in accounted[path] for p in commit.parents)
                and in_place(commit, path)
            ):
                accounted[path].add(state(commit.oid, path))
    head = commits[-1].oid
    return {p for p in asked if state(head, p) in accounted[p]}


class _InPlace:
    """Whether a clean merge's state at a path is the three-way merge of the states at that
    same path (in its parents and their one merge base), merged again here.

    git's merge follows renames: one side's edit to a file the other side moved lands at the
    new path, and a file added in a folder the other side renamed lands in the new folder, so
    the states at the path alone would not show where its lines came from. A merge of the
    same path's states cannot move content across paths: each is merged again by git's own
    merge (`git merge-tree`, its diff and its rules for modes) as a tree of that one file,
    from commits written to a scratch repository (scratch_repository: git's defaults, and the
    repository gains nothing). Files only (no folder, no submodule), each at most
    MAX_MERGED_BYTES; a merge with several merge bases (a criss-cross) is not taken."""

    def __init__(self, git_dir: Path, state: Callable[[str | None, str], State]) -> None:
        self.git_dir, self.state = git_dir, state
        self.bases: dict[str, str | None] = {}
        self.merged = 0

    def __call__(self, commit: CommitInfo, path: str) -> bool:
        if len(commit.parents) != 2:
            return False
        if commit.oid not in self.bases:
            out = git("merge-base", "--all", *commit.parents, git_dir=self.git_dir, check=False)
            found = out.decode().split()
            self.bases[commit.oid] = found[0] if len(found) == 1 else None
        base = self.bases[commit.oid]
        if base is None:
            return False
        was, ours, theirs, result = (
            self.state(c, path) for c in (base, *commit.parents, commit.oid)
        )
        if ours == theirs:
            return result == ours
        if was == ours or was == theirs:
            return result == (theirs if was == ours else ours)
        states = [s for s in (was, ours, theirs, result) if s is not None]
        if any(mode not in FILE_MODES for mode, _ in states):
            return False
        if self.merged >= MAX_CONTENT_MERGES:
            return False
        self.merged += 1
        return self._merges_to(was, ours, theirs, result)

    def _merges_to(self, was: State, ours: State, theirs: State, result: State) -> bool:
        """Whether git's clean merge of three states of one file is result (no blob past
        MAX_MERGED_BYTES). Raises DiffTooLarge past the bounds of gate.diffread."""
        states = (was, ours, theirs, result)
        blobs = [s[1] for s in states if s is not None]
        sizes = git("cat-file", "--batch-check=%(objectsize)", git_dir=self.git_dir,
                    input="".join(f"{b}\n" for b in blobs).encode()).split()  # fmt: skip
        if len(sizes) != len(blobs) or any(
            not size.isdigit() or int(size) > MAX_MERGED_BYTES for size in sizes
        ):
            return False
        with scratch_repository(self.git_dir) as (scratch, env):
            # The one-file tree of each state (the empty tree for none), made in one call.
            made = git("mktree", "--batch", git_dir=scratch, env=env, input="".join(
                f"{s[0]} blob {s[1]}\tf\n\n" for s in states if s is not None
            ).encode()).decode().split()  # fmt: skip
            files = iter(made)
            trees = [EMPTY_TREE if s is None else next(files) for s in states]

            def commit(tree: str, *parent: str) -> str:
                args = [a for p in parent for a in ("-p", p)]
                return git("commit-tree", tree, *args, "-m", "scratch", git_dir=scratch,
                           env=env).decode().strip()  # fmt: skip

            start = commit(trees[0])
            # With the bounds of every merge the gate makes (a pusher's files may be made for
            # a slow diff); a conflict is exit status 1, and no clean merge.
            try:
                out = read_git(
                    scratch, ["merge-tree", "--write-tree", "--no-messages",
                              commit(trees[1], start), commit(trees[2], start)],
                    "git's merge of one file's three states", limit=None, env=env,
                )  # fmt: skip
            except GitError:
                return False
        return out.decode("ascii", "replace").splitlines() == [trees[3]]
