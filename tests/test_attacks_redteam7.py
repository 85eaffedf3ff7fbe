"""Attacks on the supervisor answering a call before recording it, the early reads of a plain
`check`, git output read through a memfd, and the stand-in for pydantic's plugin loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import git, gk, make_repo
from helpers import pids_with, run_json, small_tmpfs


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 24 MiB tmpfs (root only: it is a mount), unmounted afterwards; at a short path, so a
    run's scratch folder can go there (TMPDIR: a deep one is not used)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    where = Path(tempfile.mkdtemp(prefix="gk-rt7-", dir="/tmp"))
    try:
        with small_tmpfs(where):
            yield where
    finally:
        where.rmdir()


def runs_json(repo: Path) -> dict[str, dict[str, object]]:
    proc = gk("runs", "--repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr
    return {r["run_id"]: r for r in json.loads(proc.stdout)}


@pytest.mark.root
def test_an_exec_whose_record_cannot_be_written_fails_the_run(
    tmp_path: Path, key: Path, small_disk: Path
) -> None:
    # The run's scratch folder (its events file) and the worktree share the small disk. The
    # agent fills it, then runs commands whose exec records (3 KB each) no longer fit: each
    # exec is answered before it is recorded, so a record lost there is a program that ran
    # without one. The agent then says all went well.
    repo = make_repo(tmp_path / "repo")
    known = set(runs_json(repo))
    (small_disk / "tmp").mkdir()
    env = {"GATEKEEPER_WORKTREES": str(small_disk / "wt"), "TMPDIR": str(small_disk / "tmp")}
    proc = gk("run", "--repo", str(repo), "--json", "--", "sh", "-c",
              "sleep 7531 & dd if=/dev/zero of=big bs=1M count=64 2>/dev/null; "
              "x=$(head -c 3000 /dev/zero | tr '\\0' x); "
              "for i in $(seq 1 40); do /bin/true $i $x; done; exit 0", env=env)  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    new = set(runs_json(repo)) - known
    assert len(new) == 1, (new, proc.stderr[-3000:])
    row = runs_json(repo)[new.pop()]
    assert row["state"] == "failed", (row, proc.stderr[-3000:])
    assert "supervisor" in str(row["reason"]).lower(), row
    # Nothing of the sandbox outlives it (the agent's background sleep went with it).
    deadline = time.monotonic() + 10
    while pids_with("sleep 7531") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_with("sleep 7531") == []


# --- a plain check: the names it resolves before the judgement loads -----------------------


def test_an_origin_head_naming_a_ref_with_odd_bytes_is_no_traceback(
    tmp_path: Path, key: Path
) -> None:
    # refs/remotes/origin/HEAD names a branch whose name is not UTF-8 (git takes any byte
    # but a few): the default target is looked up from it, and a check must judge (or say why
    # not), the same through its plain arguments as through the command line's parse.
    repo = make_repo(tmp_path / "repo")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "new.txt").write_text("new\n")
    git(repo, "add", "new.txt")
    git(repo, "commit", "-q", "-m", "new")
    odd = os.fsdecode(b"refs/remotes/origin/m\xff")
    subprocess.run(["git", "update-ref", odd, "main"], cwd=repo, check=True)
    subprocess.run(["git", "symbolic-ref", "refs/remotes/origin/HEAD", odd], cwd=repo,
                   check=True)  # fmt: skip
    plain = gk("check", "feature", cwd=repo)
    parsed = gk("check", "--format=text", "feature", cwd=repo)
    assert "Traceback" not in plain.stderr, plain.stderr
    assert plain.returncode == 1, plain.stderr  # blocked (no receipt), judged against main
    assert (plain.returncode, plain.stdout, plain.stderr) == (
        parsed.returncode,
        parsed.stdout,
        parsed.stderr,
    )


def test_a_repo_that_is_a_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    # --repo names a regular file: git cannot run there at all. The plain arguments and the
    # command line's parse say so the same way, with the usual exit code of a usage error.
    afile = tmp_path / "afile"
    afile.write_text("not a repository\n")
    plain = gk("check", "--repo", str(afile), "HEAD", cwd=tmp_path)
    parsed = gk("check", "--format=text", "--repo", str(afile), "HEAD", cwd=tmp_path)
    assert "Traceback" not in plain.stderr, plain.stderr
    assert plain.returncode == 2, plain.stderr
    assert "is not a directory" in plain.stderr
    assert (plain.returncode, plain.stdout, plain.stderr) == (
        parsed.returncode,
        parsed.stdout,
        parsed.stderr,
    )


# --- the stand-in for pydantic's plugin loader ----------------------------------------------


def test_the_plugin_loader_imports_as_a_module_of_its_package(tmp_path: Path) -> None:
    # Code in a gatekeeper process (a check's caller, a test, a library) imports pydantic's
    # loader the usual way before pydantic.plugin is in: it gets a module of that package,
    # with no plugins, its other names from pydantic, and a spec (reload, find_spec).
    site, marker = _spy_plugin(tmp_path)
    code = (
        "import gatekeeper, importlib, importlib.util\n"
        "import pydantic.plugin._loader as L\n"
        "import pydantic.plugin\n"
        "assert pydantic.plugin._loader is L\n"
        "print(tuple(L.get_plugins()), L.PYDANTIC_ENTRY_POINT_GROUP)\n"
        "assert importlib.util.find_spec('pydantic.plugin._loader') is not None\n"
        "importlib.reload(L)\n"
        "print(tuple(L.get_plugins()))\n"
        "from gatekeeper.receipt.changes import validate_records\n"
        "from gatekeeper.receipt.models import Base\n"
        "validate_records([{'status': 'A', 'path': 'a', 'old_mode': '000000',"
        " 'new_mode': '100644', 'old_blob': '0', 'new_blob': '1'}])\n"
        'Base.model_validate_json(\'{"commit": "c", "tree": "t"}\')\n'
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["() pydantic", "()"]
    assert not marker.exists()


def _spy_plugin(tmp_path: Path) -> tuple[Path, Path]:
    """A folder for PYTHONPATH with a package that registers a pydantic plugin, which leaves
    a marker file when it is loaded."""
    site = tmp_path / "site"
    info = site / "spy_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    marker = tmp_path / "loaded"
    (site / "spy_plugin.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('loaded')\n"
        "class Plugin:\n"
        "    def new_schema_validator(self, *args, **kwargs):\n"
        "        return None, None, None\n"
        "plugin = Plugin()\n"
    )
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: spy-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pydantic]\nspy = spy_plugin:plugin\n")
    return site, marker


# --- git output read through a memfd; note blobs read ahead, by their ids --------------------


def _blob(repo: Path, data: bytes) -> str:
    done = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input=data,
                          capture_output=True, check=True)  # fmt: skip
    return done.stdout.decode().strip()


def test_blob_spans_give_each_id_its_own_bytes(tmp_path: Path) -> None:
    # Ids listed twice, missing ones between, a blob whose bytes look like cat-file's own
    # headers, an empty one and a large one: each id gets exactly its blob's bytes.
    from gatekeeper.gate.notes import blob_spans

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    empty = _blob(repo, b"")
    fake = _blob(repo, f"{'0' * 40} blob 5\nhello\n{'1' * 40} missing\n".encode())
    large = _blob(repo, os.urandom(3 << 20))
    small = _blob(repo, b"x\n")
    missing = "e" * 40
    asked = [small, missing, fake, small, empty, missing, large, fake]
    out, spans = blob_spans(repo / ".git", asked)
    assert missing not in spans
    for oid in (small, fake, empty, large):
        a, b = spans[oid]
        got = subprocess.run(["git", "cat-file", "blob", oid], cwd=repo, capture_output=True,
                             check=True).stdout  # fmt: skip
        assert out[a:b] == got, oid


def test_large_output_leaks_no_descriptor_and_keeps_errors(tmp_path: Path) -> None:
    from gatekeeper.errors import GitError
    from gatekeeper.git import git as run_git
    from gatekeeper.proc import CalledProcessError, cmd_output_b

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    blob = _blob(repo, b"y" * 100_000)
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(50):
        piped = run_git("cat-file", "--batch", git_dir=repo / ".git", input=f"{blob}\n".encode())
        memory = run_git("cat-file", "--batch", git_dir=repo / ".git",
                         input=f"{blob}\n".encode(), large=True)  # fmt: skip
        assert memory == piped
        with pytest.raises(GitError, match="bad-name"):
            run_git("cat-file", "-p", "bad-name", git_dir=repo / ".git", large=True)
        code, out, err = cmd_output_b("sh", "-c", "echo out; echo err >&2; kill -9 $$",
                                      check=False, large=True)  # fmt: skip
        assert (code, out, err) == (-9, b"out\n", b"err\n")
        with pytest.raises(CalledProcessError) as failed:
            cmd_output_b("sh", "-c", "echo out; echo err >&2; exit 3", large=True)
        assert (failed.value.stdout, failed.value.stderr) == (b"out\n", b"err\n")
        with pytest.raises(OSError):
            cmd_output_b(str(tmp_path / "no-such-program"), large=True)
    assert sorted(os.listdir("/proc/self/fd")) == before


# --- the supervisor: a thread that execs while another writes ---------------------------------

RACER = """
import os, threading, time
def write():
    i = 0
    while True:
        with open(f"w-{i}", "w") as fh:
            fh.write("x")
        i += 1
threading.Thread(target=write, daemon=True).start()
time.sleep(0.3)
os.execv("/bin/sh", ["sh", "-c", "echo done > done.txt"])
"""


@pytest.mark.root
def test_a_thread_that_execs_while_another_writes_loses_no_record(
    tmp_path: Path, key: Path
) -> None:
    # Each call is answered before it is recorded: every file the writer made before the
    # exec replaced its process has its write record, and the exec its own, with the pid and
    # parent of the process it replaced.
    repo = make_repo(tmp_path / "repo")
    proc, data = run_json(repo, "python3", "-c", RACER)
    assert proc.returncode == 0, proc.stderr
    made = {p["path"] for p in data["changes"] if p["path"].startswith("w-")}
    assert len(made) > 5, made
    pred = predicate(repo, data["commit"])
    writes = {w["path"]: w for w in pred["writes"]
              if w["path"].startswith("w-") and w["source"] == "syscall"}  # fmt: skip
    assert made <= set(writes), sorted(made - set(writes))[:5]
    assert all(writes[p]["decision"] == "allow" for p in made)
    shell = [p for p in pred["processes"] if p["argv"][:2] == ["sh", "-c"]]
    assert len(shell) == 1 and shell[0]["decision"] == "allow", pred["processes"]
    python = [p for p in pred["processes"] if p["argv"][:1] == ["python3"]]
    assert shell[0]["pid"] == python[0]["pid"] and shell[0]["ppid"] == python[0]["ppid"]
    done = [w for w in pred["writes"] if w["path"] == "done.txt" and w["source"] == "syscall"]
    assert [w["decision"] for w in done] == ["allow"], done


def predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


def test_a_repository_at_a_path_with_odd_bytes_is_judged(tmp_path: Path) -> None:
    # A checkout in a folder whose name is not UTF-8: git prints its paths as they are, and
    # the check finds the repository from them (through --repo and from within it).
    where = Path(os.fsdecode(bytes(tmp_path) + b"/o\xffdd"))
    make_repo_plain(where)
    inside = gk("check", "HEAD", cwd=where)
    assert "Traceback" not in inside.stderr, inside.stderr
    assert inside.returncode == 1, inside.stderr  # blocked: no receipt, no policy
    given = gk("check", "--repo", str(where), "HEAD", cwd=tmp_path)
    assert (given.returncode, given.stdout) == (inside.returncode, inside.stdout)


def test_the_hooks_read_an_origin_head_with_odd_bytes(tmp_path: Path) -> None:
    # The hooks' sibling of the default target: the protected branch is read from
    # refs/remotes/origin/HEAD too.
    from gatekeeper.gate.hooks import local_protected

    repo = tmp_path / "repo"
    make_repo_plain(repo)
    odd = os.fsdecode(b"refs/remotes/origin/m\xff")
    subprocess.run(["git", "update-ref", odd, "HEAD"], cwd=repo, check=True)
    subprocess.run(["git", "symbolic-ref", "refs/remotes/origin/HEAD", odd], cwd=repo,
                   check=True)  # fmt: skip
    assert local_protected(repo / ".git", repo) == [os.fsdecode(b"refs/heads/m\xff")]


def make_repo_plain(path: Path) -> None:
    """A repository with one empty commit on main (no gatekeeper set-up)."""
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=path, check=True)


def test_the_hooks_read_a_checked_out_branch_with_odd_bytes(tmp_path: Path) -> None:
    # HEAD on a branch whose name is not UTF-8: the hooks that read it (before a merge commit;
    # the server's default branch) go on, rather than end in a traceback.
    from gatekeeper.gate.hooks import pre_merge_commit
    from gatekeeper.gate.refs import symbolic_head

    repo = tmp_path / "repo"
    make_repo_plain(repo)
    branch = os.fsdecode(b"m\xff")
    subprocess.run(["git", "checkout", "-q", "-b", branch], cwd=repo, check=True)
    assert pre_merge_commit(repo / ".git", repo, {}, say=lambda *a, **k: None) == 0
    assert symbolic_head(repo / ".git") == f"refs/heads/{branch}"


# --- a plain check while the notes ref moves ---------------------------------------------------

FLIPPER = """
import subprocess, sys
a, b = sys.argv[1], sys.argv[2]
while True:
    for oid in (a, b):
        subprocess.run(["git", "update-ref", "refs/notes/gatekeeper", oid], check=True)
"""


def feature_with_a_note(repo: Path) -> Path:
    """A repository whose branch `feature` has one commit with a one-line receipts note."""
    make_repo_plain(repo)
    git(repo, "checkout", "-q", "-b", "feature")
    git(repo, "commit", "-q", "--allow-empty", "-m", "b")
    git(repo, "notes", "--ref=gatekeeper", "add", "-m", "garbage-A", "HEAD")
    return repo


def test_a_notes_ref_that_moves_during_a_check_gives_one_of_its_verdicts(tmp_path: Path) -> None:
    # A second process flips the receipts ref between two notes commits (one line on head,
    # three lines on head) while plain checks read the notes on head ahead of the judgement:
    # each report is exactly the one of a ref that stood still, never a mix of the two.
    repo = feature_with_a_note(tmp_path / "repo")
    first = git(repo, "rev-parse", "refs/notes/gatekeeper").strip()
    git(repo, "notes", "--ref=gatekeeper", "add", "-f", "-m", "garbage-B1\ngarbage-B2\nB3", "HEAD")
    second = git(repo, "rev-parse", "refs/notes/gatekeeper").strip()
    stable = set()
    for oid in (first, second):
        git(repo, "update-ref", "refs/notes/gatekeeper", oid)
        alone = gk("check", "--format", "json", "feature", cwd=repo)
        assert alone.returncode == 1, alone.stderr
        stable.add(alone.stdout)
    assert len(stable) == 2
    flipper = subprocess.Popen([sys.executable, "-c", FLIPPER, first, second], cwd=repo)
    try:
        for _ in range(12):
            raced = gk("check", "--format", "json", "feature", cwd=repo)
            assert raced.returncode == 1, raced.stderr
            assert raced.stdout in stable, raced.stdout
    finally:
        flipper.kill()
        flipper.wait()


def test_replace_refs_stay_off_for_the_notes_read_ahead(tmp_path: Path) -> None:
    # refs/replace/ swaps the note blob on head for one with three lines: the notes read
    # ahead of the judgement (on threads of their own) read the real blob, as the rest does.
    repo = feature_with_a_note(tmp_path / "repo")
    before = gk("check", "--format", "json", "feature", cwd=repo)
    assert "(1 receipt(s) found" in before.stdout, before.stdout
    real = git(repo, "rev-parse", "refs/notes/gatekeeper:" + git(repo, "rev-parse", "HEAD").strip())
    other = _blob(repo, b"garbage-B1\ngarbage-B2\nB3\n")
    git(repo, "replace", real.strip(), other)
    assert git(repo, "cat-file", "blob", real.strip()).count("\n") == 3  # git itself follows it
    after = gk("check", "--format", "json", "feature", cwd=repo)
    assert (after.returncode, after.stdout) == (before.returncode, before.stdout)
