"""The gate's short cuts for large changes decide exactly as the long way does.

Each short cut (the receipts' records standing for the range's diff, compare() skipped where
the claims are the diff's own records, the policy asked once per path, the receipt pool's
indexes built when first asked, the trust file read once, range commits never asked of git
whether they are in the target) is held to the same answer as the work it spares, on real
repositories and genuine signed receipts.
"""

from __future__ import annotations

import gc
import importlib
import json
import time
from collections import OrderedDict, namedtuple
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures.gate_receipts import attach, commit_files, git_dir_of, make_receipt, sign
from pydantic import TypeAdapter

import gatekeeper.git
import gatekeeper.proc
from gatekeeper.commands.check import check, collector_paused
from gatekeeper.commands.check_early import at_once
from gatekeeper.errors import GitError
from gatekeeper.gate import GateResult, Kind, diffread, judge
from gatekeeper.gate import rewrites as rewrites_module
from gatekeeper.gate.history import range_changes
from gatekeeper.gate.notes import NoteLine, local_sources, read_ahead, read_notes
from gatekeeper.gate.policy_check import check_paths, path_findings
from gatekeeper.gate.rewrites import ReceiptPool
from gatekeeper.gate.verified import verify_note
from gatekeeper.policy.model import TRUST_PATH, builtin_policy, load_policy_at
from gatekeeper.policy.patterns import fold_path, is_write_allowed
from gatekeeper.receipt.changes import Change, changes_between
from gatekeeper.receipt.keys import load_key
from gatekeeper.report.json import pretty_json

from conftest import git

EDITS = {"src/new.py": "x = 1\n", "src/app.py": "print('bye')\n", "README.md": None}


def judged(repo: Path, head: str = "agent/1") -> GateResult:
    return judge(git_dir_of(repo), git(repo, "rev-parse", "main").strip(),
                 git(repo, "rev-parse", head).strip())  # fmt: skip


def kinds(result: GateResult) -> set[str]:
    return {f.kind.value for f in result.findings}


def test_the_range_diff_reuses_the_claims_only_when_they_are_git_own_records(repo: Path) -> None:
    edits = {"src/new.py": "x = 1\n", "src/app.py": "print('bye')\n"}
    commit = commit_files(repo, edits, branch="agent/1", start="main",
                          renames={"README.md": "docs/README.md"})  # fmt: skip
    git_dir, base = git_dir_of(repo), git(repo, "rev-parse", "main").strip()
    real = changes_between(git_dir, base, commit)
    assert any(c.status == "R" for c in real)

    same = range_changes(git_dir, base, commit, list(real))
    assert same == real and all(a is b for a, b in zip(same, real, strict=True))

    # One field changed in one record: git's records are validated afresh, the lie is not kept.
    lying = [replace(real[0], new_blob="0" * 40), *real[1:]]
    fresh = range_changes(git_dir, base, commit, lying)
    assert fresh == real and fresh[0] is not lying[0]
    # Records in another order, one missing, one extra: never the claims' objects.
    for claims in (real[::-1], real[:-1], [*real, real[0]]):
        out = range_changes(git_dir, base, commit, claims)
        assert out == real and not any(a is b for a, b in zip(out, real, strict=True))
    # The report writes each change's fields as a receipt holds them, in the same order.
    for changes in (real, lying):
        shown = GateResult(base, "main", commit, "agent/1", base, changes=changes).to_json()
        assert [list(c.items()) for c in shown["changes"]] == [
            list(c.items()) for c in TypeAdapter(list[Change]).dump_python(changes)
        ]


def test_a_receipt_whose_one_record_lies_still_blocks_and_its_own_records_pass(repo: Path) -> None:
    commit = commit_files(repo, EDITS, branch="agent/1", start="main")
    real = changes_between(git_dir_of(repo), git(repo, "rev-parse", "main").strip(), commit)
    lying = [*real[:-1], replace(real[-1], new_mode="100755")]
    attach(repo, commit, sign(make_receipt(repo, commit, changes=lying)))
    assert "change-differs" in kinds(judged(repo))

    commit_files(repo, {"src/other.py": "y = 2\n"}, branch="agent/2", start="main")
    second = git(repo, "rev-parse", "agent/2").strip()
    # The same records in another order: no short cut, and the long way finds nothing either.
    own = changes_between(git_dir_of(repo), git(repo, "rev-parse", "main").strip(), second)
    attach(repo, second, sign(make_receipt(repo, second, changes=own[::-1])))
    result = judged(repo, "agent/2")
    assert result.findings == [] and result.passed


def test_one_judgement_reads_the_trust_file_once_and_asks_git_nothing_of_range_commits(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = commit_files(repo, EDITS, branch="agent/1", start="main")
    attach(repo, commit, sign(make_receipt(repo, commit)))
    calls: list[tuple[str, ...]] = []
    real = gatekeeper.proc.cmd_output_b

    def spy(*argv: str, **kw: object) -> tuple[int, bytes, bytes]:
        calls.append(argv)
        return real(*argv, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(gatekeeper.git, "cmd_output_b", spy)
    # Diffs are read from a pipe, with a bound (gate.diffread), not through cmd_output_b.
    diffs: list[tuple[str, str]] = []
    real_diff = diffread.read_diff

    def diff_spy(git_dir: Path, base: str, result: str, *a: object, **kw: object) -> bytes:
        diffs.append((base, result))
        return real_diff(git_dir, base, result, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(diffread, "read_diff", diff_spy)
    monkeypatch.setattr(importlib.import_module("gatekeeper.gate.judgement"), "read_diff", diff_spy)
    result = judged(repo)
    assert result.passed, result.findings
    assert sum(1 for a in calls if any(x.endswith(f":{TRUST_PATH}") for x in a)) == 1
    assert not [a for a in calls if "--is-ancestor" in a]
    assert not [a for a in calls if "diff-tree" in a]
    assert len(diffs) == 1  # the range's diff is its commit's


def test_the_target_signatures_are_read_only_for_rewritten_commits_and_once(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The package's `judge` is the function; the module is reached by its full name.
    judge_module = importlib.import_module("gatekeeper.gate.judgement")
    counted: list[str] = []
    real = judge_module.target_signatures

    def spy(git_dir: Path, tip: str) -> set[frozenset[tuple[str, object, object]]]:
        counted.append(tip)
        return real(git_dir, tip)

    monkeypatch.setattr(judge_module, "target_signatures", spy)
    commit = commit_files(repo, EDITS, branch="agent/1", start="main")
    attach(repo, commit, sign(make_receipt(repo, commit)))
    assert judged(repo).passed and counted == []

    # Two commits that copy runs' changes under new ids (amended messages): each needs to know
    # whether its run landed on the target already; the target is read once for both.
    first = commit_files(repo, {"src/a.py": "a\n"}, branch="agent/2", start="main")
    attach(repo, first, sign(make_receipt(repo, first)))
    second = commit_files(repo, {"src/b.py": "b\n"}, message="second run")
    attach(repo, second, sign(make_receipt(repo, second)))
    git(repo, "checkout", "-q", "-B", "agent/3", "main")
    git(repo, "cherry-pick", "-x", first, second)  # -x: new messages, so new ids
    result = judged(repo, "agent/3")
    assert result.passed, result.findings
    assert len(counted) == 1


def test_the_receipt_pool_builds_an_index_only_when_asked(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = commit_files(repo, EDITS, branch="agent/1", start="main")
    statement = make_receipt(repo, commit)
    line = sign(statement).to_json()
    trusted = [load_key().public]
    receipt = verify_note(NoteLine(commit, line, "test"), trusted)
    later = commit_files(repo, {"src/c.py": "c\n"}, branch="agent/2", start="main")
    later_line = sign(make_receipt(repo, later)).to_json()
    asked: list[str] = []
    real = rewrites_module.index_keys

    def spy(kind: str, peek: rewrites_module.Peek) -> list[object]:
        asked.append(kind)
        return real(kind, peek)

    monkeypatch.setattr(rewrites_module, "index_keys", spy)
    pool = ReceiptPool(lambda note: verify_note(note, trusted) or None,  # type: ignore[arg-type]
                       lambda: [NoteLine(later, later_line, "test")])  # fmt: skip
    pool.add_verified(receipt)  # type: ignore[arg-type]
    assert asked == []
    s = statement
    found = pool.lookup("trees", (s.result_tree, s.predicate.base.tree))
    assert [r.line for r in found] == [line] and set(asked) == {"trees"}
    # The notes read later are in the index already built, and in those built afterwards.
    other = changes_between(git_dir_of(repo), git(repo, "rev-parse", "main").strip(), later)
    signature = rewrites_module.change_signature(other)
    assert [r.line for r in pool.lookup("changes", signature)] == [later_line]
    assert pool.count("trees", (s.result_tree, s.predicate.base.tree)) == 1
    with pytest.raises(KeyError):
        pool.lookup("no-such-index", None)


PATHS = [
    "src/app.py", "SRC/App.py", ".git/config", "src/.GIT/hooks/x", "src/.git./x", "a /.git/b",
    ".github/workflows/ci.yml", ".GitHub/workflows/ci.yml", ".vscode/tasks.json",
    ".VSCODE./tasks.json", "docs/..", "docs/./x", "a./b", "a /b", "x.", "x ", "..", ".",
    "é/.gIt/x", ".vs\u200ccode/settings.json", "Jenkinsfile", "lib/ok.txt", ".gatekeeper/policy.yaml",
]  # fmt: skip


def test_folding_and_the_policy_short_cut_decide_as_the_long_way(repo: Path) -> None:
    for path in PATHS:
        slow = "/".join(p.rstrip(". ") or p for p in path.lower().split("/"))
        if path.isascii():
            assert fold_path(path) == slow, path
    policy = builtin_policy("default")
    narrow = load_policy_at(git_dir_of(repo), "main")
    assert narrow is not None
    for loaded in (policy, narrow):
        paths = loaded.policy.paths
        for path in PATHS:
            allowed = is_write_allowed(paths.write, paths.protected_patterns, path)
            assert allowed == (path_findings(loaded, path, None) == []), path
        changes = changes_between(git_dir_of(repo), "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
                                  "main")  # fmt: skip
        assert check_paths(loaded, changes) == [
            f for c in changes for p in c.paths for f in path_findings(loaded, p, None)
        ]


def test_plain_records_are_written_as_every_other_container() -> None:
    Pair = namedtuple("Pair", "a b")
    cases = [
        [{"a": 1, "b": "x"}, {"a": None, "b": True}],
        [{"a": 1}, {"nested": OrderedDict(k=1)}],  # a dict subclass is a container
        [{"a": Pair(1, 2)}],  # so is a tuple subclass
        [{"a": 1}, [1, 2]],
    ]
    for value in cases:
        text = pretty_json({"list": value})
        assert json.loads(text) == json.loads(json.dumps({"list": value}))
        lines = text.splitlines()
        assert lines[1] == '  "list": [' and lines[-2] == "  ]"
    assert pretty_json([{"a": 1, "b": "é"}, {"a": 2, "b": None}]) == (
        '[\n  {"a":1,"b":"\\u00e9"},\n  {"a":2,"b":null}\n]'
    )
    assert pretty_json([{"a": {"b": 1}}]) == '[\n  {\n    "a": {"b":1}\n  }\n]'


def test_plain_records_are_written_one_a_line_whatever_their_strings_hold() -> None:
    """Plain records are written with one encoder call and split at the newlines it puts
    between items; strings that hold what a separator looks like do not move a line break."""
    tricky = ["}\n{", "}, {", '"}, {"a": ', "\n", "\0", "}\0{", "é", "\udcff", "x}", "{y", "",
              "\x7f", "\\", '"', "\u2028", "a/b", "\x1f"]  # fmt: skip
    flat = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))
    plain = [{"path": "d/f.txt", "n": 2**70, "none": None, "flag": True}, {}, {"k": ""}]
    cases = [
        *([{"path": text, "n": i, "flag": i % 2 == 0}] for i, text in enumerate(tricky)),
        [
            {"path": text, "n": i, "none": None, "flag": i % 2 == 0, "score": 0.5}
            for i, text in enumerate(tricky)
        ]
        + [{}, {"}\n{": "k"}, {}],  # fmt: skip
        plain,  # written by pydantic's serializer
        [*plain, {"path": "\\"}],  # one string needs an escape: all as json writes them
        [*plain, {"n": 1.5}],  # a float: json's spelling
        [*plain, {"n": Kind.unapproved_write}],  # a str subclass: json's way
        [*plain, {1: "key"}],  # a key that is not a string: json turns it into one
    ]
    for records in cases:
        for depth in (0, 1):
            pad = "  " * (depth + 1)
            expected = "[\n" + ",\n".join(pad + flat.encode(r) for r in records) + "\n"
            assert pretty_json(records, depth) == expected + "  " * depth + "]", records
        text = pretty_json({"changes": records})
        assert json.loads(text) == json.loads(json.dumps({"changes": records}))
        assert len(text.splitlines()) == len(records) + 4
    # An int json refuses to write (past int's string limit) is refused, not written.
    with pytest.raises(ValueError):
        flat.encode({"n": 10**5000})
    with pytest.raises(ValueError):
        pretty_json([*plain, {"n": 10**5000}])


def test_check_puts_the_collector_back_as_it_found_it(repo: Path, tmp_path: Path) -> None:
    commit = commit_files(repo, EDITS, branch="agent/1", start="main")
    attach(repo, commit, sign(make_receipt(repo, commit)))
    assert gc.isenabled()
    out = tmp_path / "report.json"
    assert check(repo=repo, base="main", rev="agent/1", fmt="json", output=out) == 0
    assert gc.isenabled() and json.loads(out.read_text())["verdict"] == "pass"
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_names_resolved_at_once_fail_as_if_resolved_in_turn(repo: Path, tmp_path: Path) -> None:
    """check resolves the repository, the target and the revision at the same time; the error
    it reports is the one the first of them in that order raised, whichever failed first."""
    assert at_once(lambda: 1, lambda: "two", lambda: None) == [1, "two", None]

    def late() -> None:
        time.sleep(0.2)
        raise LookupError("first in order")

    def early() -> None:
        raise KeyError("first in time")

    with pytest.raises(LookupError, match="first in order"):
        at_once(lambda: 1, late, early)
    with pytest.raises(GitError, match="not inside a git repository"):
        check(repo=tmp_path, base="no-such-base", rev="no-such-rev", fmt="json", output=None)
    with pytest.raises(GitError, match="no-such-base"):
        check(repo=repo, base="no-such-base", rev="no-such-rev", fmt="json", output=None)
    with pytest.raises(GitError, match="no-such-rev"):
        check(repo=repo, base="main", rev="no-such-rev", fmt="json", output=None)


def test_notes_read_ahead_are_the_notes_read_in_turn(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notes on head are read while the range is found; what the gate reads is the same,
    blob for blob, and head's note is read from git once."""
    first = commit_files(repo, {"src/a.py": "a = 1\n"}, branch="agent/1", start="main")
    attach(repo, first, sign(make_receipt(repo, first)))
    head = commit_files(repo, {"src/b.py": "b = 2\n"}, branch="agent/1")
    attach(repo, head, sign(make_receipt(repo, head, base=first)))
    attach(repo, head, "  not an envelope  ")
    git_dir = git_dir_of(repo)
    sources = local_sources(git_dir)
    wanted = {first, head}
    in_turn = read_notes(git_dir, sources, wanted=wanted)
    assert read_notes(git_dir, sources, wanted=wanted, ahead=read_ahead(git_dir, sources, head)) \
        == in_turn  # fmt: skip
    # Blobs read ahead for a commit that is not wanted add nothing.
    assert read_notes(git_dir, sources, wanted={first},
                      ahead=read_ahead(git_dir, sources, head)) == read_notes(
        git_dir, sources, wanted={first}
    )  # fmt: skip

    blob = git(repo, "rev-parse", f"refs/notes/gatekeeper:{head}").strip()
    asked: list[bytes] = []
    real = gatekeeper.proc.cmd_output_b

    def spy(*argv: str, **kw: object) -> tuple[int, bytes, bytes]:
        if "--batch" in argv:
            asked.append(kw["input"])  # type: ignore[arg-type]
        return real(*argv, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(gatekeeper.git, "cmd_output_b", spy)
    result = judged(repo)
    assert [f.kind.value for f in result.ignored_notes] == ["malformed-receipt"]  # the stray
    assert len(result.receipts) == 2
    assert sum(x.split().count(blob.encode()) for x in asked) == 1
