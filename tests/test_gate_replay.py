"""A generated history of more than 100 commits, replayed one run per commit as a stack.

The history is written by the test itself, deterministically: text and binary files added,
edited, renamed (with and without edits) and deleted; symlinks turning into files and back;
mode changes; folders whose `.gitignore` ignores itself and everything in it; non-ASCII names;
and side branches merged back. Each first-parent commit is then replayed as one run on a stack:
the run's result is that commit's tree, committed on top of the previous run's result, and its
receipt is signed through the library the way the launcher signs (a real sandboxed run costs
about five seconds on a loaded machine, so 100 of them would not fit in a test run).

The replayed stack must replay the history exactly and pass the gated server; rebased onto a
newer main, and squashed (onto the same base and after the rebase), it passes too; and any
single tamper, anywhere in it, blocks.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.gate_receipts import git_dir_of
from fixtures.stacks import Server, assert_pass, head, receipt_for, squash

from gatekeeper.gate import GateResult, judge
from gatekeeper.receipt.notes import NOTES_REF

from conftest import git, gk

pytestmark = pytest.mark.slow

FIRST_PARENT_COMMITS = 104


class _Writer:
    """Writes a deterministic history on the checked-out branch of repo."""

    def __init__(self, repo: Path, seed: int = 11) -> None:
        self.repo, self.rng, self.n = repo, random.Random(seed), 0
        self.text: list[str] = []  # regular text files present now
        self.binary: list[str] = []
        self.links: list[str] = []  # symlinks that may turn into files
        self.ignored_dirs: list[str] = []

    def path(self, rel: str) -> Path:
        target = self.repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def fresh(self) -> int:
        self.n += 1
        return self.n

    def name(self) -> str:
        self.fresh()
        return self.rng.choice(
            [f"src/mod_{self.n}.py", f"données/résumé {self.n}.txt", f"文档/說明{self.n}.md",
             f"deep/a/b/c/file-{self.n}.txt", f"ünï/cödé_{self.n}.txt"]
        )  # fmt: skip

    def write(self, rel: str, data: str | bytes) -> None:
        target = self.path(rel)
        if target.is_symlink():
            target.unlink()
        if isinstance(data, bytes):
            target.write_bytes(data)
        else:
            target.write_text(data)

    # Each step changes the tree in one way; a commit makes one to three of them.
    def add_text(self) -> None:
        rel = self.name()
        self.write(rel, "".join(f"{rel} line {i}\n" for i in range(self.rng.randint(1, 6))))
        self.text.append(rel)

    def edit_text(self) -> None:
        if self.text:
            rel = self.rng.choice(self.text)
            with open(self.path(rel), "a") as fh:
                fh.write(f"edit {self.n}\n")

    def rename(self, edit: bool) -> None:
        if self.text:
            old = self.text.pop(self.rng.randrange(len(self.text)))
            new = f"moved/{self.fresh()}-{Path(old).name}"
            self.path(new)
            os.rename(self.repo / old, self.repo / new)
            if edit:
                with open(self.repo / new, "a") as fh:
                    fh.write("edited while moved\n")
            self.text.append(new)

    def delete(self) -> None:
        if len(self.text) > 3:
            (self.repo / self.text.pop(self.rng.randrange(len(self.text)))).unlink()

    def binary_step(self) -> None:
        if self.binary and self.rng.random() < 0.5:
            rel = self.rng.choice(self.binary)
        else:
            rel = f"bin/blob-{self.fresh()}.bin"
            self.binary.append(rel)
        self.write(rel, bytes(self.rng.randrange(256) for _ in range(300)) + b"\0\xff")

    def link_step(self) -> None:
        """A new symlink, a symlink turned into a file, or a file turned back into a symlink."""
        if self.links and self.rng.random() < 0.6:
            rel = self.links.pop(0)
            self.write(rel, f"{rel} is a file now\n")
            self.text.append(rel)
        elif self.text and self.rng.random() < 0.5:
            rel = self.text.pop(self.rng.randrange(len(self.text)))
            (self.repo / rel).unlink()
            os.symlink("../README.md", self.repo / rel)
            self.links.append(rel)
        else:
            rel = f"links/l{self.fresh()}"
            self.path(rel)
            os.symlink(self.rng.choice(["../README.md", "nowhere", "../src"]), self.repo / rel)
            self.links.append(rel)

    def mode_step(self) -> None:
        if self.text:
            target = self.repo / self.rng.choice(self.text)
            target.chmod(0o755 if not target.stat().st_mode & 0o100 else 0o644)

    def ignored_step(self) -> None:
        """A folder whose .gitignore ignores itself, or more files in one."""
        if self.ignored_dirs and self.rng.random() < 0.5:
            folder = self.rng.choice(self.ignored_dirs)
        else:
            folder = f"gen{self.fresh()}"
            self.write(f"{folder}/.gitignore", "*\n")
            self.ignored_dirs.append(folder)
        n = self.fresh()
        self.write(f"{folder}/out-{n}.log", f"build output {n}\n")

    def commit(self, message: str) -> None:
        steps: list[Callable[[], None]] = [
            self.add_text, self.edit_text, lambda: self.rename(False), lambda: self.rename(True),
            self.delete, self.binary_step, self.link_step, self.mode_step, self.ignored_step,
        ]  # fmt: skip
        self.rng.choice(steps)()
        for step in self.rng.sample(steps, self.rng.randint(0, 2)):
            step()
        git(self.repo, "add", "-A", "--force")
        git(self.repo, "commit", "-q", "--allow-empty", "-m", message)


def write_history(repo: Path, branch: str) -> list[str]:
    """The generated history on branch; returns its first-parent commits, oldest first."""
    git(repo, "checkout", "-q", "-b", branch)
    writer = _Writer(repo)
    os.symlink("README.md", repo / "link-stable")
    git(repo, "add", "link-stable")
    git(repo, "commit", "-q", "-m", "a stable link")
    for i in range(FIRST_PARENT_COMMITS - 1):
        if i % 12 == 11:  # a side branch of two commits on paths of its own, merged back
            side = f"side-{i}"
            git(repo, "checkout", "-q", "-b", side)
            for j in range(2):
                writer.write(f"side/{i}/ñ-{j}.txt", f"side {i} {j}\n")
                git(repo, "add", "-A", "--force")
                git(repo, "commit", "-q", "-m", f"side {i}.{j}")
            git(repo, "checkout", "-q", branch)
            writer.commit(f"history {i} before the merge")
            git(repo, "merge", "-q", "--no-ff", "-m", f"merge {side}", side)
        else:
            writer.commit(f"history {i}")
    return git(repo, "rev-list", "--first-parent", "--reverse", f"main..{branch}").split()


def replay(repo: Path, history: list[str], branch: str) -> list[str]:
    """One run per commit of history, stacked on branch: each run's result is that commit's
    tree; returns the results."""
    git(repo, "checkout", "-q", "-b", branch, "main")
    results = []
    for commit in history:
        git(repo, "read-tree", "--reset", "-u", commit)
        git(repo, "commit", "-q", "--allow-empty", "-m", f"replay of {commit[:12]}")
        results.append(head(repo))
        receipt_for(repo, results[-1])
    return results


@dataclass
class Built:
    root: Path
    history: list[str]
    replayed: list[str]
    keys: Path  # GATEKEEPER_HOME with the key the stack's receipts are signed with


@pytest.fixture(scope="module")
def stack_built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """The server, its clone with the history and the replayed stack (made once, copied)."""
    root = tmp_path_factory.mktemp("replay")
    home = root / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Test User\n\temail = test@example.invalid\n"
        "[init]\n\tdefaultBranch = main\n"
    )
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "HOME": home, "GATEKEEPER_HOME": home / ".config" / "gatekeeper",
            "XDG_CONFIG_HOME": home / ".config", "XDG_DATA_HOME": home / ".local" / "share",
            "GIT_CONFIG_GLOBAL": home / ".gitconfig", "GIT_CONFIG_NOSYSTEM": "1",
        }.items():  # fmt: skip
            mp.setenv(name, str(value))
        assert gk("keys", "generate").returncode == 0
        server = Server(root / "work")
        history = write_history(server.clone, "history")
        replayed = replay(server.clone, history, "feature")
    yield Built(root / "work", history, replayed, home / ".config" / "gatekeeper")


@pytest.fixture
def built(stack_built: Built, monkeypatch: pytest.MonkeyPatch) -> Built:
    """The built stack, with its signing key for the runs a test adds (main moving on)."""
    monkeypatch.setenv("GATEKEEPER_HOME", str(stack_built.keys))
    return stack_built


def copy_of(built: Built, tmp_path: Path) -> Server:
    """A copy of the built server and clone, the clone's origin pointing at the copy."""
    work = tmp_path / "work"
    shutil.copytree(built.root, work, symlinks=True)
    server = Server.__new__(Server)
    server.bare, server.clone = work / "server.git", work / "clone"
    git(server.clone, "remote", "set-url", "origin", str(server.bare))
    return server


def check(repo: Path, rev: str = "HEAD", base: str = "main") -> GateResult:
    return judge(git_dir_of(repo), head(repo, base), head(repo, rev))


def test_the_history_is_what_it_should_be(built: Built) -> None:
    clone = built.root / "clone"
    assert len(built.history) >= 100
    merges = git(clone, "rev-list", "--merges", "main..history").split()
    assert len(merges) >= 8
    raw = git(clone, "log", "--raw", "--no-renames", "--format=", "-c", "main..history")
    assert "120000" in raw and "100755" in raw  # symlinks and executables came and went
    summary = git(clone, "log", "-M", "--summary", "--format=", "main..history")
    assert "rename" in summary and "delete mode" in summary and "mode change" in summary
    names = git(clone, "-c", "core.quotePath=false", "log", "--name-only", "--format=",
                "main..history")  # fmt: skip
    assert "données/" in names and "ünï/" in names and "文档/" in names and "/ñ-" in names
    assert "/.gitignore" in names and ".log" in names  # self-ignoring folders were committed
    types = git(clone, "log", "--raw", "--format=", "main..history")
    assert " T\t" in types  # a path changed type (symlink <-> file)


def test_the_history_replays_exactly_and_the_stack_passes(built: Built, tmp_path: Path) -> None:
    served = copy_of(built, tmp_path)
    for original, replayed in zip(built.history, built.replayed, strict=True):
        assert head(served.clone, f"{replayed}^{{tree}}") == head(
            served.clone, f"{original}^{{tree}}"
        )
    proc = served.push_main("feature")
    assert_pass(proc)
    assert f"{len(built.replayed)} receipt(s) verified, 0 finding(s)" in proc.stderr


@pytest.mark.parametrize("how", ["rebased", "squashed", "rebased-and-squashed"])
def test_the_stack_rebased_or_squashed_passes(built: Built, tmp_path: Path, how: str) -> None:
    served = copy_of(built, tmp_path)
    clone = served.clone
    git(clone, "checkout", "-q", "feature")
    start = head(clone, "main")
    if how.startswith("rebased"):
        served.advance_main({"NEWS.md": "main moves on\n"})
        git(clone, "rebase", "-q", "origin/main")
        start = head(clone, "origin/main")
        assert len(git(clone, "rev-list", f"{start}..HEAD").split()) == len(built.replayed)
    runs = len(built.replayed)
    if how.endswith("squashed"):
        squash(clone, start)
        # A squash is covered by the chain of runs whose changes it makes; a run that changed
        # nothing (its base tree is its result tree) adds nothing to it and may be left out.
        runs -= sum(
            1
            for r in built.replayed
            if head(clone, f"{r}^{{tree}}") == head(clone, f"{r}~1^{{tree}}")
        )
    proc = served.push_main()
    assert_pass(proc)
    verified = int(proc.stderr.split("PASS (")[1].split(" ")[0])
    assert runs <= verified <= len(built.replayed), proc.stderr


# --- any single tamper blocks -------------------------------------------------------------------


def rewrite_one(repo: Path, commit: str, edit: Callable[[Path], None]) -> None:
    """Change one commit of feature's stack; every later commit keeps its tree."""
    later = git(repo, "rev-list", "--reverse", f"{commit}..feature").split()
    git(repo, "checkout", "-q", "--detach", commit)
    edit(repo)
    git(repo, "add", "-A", "--force")
    git(repo, "commit", "-q", "--amend", "--allow-empty", "--no-edit")
    tip = head(repo)
    for oid in later:
        tip = git(repo, "commit-tree", f"{oid}^{{tree}}", "-p", tip, "-m", "replay").strip()
    git(repo, "checkout", "-q", "-B", "feature", tip)


def extra_line(repo: Path) -> None:
    with open(repo / "README.md", "a") as fh:
        fh.write("one extra line\n")


def flip_mode(repo: Path) -> None:
    (repo / "README.md").chmod(0o755)


def link_as_file(repo: Path) -> None:
    (repo / "link-stable").unlink()
    (repo / "link-stable").write_text("README.md")


def flip_binary_byte(repo: Path) -> None:
    blobs = sorted((repo / "bin").iterdir())
    data = bytearray(blobs[0].read_bytes())
    data[0] ^= 1
    blobs[0].write_bytes(bytes(data))


def ignored_file(repo: Path) -> None:
    folder = next(p for p in sorted(repo.iterdir()) if p.name.startswith("gen"))
    (folder / "sneaked-in.log").write_text("not the run's\n")


EDITS = {
    "extra-line": extra_line,
    "mode": flip_mode,
    "link-as-file": link_as_file,
    "binary-byte": flip_binary_byte,
    "ignored-file": ignored_file,
}


@pytest.mark.parametrize("where", ["middle", "tip"])
@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_a_changed_commit_in_the_stack_blocks(
    built: Built, tmp_path: Path, edit: str, where: str
) -> None:
    served = copy_of(built, tmp_path)
    at = built.replayed[-1] if where == "tip" else built.replayed[len(built.replayed) // 2 + 3]
    rewrite_one(served.clone, at, EDITS[edit])
    result = check(served.clone, "feature")
    kinds = {f.kind.value for f in result.findings}
    assert "uncovered-commit" in kinds
    if where == "tip":
        assert kinds & {"unclaimed-change", "change-differs"}


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_a_changed_squash_of_the_rebased_stack_blocks(
    built: Built, tmp_path: Path, edit: str
) -> None:
    served = copy_of(built, tmp_path)
    clone = served.clone
    git(clone, "checkout", "-q", "feature")
    served.advance_main({"NEWS.md": "main moves on\n"})
    git(clone, "rebase", "-q", "origin/main")
    EDITS[edit](clone)
    git(clone, "add", "-A", "--force")
    squash(clone, head(clone, "origin/main"))
    result = check(clone, "HEAD", "origin/main")
    kinds = {f.kind.value for f in result.findings}
    assert "uncovered-commit" in kinds and kinds & {"unclaimed-change", "change-differs"}


def test_a_receipt_removed_from_the_stack_blocks(built: Built, tmp_path: Path) -> None:
    served = copy_of(built, tmp_path)
    middle = built.replayed[len(built.replayed) // 2]
    git(served.clone, "notes", f"--ref={NOTES_REF}", "remove", middle)
    result = check(served.clone, "feature")
    assert ("uncovered-commit", middle) in {(f.kind.value, f.commit) for f in result.findings}


def test_a_receipt_changed_in_the_stack_blocks(built: Built, tmp_path: Path) -> None:
    served = copy_of(built, tmp_path)
    middle = built.replayed[len(built.replayed) // 2]
    line = git(served.clone, "notes", f"--ref={NOTES_REF}", "show", middle).strip()
    forged = line.replace('"payload":"', '"payload":"A', 1)
    git(served.clone, "notes", f"--ref={NOTES_REF}", "add", "-f", "-m", forged, middle)
    kinds = {f.kind.value for f in check(served.clone, "feature").findings}
    assert {"uncovered-commit"} <= kinds and kinds & {"bad-signature", "malformed-receipt"}
