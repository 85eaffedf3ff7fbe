"""The mount layer alone keeps writes inside the write set, whatever the write entries name.

These tests run bubblewrap with the mount plan but without the supervisor: an agent that beats
the supervisor's judgement (a second thread flipping its working directory) has exactly this
much power, so nothing the supervisor would refuse may get through here.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gatekeeper.policy.model import parse_policy
from gatekeeper.run.worktree import Worktree
from gatekeeper.sandbox.launch import Sandbox
from gatekeeper.sandbox.limits import ProcessLimit
from gatekeeper.sandbox.mounts import MountPlan, remove_placeholders

from conftest import git, gk, make_repo, needs_bwrap
from helpers import sandbox_plan, user_visible_state

pytestmark = [needs_bwrap, pytest.mark.sandbox]

FILES = {
    "src/a.py": "a\n",
    "src/data.txt": "d\n",
    "src/pkg/b.py": "b\n",
    "docs/guide.md": "g\n",
    "README.md": "r\n",
}


def _plan(
    tmp_path: Path, write: list[str], files: dict[str, str] | None = None
) -> tuple[Path, Worktree, MountPlan]:
    repo = make_repo(tmp_path / "r", files=files or FILES)
    policy = parse_policy(f"paths: {{read: ['**'], write: {write!r}}}\n".encode(), "p.yaml")
    _, wt, plan = sandbox_plan(repo, policy, tmp_path / "scratch")
    return repo, wt, plan


def _run_unsupervised(plan: MountPlan, script: str, out: Path) -> str:
    limit = ProcessLimit(plan.env["GATEKEEPER_RUN_ID"], 256)
    sandbox = Sandbox(plan, max_file_size=1 << 20, process_limit=limit)
    try:
        with out.open("wb") as fh:
            outcome = sandbox.run(["sh", "-c", script], deadline=time.monotonic() + 60, stdout=fh)
    finally:
        sandbox.close()
        limit.remove()
    assert outcome.exit_code == 0, out.read_text()
    return out.read_text()


# Every place an agent might try to write: existing files and folders of each kind, new names
# beside them, new folders, and the places a rename or a hard link would come from.
ATTEMPTS = [
    "README.md", "new.txt", "newdir/x", "src/data.txt", "src/new.py", "src/new.txt",
    "src/pkg/b.py", "src/pkg/new.py", "docs/guide.md", "docs/new.md", "notes/other.md",
    ".gatekeeper/policy.yaml", ".git",
]  # fmt: skip


def _attack(allowed: list[str]) -> str:
    lines = []
    for target in ATTEMPTS:
        if target in allowed:
            continue
        lines.append(f"(mkdir -p $(dirname {target}) 2>/dev/null; echo x > {target}) 2>/dev/null "
                     f"&& echo WROTE {target}")  # fmt: skip
    # Renames and links inside the worktree: from a writable place onto read-only names.
    for target in allowed:
        lines.append(f"mv {target} moved.txt 2>/dev/null && echo WROTE moved-{target}")
        lines.append(f"ln {target} src/hard 2>/dev/null && echo WROTE hard-{target}")
        lines.append(f"ln -s /etc/passwd $(dirname {target})/sl 2>/dev/null && echo WROTE sl")
    lines += [f"echo ok >> {t} && echo ALLOWED {t}" for t in allowed]
    lines.append("rmdir src/pkg 2>/dev/null && echo WROTE rmdir")
    lines.append("rm -f README.md 2>/dev/null; test -e README.md || echo WROTE rm")
    return "; ".join(lines) + "; exit 0"


def test_a_write_entry_for_a_path_that_does_not_exist_opens_only_that_path(
    tmp_path: Path, key: Path
) -> None:
    repo, wt, plan = _plan(tmp_path, ["notes/todo.md"])
    assert "." not in plan.writable
    text = _run_unsupervised(plan, _attack(["notes/todo.md"]), tmp_path / "out.txt")
    assert "WROTE" not in text, text
    assert "ALLOWED notes/todo.md" in text
    assert (wt.path / "notes" / "todo.md").read_text() == "ok\n"
    assert (wt.path / "README.md").read_text() == "r\n"
    assert not (wt.path / "new.txt").exists() and not (wt.path / "moved.txt").exists()


def test_a_glob_in_a_mixed_folder_opens_only_the_matching_files(tmp_path: Path, key: Path) -> None:
    repo, wt, plan = _plan(tmp_path, ["src/*.py"])
    assert "src" not in plan.writable and "." not in plan.writable
    text = _run_unsupervised(plan, _attack(["src/a.py"]), tmp_path / "out.txt")
    assert "WROTE" not in text, text
    assert "ALLOWED src/a.py" in text
    assert (wt.path / "src" / "a.py").read_text() == "a\nok\n"
    assert (wt.path / "src" / "data.txt").read_text() == "d\n"
    assert not (wt.path / "src" / "new.py").exists()


def test_a_folder_wholly_in_the_write_set_stays_a_folder_bind(tmp_path: Path, key: Path) -> None:
    repo, wt, plan = _plan(tmp_path, ["src/**"])
    assert plan.writable == ["src"]
    script = ("echo n > src/new.py && mkdir src/d && echo n > src/d/x && mv src/a.py src/c.py "
              "&& echo FOLDER-OK; echo x > README.md 2>/dev/null && echo WROTE; exit 0")  # fmt: skip
    text = _run_unsupervised(plan, script, tmp_path / "out.txt")
    assert "FOLDER-OK" in text and "WROTE" not in text, text


def test_a_placeholder_the_agent_left_empty_is_removed(tmp_path: Path, key: Path) -> None:
    repo, wt, plan = _plan(tmp_path, ["notes/todo.md", "build"])
    assert (wt.path / "notes" / "todo.md").is_file() and (wt.path / "build").is_dir()
    _run_unsupervised(plan, "exit 0", tmp_path / "out.txt")
    remove_placeholders(plan)
    assert not (wt.path / "notes").exists() and not (wt.path / "build").exists()


def test_a_placeholder_the_agent_wrote_is_kept(tmp_path: Path, key: Path) -> None:
    repo, wt, plan = _plan(tmp_path, ["notes/todo.md"])
    _run_unsupervised(plan, "echo todo > notes/todo.md", tmp_path / "out.txt")
    remove_placeholders(plan)
    assert (wt.path / "notes" / "todo.md").read_text() == "todo\n"


def test_bind_sources_in_the_worktree_are_passed_as_descriptors(tmp_path: Path, key: Path) -> None:
    repo, wt, plan = _plan(tmp_path, ["src/*.py", "docs/**"])
    args = plan.args
    for i, arg in enumerate(args):
        if arg in ("--bind", "--ro-bind") and args[i + 1].startswith(str(wt.path)):
            pytest.fail(f"{arg} {args[i + 1]} names a worktree path for bwrap to resolve")
    fds = [int(args[i + 1]) for i, a in enumerate(args) if a in ("--bind-fd", "--ro-bind-fd")]
    assert fds and set(fds) <= set(plan.fds)
    for fd in fds:
        flags = int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        assert flags & os.O_PATH
    plan.close()


def test_bind_descriptors_do_not_reach_the_sandbox(tmp_path: Path, key: Path) -> None:
    # An O_PATH descriptor of a host folder inside the sandbox would be a way out (openat "..").
    repo, wt, plan = _plan(tmp_path, ["src/*.py", "docs/**"])
    text = _run_unsupervised(plan, "for f in /proc/$$/fd/*; do readlink $f; done; exit 0",
                             tmp_path / "out.txt")  # fmt: skip
    shown = [line for line in text.splitlines() if line.startswith("/")]
    assert not [line for line in shown if line.startswith((str(wt.path), str(repo)))], text


def test_protected_paths_cannot_be_created_or_moved_away_under_a_broad_write_set(
    tmp_path: Path, key: Path
) -> None:
    repo, wt, plan = _plan(tmp_path, ["**"])
    script = (
        "(mkdir -p .github/workflows && echo x > .github/workflows/ci.yml) 2>/dev/null "
        "&& echo WROTE github; (echo x > .gitlab-ci.yml) 2>/dev/null && echo WROTE gitlab; "
        "(echo x > .gitattributes) 2>/dev/null && echo WROTE attributes; "
        "(mkdir .husky) 2>/dev/null && echo WROTE husky; "
        "mv .gatekeeper g2 2>/dev/null && echo WROTE moved-policy; "
        "mv .github gh2 2>/dev/null && echo WROTE moved-standin; "
        "echo ok > new.txt && mkdir -p newdir && echo ok > newdir/x && echo BROAD-OK; exit 0"
    )
    text = _run_unsupervised(plan, script, tmp_path / "out.txt")
    # Protected folders hold by the mounts alone (empty read-only stand-ins); a missing
    # protected file gets no stand-in (tools read those names, and an empty one breaks them):
    # creating one is left to the supervisor, the commit and the gate (see test_run.py and
    # test_policy_protected.py for those).
    for held in ("github", "husky", "moved-policy", "moved-standin"):
        assert f"WROTE {held}" not in text, text
    assert "BROAD-OK" in text
    removed = remove_placeholders(plan)
    assert {".github", ".husky"} <= set(removed)
    left = {p.name for p in wt.path.iterdir()}
    assert left == {".git", ".gatekeeper", "src", "docs", "README.md", "new.txt", "newdir",
                    ".gitlab-ci.yml", ".gitattributes"}, left  # fmt: skip


def test_a_folder_holding_a_protected_file_cannot_be_renamed_away(
    tmp_path: Path, key: Path
) -> None:
    _, wt, plan = _plan(tmp_path, ["**"], {"docs/sub/.gitattributes": "* text\n", "a": "a\n"})
    script = (
        "(mv docs d2 || mv docs/sub docs/s2) 2>/dev/null && echo WROTE moved; "
        "(echo x > docs/sub/.gitattributes) 2>/dev/null && echo WROTE attributes; "
        "echo ok > docs/sub/new.txt && mv docs/sub/new.txt docs/new.txt && echo MOVE-OK; exit 0"
    )
    text = _run_unsupervised(plan, script, tmp_path / "out.txt")
    assert "WROTE" not in text and "MOVE-OK" in text, text
    assert (wt.path / "docs" / "sub" / ".gitattributes").read_text() == "* text\n"


@pytest.mark.parametrize("entry", ["{home}", "/", "{home}/..", "{home}/bin"])
def test_home_on_path_never_shows_home(tmp_path: Path, key: Path, entry: str) -> None:
    """A PATH entry that is HOME, or holds it, shows none of it: not the signing key, not the
    user's other files."""
    from conftest import make_repo
    from helpers import run_json

    home = Path(os.environ["HOME"])
    (home / "bin").mkdir(exist_ok=True)
    (home / "notes.txt").write_text("private notes\n")
    repo = make_repo(tmp_path / "r")
    path = f"/usr/bin:/bin:{entry.format(home=home)}"
    proc, data = run_json(repo, "sh", "-c",
                          f"cat {key}; cat {home}/notes.txt; ls {home}/.config/gatekeeper; exit 0",
                          env={"PATH": path})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "PRIVATE KEY" not in proc.stderr + proc.stdout
    assert "private notes" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("layout", ["symlinked-home", "pyvenv-in-home", "local-bin"])
def test_the_agents_installation_never_shows_home(tmp_path: Path, key: Path, layout: str) -> None:
    """The program's installation is shown under the same rules as PATH's: never HOME, a
    folder above it, a shared folder of HOME (~/.local) or the key folder."""
    from helpers import run_json

    home = Path(os.environ["HOME"])
    (home / "notes.txt").write_text("private notes\n")
    (home / ".local" / "share" / "fish").mkdir(parents=True, exist_ok=True)
    (home / ".local" / "share" / "fish" / "fish_history").write_text("private history\n")
    script = f"#!/bin/sh\ncat {key} {home}/notes.txt {home}/.local/share/fish/fish_history\n"
    env: dict[str, str] = {}
    if layout == "symlinked-home":
        link = tmp_path / "homelink"
        link.symlink_to(home)
        (home / "bin").mkdir(exist_ok=True)
        (home / "lib").mkdir(exist_ok=True)
        tool = home / "bin" / "tool"
        env["HOME"] = str(link)
        command = str(link / "bin" / "tool")
    elif layout == "pyvenv-in-home":
        (home / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (home / "tools").mkdir(exist_ok=True)
        tool = home / "tools" / "agent"
        command = str(tool)
    else:
        version = home / ".local" / "share" / "tool" / "versions"
        version.mkdir(parents=True, exist_ok=True)
        (home / ".local" / "bin").mkdir(parents=True, exist_ok=True)
        (home / ".local" / "lib").mkdir(parents=True, exist_ok=True)
        tool = version / "1.0"
        (home / ".local" / "bin" / "tool").symlink_to(tool)
        command = str(home / ".local" / "bin" / "tool")
    tool.write_text(script)
    tool.chmod(0o755)
    repo = make_repo(tmp_path / "r")
    proc, _ = run_json(repo, command, env=env)
    out = proc.stdout + proc.stderr
    assert "PRIVATE KEY" not in out and "private notes" not in out and "private history" not in out


def _many_files_repo(tmp_path: Path, count: int) -> Path:
    files = {f"d{i % 4}/f{i}.txt": f"{i}\n" for i in range(count)}
    repo = make_repo(tmp_path / "repo", files=files)
    policy = repo / ".gatekeeper" / "policy.yaml"
    text = policy.read_text()
    assert 'write: ["**"]' in text
    policy.write_text(text.replace('write: ["**"]', 'write: ["d*/f*.txt"]'))
    git(repo, "commit", "-qam", "write single files only")
    return repo


def test_a_write_set_of_more_single_files_than_bubblewrap_takes_is_a_clear_error(
    tmp_path: Path, key: Path
) -> None:
    # Each file a pattern names in a folder it does not cover whole is a bind of its own:
    # 2,400 of them were 7,200 of bubblewrap's 9,000 arguments, and the run died with its
    # message and a hint about user namespaces.
    repo = _many_files_repo(tmp_path, 2400)
    before = user_visible_state(repo)
    proc = gk("run", "--repo", str(repo), "--", "sh", "-c", "echo x >> d0/f0.txt")
    assert proc.returncode == 2, proc.stderr
    assert "one by one" in proc.stderr and "`src/**` rather than `src/*.py`" in proc.stderr
    assert "Traceback" not in proc.stderr and "namespaces" not in proc.stderr
    assert user_visible_state(repo) == before
    assert git(repo, "branch", "--list", "agent/*") == ""
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_single_file_binds_beyond_a_low_descriptor_limit_still_work(
    tmp_path: Path, key: Path
) -> None:
    # 1,500 binds hold 1,500 descriptors: more than a soft limit of 1024 allows.
    repo = _many_files_repo(tmp_path, 1500)

    def low_limit() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )

    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--json", "--", "sh",
         "-c", "echo x >> d3/f1499.txt; echo y > d3/new.txt; echo z >> d1/f1.txt"],
        capture_output=True, text=True, preexec_fn=low_limit, check=False, timeout=300,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr  # the script's last command worked
    assert "cannot create d3/new.txt" in proc.stderr  # not in the write set: refused
    data = json.loads(proc.stdout)
    assert sorted(c["path"] for c in data["changes"]) == ["d1/f1.txt", "d3/f1499.txt"]
    assert any(p.endswith("d3/new.txt") for p in data["denied_writes"]), data["denied_writes"]
