"""The agent's own commits: each judged on its own, foreign history refused, and whatever the
agent leaves in its git dir, the run still ends with a commit and a signed receipt."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox]

POLICY = """\
paths: {read: ['**'], write: ['src/**']}
commands: {deny: ["rm -rf"], default: allow}
"""

# A commit made by hand on a side line (its parent is the base) that adds a workflow file.
SIDE_COMMIT = (
    "blob=$(echo 'on: push' | git hash-object -w --stdin) && "
    "GIT_INDEX_FILE=/tmp/side-index git read-tree HEAD~1 && "
    "GIT_INDEX_FILE=/tmp/side-index git update-index --add "
    "--cacheinfo 100644,$blob,.github/workflows/evil.yml && "
    "side=$(echo side | git commit-tree $(GIT_INDEX_FILE=/tmp/side-index git write-tree) -p HEAD~1)"
)


@pytest.fixture
def repo(tmp_path: Path, key: Path) -> Path:
    repo = make_repo(tmp_path / "repo", policy=POLICY,
                     files={"src/a.py": "a\n", "README.md": "r\n"})  # fmt: skip
    # A branch the agent's base does not contain, with data of its own.
    git(repo, "checkout", "-q", "-b", "secret")
    (repo / "secret.txt").write_text("the other branch's data\n")
    git(repo, "add", "secret.txt")
    git(repo, "commit", "-q", "-m", "secret")
    git(repo, "checkout", "-q", "main")
    return repo


def predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


def reachable_paths(repo: Path, commit: str, base: str) -> set[str]:
    """Every path named by an object the result brings beyond the base."""
    out = git(repo, "rev-list", "--objects", commit, "--not", base)
    return {line.split(" ", 1)[1] for line in out.splitlines() if " " in line}


def history(repo: Path, commit: str) -> set[str]:
    return set(git(repo, "rev-list", commit).split())


def test_merge_ours_of_a_hand_made_commit_does_not_carry_a_workflow_file(repo: Path) -> None:
    script = ("echo ok > src/ok.py && git add src/ok.py && git commit -qm ok && "
              f"{SIDE_COMMIT} && git merge -q -s ours --no-edit $side && "
              "git log --oneline -3")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits"] == []
    assert data["agent_commits_refused"]
    assert ".github/workflows/evil.yml" not in reachable_paths(repo, data["commit"], data["base"])
    # The agent's work within the policy is still committed, by the launcher.
    assert git(repo, "show", f"{data['commit']}:src/ok.py") == "ok\n"
    assert git(repo, "rev-parse", f"{data['commit']}^").strip() == data["base"]
    pred = predicate(repo, data["commit"])
    assert pred["agent_commits"] == []
    assert pred["agent_commits_refused"] == data["agent_commits_refused"]
    refused = [w for w in pred["writes"] if w["path"] == ".github/workflows/evil.yml"]
    assert refused and all(w["decision"] == "deny" and w["source"] == "commit" and w["reason"]
                           for w in refused)  # fmt: skip


def test_merge_ours_of_another_branch_does_not_carry_its_history(repo: Path) -> None:
    secret = git(repo, "rev-parse", "refs/heads/secret").strip()
    # Other branches are not listed in the agent's git dir, but their objects are readable
    # through the alternate (`git cat-file --batch-all-objects`): merge by id.
    script = ("echo ok > src/ok.py && git add src/ok.py && git commit -qm ok && "
              f"git cat-file -e {secret} && git merge -q -s ours --no-edit {secret} && "
              "git log --oneline -3")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "Merge commit" in proc.stderr  # the merge happened inside
    assert data["agent_commits"] == []
    assert "did not make" in data["agent_commits_refused"]
    assert secret not in history(repo, data["commit"])
    assert "secret.txt" not in reachable_paths(repo, data["commit"], data["base"])
    assert git(repo, "show", f"{data['commit']}:src/ok.py") == "ok\n"
    pred = predicate(repo, data["commit"])
    assert pred["agent_commits_refused"]
    # What the refused history would have brought is recorded, with the reason.
    assert any(w["path"] == "secret.txt" and w["decision"] == "deny" and w["source"] == "commit"
               and w["reason"] == pred["agent_commits_refused"] for w in pred["writes"])  # fmt: skip


def test_a_fast_forward_to_another_branch_is_refused(repo: Path) -> None:
    # The other branch builds on the base: a fast-forward would hand over someone else's commit.
    git(repo, "checkout", "-q", "-b", "later", "main")
    (repo / "src" / "later.py").write_text("not the agent's\n")
    git(repo, "add", "src/later.py")
    git(repo, "commit", "-q", "-m", "later")
    git(repo, "checkout", "-q", "main")
    later = git(repo, "rev-parse", "refs/heads/later").strip()
    proc, data = run_json(repo, "sh", "-c", f"git merge -q --ff-only {later}")
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits"] == []
    assert later not in history(repo, data["commit"])
    assert later not in predicate(repo, data["commit"])["agent_commits"]


def test_a_file_added_then_removed_in_a_later_commit_is_judged_per_commit(repo: Path) -> None:
    script = ("echo ok > src/ok.py && git add src && blob=$(echo x | git hash-object -w --stdin) "
              "&& git update-index --add --cacheinfo 100644,$blob,README.md && git commit -qm one "
              "&& git update-index --add --cacheinfo 100644,$(git rev-parse HEAD~1:README.md),"
              "README.md && git commit -qm two && git log --oneline -3")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits"] == []
    pred = predicate(repo, data["commit"])
    assert any(w["path"] == "README.md" and w["decision"] == "deny" and w["source"] == "commit"
               for w in pred["writes"])  # fmt: skip
    assert git(repo, "show", f"{data['commit']}:src/ok.py") == "ok\n"
    assert git(repo, "rev-list", "--count", f"{data['base']}..{data['commit']}").strip() == "1"


def test_a_new_root_commit_is_refused(repo: Path) -> None:
    script = ("blob=$(echo w | git hash-object -w --stdin) && "
              "t=$(printf '100644 blob %s\\tx.yml\\n' $blob | git mktree) && "
              "root=$(echo root | git commit-tree $t) && echo ok > src/ok.py && git add src && "
              "git commit -qm ok && git merge -q -s ours --allow-unrelated-histories --no-edit "
              "$root && git log --oneline -3")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits"] == [] and "new root" in data["agent_commits_refused"]
    assert "x.yml" not in reachable_paths(repo, data["commit"], data["base"])


def test_a_file_named_like_a_commit_id_is_judged_as_a_path(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy="paths: {read: ['**'], write: ['**']}\n")
    name = "0123456789abcdef0123456789abcdef01234567"
    proc, data = run_json(repo, "sh", "-c", f"echo y > {name} && git add {name} && "
                          "git commit -qm hex")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits_refused"] is None and len(data["agent_commits"]) == 1


def test_a_merge_of_the_agents_own_lines_is_imported_whole(repo: Path) -> None:
    script = ("me=$(git symbolic-ref --short HEAD) && git checkout -qb side && "
              "echo s > src/s.py && git add src && git commit -qm side && "
              "git checkout -q $me && echo m > src/m.py && git add src && git commit -qm main && "
              "git merge -q --no-edit side && git log --oneline -4")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits_refused"] is None
    assert len(data["agent_commits"]) == 3
    merge = data["agent_commits"][-1]
    assert len(git(repo, "rev-list", "--parents", "-1", merge).split()) == 3
    assert git(repo, "rev-parse", f"{data['commit']}^").strip() == merge
    assert predicate(repo, data["commit"])["agent_commits"] == data["agent_commits"]
    check = gk("check", "--repo", str(repo), "--base", "main", "--format", "json", data["branch"])
    assert check.returncode == 0, check.stdout


# --- the agent's git dir as hostile input --------------------------------------------------

# The agent's work within policy, a denied command and a commit of its own, then the damage.
PRELUDE = ("rm -rf src/a.py; echo x > src/x.py; echo c > src/c.py && git add src/c.py && "
           "git commit -qm c; G=$(git rev-parse --git-dir); B=$(git symbolic-ref HEAD); ")  # fmt: skip
# A commit object whose tree does not exist.
TREELESS = ("bad=$(printf 'tree 1111111111111111111111111111111111111111\\nparent %s\\n"
            "author a <a@b> 0 +0000\\ncommitter a <a@b> 0 +0000\\n\\nx\\n' $(git rev-parse HEAD) "
            "| git hash-object -t commit -w --literally --stdin); ")  # fmt: skip


@pytest.mark.parametrize(
    "damage",
    [
        # The reviewer's two cases.
        "rm -f $G/objects/info/alternates && mkdir -p $G/objects/info/alternates/x",
        TREELESS + "echo $bad > $G/$B && echo $bad > $G/HEAD",
        # Siblings.
        TREELESS + "echo $bad > $G/$B",
        "rm -rf $G/objects/info && ln -s /etc $G/objects/info",
        "rm -f $G/objects/info/alternates && mkfifo $G/objects/info/alternates",
        "rm -f $G/objects/info/alternates && mkdir -p $G/objects/info/alternates/d && "
        "ln -s /etc $G/objects/info/alternates/l && chmod 000 $G/objects/info/alternates/d",
        "chmod 000 $G/objects/info",
        "rm -f $G/$B && mkdir -p $G/$B/x",
        "rm -f $G/$B && ln -s /etc/passwd $G/$B",
        "rm -f $G/$B && mkfifo $G/$B",
        "truncate -s 100M $G/$B",
        "head -c 100000 /dev/urandom > $G/packed-refs",
        "echo 'ref: refs/heads/../../../etc' > $G/HEAD",
        "git rev-parse HEAD > $G/shallow",
        "head -c 5000 /dev/urandom > $G/index",
        # The tip's own object replaced by garbage (content no longer matches its name).
        "o=$(git rev-parse HEAD) && f=$G/objects/$(echo $o | cut -c1-2)/$(echo $o | cut -c3-) && "
        "chmod u+w $f && head -c 300 /dev/urandom > $f",
        # Another repository's objects as an alternate.
        "echo / > $G/objects/info/alternates",
        "chmod -R 000 $G/objects",
    ],
)
def test_whatever_is_left_in_the_git_dir_the_run_is_committed_and_signed(
    repo: Path, damage: str
) -> None:
    proc, data = run_json(repo, "sh", "-c", PRELUDE + damage + "; exit 0")
    assert proc.returncode == 0, proc.stderr
    assert data is not None and "Traceback" not in proc.stderr, proc.stderr
    assert git(repo, "show", f"{data['commit']}:src/x.py") == "x\n"
    pred = predicate(repo, data["commit"])
    denied = [p for p in pred["processes"] if p["decision"] == "deny"]
    assert any(p["argv"][:2] == ["rm", "-rf"] for p in denied), pred["processes"]
    assert git(repo, "show", f"{data['commit']}:src/a.py") == "a\n"
    if data["agent_commits"]:
        # Taken only when whole: the commit is really in the repository, with all it needs.
        git(repo, "rev-list", "--objects", data["commit"])
        assert git(repo, "show", f"{data['commit']}:src/c.py") == "c\n"
    else:
        assert pred["agent_commits_refused"] or pred["launcher_errors"]
        assert git(repo, "show", f"{data['commit']}:src/c.py") == "c\n"


def test_a_symlinked_pack_folder_cannot_pull_in_another_repositorys_objects(
    repo: Path, tmp_path: Path
) -> None:
    # Another repository on the host, packed, whose object ids the agent knows (a submodule's
    # gitlink gives a commit id; here the test hands over a blob id).
    other = tmp_path / "secret-repo"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    (other / "config.py").write_text("API_KEY=sk_live_private\n")
    git(other, "add", "config.py")
    git(other, "commit", "-q", "-m", "private")
    git(other, "gc", "-q")
    blob = git(other, "rev-parse", "HEAD:config.py").strip()
    packs = other / ".git" / "objects" / "pack"
    # An ordinary-looking commit on the base, in the write set, whose new file is that blob.
    script = (
        "G=$(git rev-parse --git-dir) && mv $G/objects/pack /tmp/old-pack && "
        f"ln -s {packs} $G/objects/pack && "
        # The blob is not readable inside: build the trees with mktree --missing.
        f"S=$( (git ls-tree HEAD:src; printf '100644 blob {blob}\\tleak.py\\n') | "
        "git mktree --missing) && "
        "T=$( (git ls-tree HEAD | grep -v '\tsrc$'; printf '040000 tree %s\tsrc\n' $S) | "
        "git mktree) && C=$(echo leak | git commit-tree $T -p HEAD) && git update-ref HEAD $C; "
        "echo ok > src/ok.py; exit 0"
    )
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits"] == []
    assert "symlink" in (data["agent_commits_refused"] or ""), proc.stderr
    missing = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", blob],
                             capture_output=True, check=False)  # fmt: skip
    assert missing.returncode != 0, "the other repository's object reached this one"
    assert "src/leak.py" not in git(repo, "ls-tree", "-r", "--name-only", data["commit"])
    assert git(repo, "show", f"{data['commit']}:src/ok.py") == "ok\n"
