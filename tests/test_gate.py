"""The gate's judgement on real repositories with genuine signed receipts (made via the library)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from fixtures.gate_receipts import (
    attach,
    commit_files,
    git_dir_of,
    make_receipt,
    receipted_commit,
    sign,
)

from gatekeeper.gate import GateResult, judge
from gatekeeper.receipt.keys import generate_key
from gatekeeper.receipt.notes import NOTES_REF

from conftest import git, gk, make_repo, needs_bwrap


def check(repo: Path, head: str = "agent/1", base: str = "main") -> GateResult:
    git_dir = git_dir_of(repo)
    return judge(
        git_dir,
        git(repo, "rev-parse", base).strip(),
        git(repo, "rev-parse", head).strip(),
        target_name=base,
        head_name=head,
    )


def kinds(result: GateResult) -> set[str]:
    return {f.kind.value for f in result.findings}


def assert_pass(result: GateResult) -> None:
    assert [f"{f.kind.value}: {f.message}" for f in result.findings] == []
    assert result.verdict.value == "pass"
    assert result.receipts_verified >= 1


def raw(repo: Path, name: bytes, data: bytes) -> None:
    """Write a file whose name is arbitrary bytes (non-UTF-8 included)."""
    path = os.path.join(os.fsencode(repo), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def add_gitlink(repo: Path, path: str, oid: str) -> None:
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{oid},{path}")


# --- every kind of change, with a genuine receipt, passes ---------------------------------------

EDITS: dict[str, dict[str, Any]] = {
    "add-modify-delete": {
        "files": {"src/new.py": "x = 1\n", "src/app.py": "print('bye')\n", "README.md": None}
    },
    "pure-rename": {"renames": {"src/app.py": "lib/app.py"}},
    "rename-with-edit": {
        "renames": {"README.md": "docs/README.md"},
        "files": {"docs/README.md": "# demo\n\nmore words here\n"},
    },
    "mode-change": {"chmod": {"src/app.py": 0o755}},
    "file-to-symlink": {"symlinks": {"README.md": "src/app.py"}},
    "new-symlink": {"symlinks": {"link": "../outside/target"}},
    "binary": {"files": {"img.bin": bytes(range(256)) * 8}},
    "empty-file": {"files": {"empty": ""}},
    "odd-names": {
        "files": {
            "with space.txt": "a\n",
            "new\nline.txt": "b\n",
            "ünï cödé/文件.txt": "c\n",
            "tab\there": "d\n",
            'quote"d': "e\n",
        }
    },
}


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_a_genuine_receipt_passes(repo: Path, edit: str) -> None:
    receipted_commit(repo, **EDITS[edit])
    result = check(repo)
    assert_pass(result)
    assert result.receipts_verified == 1
    assert result.changes, "the edit changed nothing"


def test_symlink_to_file_and_submodules_pass(repo: Path) -> None:
    commit_files(repo, symlinks={"ln": "README.md"}, message="a link on main")
    git(repo, "checkout", "-q", "-b", "agent/1")
    (repo / "ln").unlink()
    (repo / "ln").write_text("now a file\n")
    git(repo, "add", "-A")
    add_gitlink(repo, "vendor/lib", git(repo, "rev-parse", "HEAD").strip())
    git(repo, "commit", "-q", "-m", "agent")
    commit = git(repo, "rev-parse", "HEAD").strip()
    attach(repo, commit, sign(make_receipt(repo, commit)))
    result = check(repo)
    assert_pass(result)
    statuses = {c.path: (c.status, c.new_mode) for c in result.changes}
    assert statuses["ln"] == ("T", "100644")
    assert statuses["vendor/lib"] == ("A", "160000")


@pytest.mark.parametrize("tamper", ["hidden", "other-commit"])
def test_a_submodule_bump_must_match_the_receipt(repo: Path, tamper: str) -> None:
    main = git(repo, "rev-parse", "HEAD").strip()
    add_gitlink(repo, "vendor/lib", main)
    git(repo, "commit", "-q", "-m", "submodule on main")
    git(repo, "checkout", "-q", "-b", "agent/1")
    (repo / "f.txt").write_text("x\n")
    git(repo, "add", "f.txt")
    add_gitlink(repo, "vendor/lib", git(repo, "rev-parse", "HEAD").strip())
    git(repo, "commit", "-q", "-m", "bump the submodule")
    head = git(repo, "rev-parse", "HEAD").strip()

    def mutate(data: dict[str, Any]) -> None:
        changes = data["predicate"]["changes"]
        if tamper == "hidden":
            data["predicate"]["changes"] = [c for c in changes if c["path"] != "vendor/lib"]
        else:
            for c in changes:
                if c["path"] == "vendor/lib":
                    c["new_blob"] = main

    attach(repo, head, sign(make_receipt(repo, head, mutate=mutate)))
    result = check(repo)
    expected = "unclaimed-change" if tamper == "hidden" else "change-differs"
    assert {(f.kind.value, f.path) for f in result.findings} == {(expected, "vendor/lib")}


def test_a_non_utf8_path_is_judged_and_named(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "agent/1")
    raw(repo, b"raw\xffname.txt", b"bytes\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "human, odd name")
    result = check(repo)
    assert ("unclaimed-change", "raw\udcffname.txt") in {
        (f.kind.value, f.path) for f in result.findings
    }


def test_filters_are_not_applied_blob_ids_are_compared(repo: Path) -> None:
    commit_files(
        repo,
        {".gitattributes": "*.up filter=upper\n*.txt text eol=crlf\n"},
        message="attributes on main",
    )
    git(repo, "config", "filter.upper.clean", "tr a-z A-Z")
    git(repo, "config", "filter.upper.smudge", "tr A-Z a-z")
    commit = receipted_commit(repo, {"data.up": "shout\n", "notes.txt": "line\r\nline\n"})
    # The checkout differs from the blobs (smudged, unstaged edits): the gate reads objects only.
    (repo / "data.up").write_text("something else entirely\n")
    result = check(repo)
    assert_pass(result)
    blob = git(repo, "cat-file", "-p", f"{commit}:data.up")
    assert blob == "SHOUT\n"


# --- a receipt that does not match the diff is caught, path by path ---------------------------


def _drop(path: str) -> Any:
    def mutate(data: dict[str, Any]) -> None:
        data["predicate"]["changes"] = [
            c for c in data["predicate"]["changes"] if c["path"] != path
        ]

    return mutate


def _add_fake(data: dict[str, Any]) -> None:
    data["predicate"]["changes"].append(
        {
            "status": "A",
            "path": "src/claimed.py",
            "old_path": None,
            "old_mode": "000000",
            "new_mode": "100644",
            "old_blob": "0" * 40,
            "new_blob": "1" * 40,
            "score": None,
        }
    )


def _set(path: str, **fields: Any) -> Any:
    def mutate(data: dict[str, Any]) -> None:
        for change in data["predicate"]["changes"]:
            if change["path"] == path:
                change.update(fields)

    return mutate


TAMPERED = [
    (
        "unclaimed",
        {"files": {"a.txt": "a\n", "b.txt": "b\n"}},
        _drop("b.txt"),
        "unclaimed-change",
        "b.txt",
    ),
    ("missing", {"files": {"a.txt": "a\n"}}, _add_fake, "missing-change", "src/claimed.py"),
    (
        "blob",
        {"files": {"a.txt": "a\n"}},
        _set("a.txt", new_blob="2" * 40),
        "change-differs",
        "a.txt",
    ),
    (
        "mode",
        {"chmod": {"src/app.py": 0o755}},
        _set("src/app.py", new_mode="100644"),
        "change-differs",
        "src/app.py",
    ),
    (
        "type",
        {"symlinks": {"README.md": "x"}},
        _set("README.md", new_mode="100644", status="M"),
        "change-differs",
        "README.md",
    ),
    (
        "link-target",
        {"symlinks": {"ln": "good"}},
        _set("ln", new_blob="3" * 40),
        "change-differs",
        "ln",
    ),
    (
        "rename-as-modify",
        {"renames": {"src/app.py": "src/main.py"}},
        _set("src/main.py", status="M", old_path=None, old_mode="100644"),
        "change-differs",
        "src/main.py",
    ),
    (
        "deletion-hidden",
        {"files": {"README.md": None, "a.txt": "a\n"}},
        _drop("README.md"),
        "unclaimed-change",
        "README.md",
    ),
    (
        "odd-name",
        {"files": {"new\nline ü.txt": "x\n"}},
        _set("new\nline ü.txt", new_blob="4" * 40),
        "change-differs",
        "new\nline ü.txt",
    ),
]


@pytest.mark.parametrize(
    ("edit", "mutate", "kind", "path"), [t[1:] for t in TAMPERED], ids=[t[0] for t in TAMPERED]
)
def test_a_receipt_that_differs_from_the_diff_blocks(
    repo: Path, edit: dict[str, Any], mutate: Any, kind: str, path: str
) -> None:
    receipted_commit(repo, mutate=mutate, **edit)
    result = check(repo)
    assert result.verdict.value == "block"
    assert (kind, path) in {(f.kind.value, f.path) for f in result.findings}, result.findings


def test_a_rename_written_as_delete_and_add_is_the_same_change(repo: Path) -> None:
    def split(data: dict[str, Any]) -> None:
        (r,) = data["predicate"]["changes"]
        data["predicate"]["changes"] = [
            {
                **r,
                "status": "D",
                "path": r["old_path"],
                "old_path": None,
                "new_mode": "000000",
                "new_blob": "0" * 40,
                "score": None,
            },
            {
                **r,
                "status": "A",
                "old_path": None,
                "old_mode": "000000",
                "old_blob": "0" * 40,
                "score": None,
            },
        ]

    receipted_commit(repo, renames={"src/app.py": "src/main.py"}, mutate=split)
    assert_pass(check(repo))


# --- coverage: stacked, squashed, rebased, merged ---------------------------------------------


def test_stacked_runs_compose(repo: Path) -> None:
    receipted_commit(repo, {"f.txt": "one\n", "g.txt": "tmp\n"})
    receipted_commit(repo, {"f.txt": "two\n", "g.txt": None}, start=None)
    result = check(repo)
    assert_pass(result)
    assert result.receipts_verified == 2
    assert [c.path for c in result.changes] == ["f.txt"]


def test_a_squash_onto_the_same_base_is_covered_by_the_original_receipt(repo: Path) -> None:
    agent = receipted_commit(repo, {"f.txt": "x\n"})
    squashed = git(repo, "commit-tree", f"{agent}^{{tree}}", "-p", "main", "-m", "squashed").strip()
    git(repo, "branch", "-f", "squashed", squashed)
    result = check(repo, "squashed")
    assert_pass(result)
    assert result.covered_by == {squashed: f"run-{agent[:8]}"}


def test_a_rebase_onto_a_newer_target_is_covered(repo: Path) -> None:
    receipted_commit(repo, {"src/feature.py": "x\n"})
    git(repo, "checkout", "-q", "main")
    commit_files(repo, {"docs/news.md": "later on main\n"}, message="main moves on")
    git(repo, "rebase", "-q", "main", "agent/1")
    assert_pass(check(repo))


def test_a_rebase_over_the_targets_own_change_to_the_same_file_blocks_and_says_why(
    repo: Path,
) -> None:
    """git merges the target's change to a file with the run's cleanly, but the result is no
    run's work: it blocks, and the finding says what happened and what to do."""
    commit_files(repo, {"notes.txt": "".join(f"{i}\n" for i in range(1, 11))}, message="base",
                 branch="main")  # fmt: skip
    receipted_commit(repo, {"notes.txt": "".join(f"{i}\n" for i in (*range(1, 8), "8 run", 9, 10))},
                     branch="agent/1", start="main")  # fmt: skip
    git(repo, "checkout", "-q", "main")
    commit_files(repo, {"notes.txt": "".join(f"{i}\n" for i in ("1 main", *range(2, 11)))},
                 message="main changes the same file")  # fmt: skip
    git(repo, "-c", f"notes.rewriteRef={NOTES_REF}", "rebase", "-q", "main", "agent/1")
    result = check(repo)
    assert result.verdict == "block"
    mismatch = [f.message for f in result.findings if f.kind.value == "result-mismatch"]
    assert len(mismatch) == 1, result.findings
    assert "changes the same paths, but from other content ('notes.txt')" in mismatch[0]
    assert "redo the run on the new base" in mismatch[0]


def test_a_rebase_of_a_run_started_outside_the_target_is_base_mismatch(repo: Path) -> None:
    commit_files(repo, {"side.txt": "human\n"}, branch="side", start="main", message="side work")
    receipted_commit(repo, {"src/feature.py": "x\n"}, branch="agent/1", start="side")
    git(
        repo,
        "-c",
        f"notes.rewriteRef={NOTES_REF}",
        "rebase",
        "-q",
        "--onto",
        "main",
        "side",
        "agent/1",
    )
    result = check(repo)
    assert "base-mismatch" in kinds(result)
    assert "not in the target's history" in " ".join(f.message for f in result.findings)


def test_same_result_on_another_parent_is_base_mismatch(repo: Path) -> None:
    agent = receipted_commit(repo, {"f.txt": "x\n"})
    other = commit_files(repo, {"other.txt": "o\n"}, branch="other", start="main")
    moved = git(repo, "commit-tree", f"{agent}^{{tree}}", "-p", other, "-m", "same tree").strip()
    git(repo, "branch", "-f", "moved", moved)
    line = git(repo, "notes", f"--ref={NOTES_REF}", "show", agent).strip()
    attach(repo, moved, line)
    result = check(repo, "moved")
    assert "base-mismatch" in kinds(result)
    assert "uncovered-commit" in kinds(result)  # `other` itself has no receipt


def test_merging_the_target_into_the_branch_needs_no_receipt(repo: Path) -> None:
    receipted_commit(repo, {"src/feature.py": "x\n"})
    git(repo, "checkout", "-q", "main")
    commit_files(repo, {"docs/news.md": "main moves on\n"}, message="main moves on")
    git(repo, "checkout", "-q", "agent/1")
    git(repo, "merge", "-q", "--no-edit", "main")
    assert_pass(check(repo))


def test_an_evil_merge_is_caught_by_the_diff(repo: Path) -> None:
    receipted_commit(repo, {"src/feature.py": "x\n"})
    git(repo, "checkout", "-q", "main")
    commit_files(repo, {"docs/news.md": "main moves on\n"}, message="main moves on")
    git(repo, "checkout", "-q", "agent/1")
    git(repo, "merge", "-q", "--no-commit", "main")
    (repo / "src/app.py").write_text("import os; os.system('evil')\n")
    git(repo, "commit", "-q", "-am", "merge main")
    result = check(repo)
    assert ("unclaimed-change", "src/app.py") in {(f.kind.value, f.path) for f in result.findings}


def test_receipts_fetched_from_a_remote_are_found(repo: Path, tmp_path: Path) -> None:
    receipted_commit(repo, {"f.txt": "x\n"})
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    git(clone, "fetch", "-q", "origin", f"+{NOTES_REF}:refs/notes/remotes/origin/gatekeeper")
    result = check(clone, "origin/agent/1", "origin/main")
    assert_pass(result)
    assert result.receipts[0].source == "refs/notes/remotes/origin/gatekeeper"


def test_notes_in_a_fanned_out_tree_are_read(repo: Path) -> None:
    from gatekeeper.gate.notes import read_notes

    commit = receipted_commit(repo, {"f.txt": "x\n"})
    blob = git(repo, "notes", f"--ref={NOTES_REF}", "list", commit).strip()
    inner = git(repo, "mktree", input=f"100644 blob {blob}\t{commit[2:]}\n".encode()).strip()
    outer = git(repo, "mktree", input=f"040000 tree {inner}\t{commit[:2]}\n".encode()).strip()
    notes_commit = git(repo, "commit-tree", outer, "-m", "fanned out").strip()
    git(repo, "update-ref", NOTES_REF, notes_commit)
    assert git(repo, "notes", f"--ref={NOTES_REF}", "list", commit).strip() == blob
    found = read_notes(git_dir_of(repo), [("x", notes_commit)])
    assert list(found) == [commit]
    assert_pass(check(repo))


# --- policy: the target's, never the branch's ---------------------------------------------------


DOCS_ONLY = "version: 1\npaths:\n  write: ['docs/**', '**/*.md']\n"


def test_writes_outside_the_target_policy_are_unapproved(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy=DOCS_ONLY)
    receipted_commit(repo, {"docs/guide.md": "ok\n", "src/app.py": "not ok\n"})
    result = check(repo)
    assert {(f.kind.value, f.path) for f in result.findings} == {("unapproved-write", "src/app.py")}


def test_the_branch_policy_does_not_judge(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy=DOCS_ONLY)
    receipted_commit(
        repo,
        {
            ".gatekeeper/policy.yaml": "version: 1\npaths:\n  write: ['**']\n",
            "src/app.py": "now allowed?\n",
        },
    )
    result = check(repo)
    assert ("protected-path", ".gatekeeper/policy.yaml") in {
        (f.kind.value, f.path) for f in result.findings
    }
    assert ("unapproved-write", "src/app.py") in {(f.kind.value, f.path) for f in result.findings}


@pytest.mark.parametrize(
    "path",
    [
        ".github/workflows/ci.yml",
        ".gitmodules",
        ".gitattributes",
        "src/.gitattributes",
        ".gatekeeper/trusted_keys",
        ".githooks/pre-commit",
    ],
)
def test_protected_paths_need_an_explicit_write_entry(repo: Path, path: str) -> None:
    receipted_commit(repo, {path: "changed\n"})
    result = check(repo)
    assert {(f.kind.value, f.path) for f in result.findings} == {("protected-path", path)}


def test_an_explicit_write_entry_opens_a_protected_path(tmp_path: Path, key: Path) -> None:
    policy = "version: 1\npaths:\n  write: ['**', '.github/workflows/**']\n"
    repo = make_repo(tmp_path / "r", policy=policy)
    receipted_commit(repo, {".github/workflows/ci.yml": "on: push\n"})
    assert_pass(check(repo))


def test_a_receipt_made_under_another_policy_is_policy_mismatch(repo: Path) -> None:
    receipted_commit(repo, {"f.txt": "x\n"}, policy_sha="f" * 64)
    assert kinds(check(repo)) == {"policy-mismatch"}


def test_a_target_without_policy_blocks(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r")
    git(repo, "rm", "-q", ".gatekeeper/policy.yaml")
    git(repo, "commit", "-q", "-m", "no policy")
    receipted_commit(repo, {"f.txt": "x\n"})
    result = check(repo)
    assert "policy-mismatch" in kinds(result)
    assert "has no .gatekeeper/policy.yaml" in " ".join(f.message for f in result.findings)


# --- fail closed --------------------------------------------------------------------------------


def test_no_trust_file_at_the_target_blocks(repo: Path) -> None:
    git(repo, "rm", "-q", ".gatekeeper/trusted_keys")
    git(repo, "commit", "-q", "-m", "drop the trust file")
    receipted_commit(repo, {"f.txt": "x\n"})
    result = check(repo)
    assert result.verdict.value == "block"
    assert result.receipts_verified == 0
    assert {"untrusted-key", "no-receipt"} <= kinds(result)
    assert "no trust file" in " ".join(f.message for f in result.findings)


def test_a_key_added_on_the_branch_is_not_trusted(repo: Path, tmp_path: Path) -> None:
    attacker = generate_key(tmp_path / "attacker" / "key.pem")
    trust = (repo / ".gatekeeper/trusted_keys").read_text() + attacker.public.line + "\n"
    commit = commit_files(
        repo, {".gatekeeper/trusted_keys": trust, "f.txt": "x\n"}, branch="agent/1", start="main"
    )
    attach(repo, commit, sign(make_receipt(repo, commit), attacker))
    result = check(repo)
    assert {"untrusted-key", "no-receipt", "protected-path"} <= kinds(result)


def test_a_malformed_receipt_is_reported(repo: Path) -> None:
    commit = commit_files(repo, {"f.txt": "x\n"}, branch="agent/1", start="main")
    attach(repo, commit, "this is not json")
    result = check(repo)
    assert {"malformed-receipt", "uncovered-commit", "no-receipt"} <= kinds(result)
    assert result.verdict.value == "block" and not result.ignored_notes


def test_lines_beside_a_genuine_receipt_that_do_not_speak_for_the_commit_are_ignored(
    repo: Path, tmp_path: Path
) -> None:
    # Anyone who may push notes can add a line to any commit's note (the server keeps notes
    # append-only, and rewrites copy them): junk, a receipt signed by a key of their own, or
    # another run's genuine receipt. Beside the receipt that covers the commit, none of them
    # blocks it: each is shown as ignored, and says why.
    other = receipted_commit(repo, {"g.txt": "y\n"}, branch="agent/other")
    stray = git(repo, "notes", f"--ref={NOTES_REF}", "show", other).strip()
    commit = receipted_commit(repo, {"f.txt": "x\n"})
    attacker = generate_key(tmp_path / "attacker" / "key.pem")
    attach(repo, commit, '{"payload": "not base64!", "payloadType": "x", "signatures": []}')
    attach(repo, commit, "this is not json")
    attach(repo, commit, sign(make_receipt(repo, commit), attacker))
    attach(repo, commit, stray)
    # The other run's receipt, made under another policy: it covers nothing here, so its
    # policy is not the range's either.
    attach(repo, commit, sign(make_receipt(repo, other, policy_sha="1" * 64)))
    # A clean merge of the target into the branch, with junk on it too.
    git(repo, "checkout", "-q", "main")
    commit_files(repo, {"docs/news.md": "main moves on\n"}, message="main moves on")
    git(repo, "checkout", "-q", "agent/1")
    git(repo, "merge", "-q", "--no-edit", "main")
    merge = git(repo, "rev-parse", "HEAD").strip()
    attach(repo, merge, "junk on a merge")
    result = check(repo)
    assert result.verdict.value == "pass", result.findings
    assert result.receipts_verified == 3  # the other run's are listed, covering nothing here
    shown = sorted(f.kind.value for f in result.ignored_notes)
    assert shown == ["malformed-receipt"] * 3 + ["result-mismatch"] * 2 + ["untrusted-key"], (
        result.ignored_notes
    )
    assert {f.commit for f in result.ignored_notes} == {commit, merge}
    assert result.to_json()["ignored_notes"][0]["commit"] == commit
    proc = gk("check", "--repo", str(repo), "--base", "main", "agent/1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "note lines ignored (6)" in proc.stdout, proc.stdout
    assert "6 note line(s) ignored" in proc.stderr, proc.stderr
    # A receipt the trusted key signed naming this very commit as its result, with another
    # tree, contradicts the one that covers it: a finding, not a line to ignore.
    attach(repo, commit, sign(make_receipt(repo, commit, base="main")))
    assert "base-mismatch" in kinds(check(repo)) or "result-mismatch" in kinds(check(repo))


def test_another_runs_receipt_accounts_for_nothing_it_does_not_cover(repo: Path) -> None:
    # A range of one merge that changes nothing, with another run's genuine receipt on it:
    # no receipt covers the range, so it blocks as having none.
    other = receipted_commit(repo, {"g.txt": "y\n"}, branch="agent/other")
    stray = git(repo, "notes", f"--ref={NOTES_REF}", "show", other).strip()
    main = git(repo, "rev-parse", "main").strip()
    commit_files(repo, {"docs/news.md": "main moves on\n"}, branch="main", start="main")
    tree = git(repo, "rev-parse", "main^{tree}").strip()
    merge = git(repo, "commit-tree", tree, "-p", "main", "-p", main, "-m", "merge").strip()
    git(repo, "branch", "-f", "agent/1", merge)
    attach(repo, merge, stray)
    assert "no-receipt" in kinds(check(repo))


def test_a_trusted_receipt_naming_a_commit_of_the_range_it_does_not_describe_blocks(
    repo: Path,
) -> None:
    # A two-commit run, each covered; a receipt the trusted key signed names the second as
    # its result, from another base: on either commit, it contradicts what covers them.
    first = receipted_commit(repo, {"a.txt": "1\n"})
    second = receipted_commit(repo, {"b.txt": "2\n"}, start=None)
    attach(repo, first, sign(make_receipt(repo, second, base="main")))
    found = kinds(check(repo))
    assert found & {"base-mismatch", "result-mismatch"}, found


def test_an_empty_branch_blocks(repo: Path) -> None:
    git(repo, "branch", "agent/1", "main")
    result = check(repo)
    assert kinds(result) == {"no-receipt"}
    assert result.receipts_verified == 0


def test_commits_without_receipts_block(repo: Path) -> None:
    commit_files(repo, {"f.txt": "x\n"}, branch="agent/1", start="main")
    result = check(repo)
    assert kinds(result) == {"no-receipt", "uncovered-commit", "unclaimed-change"}


def test_an_internal_error_blocks_and_says_so(repo: Path) -> None:
    commit = receipted_commit(repo, {"deep/dir/f.txt": "x\n"})
    tree = git(repo, "rev-parse", f"{commit}:deep").strip()
    os.unlink(repo / ".git" / "objects" / tree[:2] / tree[2:])
    result = check(repo)
    assert result.verdict.value == "block"
    assert "internal-error" in kinds(result)
    assert "the gate could not finish" in result.findings[-1].message


def test_unrelated_histories_are_judged_whole(repo: Path, tmp_path: Path) -> None:
    git(repo, "checkout", "-q", "--orphan", "agent/1")
    git(repo, "commit", "-q", "-m", "orphan")
    result = check(repo)
    assert result.merge_base is None
    assert {"no-receipt", "uncovered-commit"} <= kinds(result)


@needs_bwrap
@pytest.mark.sandbox
def test_a_real_run_passes_check_and_edits_after_it_do_not(repo: Path) -> None:
    proc = gk(
        "run",
        "--repo",
        str(repo),
        "--json",
        "--",
        "sh",
        "-c",
        "echo new > 'with space.txt' && chmod +x src/app.py && ln -s README.md link",
    )
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)
    branch, worktree = run["branch"], Path(run["worktree"])
    checked = gk("check", "--repo", str(repo), "--base", "main", "--format", "json", branch)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["receipts_verified"] == 1

    # A human edits in the run's worktree afterwards and commits on the agent branch.
    (worktree / "with space.txt").write_text("changed by hand\n")
    git(worktree, "commit", "-q", "-am", "hand edit")
    checked = gk("check", "--repo", str(repo), "--base", "main", "--format", "json", branch)
    assert checked.returncode == 1
    data = json.loads(checked.stdout)
    assert {f["kind"] for f in data["findings"]} == {"uncovered-commit", "change-differs"}
