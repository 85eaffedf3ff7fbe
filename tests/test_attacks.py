"""Attacks on the boundary found in review, kept as regression tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

POLICY = """\
paths: {read: ['**'], write: ['src/**']}
commands: {deny: ["rm -rf", "git push", "touch"], default: allow}
"""


@pytest.fixture
def repo(tmp_path: Path, key: Path) -> Path:
    return make_repo(tmp_path / "repo", policy=POLICY,
                     files={"src/a.py": "a\n", "README.md": "r\n"})  # fmt: skip


def predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


def test_a_submodule_with_its_own_filter_never_runs_code_on_the_host(repo: Path) -> None:
    marker = Path(f"/tmp/gk-pwned-{os.getpid()}")
    script = f"""
mkdir -p src/sub && cd src/sub && git init -q && echo data > f && git add f &&
git -c user.name=a -c user.email=a@b commit -qm x && cd ../.. && git add src/sub &&
git commit -qm 'add sub' ; cd src/sub && mkdir -p .git/info &&
echo '* filter=evil' > .git/info/attributes &&
git config filter.evil.clean "sh -c 'id > {marker}; cat'" && touch -d 2000-01-01 f; exit 0
"""
    policy = "paths: {read: ['**'], write: ['src/**']}\n"
    (repo / "p.yaml").write_text(policy)
    proc, data = run_json(repo, "sh", "-c", script, policy=repo / "p.yaml")
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    files = git(repo, "ls-tree", "-r", data["commit"]).splitlines()
    assert not any(line.startswith("160000") for line in files)


def test_folders_under_home_on_path_do_not_expose_their_neighbours(
    tmp_path: Path, key: Path, isolated_home: Path
) -> None:
    repo = make_repo(tmp_path / "r")
    tool = isolated_home / "projects" / "tool" / "bin"
    tool.mkdir(parents=True)
    (tool / "mytool").write_text("#!/bin/sh\necho tool-ok\n")
    (tool / "mytool").chmod(0o755)
    other = isolated_home / "projects" / "other"
    other.mkdir()
    (other / "notes.txt").write_text("NEIGHBOUR-PRIVATE\n")
    (isolated_home / "projects" / "tool" / ".env").write_text("TOOL-SECRET\n")
    env = {"PATH": f"{tool}:{os.environ['PATH']}"}
    proc, _ = run_json(repo, "sh", "-c", f"mytool; cat {other}/notes.txt "
                       f"{isolated_home}/projects/tool/.env; exit 0", env=env)  # fmt: skip
    assert "tool-ok" in proc.stderr
    assert "NEIGHBOUR-PRIVATE" not in proc.stderr and "TOOL-SECRET" not in proc.stderr


def test_credentials_in_the_repository_config_are_not_readable(repo: Path) -> None:
    git(repo, "remote", "add", "origin", "https://user:ghp_SECRETTOKEN@example.invalid/x.git")
    git(
        repo,
        "config",
        "http.https://example.invalid/.extraheader",
        "AUTHORIZATION: basic SECRETHDR",
    )
    proc, _ = run_json(repo, "sh", "-c", f"cat {repo}/.git/config; git remote -v; exit 0")
    assert "SECRETTOKEN" not in proc.stderr and "SECRETHDR" not in proc.stderr
    assert "example.invalid/x.git" in proc.stderr
    assert "SECRETTOKEN" in (repo / ".git" / "config").read_text()


@pytest.mark.parametrize(
    "attack, path",
    [
        ("echo b > /proc/self/cwd/README.md", "README.md"),
        ("mkdir /proc/self/cwd/newdir", "newdir"),
        ("mv /proc/self/cwd/src/a.py /proc/self/cwd/moved.py", "moved.py"),
        ("exec 3>>README.md; echo x > /dev/fd/3", "README.md"),
        ("echo x > /proc/self/root/etc/new", "/etc/new"),
    ],
)  # fmt: skip
def test_magic_proc_paths_do_not_get_around_the_write_set(
    repo: Path, attack: str, path: str
) -> None:
    proc, data = run_json(repo, "sh", "-c", f"{attack}; exit 0")
    pred = predicate(repo, data["commit"])
    denied = {
        w["path"] for w in pred["writes"] if w["decision"] == "deny" and w["source"] == "syscall"
    }
    assert path in denied, (pred["writes"], proc.stderr)
    assert git(repo, "show", f"{data['commit']}:README.md") == "r\n"


@pytest.mark.parametrize(
    "attack, argv0",
    [
        ("rm -r -f src", "rm"),
        ("rm -fr src", "rm"),
        ("git -C . push", "git"),
        ("exec 3</usr/bin/touch; /proc/self/fd/3 src/x", "/proc/self/fd/3"),
        ("printf '#!/bin/rm -rf\\n' > src/cleanup; chmod +x src/cleanup; ./src/cleanup src",
         "./src/cleanup"),
        ("python3 -c \"import os; fd = os.memfd_create('t'); "
         "os.write(fd, open('/usr/bin/touch', 'rb').read()); "
         "os.execve(fd, ['touch', 'src/x'], {})\"", "touch"),
    ],
)  # fmt: skip
def test_command_rules_hold_against_rewording_fds_and_scripts(
    repo: Path, attack: str, argv0: str
) -> None:
    proc, data = run_json(repo, "sh", "-c", f"{attack}; exit 0")
    pred = predicate(repo, data["commit"])
    denied = [p for p in pred["processes"] if p["decision"] == "deny"]
    assert any(p["argv"][0] == argv0 for p in denied), (pred["processes"], proc.stderr)
    worktree = Path(data["worktree"])
    assert (worktree / "src" / "a.py").exists() and not (worktree / "src" / "x").exists()


def test_a_fifo_or_symlink_as_the_agent_ref_cannot_stall_or_redirect_the_launcher(
    repo: Path,
) -> None:
    script = ("b=$(git symbolic-ref --short HEAD); d=$(git rev-parse --git-dir); "
              "rm $d/refs/heads/$b; mkfifo $d/refs/heads/$b; echo x > src/new.py")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (
        data["agent_commits"] == [] and git(repo, "show", f"{data['commit']}:src/new.py") == "x\n"
    )
    script = ("b=$(git symbolic-ref --short HEAD); d=$(git rev-parse --git-dir); "
              "rm $d/refs/heads/$b; ln -s /dev/zero $d/refs/heads/$b")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script, timeout=60)
    assert proc.returncode == 0 and data["agent_commits"] == []


def test_a_symlinked_folder_does_not_stop_the_commit(repo: Path) -> None:
    proc, data = run_json(repo, "sh", "-c", "echo y > src/b.py; rm -f src/a.py; exit 0")
    assert proc.returncode == 0
    proc, data = run_json(repo, "sh", "-c", "mkdir -p src/d && echo z > src/d/f; "
                          "mv src/d src/e && ln -s /tmp src/d; exit 0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert predicate(repo, data["commit"])["run_id"] == data["run_id"]


def test_objects_from_other_repositories_cannot_be_imported(repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", str(other))
    (other / "secret.txt").write_text("OTHER-REPO-SECRET\n")
    git(other, "add", "secret.txt")
    git(other, "commit", "-qm", "x")
    blob = git(other, "rev-parse", "HEAD:secret.txt").strip()
    script = (f"d=$(git rev-parse --git-dir); echo {other}/.git/objects >> $d/objects/info/alternates; "
              f"git update-index --add --cacheinfo 100644,{blob},src/stolen.txt && "
              "git commit -qm steal; exit 0")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits"] == []
    assert "src/stolen.txt" not in git(repo, "ls-tree", "-r", "--name-only", data["commit"])


def test_paths_that_are_not_utf8_keep_the_receipt_valid(repo: Path) -> None:
    proc, data = run_json(repo, "python3", "-c", "open(b'src/bad\\xff\\xfe.py', 'w').write('x')")
    assert proc.returncode == 0, proc.stderr
    pred = predicate(repo, data["commit"])
    assert len(pred["changes"]) == 1
    check = gk("check", "--repo", str(repo), "--base", "main", data["branch"])
    assert check.returncode == 0, check.stdout + check.stderr


def test_writes_to_the_repository_and_checkout_are_recorded_wherever_they_live(repo: Path) -> None:
    # The repository may live under /tmp or HOME, which are scratch inside the sandbox; what is
    # bound read-only there is still outside the boundary, and the attempt is recorded.
    targets = [f"{repo}/.git/hooks/pre-commit", f"{repo}/.git/config", f"{repo}/README.md"]
    script = "; ".join(f"echo x > {t}" for t in targets) + "; exit 0"
    proc, data = run_json(repo, "sh", "-c", script)
    pred = predicate(repo, data["commit"])
    denied = {
        w["path"] for w in pred["writes"] if w["decision"] == "deny" and w["source"] == "syscall"
    }
    assert set(targets) <= denied, (pred["writes"], proc.stderr)
