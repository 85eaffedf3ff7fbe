"""`gatekeeper hooks install` and the local hooks, run by real git."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.gate_receipts import commit_files, receipted_commit

from gatekeeper.gate.install import HOOK_ID
from gatekeeper.receipt.notes import NOTES_REF

from conftest import git, gk


def run_git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"], GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=120
    )


def install(repo: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return gk("hooks", "install", "--repo", str(repo), *extra)


def test_install_puts_hooks_in_the_common_git_dir(repo: Path, tmp_path: Path) -> None:
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "side", str(worktree))
    proc = install(worktree)
    assert proc.returncode == 0, proc.stderr
    for name in ("pre-push", "pre-merge-commit"):
        hook = repo / ".git" / "hooks" / name
        text = hook.read_text()
        assert HOOK_ID in text
        assert sys.executable in text
        assert os.access(hook, os.X_OK)
    assert not (repo / ".git" / "worktrees" / "wt" / "hooks").exists()


def test_install_refuses_an_interpreter_that_finds_gatekeeper_only_through_pythonpath(
    repo: Path, tmp_path: Path
) -> None:
    """Hooks run `python -I`, which ignores PYTHONPATH: a gatekeeper run from a source folder
    through PYTHONPATH would leave hooks that fail at every push. Nothing is written."""
    base = getattr(sys, "_base_executable", sys.executable)
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests' interpreter is not a virtual environment's")
    import gatekeeper

    source = Path(gatekeeper.__file__).resolve().parent.parent
    site = [p for p in sys.path if p.endswith("site-packages")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), *site])}
    hooks = repo / ".git" / "hooks"
    before = sorted(p.name for p in hooks.iterdir()) if hooks.exists() else []
    proc = subprocess.run([base, "-m", "gatekeeper", "hooks", "install", "--repo", str(repo)],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "cannot import gatekeeper in isolated mode" in proc.stderr, proc.stderr
    assert "pip install" in proc.stderr
    assert (sorted(p.name for p in hooks.iterdir()) if hooks.exists() else []) == before
    # init, which installs the hooks too, says so before it writes its files
    fresh = tmp_path / "fresh"
    git(tmp_path, "init", "-q", str(fresh))
    config = (fresh / ".git" / "config").read_text()
    proc = subprocess.run([base, "-m", "gatekeeper", "init", "--repo", str(fresh)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "cannot import gatekeeper in isolated mode" in proc.stderr, proc.stderr
    assert sorted(p.name for p in fresh.iterdir()) == [".git"]
    assert (fresh / ".git" / "config").read_text() == config


def test_install_refuses_an_interpreter_that_cannot_import_it(tmp_path: Path) -> None:
    from gatekeeper.errors import UsageError
    from gatekeeper.gate.install import isolated_import

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'gatekeeper'\" >&2\n"
                    "exit 1\n")  # fmt: skip
    fake.chmod(0o755)
    with pytest.raises(UsageError, match="No module named 'gatekeeper'"):
        isolated_import(str(fake))
    with pytest.raises(UsageError, match="cannot be started"):
        isolated_import(str(tmp_path / "missing"))
    fake.write_text("#!/bin/sh\nexit 0\n")  # (a .pth that ends the probe before it says)
    with pytest.raises(UsageError, match="did not say where from"):
        isolated_import(str(fake))
    isolated_import(sys.executable)  # the tests' own: installed, it imports
    isolated_import(sys.executable, work_tree=tmp_path / "elsewhere")


def test_install_refuses_an_interpreter_whose_environment_lies_in_the_work_tree(
    tmp_path: Path,
) -> None:
    """A merge writes the branch's files into the work tree before pre-merge-commit runs, and
    -I does not stop a virtual environment's .pth files: an interpreter there would run the
    branch's code in the gate's place."""
    from gatekeeper.errors import UsageError
    from gatekeeper.gate.install import isolated_import

    top = tmp_path / "project"
    (top / ".venv" / "bin").mkdir(parents=True)
    for prefix, package, what in (
        (top / ".venv", tmp_path / "site" / "gatekeeper", "environment"),
        (tmp_path / "venv", top / "src" / "gatekeeper", "gatekeeper"),
    ):
        fake = top / ".venv" / "bin" / "python"
        fake.write_text(f"#!/bin/sh\necho 'a .pth printed this'\necho {prefix}\necho {package}\n")
        fake.chmod(0o755)
        with pytest.raises(UsageError, match=f"whose {what} .* lies in the repository's work"):
            isolated_import(str(fake), work_tree=top)
        isolated_import(str(fake), work_tree=tmp_path / "other")  # elsewhere: only a warning


def test_reinstall_replaces_its_own_hooks(repo: Path) -> None:
    assert install(repo).returncode == 0
    proc = install(repo)
    assert proc.returncode == 0
    assert "updated" in proc.stderr
    assert sorted(p.name for p in (repo / ".git" / "hooks").iterdir() if "legacy" in p.name) == []


def test_a_foreign_hook_is_moved_aside_and_still_runs(repo: Path, tmp_path: Path) -> None:
    hooks = repo / ".git" / "hooks"
    marker = tmp_path / "legacy-ran"
    foreign = f'#!/bin/sh\ncat > {marker}\necho legacy args: "$@" >> {marker}\n'
    (hooks / "pre-push").write_text(foreign)
    (hooks / "pre-push").chmod(0o755)
    proc = install(repo)
    assert proc.returncode == 0
    assert (hooks / "pre-push.legacy").read_text() == foreign
    assert "kept as" in proc.stderr

    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    proc = run_git(repo, "push", "origin", "main:refs/heads/wip")  # not protected: gate passes
    assert proc.returncode == 0, proc.stderr
    ran = marker.read_text()
    assert "refs/heads/main" in ran and "legacy args: origin" in ran  # same stdin and arguments

    (hooks / "pre-push").write_text("#!/bin/sh\nexit 0\n")  # another foreign hook
    assert install(repo).returncode == 0
    assert (hooks / "pre-push.legacy.1").read_text() == "#!/bin/sh\nexit 0\n"


def test_core_hooks_path_is_refused_with_a_hint(repo: Path) -> None:
    git(repo, "config", "core.hooksPath", ".githooks")
    proc = install(repo)
    assert proc.returncode == 2
    assert "Cowardly refusing to install hooks with `core.hooksPath` set" in proc.stderr
    assert "git config --unset-all core.hooksPath" in proc.stderr
    assert not (repo / ".git" / "hooks" / "pre-push").exists()


def test_init_installs_the_local_hooks(tmp_path: Path, key: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    proc = gk("init", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert HOOK_ID in (repo / ".git" / "hooks" / "pre-push").read_text()
    assert HOOK_ID in (repo / ".git" / "hooks" / "pre-merge-commit").read_text()


def test_server_install_sets_protected_refs(tmp_path: Path, repo: Path) -> None:
    bare = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    proc = gk(
        "hooks",
        "install",
        "--server",
        str(bare),
        "--protect",
        "main",
        "--protect",
        "refs/heads/release/*",
    )
    assert proc.returncode == 0, proc.stderr
    assert HOOK_ID in (bare / "hooks" / "pre-receive").read_text()
    assert git(bare, "config", "--get-all", "gatekeeper.protect").split() == [
        "refs/heads/main",
        "refs/heads/release/*",
    ]
    assert "protected refs: refs/heads/main, refs/heads/release/*" in proc.stderr


def test_a_hook_whose_interpreter_is_gone_refuses(tmp_path: Path, repo: Path) -> None:
    bare = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    assert gk("hooks", "install", "--server", str(bare)).returncode == 0
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(hook.read_text().replace(sys.executable, "/nonexistent/python"))
    proc = subprocess.run(
        [str(hook)], input="", capture_output=True, text=True, cwd=bare, check=False
    )
    assert proc.returncode == 1
    assert "run 'gatekeeper hooks install' again" in proc.stderr


# --- the local hooks at work --------------------------------------------------------------------


@pytest.fixture
def pushing(repo: Path, tmp_path: Path) -> Path:
    """repo with hooks installed and a bare remote `origin` that has main."""
    remote = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "origin", "main")
    git(repo, "fetch", "-q", "origin")
    git(repo, "remote", "set-head", "origin", "main")
    assert install(repo).returncode == 0
    return repo


def test_pre_push_refuses_an_unreceipted_commit_on_the_protected_branch(pushing: Path) -> None:
    commit_files(pushing, {"src/app.py": "by hand\n"}, branch="main", message="by hand")
    proc = run_git(pushing, "push", "origin", "main")
    assert proc.returncode != 0
    assert "gatekeeper: refs/heads/main: BLOCK" in proc.stderr
    assert "uncovered-commit" in proc.stderr and "unclaimed-change" in proc.stderr
    assert "failed to push" in proc.stderr


def test_pre_push_lets_receipted_work_and_other_branches_through(pushing: Path) -> None:
    commit_files(pushing, {"wip.txt": "x\n"}, branch="wip", start="main")
    assert run_git(pushing, "push", "origin", "wip").returncode == 0
    agent = receipted_commit(pushing, {"src/feature.py": "x = 1\n"})
    git(pushing, "checkout", "-q", "main")
    git(pushing, "merge", "-q", "--ff-only", agent)
    proc = run_git(pushing, "push", "origin", "main", NOTES_REF)
    assert proc.returncode == 0, proc.stderr
    assert "refs/heads/main: PASS" in proc.stderr


def test_pre_push_hints_when_receipts_stay_behind(pushing: Path) -> None:
    agent = receipted_commit(pushing, {"src/feature.py": "x = 1\n"})
    proc = run_git(pushing, "push", "origin", f"{agent}:refs/heads/main")
    assert proc.returncode == 0, proc.stderr
    assert f"push {NOTES_REF} too" in proc.stderr


def test_pre_merge_commit_refuses_an_unreceipted_branch(pushing: Path) -> None:
    commit_files(pushing, {"src/app.py": "by hand\n"}, branch="topic", start="main")
    git(pushing, "checkout", "-q", "main")
    commit_files(pushing, {"docs/x.md": "x\n"}, message="main moves")  # so the merge is real
    proc = run_git(pushing, "merge", "--no-edit", "topic")
    assert proc.returncode != 0
    assert "gatekeeper: refs/heads/main: BLOCK" in proc.stderr
    assert "uncovered-commit" in proc.stderr

    git(pushing, "reset", "-q", "--hard")  # the refused merge left its result uncommitted
    agent = receipted_commit(
        pushing, {"src/feature.py": "x = 1\n"}, branch="agent/ok", start="main~1"
    )
    git(pushing, "checkout", "-q", "main")
    proc = run_git(pushing, "merge", "--no-edit", agent)
    assert proc.returncode == 0, proc.stderr
    assert "refs/heads/main: PASS" in proc.stderr


@pytest.mark.parametrize("how", ["refused", "conflict"])
def test_committing_a_stopped_merge_is_judged_too(pushing: Path, how: str) -> None:
    """`git commit` after a merge stopped (pre-merge-commit refused it, or a conflict was
    resolved by hand) runs the pre-commit hook, not pre-merge-commit: it judges the branch in
    MERGE_HEAD the same way. A commit that completes no merge is not judged."""
    same = "src/app.py" if how == "conflict" else "src/topic.py"
    commit_files(pushing, {same: "topic\n"}, branch="topic", start="main")
    git(pushing, "checkout", "-q", "main")
    commit_files(pushing, {"src/app.py": "main\n"}, message="main moves")
    proc = run_git(pushing, "merge", "--no-edit", "topic")
    assert proc.returncode != 0
    if how == "refused":
        assert "gatekeeper: refs/heads/main: BLOCK" in proc.stderr
        assert "`git merge --abort` drops it" in proc.stderr
    else:
        assert "CONFLICT" in proc.stdout + proc.stderr
        (pushing / "src" / "app.py").write_text("resolved\n")
        git(pushing, "add", "src/app.py")
    before = git(pushing, "rev-parse", "HEAD")
    proc = run_git(pushing, "commit", "--no-edit")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "gatekeeper: refs/heads/main: BLOCK" in proc.stderr
    assert "uncovered-commit" in proc.stderr
    assert git(pushing, "rev-parse", "HEAD") == before  # the merge was not committed
    git(pushing, "merge", "--abort")
    commit_files(pushing, {"docs/plain.md": "a plain commit\n"}, message="not a merge")
    assert git(pushing, "log", "-1", "--format=%s").strip() == "not a merge"


def test_pre_merge_commit_ignores_unprotected_branches(pushing: Path) -> None:
    commit_files(pushing, {"a.txt": "a\n"}, branch="topic", start="main")
    commit_files(pushing, {"b.txt": "b\n"}, branch="other", start="main")
    proc = run_git(pushing, "merge", "--no-edit", "topic")
    assert proc.returncode == 0, proc.stderr


def test_hooks_work_from_a_linked_worktree(pushing: Path, tmp_path: Path) -> None:
    worktree = tmp_path / "wt"
    git(pushing, "worktree", "add", "-q", "-b", "side", str(worktree), "main")
    commit_files(worktree, {"src/app.py": "by hand\n"}, message="by hand")
    proc = run_git(worktree, "push", "origin", "side:main")
    assert proc.returncode != 0
    assert "uncovered-commit" in proc.stderr
