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
from gatekeeper.gate.diffread import MAX_DIFF_PATHS, MAX_GIT_MEMORY, DiffTooLarge, read_diff
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
    assert "The gate blocks: land the change in parts" in findings[0]["message"]
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


# What a command reading a pushed tree may peak at: git's bound, and some room.
BOUNDED = MAX_GIT_MEMORY + (128 << 20)


def _deep_tree(repo: Path, files: int) -> str:
    """A tree of `files` empty files, 1,000 to a folder (as few as git fans notes out to),
    under 15 folders of 250-character names: each path some 3.8 KB long, the tree a few KB
    of objects."""
    blob = git(repo, "hash-object", "-w", "--stdin", input=b"").strip()
    folders = []
    for start in range(0, files, 1000):
        leaf = "".join(
            f"100644 blob {blob}\tf{i:06d}\n" for i in range(start, min(files, start + 1000))
        )
        folders.append(git(repo, "mktree", input=leaf.encode()).strip())
    listing = "".join(f"040000 tree {t}\tg{n:03d}\n" for n, t in enumerate(folders))
    tree = git(repo, "mktree", input=listing.encode()).strip()
    for level in range(15):
        name = f"d{level:02d}".ljust(250, "x")
        tree = git(repo, "mktree", input=f"040000 tree {tree}\t{name}\n".encode()).strip()
    return tree


def _evil_merge_dropped(repo: Path, files: int) -> tuple[str, str]:
    """On branch `evil`: a merge of main and a side branch whose tree also holds _deep_tree
    (content of its own), then a commit dropping it again, so that the range's ends differ
    by the side branch's file alone. (merge commit, head)"""
    main = git(repo, "rev-parse", "main").strip()
    side = commit_files(repo, {"side.txt": "side\n"}, message="side", branch="side",
                        start="main")  # fmt: skip
    listing = git(repo, "ls-tree", side).encode()
    deep = _deep_tree(repo, files)
    merged = git(repo, "mktree", input=listing + f"040000 tree {deep}\tdeep\n".encode()).strip()
    merge = git(repo, "commit-tree", merged, "-p", main, "-p", side, "-m", "merge").strip()
    tree = git(repo, "rev-parse", f"{side}^{{tree}}").strip()
    head = git(repo, "commit-tree", tree, "-p", merge, "-m", "drop").strip()
    git(repo, "update-ref", "refs/heads/evil", head)
    return merge, head


@pytest.mark.slow
def test_a_merge_listing_past_the_bound_blocks_reading_no_further(
    repo: Path, tmp_path: Path
) -> None:
    """A merge's own paths are listed to judge it (merges.py): a merge that brings in 200,000
    files of 3.8 KB paths (a few hundred KB of objects, 780 MB listed) and a later commit
    that drops them again leave the range's ends small. `check` and the server's hook block
    with `change-too-large`, in bounded memory, git's own included (unbounded, git alone took
    2.3 GB and 12 s for one diff of it)."""
    _server(tmp_path, repo)
    _evil_merge_dropped(repo, 200_000)
    check = [sys.executable, "-m", "gatekeeper", "check", "--repo", str(repo), "--base", "main",
             "--format", "json", "evil"]  # fmt: skip
    proc, peak = _peak(check, repo)
    assert proc.returncode == 1, proc.stderr
    findings = json.loads(proc.stdout)["findings"]
    # (Which read stops first, the merge's listing or a commit's diff, depends on the order
    # of reads: each is bounded.)
    assert [f["kind"] for f in findings if f["kind"] == "change-too-large"], findings
    assert peak < BOUNDED, f"check peaked at {peak >> 20} MiB"

    proc, peak = _peak(["git", "push", "origin", "evil:refs/heads/main"], repo)
    assert proc.returncode != 0
    remote = [ln for ln in proc.stderr.splitlines() if ln.startswith("remote:")]
    assert any("change-too-large" in ln for ln in remote), remote
    assert peak < BOUNDED, f"the push (and its hook) peaked at {peak >> 20} MiB"


@pytest.mark.slow
def test_a_notes_push_past_the_bound_is_refused_reading_no_further(
    repo: Path, tmp_path: Path
) -> None:
    """The server's hook lists what a push of the receipts ref changes (to refuse a push that
    drops a receipt): a notes commit whose tree holds 200,000 entries of 3.8 KB paths (780 MB
    listed) is refused as too large to check, in bounded memory, git's own included, and the
    ref is not moved."""
    from gatekeeper.receipt.notes import NOTES_REF

    bare = _server(tmp_path, repo)
    notes = git(repo, "commit-tree", _deep_tree(repo, 200_000), "-m", "notes").strip()
    proc, peak = _peak(["git", "push", "origin", f"{notes}:{NOTES_REF}"], repo)
    assert proc.returncode != 0
    assert "too large for the gate to read" in proc.stderr, proc.stderr
    assert "a receipts ref holds one small note per commit" in proc.stderr
    assert peak < BOUNDED, f"the push (and its hook) peaked at {peak >> 20} MiB"
    assert git(bare, "for-each-ref", NOTES_REF).strip() == ""


def test_every_listing_of_a_pushed_tree_is_bounded(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """merges.combined_paths, the notes tree's listing and the change of the notes each stop at
    the bound in bytes (here made small), saying what they read."""
    from gatekeeper.gate import diffread, merges, notes
    from gatekeeper.gate.history import range_commits

    merge, head = _evil_merge_dropped(repo, 20)
    git_dir = repo / ".git"
    notes_commit = git(repo, "commit-tree", _deep_tree(repo, 20), "-m", "notes").strip()
    [info] = [c for c in range_commits(git_dir, "main", head) if c.oid == merge]
    paths, clean = merges.combined_paths(git_dir, info)
    assert len(paths) == 20 and not clean
    assert len(notes._list_notes(git_dir, notes_commit)) == 0  # (no note: not hex ids)
    assert notes.lost_lines(git_dir, "4b825dc642cb6eb9a060e54bf8d69288fbee4904", notes_commit) == []
    monkeypatch.setattr(diffread, "MAX_DIFF_BYTES", 32 << 10)
    with pytest.raises(DiffTooLarge, match=f"the paths merge {merge[:12]}"):
        merges.combined_paths(git_dir, info)
    with pytest.raises(DiffTooLarge) as raised:
        merges.check_merges(git_dir, [info])
    assert raised.value.commit == merge  # (the finding names the merge)
    result = judgement.judge(git_dir, git(repo, "rev-parse", "main").strip(), head)
    kinds = {f.kind for f in result.findings}
    assert Kind.change_too_large in kinds and Kind.internal_error not in kinds
    with pytest.raises(DiffTooLarge, match="the notes tree of .* takes more than 32,768 bytes"):
        notes._list_notes(git_dir, notes_commit)
    with pytest.raises(DiffTooLarge, match="the change of the notes"):
        notes.lost_lines(git_dir, "4b825dc642cb6eb9a060e54bf8d69288fbee4904", notes_commit)


def test_git_itself_is_bounded_in_memory(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git holds a whole diff before it writes a line of it: past MAX_GIT_MEMORY (here made
    32 MiB) it fails, and the read says the listing is too large, not that git broke. A
    small diff is read as ever under the same bound."""
    from gatekeeper.gate import diffread

    monkeypatch.setattr(diffread, "MAX_GIT_MEMORY", 32 << 20)
    git_dir = repo / ".git"
    main = git(repo, "rev-parse", "main").strip()
    small = commit_files(repo, {"src/small.py": "x = 1\n"}, message="small", branch="small",
                         start="main")  # fmt: skip
    assert b"src/small.py" in read_diff(git_dir, main, small)
    wide = git(repo, "commit-tree", _deep_tree(repo, 20_000), "-p", main, "-m", "deep").strip()
    with pytest.raises(DiffTooLarge, match="takes git more than 32 MiB of memory to list"):
        read_diff(git_dir, main, wide)


def _renaming_merge(repo: Path, files: int, lines: int) -> str:
    """On main, a merge whose one side renames `files` near-alike files of `lines` lines (and
    tweaks each) while the other side edits them all, and which adds a file of its own: git's
    merge of its parents compares every renamed file with every added one."""
    base = "".join(f"{i:064x}\n" for i in range(lines)).encode()
    stream: list[bytes] = []

    def blob(mark: int, data: bytes) -> None:
        stream.append(b"blob\nmark :%d\ndata %d\n%s\n" % (mark, len(data), data))

    for i in range(files):
        blob(i + 1, base + b"a %d\n" % i)
        blob(files + i + 1, base + b"b %d\n" % i)
        blob(2 * files + i + 1, b"edit %d\n" % i + base + b"a %d\n" % i)
    main = git(repo, "rev-parse", "main").strip().encode()
    commits = [
        (main, None, b"".join(b"M 100644 :%d a/x%05d\n" % (i + 1, i) for i in range(files))),
        (b":90001", None, b"".join(b"D a/x%05d\nM 100644 :%d b/y%05d\n" % (i, files + i + 1, i)
                                   for i in range(files))),
        (b":90001", None, b"".join(b"M 100644 :%d a/x%05d\n" % (2 * files + i + 1, i)
                                   for i in range(files))),
        (b":90002", b":90003", b"M 100644 inline extra\ndata 2\nx\n"),
    ]  # fmt: skip
    for number, (first, second, body) in enumerate(commits, start=90001):
        merge = b"merge %s\n" % second if second else b""
        stream.append(b"commit refs/heads/renames\nmark :%d\ncommitter t <t@t> 1 +0000\n"
                      b"data 1\nc\nfrom %s\n%s%s\n" % (number, first, merge, body))  # fmt: skip
    subprocess.run(["git", "fast-import", "--quiet"], input=b"".join(stream), cwd=repo,
                   env=_env(), check=True)  # fmt: skip
    return git(repo, "rev-parse", "renames").strip()


def test_git_itself_is_bounded_in_processor_time(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding renames compares every deleted file with every added one: a push of a
    megabyte (thousands of near-alike files renamed on one side of a merge and edited on the
    other) took git's merge of the parents minutes, and a branch of such merges kept the
    server's hook busy without end. Past MAX_GIT_SECONDS (here 1 s) git is ended and the
    judgement blocks, naming git's merge; past MAX_GIT_SECONDS_IN_ALL (here 1 s) for all
    its listings, the same, naming them all."""
    from gatekeeper.gate import diffread

    main = git(repo, "rev-parse", "main").strip()
    head = _renaming_merge(repo, 2000, 1000)  # git's merge of its parents: some 5 s
    for per_call, in_all, said in (
        (1, 60, "git's merge of the parents of"),
        (30, 1, "the listings git made for this judgement take git more than 1 s"),
    ):
        monkeypatch.setattr(diffread, "MAX_GIT_SECONDS", per_call)
        monkeypatch.setattr(diffread, "MAX_GIT_SECONDS_IN_ALL", in_all)
        result = judgement.judge(repo / ".git", main, head)
        too_large = [f for f in result.findings if f.kind == Kind.change_too_large]
        assert len(too_large) == 1, [(f.kind, f.message) for f in result.findings]
        assert said in too_large[0].message and "processor time" in too_large[0].message
        assert Kind.internal_error not in {f.kind for f in result.findings}


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


def test_runs_lists_around_a_pushed_note_of_the_wrong_shape(repo: Path) -> None:
    """`gatekeeper runs` lists what receipts say before any is verified: a pushed note whose
    `command` was a list broke it with a traceback for everyone who fetched the receipts."""
    import base64

    commit = git(repo, "rev-parse", "HEAD").strip()
    for n, predicate in enumerate((
        {"run_id": "run-list-command", "command": ["x"]},
        {"run_id": "run-list-counts", "counts": {"files_touched": [1]}},
        {"run_id": "run-odd-times", "started_at": 5, "command": {"exit_code": "zero"}},
        ["not", "a", "predicate"],
    )):  # fmt: skip
        payload = {"predicateType": "urn:gatekeeper:receipt:v1", "predicate": predicate}
        envelope = {"payload": base64.b64encode(json.dumps(payload).encode()).decode(),
                    "payloadType": "application/vnd.in-toto+json", "signatures": []}  # fmt: skip
        git(repo, "notes", "--ref=gatekeeper", "append", "-m", json.dumps(envelope), commit)
        listed = gk("runs", "--repo", str(repo))
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, (n, listed.stderr)
