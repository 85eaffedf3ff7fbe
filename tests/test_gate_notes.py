"""Receipt notes are append-only on the server, and crafted notes cost every reader little.

The attacks: a notes commit that descends from the server's but drops receipts (an empty
tree), one envelope with 200,000 key-less signatures, and a note of millions of junk lines.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
import test_push
from fixtures.gate_receipts import commit_files, git_dir_of, receipted_commit
from test_push import PUSH, ZERO, Setup, assert_accepted, assert_blocked

from gatekeeper.gate import GateResult, judge
from gatekeeper.receipt.notes import MAX_NOTE_BYTES, NOTES_REF

from conftest import git, gk

daemon = test_push.daemon
setup = test_push.setup


def check(repo: Path, head: str = "agent/1", base: str = "main") -> GateResult:
    return judge(
        git_dir_of(repo),
        git(repo, "rev-parse", base).strip(),
        git(repo, "rev-parse", head).strip(),
    )


def set_note(repo: Path, commit: str, data: bytes) -> None:
    """Make data (appended to the note already there) commit's receipts note."""
    existing = git(repo, "notes", f"--ref={NOTES_REF}", "show", commit, check=False).encode()
    blob = git(repo, "hash-object", "-w", "--stdin", input=existing + data).strip()
    git(repo, "notes", f"--ref={NOTES_REF}", "add", "-f", "-C", blob, commit)


def notes_commit(repo: Path, tree: str, message: str) -> str:
    parent = git(repo, "rev-parse", NOTES_REF).strip()
    return git(repo, "commit-tree", tree, "-p", parent, "-m", message).strip()


def many_signatures(count: int, keyid: str = "") -> str:
    payload = base64.b64encode(b'{"_type": "x"}').decode()
    sigs = [{"keyid": keyid, "sig": "AA=="}] * count
    return json.dumps(
        {"payload": payload, "payloadType": "application/vnd.in-toto+json", "signatures": sigs}
    )


def malformed(result: GateResult) -> list[str]:
    return [f.message for f in result.findings if f.kind.value == "malformed-receipt"]


def ignored(result: GateResult, kind: str = "malformed-receipt") -> list[str]:
    """The messages of the note lines ignored beside a receipt that covers their commit."""
    return [f.message for f in result.ignored_notes if f.kind.value == kind]


# --- the server keeps every receipt -------------------------------------------------------------


def test_an_empty_notes_commit_that_descends_is_refused(setup: Setup) -> None:
    commit = receipted_commit(setup.clone, {"src/a.py": "a\n"})
    assert_accepted(setup.push(*PUSH))
    empty = git(setup.clone, "mktree", input=b"").strip()
    wiped = notes_commit(setup.clone, empty, "wipe every receipt")
    proc = setup.push(f"{wiped}:{NOTES_REF}")
    assert proc.returncode != 0, proc.stderr
    assert "may be added, never removed or changed" in proc.stderr
    assert f"the note on {commit[:12]} would lose 1 receipt or approval line(s)" in proc.stderr
    assert git(setup.bare, "notes", f"--ref={NOTES_REF}", "show", commit).strip()


def test_dropping_one_line_of_a_note_is_refused(setup: Setup) -> None:
    commit = receipted_commit(setup.clone, {"src/a.py": "a\n"})
    set_note(setup.clone, commit, b"another line\n")
    assert_accepted(setup.push(f"{NOTES_REF}:{NOTES_REF}"))
    first = git(setup.clone, "notes", f"--ref={NOTES_REF}", "show", commit).splitlines()[0]
    git(setup.clone, "notes", f"--ref={NOTES_REF}", "add", "-f", "-m", first, commit)
    proc = setup.push(f"{NOTES_REF}:{NOTES_REF}")
    assert proc.returncode != 0
    assert "would lose 1 receipt or approval line(s)" in proc.stderr


def test_notes_may_be_fanned_out_and_added_to(setup: Setup) -> None:
    commit = receipted_commit(setup.clone, {"src/a.py": "a\n"})
    assert_accepted(setup.push(*PUSH))
    blob = git(setup.clone, "notes", f"--ref={NOTES_REF}", "list", commit).strip()
    extra = git(setup.clone, "hash-object", "-w", "--stdin", input=b"one more line\n").strip()
    other = git(setup.clone, "rev-parse", "main").strip()
    inner = git(setup.clone, "mktree", input=f"100644 blob {blob}\t{commit[2:]}\n".encode()).strip()
    entries = f"040000 tree {inner}\t{commit[:2]}\n100644 blob {extra}\t{other}\n"
    tree = git(setup.clone, "mktree", input=entries.encode()).strip()
    refanned = notes_commit(setup.clone, tree, "fan out, add a note")
    assert_accepted(setup.push(f"{refanned}:{NOTES_REF}"))


def test_a_line_moved_where_the_gate_never_looks_is_lost(setup: Setup) -> None:
    """A note split over two blobs for one commit: its second line under a path of the
    commit's id the gate never reads (four levels of fan-out, or a 3-character one). The
    gate would lose that line (a denial): the server refuses it as it refuses a removal."""
    commit = receipted_commit(setup.clone, {"src/a.py": "a\n"})
    set_note(setup.clone, commit, b"a denial\n")
    assert_accepted(setup.push(f"{NOTES_REF}:{NOTES_REF}"))
    first = git(setup.clone, "notes", f"--ref={NOTES_REF}", "show", commit).splitlines()[0]
    kept = git(setup.clone, "hash-object", "-w", "--stdin", input=f"{first}\n".encode()).strip()
    moved = git(setup.clone, "hash-object", "-w", "--stdin", input=b"a denial\n").strip()
    for parts in ([commit[:2], commit[2:4], commit[4:6], commit[6:8], commit[8:]],
                  [commit[:3], commit[3:]]):  # fmt: skip
        tree = git(setup.clone, "mktree", input=f"100644 blob {moved}\t{parts[-1]}\n".encode())
        for name in reversed(parts[1:-1]):
            tree = git(
                setup.clone, "mktree", input=f"040000 tree {tree.strip()}\t{name}\n".encode()
            )
        entries = f"100644 blob {kept}\t{commit}\n040000 tree {tree.strip()}\t{parts[0]}\n"
        top = git(setup.clone, "mktree", input=entries.encode()).strip()
        proc = setup.push(f"{notes_commit(setup.clone, top, 'hide a line')}:{NOTES_REF}")
        assert proc.returncode != 0, (parts, proc.stderr)
        assert f"the note on {commit[:12]} would lose 1 receipt or approval line(s)" in proc.stderr


def _raw_tree(repo: Path, entries: list[tuple[str, bytes, str]]) -> str:
    """A tree object written as given (git's own commands refuse a malformed one)."""
    data = b"".join(m.encode() + b" " + n + b"\0" + bytes.fromhex(o) for m, n, o in entries)
    return git(
        repo, "hash-object", "-t", "tree", "-w", "--literally", "--stdin", input=data
    ).strip()


def test_a_notes_tree_git_would_never_write_is_refused(setup: Setup) -> None:
    """Two entries of one name (a blob `ab` beside the folder `ab`), or a name holding a
    `/`: a path's lookup reads such a tree one way and diff-tree another, so a line could
    be hidden from the gate while the server counted it kept. Refused, whatever it holds."""
    commit = receipted_commit(setup.clone, {"src/a.py": "a\n"})
    assert_accepted(setup.push(*PUSH))
    blob = git(setup.clone, "notes", f"--ref={NOTES_REF}", "list", commit).strip()
    empty = git(setup.clone, "hash-object", "-w", "--stdin", input=b"").strip()
    inner = _raw_tree(setup.clone, [("100644", commit[2:].encode(), blob)])
    twice = [("100644", commit[:2].encode(), empty), ("40000", commit[:2].encode(), inner)]
    slashed = [("100644", f"{commit[:2]}/{commit[2:]}".encode(), blob)]
    padded = [("040000", commit[:2].encode(), inner)]  # git writes `40000`
    flat = [("100644", f"{n:040x}".encode(), empty) for n in range(1025)]
    for entries in (twice, slashed, padded, flat):
        tree = _raw_tree(setup.clone, entries)
        proc = setup.push(f"{notes_commit(setup.clone, tree, 'malformed')}:{NOTES_REF}")
        assert proc.returncode != 0, proc.stderr
        assert "which git never writes" in proc.stderr or "git fans notes out" in proc.stderr, (
            proc.stderr
        )


def test_a_line_changed_by_unicode_blanks_is_lost(setup: Setup) -> None:
    """The gate strips ASCII blanks from a note's lines: a line with U+3000 appended is
    another line to it (one that no longer parses), so the old one is lost."""
    commit = receipted_commit(setup.clone, {"src/a.py": "a\n"})
    assert_accepted(setup.push(*PUSH))
    line = git(setup.clone, "notes", f"--ref={NOTES_REF}", "show", commit).splitlines()[0]
    git(setup.clone, "notes", f"--ref={NOTES_REF}", "add", "-f", "-m", line + "\u3000", commit)
    proc = setup.push(f"{NOTES_REF}:{NOTES_REF}")
    assert proc.returncode != 0
    assert f"the note on {commit[:12]} would lose 1 receipt or approval line(s)" in proc.stderr


def test_deleting_the_notes_ref_is_refused(setup: Setup) -> None:
    receipted_commit(setup.clone, {"src/a.py": "a\n"})
    assert_accepted(setup.push(*PUSH))
    proc = setup.push(f":{NOTES_REF}")
    assert proc.returncode != 0
    assert "would drop every receipt" in proc.stderr


def test_an_oversized_note_is_refused_by_the_server(setup: Setup) -> None:
    commit = receipted_commit(setup.clone, {"src/a.py": "a\n"})
    set_note(setup.clone, commit, b"x" * (MAX_NOTE_BYTES + 1))  # compresses to little
    proc = setup.push(*PUSH)
    assert proc.returncode != 0
    assert f"over the limit of {MAX_NOTE_BYTES}" in proc.stderr


# --- bounded reading: over-limit input is malformed-receipt, never dropped -----------------------
# (Beside a genuine receipt of the commit, anyone's junk is shown as ignored: it cannot speak
# for the commit, and blocking on it would let whoever may push notes veto any run for good.)


def test_an_envelope_with_200000_keyless_signatures_is_malformed(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    set_note(repo, commit, many_signatures(200_000).encode() + b"\n")
    result = check(repo)
    assert result.verdict.value == "pass", result.findings
    assert any("200000 signatures, over the limit of 16" in m for m in ignored(result)), (
        result.ignored_notes
    )
    assert result.receipts_verified == 1  # the genuine receipt beside it still verifies
    # Alone on a commit, the same line blocks, and says why nothing covers it.
    bare = commit_files(repo, {"src/b.py": "b\n"}, branch="agent/2", start="main")
    set_note(repo, bare, many_signatures(200_000).encode() + b"\n")
    alone = check(repo, head="agent/2")
    assert any("200000 signatures, over the limit of 16" in m for m in malformed(alone))
    assert "uncovered-commit" in {f.kind.value for f in alone.findings}


def test_an_envelope_with_too_many_signatures_is_malformed(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    set_note(repo, commit, many_signatures(17, "k" * 64).encode() + b"\n")
    assert any("17 signatures, over the limit of 16" in m for m in ignored(check(repo)))


def test_a_keyless_signature_is_never_tried_against_trusted_keys(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    line = git(repo, "notes", f"--ref={NOTES_REF}", "show", commit).strip()
    envelope = json.loads(line)
    envelope["signatures"][0]["keyid"] = ""
    git(repo, "notes", f"--ref={NOTES_REF}", "add", "-f", "-m", json.dumps(envelope), commit)
    result = check(repo)
    assert "untrusted-key" in {f.kind.value for f in result.findings}
    assert result.receipts_verified == 0


def test_a_note_of_millions_of_junk_lines_is_malformed(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    set_note(repo, commit, b"junk\n" * 5_000_000)
    result = check(repo)
    assert any("more than 1000 lines" in m for m in ignored(result)), result.ignored_notes
    assert result.verdict.value == "pass" and result.receipts_verified == 1


def test_a_note_of_too_many_lines_is_malformed(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    set_note(repo, commit, b"j\n" * 5000)
    result = check(repo)
    assert any("more than 1000 lines" in m for m in ignored(result)), result.ignored_notes
    assert result.receipts_verified == 1


def test_junk_on_a_commit_outside_the_range_is_not_read(repo: Path) -> None:
    outside = commit_files(repo, {"docs/x.md": "x\n"}, branch="elsewhere", start="main")
    set_note(repo, outside, b"junk\n" * 5_000_000 + many_signatures(200_000).encode())
    receipted_commit(repo, {"src/a.py": "a\n"})
    result = check(repo)
    assert [f.message for f in result.findings] == []
    proc = gk("check", "--repo", str(repo), "--base", "main", "agent/1")
    assert proc.returncode == 0, proc.stderr


def test_receipt_show_reports_an_oversized_note(repo: Path) -> None:
    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    set_note(repo, commit, b"junk\n" * 5_000_000)
    proc = gk("receipt", "show", commit, cwd=repo)
    assert proc.returncode == 1
    assert "MALFORMED receipt note" in proc.stderr and "more than 1000 lines" in proc.stderr


def test_many_junk_lines_pushed_to_the_server_are_read_within_bounds(setup: Setup) -> None:
    # Beside the genuine receipt the junk is ignored (and said so); alone it blocks.
    commit = receipted_commit(setup.clone, {"src/a.py": "a\n"})
    set_note(setup.clone, commit, b"j\n" * 5000 + many_signatures(200_000).encode() + b"\n")
    proc = setup.push(*PUSH)
    assert_accepted(proc)
    assert "1 receipt(s) verified, 0 finding(s), 2 note line(s) ignored" in proc.stderr
    bare = commit_files(setup.clone, {"src/b.py": "b\n"}, branch="agent/1", start="HEAD")
    set_note(setup.clone, bare, b"j\n" * 5000 + many_signatures(200_000).encode() + b"\n")
    assert_blocked(setup.push(*PUSH), "malformed-receipt")


# --- what a push of notes may cost the gate in all ----------------------------------------------


def test_a_line_on_many_commits_is_verified_once_and_each_key_tried_once(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each verification parses and hashes the whole line: one line of a hundred megabytes
    (a few KB of pack) noted on 80 commits, with 16 signatures naming the trusted key, was
    verified 80 times, each key tried 16 times: two minutes of the hook."""
    from gatekeeper.gate import verified
    from gatekeeper.receipt.keys import PublicKey

    main = git(repo, "rev-parse", "main").strip()
    commits = [receipted_commit(repo, {f"src/f{i}.py": f"{i}\n"}, start=None if i else "main")
               for i in range(3)]  # fmt: skip
    genuine = git(repo, "notes", f"--ref={NOTES_REF}", "show", commits[0]).strip()
    forged = json.loads(genuine)
    forged["signatures"] = [dict(forged["signatures"][0], sig="AA==")] * 16  # the trusted keyid
    for commit in commits:
        set_note(repo, commit, json.dumps(forged).encode() + b"\n")
    calls = {"verify_envelope": 0, "key": 0}
    real_envelope, real_key = verified.verify_envelope, PublicKey.verify

    def counted_envelope(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["verify_envelope"] += 1
        return real_envelope(*args, **kwargs)

    def counted_key(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["key"] += 1
        return real_key(self, *args, **kwargs)

    monkeypatch.setattr(verified, "verify_envelope", counted_envelope)
    monkeypatch.setattr(PublicKey, "verify", counted_key)
    result = judge(git_dir_of(repo), main, commits[-1])
    assert result.receipts_verified == 3
    assert calls["verify_envelope"] == 4, calls  # three genuine lines, one forged
    assert calls["key"] == 4, calls  # the forged one's key tried once, not 16 times
    assert len(ignored(result, "bad-signature")) == 3  # each beside its commit's genuine one


def test_the_notes_on_a_range_are_bounded_in_all(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of commits each with a note of junk lines (a push of 720 KB) made the hook
    hold 4,000,000 findings and 1.9 GB; notes of hundreds of MB on each commit, gigabytes."""
    from gatekeeper.gate import notes

    commits = [receipted_commit(repo, {f"src/f{i}.py": f"{i}\n"}, start=None if i else "main")
               for i in range(3)]  # fmt: skip
    for commit in commits:
        set_note(repo, commit, b"".join(b"junk %d\n" % i for i in range(50)))
    monkeypatch.setattr(notes, "RANGE_MAX_LINES", 60)
    result = check(repo)
    found = malformed(result)
    assert any("hold over 60 lines" in m for m in found), found
    # Each commit is covered, but what was not read is every later note of the range (a
    # denial among them): never ignored as one line beside a receipt would be.
    assert result.verdict.value == "block"
    assert len(found) < 60, found
    monkeypatch.setattr(notes, "RANGE_MAX_LINES", 100_000)
    size = len(git(repo, "notes", f"--ref={NOTES_REF}", "show", commits[0]).encode())
    monkeypatch.setattr(notes, "RANGE_BUDGET", size + size // 2)
    found = malformed(check(repo))
    assert any("over 0 MiB in all" in m or "MiB in all" in m for m in found), found


def test_a_notes_push_is_read_within_a_budget(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three note blobs of 200 MiB each (608 KB of pack) pushed to the receipts ref were read
    whole to see that nothing was lost: 1.2 GB, and the push accepted."""
    from gatekeeper.gate import notes

    commit = receipted_commit(repo, {"src/a.py": "a\n"})
    old = git(repo, "rev-parse", NOTES_REF).strip()
    set_note(repo, commit, b"x" * 4096 + b"\n")
    new = git(repo, "rev-parse", NOTES_REF).strip()
    assert notes.lost_lines(git_dir_of(repo), old, new) == []
    monkeypatch.setattr(notes, "NOTES_PUSH_BUDGET", 4096)
    problems = notes.lost_lines(git_dir_of(repo), old, new)
    assert len(problems) == 1 and "MiB in all" in problems[0], problems


def test_only_a_commit_may_be_the_receipts_ref(repo: Path) -> None:
    """A tree pushed as the first receipts ref was accepted; from then on no push of receipts
    could descend from it, and every judged push blocked."""
    from gatekeeper.gate.hooks import _notes_problem
    from gatekeeper.gate.refs import RefUpdate
    from gatekeeper.git import ZERO_OID

    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    problem = _notes_problem(git_dir_of(repo), RefUpdate(ZERO_OID, tree, NOTES_REF))
    assert problem is not None and "not a tree" in problem, problem
    head = git(repo, "rev-parse", "HEAD").strip()
    assert "not a blob" in (
        _notes_problem(
            git_dir_of(repo),
            RefUpdate(ZERO_OID, git(repo, "rev-parse", f"{head}:README.md").strip(), NOTES_REF),
        )
        or ""
    )


def _pre_receive(setup: Setup, *lines: str) -> subprocess.CompletedProcess[str]:
    """The server's pre-receive hook, given these ref updates as a receive-pack client could
    send them (the old values are the client's word)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_DIR=str(setup.bare), GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run([str(setup.bare / "hooks" / "pre-receive")], cwd=setup.bare, env=env,
                          input="".join(f"{line}\n" for line in lines), capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def test_notes_pushed_with_an_old_value_that_is_not_the_servers_are_refused(
    setup: Setup,
) -> None:
    """A push's old value for the notes ref is the client's word. The hook judged the protected
    refs of the push with the pushed notes, checked only against that word: a "create", or an
    older notes commit, left out lines the server holds (a later denial). git refused the notes
    update itself afterwards, but the protected ref had moved. Now such a push is refused."""
    receipted_commit(setup.clone, {"src/feature.py": "x = 1\n"})
    assert_accepted(setup.push(*PUSH))
    older = setup.server_rev(NOTES_REF)
    assert older is not None
    receipted_commit(setup.clone, {"src/more.py": "y = 1\n"}, branch="agent/2", start="agent/1")
    assert_accepted(setup.push(*PUSH))
    current = setup.server_rev(NOTES_REF)
    tip = setup.server_rev("refs/heads/main")
    # A notes commit made from the older one, beside the server's: it lacks the newer lines.
    fork = notes_commit(setup.clone, git(setup.clone, "rev-parse", f"{older}^{{tree}}").strip(),
                        "beside")  # fmt: skip
    assert_accepted(setup.push(f"{fork}:refs/heads/beside"))  # its objects reach the server
    for claimed in (ZERO, older):
        proc = _pre_receive(setup, f"{tip} {tip} refs/heads/main", f"{claimed} {fork} {NOTES_REF}")
        assert proc.returncode != 0, proc.stderr
        assert f"expects the server's receipts at {claimed[:12]}" in proc.stderr, proc.stderr
        assert f"are at {current[:12]}" in proc.stderr
    assert setup.server_rev(NOTES_REF) == current
