"""The repository's git dir inside the sandbox: objects read-only, nothing else of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.sandbox.mounts import agent_git_config

from conftest import git, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

HEADER_TOKEN = "INCLUDED-HEADER-TOKEN-1"
CRYPT_KEY = "GIT-CRYPT-KEY-MATERIAL-2"
URL_TOKEN = "URL-SECTION-TOKEN-3"
TOKENS = (HEADER_TOKEN, CRYPT_KEY, URL_TOKEN)


@pytest.fixture
def planted(tmp_path: Path, key: Path) -> Path:
    repo = make_repo(tmp_path / "r", files={"src/a.py": "a\n"})
    git_dir = repo / ".git"
    (git_dir / "creds.conf").write_text(
        f"[http]\n\textraHeader = AUTHORIZATION: bearer {HEADER_TOKEN}\n"
    )
    (git_dir / "git-crypt" / "keys").mkdir(parents=True)
    (git_dir / "git-crypt" / "keys" / "default").write_text(CRYPT_KEY + "\n")
    with (git_dir / "config").open("a") as fh:
        fh.write(
            "[include]\n\tpath = creds.conf\n"
            f'[url "https://user:{URL_TOKEN}@git.example.invalid/"]\n'
            "\tinsteadOf = https://git.example.invalid/\n"
            '[remote "origin"]\n\turl = https://git.example.invalid/r.git\n'
            "\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
        )
    return repo


def test_secrets_in_the_git_dir_are_unreadable_and_never_committed(planted: Path) -> None:
    repo = planted
    git_dir = repo / ".git"
    probe = (
        f"cat {git_dir}/creds.conf {git_dir}/git-crypt/keys/default {git_dir}/config; "
        "cat $(git rev-parse --git-dir)/config; git config --list --show-origin; "
        f"ls -la {git_dir}; grep -r . {git_dir} 2>/dev/null | grep -v objects/ | head -50; "
        f"cp -r {git_dir} src/copied-git; cp -r $(git rev-parse --git-dir) src/copied-private; "
        f"cp {git_dir}/creds.conf {git_dir}/git-crypt/keys/default src/; "
        "git config --list > src/config-list.txt; exit 0"
    )
    proc, data = run_json(repo, "sh", "-c", probe)
    assert proc.returncode == 0, proc.stderr
    for token in TOKENS:
        assert token not in proc.stderr, token
        hits = git(repo, "grep", "-I", "-l", token, data["commit"], check=False)
        assert hits == "", (token, hits)
    # The remote is there for the agent to see, without credentials.
    listed = git(repo, "show", f"{data['commit']}:src/config-list.txt")
    assert "remote.origin.url=https://git.example.invalid/r.git" in listed
    assert "include" not in listed and "insteadof" not in listed.lower()


def test_git_still_works_inside(planted: Path) -> None:
    script = (
        "git status --short && echo x > src/new.py && git add src/new.py && "
        "git commit -qm 'agent commit' && git log --oneline && git diff HEAD~1 --stat && "
        "git show --stat HEAD~1 | head -3 && git rev-parse --abbrev-ref HEAD"
    )
    proc, data = run_json(planted, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "agent commit" in proc.stderr and "initial" in proc.stderr
    assert len(data["agent_commits"]) == 1
    assert git(planted, "show", f"{data['commit']}:src/new.py") == "x\n"


def test_other_branches_are_not_listed(planted: Path) -> None:
    git(planted, "branch", "customer-acme-secret-project")
    git(planted, "commit", "-q", "--allow-empty", "-m", "later")
    proc, _ = run_json(planted, "sh", "-c", "git branch -a; git tag; git log --all --oneline")
    assert proc.returncode == 0, proc.stderr
    assert "customer-acme" not in proc.stderr
    assert "main" in proc.stderr  # the branch the run is based on


def test_stand_ins_for_protected_paths_stay_out_of_the_agents_git(planted: Path) -> None:
    # The default policy writes "**": empty read-only stand-ins hold .github/, .vscode/, ...
    script = ("ls -a; git status --porcelain --untracked-files=all; echo x > new.txt && "
              "git add -A && git commit -qm mine && git show --stat --format=%s HEAD")  # fmt: skip
    proc, data = run_json(planted, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert ".github" in proc.stderr and ".vscode" in proc.stderr  # the stand-ins are there ...
    assert "?? .github" not in proc.stderr and "?? .vscode" not in proc.stderr  # ... not work
    assert len(data["agent_commits"]) == 1, proc.stderr
    files = git(planted, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert files and not [f for f in files if f.startswith((".github", ".vscode"))]
    assert "new.txt" in files
    assert not (Path(data["worktree"]) / ".github").exists()


def test_the_agents_config_is_an_allowlist_with_includes_resolved(tmp_path: Path) -> None:
    (tmp_path / "more.conf").write_text(
        '[remote "up"]\n\turl = https://bot:SECRET1@example.invalid/up.git?private_token=SECRET2\n'
        "\tfetch = +refs/heads/*:refs/remotes/up/*\n"
        '[credential "https://example.invalid"]\n\thelper = store --file=/x SECRET3\n'
    )
    (tmp_path / "cond.conf").write_text("[http]\n\textraHeader = X-Token: SECRET4\n")
    config = tmp_path / "config"
    config.write_text(
        "[core]\n\tautocrlf = input\n\tsshCommand = ssh -i /k SECRET5\n\taskPass = /bin/SECRET6\n"
        "\thooksPath = /SECRET7\n[include]\n\tpath = more.conf\n"
        '[includeIf "gitdir:/"]\n\tpath = cond.conf\n'
        '[url "https://u:SECRET8@example.invalid/"]\n\tinsteadOf = https://example.invalid/\n'
        '[remote "origin"]\n\turl = git@example.invalid:org/r.git\n'
        '[alias]\n\tx = !echo SECRET9\n[filter "f"]\n\tclean = SECRET10\n'
    )
    text = agent_git_config(config)
    assert "SECRET" not in text, text
    assert 'url = "https://example.invalid/up.git"' in text
    assert 'url = "git@example.invalid:org/r.git"' in text
    assert "autocrlf = input" in text and "fetch" in text
