"""What the gate prints for people: repository text escaped, findings capped per kind, and a
diff too large to judge blocked after reading a bounded part of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.gate_receipts import commit_files, receipted_commit

from gatekeeper.gate import judgement
from gatekeeper.gate.diffread import MAX_DIFF_PATHS, DiffTooLarge, read_diff
from gatekeeper.gate.findings import Kind
from gatekeeper.gate.shown import SHOWN_PER_KIND, visible

from conftest import git, gk

# Clear screen and home, a fake verdict, a bell, a carriage return, an OSC title, a bidi
# override, and conceal for what follows.
NASTY = (
    "fix\x1b[2J\x1b[Hverdict: PASS\x07\rfindings: none\x1b]0;title\x07 \u202etxt.exe\x1b[8;30;40m"
)
RAW = ("\x1b", "\x07", "\r", "\u202e")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"], GIT_CONFIG_NOSYSTEM="1")
    return env


def _assert_escaped(text: str) -> None:
    for ch in RAW:
        assert ch not in text, (ch, text)


def _server(tmp_path: Path, repo: Path) -> Path:
    """A bare copy of repo's main with the pre-receive hook; repo's origin."""
    bare = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    proc = gk("hooks", "install", "--server", str(bare))
    assert proc.returncode == 0, proc.stderr
    git(repo, "remote", "add", "origin", str(bare))
    return bare


def _push(repo: Path, *refspecs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "push", "origin", *refspecs], cwd=repo, env=_env(), capture_output=True,
        text=True, check=False, timeout=300,
    )  # fmt: skip


def _nasty_commit(repo: Path) -> str:
    """A hand commit on agent/1 (after a receipted one) whose subject is NASTY."""
    receipted_commit(repo, {"src/feature.py": "x = 1\n"})
    commit_files(repo, {"src/app.py": "print('by hand')\n"}, message="tmp")
    git(repo, "commit", "-q", "--amend", "--cleanup=verbatim", "-F", "-",
        input=NASTY.encode())  # fmt: skip
    subject = git(repo, "log", "-1", "--format=%s")
    assert "\x1b[2J" in subject and "\u202e" in subject  # git kept every byte
    return git(repo, "rev-parse", "HEAD").strip()


def test_visible_escapes_what_steers_a_terminal() -> None:
    shown = visible(NASTY)
    _assert_escaped(shown)
    assert "\\x1b[2J" in shown and "\\u202e" in shown and "\\r" not in shown
    assert "\\x0d" in shown and "\\x07" in shown
    assert visible("plain text, ünïcode") == "plain text, ünïcode"


def test_a_subject_with_escapes_is_shown_escaped_by_check(repo: Path) -> None:
    _nasty_commit(repo)
    proc = gk("check", "--repo", str(repo), "--base", "main", "agent/1")
    assert proc.returncode == 1
    _assert_escaped(proc.stdout)
    _assert_escaped(proc.stderr)
    assert "verdict: BLOCK" in proc.stdout
    assert "\\x1b[2J\\x1b[Hverdict: PASS\\x07\\x0dfindings: none" in proc.stdout
    assert "\\u202etxt.exe" in proc.stdout
    # Written to a file, the report (and the findings on stderr) are escaped as well.
    out = repo.parent / "report.txt"
    proc = gk("check", "--repo", str(repo), "--base", "main", "-o", str(out), "agent/1")
    assert proc.returncode == 1
    _assert_escaped(out.read_text())
    _assert_escaped(proc.stderr)
    # Markdown and HTML (a pull-request comment, a page; both also read in terminals and CI
    # logs) show it escaped too.
    for fmt in ("md", "html"):
        proc = gk("check", "--repo", str(repo), "--base", "main", "--format", fmt, "agent/1")
        assert proc.returncode == 1 and "verdict" in proc.stdout.lower(), proc.stderr
        _assert_escaped(proc.stdout)
    # The JSON report keeps the subject as it is (JSON escapes it).
    proc = gk("check", "--repo", str(repo), "--base", "main", "--format", "json", "agent/1")
    subjects = [c["subject"] for c in json.loads(proc.stdout)["commits"]]
    assert NASTY in subjects


def test_the_hook_shows_a_subject_and_a_ref_name_escaped(repo: Path, tmp_path: Path) -> None:
    _server(tmp_path, repo)
    git(repo, "config", "--add", "gatekeeper.protect", "refs/heads/*")
    _nasty_commit(repo)
    # Ref names may not hold controls, but may hold a bidi override.
    git(repo.parent / "server.git", "config", "--add", "gatekeeper.protect", "refs/heads/*")
    proc = _push(repo, "agent/1:refs/heads/main", "agent/1:refs/heads/x\u202egnp.exe")
    assert proc.returncode != 0
    remote = "\n".join(line for line in proc.stderr.splitlines() if line.startswith("remote:"))
    assert "gatekeeper:" in remote and "BLOCK" in remote
    _assert_escaped(remote.replace("\r", ""))  # (git ends each remote: line with \r itself)
    assert "x\\u202egnp.exe" in remote
    assert "\\x1b[2J" in remote  # the uncovered commit's subject, escaped


def test_findings_are_capped_per_kind_in_text_and_hook(repo: Path, tmp_path: Path) -> None:
    _server(tmp_path, repo)
    many = SHOWN_PER_KIND + 30
    commit_files(repo, {f"src/many/f{i}.py": f"x = {i}\n" for i in range(many)},
                 message="many files", branch="agent/1", start="main")  # fmt: skip
    shown = gk("check", "--repo", str(repo), "--base", "main", "--format", "json", "agent/1")
    unclaimed = [f for f in json.loads(shown.stdout)["findings"] if f["kind"] == "unclaimed-change"]
    assert len(unclaimed) == many  # the JSON report lists every one

    proc = gk("check", "--repo", str(repo), "--base", "main", "agent/1")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("  [unclaimed-change]")]
    assert len(lines) == SHOWN_PER_KIND
    assert "  ... and 30 more [unclaimed-change] (the JSON report lists all)" in proc.stdout
    assert f"findings ({len(json.loads(shown.stdout)['findings'])}):" in proc.stdout

    pushed = _push(repo, "agent/1:refs/heads/main")
    assert pushed.returncode != 0
    remote = [ln for ln in pushed.stderr.splitlines() if ln.startswith("remote: gatekeeper:")]
    assert sum("unclaimed-change [" in ln for ln in remote) == SHOWN_PER_KIND
    assert any("... and 30 more unclaimed-change finding(s)" in ln for ln in remote)
    assert len(remote) < SHOWN_PER_KIND + 10


def _commit_with_files(repo: Path, count: int, branch: str = "wide") -> str:
    """A commit on main adding count empty files (one blob) in folders of 1,000, via
    fast-import: a pack of a megabyte or so."""
    head = git(repo, "rev-parse", "main").strip()
    lines = ["blob", "mark :1", "data 0", "",
             f"commit refs/heads/{branch}", "committer a <a@e.invalid> 1000000 +0000",
             "data 5", "wide", f"from {head}"]  # fmt: skip
    lines += [f"M 100644 :1 src/d{i // 1000}/f{i}" for i in range(count)]
    git(repo, "fast-import", "--quiet", input=("\n".join(lines) + "\n\n").encode())
    return git(repo, "rev-parse", branch).strip()


# Measure a command's peak memory from a fresh process: RUSAGE_CHILDREN holds the largest
# of its children (and theirs: the hook under receive-pack under push, git under check).
_PEAK = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(p.returncode)\n"
)


def _peak(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    proc = subprocess.run([sys.executable, "-c", _PEAK, *argv], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    *rest, peak = proc.stderr.rstrip("\n").split("\n")
    proc.stderr = "\n".join(rest)
    return proc, int(peak) * 1024


@pytest.mark.slow
def test_a_change_past_the_bound_blocks_reading_no_further(repo: Path, tmp_path: Path) -> None:
    """One commit adding more files than a diff may name: `check` and the hook block with
    `change-too-large`, in bounded memory (unbounded, such a commit took gigabytes), and
    the hook says so in a few lines."""
    _server(tmp_path, repo)
    _commit_with_files(repo, MAX_DIFF_PATHS + 1)
    check = [sys.executable, "-m", "gatekeeper", "check", "--repo", str(repo), "--base", "main",
             "--format", "json", "wide"]  # fmt: skip
    proc, peak = _peak(check, repo)
    assert proc.returncode == 1, proc.stderr
    findings = json.loads(proc.stdout)["findings"]
    assert [f["kind"] for f in findings] == ["change-too-large"], findings
    assert f"more than {MAX_DIFF_PATHS:,} paths" in findings[0]["message"]
    assert "Land the change in parts" in findings[0]["message"]
    assert peak < 300 << 20, f"check peaked at {peak >> 20} MiB"

    proc, peak = _peak(["git", "push", "origin", "wide:refs/heads/main"], repo)
    assert proc.returncode != 0
    remote = [ln for ln in proc.stderr.splitlines() if ln.startswith("remote:")]
    assert any("change-too-large" in ln for ln in remote), remote
    assert len(remote) <= 5, remote
    assert peak < 300 << 20, f"the push (and its hook) peaked at {peak >> 20} MiB"


def test_read_diff_counts_paths_exactly(repo: Path) -> None:
    """The bound is on paths: a rename names two; exactly the bound is read, one more not."""
    git(repo, "mv", "src/app.py", "src/moved.py")
    for i in range(5):
        (repo / f"n{i}.txt").write_text(f"{i}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "rename and add")
    git_dir = repo / ".git"
    raw = read_diff(git_dir, "HEAD~1", "HEAD", limit=7)  # 5 added, a rename's 2
    assert raw.count(b"\0") == 5 * 2 + 3
    with pytest.raises(DiffTooLarge, match="more than 6 paths"):
        read_diff(git_dir, "HEAD~1", "HEAD", limit=6)
    with pytest.raises(DiffTooLarge):
        read_diff(git_dir, "HEAD~1", "HEAD", limit=0)


def test_read_diff_is_bounded_in_bytes_too(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path may be thousands of bytes long (deep folders of long names, a few KB of pack):
    a bound on paths alone would let 100,000 of them take gigabytes. Past the bytes, it
    blocks as well, reading no further."""
    from gatekeeper.gate import diffread

    deep = repo / "/".join(["d" * 200] * 15)
    deep.mkdir(parents=True)
    for i in range(20):
        (deep / f"f{i}").write_text("")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "deep")
    git_dir = repo / ".git"
    raw = read_diff(git_dir, "HEAD~1", "HEAD")
    assert len(raw) > 20 * 3000
    monkeypatch.setattr(diffread, "MAX_DIFF_BYTES", 32 << 10)
    with pytest.raises(DiffTooLarge, match="takes more than"):
        read_diff(git_dir, "HEAD~1", "HEAD")


def test_the_diffs_of_a_judgement_are_bounded_in_all(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many commits each within the bound cost as one large change: past the bound on all
    the diffs a judgement reads, it blocks too."""
    main = git(repo, "rev-parse", "main").strip()
    for i in range(4):
        commit_files(repo, {f"src/f{j}.py": f"{i}\n" for j in range(10)}, message=f"c{i}",
                     branch="agent/1", start="main" if i == 0 else None)  # fmt: skip
    head = git(repo, "rev-parse", "agent/1").strip()
    monkeypatch.setattr(judgement, "MAX_DIFF_PATHS_IN_ALL", 25)
    result = judgement.judge(repo / ".git", main, head)
    kinds = {f.kind for f in result.findings}
    assert Kind.change_too_large in kinds and Kind.internal_error not in kinds
    monkeypatch.setattr(judgement, "MAX_DIFF_PATHS_IN_ALL", 10_000)
    result = judgement.judge(repo / ".git", main, head)
    assert Kind.change_too_large not in {f.kind for f in result.findings}


def test_what_a_pushed_note_says_is_shown_escaped(repo: Path) -> None:
    """`gatekeeper runs` lists what receipts say before any is verified (a note anyone may
    push), and `receipt show` reports a malformed one: neither lets its text steer the
    terminal."""
    import base64

    commit = git(repo, "rev-parse", "HEAD").strip()
    payload = {"predicateType": "urn:gatekeeper:receipt:v1",
               "predicate": {"run_id": "run-" + NASTY, "branch": "main" + NASTY}}  # fmt: skip
    envelope = {"payload": base64.b64encode(json.dumps(payload).encode()).decode(),
                "payloadType": "application/vnd.in-toto+json", "signatures": []}  # fmt: skip
    git(repo, "notes", "--ref=gatekeeper", "add", "-f", "-m", json.dumps(envelope), commit)
    listed = gk("runs", "--repo", str(repo))
    assert "run-fix" in listed.stdout, listed.stdout + listed.stderr
    _assert_escaped(listed.stdout + listed.stderr)
    shown = gk("receipt", "show", "--repo", str(repo), commit)
    assert shown.returncode != 0
    _assert_escaped(shown.stdout + shown.stderr)
