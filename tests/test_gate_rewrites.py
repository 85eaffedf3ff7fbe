"""Coverage survives the usual rewrites, and content that is not the runs' own still blocks.

Each everyday rewrite is pushed for real to a bare repository with the server hook: a rebase
of a stack of runs onto a newer main (with and without notes following the rewrite), squashes
of two runs and of a whole stack, a message-only amend, a rebase of runs whose agent committed
inside the sandbox (with and without the launcher's empty commit), and a merge of main into
the branch; each also with one extra line changed, which blocks. The attacks on combining
receipts are judged directly (no push needed): runs that do not chain, a receipt used twice,
runs started outside the target, untrusted receipts, squashes that keep or lose a change.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
from fixtures.gate_receipts import attach, commit_files, git_dir_of, make_receipt, sign
from fixtures.stacks import (
    PUSH_NOTES,
    Server,
    add_line,
    agent_run,
    assert_block,
    assert_pass,
    head,
    run,
    squash,
    stack,
)

from gatekeeper.gate import GateResult, judge
from gatekeeper.receipt.keys import generate_key

from conftest import git, gk, needs_bwrap
from helpers import run_json

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path, key: Path) -> Server:
    served = Server(tmp_path)
    git(served.clone, "checkout", "-q", "-b", "feature")
    return served


def commits_after(repo: Path, base: str, tip: str = "HEAD") -> list[str]:
    return git(repo, "rev-list", "--reverse", "--topo-order", f"{base}..{tip}").split()


def amend_with_extra_line(repo: Path, commit: str, branch: str = "feature") -> None:
    """Change one line in commit (anywhere in the branch) and replay what follows it."""
    git(repo, "checkout", "-q", "--detach", commit)
    add_line(repo)
    git(repo, "commit", "-q", "-a", "--amend", "--no-edit")
    git(repo, "rebase", "-q", "--onto", head(repo), commit, branch)


# --- rebase of a stack --------------------------------------------------------------------------


@pytest.mark.parametrize("rewrite_notes", [True, False], ids=["notes-follow", "notes-stay"])
def test_a_stack_of_20_runs_rebased_onto_a_newer_main_passes(
    tmp_path: Path, key: Path, rewrite_notes: bool
) -> None:
    served = Server(tmp_path, rewrite_notes=rewrite_notes)
    git(served.clone, "checkout", "-q", "-b", "feature")
    originals = stack(served.clone, 20)
    served.advance_main({"docs/news.md": "main moves on\n"})
    git(served.clone, "rebase", "-q", "origin/main")
    rebased = commits_after(served.clone, "origin/main")
    assert len(rebased) == 20 and not set(rebased) & set(originals)
    proc = served.push_main()
    assert_pass(proc)
    assert "20 receipt(s) verified, 0 finding(s)" in proc.stderr


def test_a_rebased_stack_with_one_extra_line_blocks(server: Server) -> None:
    stack(server.clone, 20)
    server.advance_main({"docs/news.md": "main moves on\n"})
    git(server.clone, "rebase", "-q", "origin/main")
    amend_with_extra_line(server.clone, commits_after(server.clone, "origin/main")[9])
    before = server.server_rev("refs/heads/main")
    assert_block(server.push_main(), "uncovered-commit", "unclaimed-change")
    assert server.server_rev("refs/heads/main") == before


# --- squashes -----------------------------------------------------------------------------------


def test_a_squash_of_two_runs_passes(server: Server) -> None:
    start = head(server.clone)
    stack(server.clone, 2)
    squash(server.clone, start)
    proc = server.push_main()
    assert_pass(proc)
    assert "2 receipt(s) verified" in proc.stderr


def test_a_squash_of_two_runs_with_one_extra_line_blocks(server: Server) -> None:
    start = head(server.clone)
    stack(server.clone, 2)
    squash(server.clone, start)
    add_line(server.clone)
    git(server.clone, "commit", "-q", "-a", "--amend", "--no-edit")
    assert_block(server.push_main(), "uncovered-commit", "unclaimed-change")


def test_two_runs_squashed_inside_a_rebased_stack_pass(server: Server) -> None:
    stack(server.clone, 6)
    server.advance_main({"docs/news.md": "main moves on\n"})
    git(server.clone, "rebase", "-q", "origin/main")
    rebased = commits_after(server.clone, "origin/main")
    joined = git(
        server.clone, "commit-tree", f"{rebased[3]}^{{tree}}", "-p", rebased[1], "-m", "runs 3+4"
    ).strip()
    git(server.clone, "rebase", "-q", "--onto", joined, rebased[3], "feature")
    assert len(commits_after(server.clone, "origin/main")) == 5
    assert_pass(server.push_main())


@pytest.mark.parametrize("rebase_first", [False, True], ids=["same-base", "rebased"])
def test_the_whole_stack_squashed_passes(server: Server, rebase_first: bool) -> None:
    start = head(server.clone)
    stack(server.clone, 20)
    if rebase_first:
        server.advance_main({"docs/news.md": "main moves on\n"})
        git(server.clone, "rebase", "-q", "origin/main")
        start = head(server.clone, "origin/main")
    squash(server.clone, start)
    proc = server.push_main()
    assert_pass(proc)
    assert "20 receipt(s) verified, 0 finding(s)" in proc.stderr


def test_the_whole_stack_squashed_with_one_extra_line_blocks(server: Server) -> None:
    start = head(server.clone)
    stack(server.clone, 20)
    add_line(server.clone, "src/s_shared.txt")
    git(server.clone, "add", "src/s_shared.txt")
    squash(server.clone, start)
    assert_block(server.push_main(), "uncovered-commit", "unclaimed-change")


# --- message-only amend -------------------------------------------------------------------------

RUNS = {
    "launcher-only": lambda repo: run(repo, {"src/feature.py": "x = 1\n"}),
    "agent-committed": lambda repo: agent_run(
        repo, [{"src/a.py": "a\n"}, {"src/b.py": "b\n"}], {"src/c.py": "c\n"}
    ),
    "agent-committed-empty-launcher": lambda repo: agent_run(repo, [{"src/a.py": "a\n"}]),
}


@pytest.mark.parametrize("made_by", RUNS, ids=list(RUNS))
def test_a_message_only_amend_passes(server: Server, made_by: str) -> None:
    RUNS[made_by](server.clone)
    git(server.clone, "commit", "-q", "--amend", "--allow-empty", "-m", "a better message")
    assert_pass(server.push_main())


@pytest.mark.parametrize("made_by", RUNS, ids=list(RUNS))
def test_an_amend_with_one_extra_line_blocks(server: Server, made_by: str) -> None:
    RUNS[made_by](server.clone)
    add_line(server.clone)
    git(server.clone, "commit", "-q", "-a", "--amend", "-m", "a better message")
    assert_block(server.push_main(), "uncovered-commit", "unclaimed-change")


# --- rebase of runs whose agent committed inside the sandbox -------------------------------------


@pytest.mark.parametrize("keep_empty", [True, False], ids=["empty-kept", "empty-dropped"])
def test_a_rebased_stack_of_runs_whose_agent_committed_passes(
    server: Server, keep_empty: bool
) -> None:
    """One agent commit and the launcher's empty commit per run: no original needed."""
    for i in range(3):
        agent_run(server.clone, [{f"src/m{i}.py": f"m = {i}\n", "src/shared.txt": f"{i}\n"}])
    server.advance_main({"docs/news.md": "main moves on\n"})
    git(server.clone, "rebase", "-q", *([] if keep_empty else ["--no-keep-empty"]), "origin/main")
    assert len(commits_after(server.clone, "origin/main")) == (6 if keep_empty else 3)
    proc = server.push_main()
    assert_pass(proc)
    assert "3 receipt(s) verified, 0 finding(s)" in proc.stderr


@pytest.mark.parametrize("keep_empty", [True, False], ids=["empty-kept", "empty-dropped"])
def test_a_rebased_run_with_several_agent_commits_passes_beside_its_originals(
    server: Server, keep_empty: bool
) -> None:
    """Several agent commits: each rebased one must make exactly its original's changes, so
    the originals (the run's branch) must be on the server."""
    agent_run(server.clone, [{"src/a.py": "a\n"}, {"src/a.py": "a2\n", "src/b.py": "b\n"}])
    agent_run(server.clone, [{"src/c.py": "c\n"}, {"src/b.py": None}], {"src/d.py": "d\n"})
    assert_pass_or_unprotected(server.push("HEAD:refs/heads/agent/1", PUSH_NOTES))
    server.advance_main({"docs/news.md": "main moves on\n"})
    git(server.clone, "rebase", "-q", *([] if keep_empty else ["--no-keep-empty"]), "origin/main")
    assert len(commits_after(server.clone, "origin/main")) == (6 if keep_empty else 5)
    assert_pass(server.push_main())


def assert_pass_or_unprotected(proc) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode == 0, proc.stderr


def test_a_rebased_run_with_several_agent_commits_and_no_originals_blocks(server: Server) -> None:
    agent_run(server.clone, [{"src/a.py": "a\n"}, {"src/a.py": "a2\n", "src/b.py": "b\n"}])
    server.advance_main({"docs/news.md": "main moves on\n"})
    git(server.clone, "rebase", "-q", "origin/main")
    proc = server.push_main()
    assert_block(proc, "uncovered-commit")
    assert "the run's own commits (which the receipt names) are not in this repository" in (
        proc.stderr.replace("        \nremote: gatekeeper:", "")
    )
    # Squashing the run into one commit needs no original.
    squash(server.clone, head(server.clone, "origin/main"))
    assert_pass(server.push_main())


def test_a_rebased_agent_run_with_one_extra_line_blocks(server: Server) -> None:
    agent_run(server.clone, [{"src/a.py": "a\n"}])
    server.advance_main({"docs/news.md": "main moves on\n"})
    git(server.clone, "rebase", "-q", "origin/main")
    amend_with_extra_line(server.clone, commits_after(server.clone, "origin/main")[0])
    assert_block(server.push_main(), "uncovered-commit", "unclaimed-change")


# --- merge of main into the branch --------------------------------------------------------------


def test_merging_main_into_the_branch_passes(server: Server) -> None:
    run(server.clone, {"src/feature.py": "x = 1\n"})
    server.advance_main({"docs/news.md": "main moves on\n"})
    git(server.clone, "merge", "-q", "--no-edit", "origin/main")
    run(server.clone, {"src/feature.py": "x = 2\n"})
    assert_pass(server.push_main())


def test_a_merge_of_main_with_one_extra_line_blocks(server: Server) -> None:
    run(server.clone, {"src/feature.py": "x = 1\n"})
    server.advance_main({"docs/news.md": "main moves on\n"})
    git(server.clone, "merge", "-q", "--no-commit", "origin/main")
    add_line(server.clone)
    git(server.clone, "commit", "-q", "-a", "--no-edit")
    assert_block(server.push_main(), "unclaimed-change")


# --- attacks on combining receipts, judged directly ----------------------------------------------


def check(repo: Path, rev: str = "HEAD", base: str = "main") -> GateResult:
    return judge(git_dir_of(repo), head(repo, base), head(repo, rev))


def found(result: GateResult) -> set[str]:
    return {f.kind.value for f in result.findings}


def assert_clean(result: GateResult) -> None:
    assert [f"{f.kind.value}: {f.message}" for f in result.findings] == []
    assert result.passed


def test_runs_that_do_not_chain_cannot_be_squashed_together(repo: Path) -> None:
    """Two runs from the same base: the content is each run's own, but no run made both."""
    one = commit_files(repo, {"src/a.py": "a\n"}, branch="one", start="main")
    attach(repo, one, sign(make_receipt(repo, one)))
    two = commit_files(repo, {"src/b.py": "b\n"}, branch="two", start="main")
    attach(repo, two, sign(make_receipt(repo, two)))
    git(repo, "checkout", "-q", "-B", "both", "one")
    git(repo, "checkout", "-q", "two", "--", "src/b.py")
    squash(repo, "main")
    result = check(repo)
    assert "uncovered-commit" in found(result)


@pytest.mark.parametrize("copies", [1, 2], ids=["one-receipt", "re-signed-copy"])
def test_a_receipt_covers_one_block_only(repo: Path, copies: int) -> None:
    """Run 1 adds a file, run 2 deletes it; a hand commit that adds it again makes run 1's
    exact change, but run 1's receipt already covers its own commit (also when a second,
    differently signed receipt of the same run is around)."""
    git(repo, "checkout", "-q", "-b", "agent/1")
    first = run(repo, {"src/tool.py": "TOOL = 1\n"})
    if copies == 2:
        later = make_receipt(repo, first, mutate=lambda d: d["predicate"].update(
            finished_at="2024-01-01T00:00:09Z"))  # fmt: skip
        attach(repo, head(repo, "main"), sign(later))  # outside the range: found by content
    run(repo, {"src/tool.py": None})
    again = commit_files(repo, {"src/tool.py": "TOOL = 1\n"}, message="by hand")
    uncovered = {f.commit for f in check(repo).findings if f.kind.value == "uncovered-commit"}
    assert uncovered == {again}


def test_a_squash_of_runs_started_outside_the_target_blocks(repo: Path) -> None:
    side = commit_files(repo, {"side.txt": "by hand\n"}, branch="agent/1", start="main")
    run(repo, {"src/a.py": "a\n"})
    run(repo, {"src/a.py": "a2\n", "src/b.py": "b\n"})
    git(repo, "rebase", "-q", "--onto", "main", side)
    squash(repo, "main")
    assert "uncovered-commit" in found(check(repo))


def test_untrusted_receipts_on_the_originals_cover_nothing(repo: Path, tmp_path: Path) -> None:
    git(repo, "checkout", "-q", "-b", "agent/1")
    stranger = generate_key(tmp_path / "stranger" / "key.pem")
    for text in ("a\n", "b\n"):
        commit = commit_files(repo, {"src/a.py": text})
        attach(repo, commit, sign(make_receipt(repo, commit), stranger))
    commit_files(repo, {"docs/news.md": "news\n"}, branch="main", start="main")
    git(repo, "rebase", "-q", "main", "agent/1")
    assert "uncovered-commit" in found(check(repo))
    squash(repo, "main")
    assert "uncovered-commit" in found(check(repo))


def test_a_squash_composes_renames_edits_and_a_file_added_then_deleted(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "agent/1")
    run(repo, {"tmp/scratch.bin": bytes(range(256)), "src/app.py": "print('one')\n"})
    run(repo, renames={"src/app.py": "lib/app.py"}, files={"lib/app.py": "print('two')\n"})
    run(repo, {"tmp/scratch.bin": None}, renames={"lib/app.py": "pkg/main.py"})
    run(repo, {"pkg/main.py": "print('three')\n"}, chmod={"README.md": 0o755})
    squash(repo, "main")
    result = check(repo)
    assert_clean(result)
    assert result.receipts_verified == 4
    touched = sorted(p for c in result.changes for p in c.paths)
    assert touched == ["README.md", "pkg/main.py", "src/app.py"]


@pytest.mark.parametrize("keep", ["deleted-file", "half-of-run-2", "old-name"])
def test_a_squash_that_is_not_the_runs_changes_blocks(repo: Path, keep: str) -> None:
    git(repo, "checkout", "-q", "-b", "agent/1")
    run(repo, {"tmp/scratch.txt": "scratch\n", "src/app.py": "print('one')\n"})
    run(repo, {"tmp/scratch.txt": None, "src/b.py": "b\n"}, renames={"README.md": "DOC.md"})
    git(repo, "reset", "-q", "--soft", "main")
    if keep == "deleted-file":
        (repo / "tmp").mkdir()
        (repo / "tmp/scratch.txt").write_text("scratch\n")
        git(repo, "add", "tmp/scratch.txt")
    elif keep == "half-of-run-2":
        git(repo, "rm", "-q", "--cached", "src/b.py")
    else:
        git(repo, "checkout", "main", "--", "README.md")
    git(repo, "commit", "-q", "-m", "squash")
    result = check(repo)
    assert "uncovered-commit" in found(result)
    assert found(result) & {"unclaimed-change", "missing-change", "change-differs"}


def test_a_rebased_agent_commit_with_other_content_blocks_though_the_end_is_the_same(
    repo: Path,
) -> None:
    """The run's last state is reached, but a rebased agent commit held content the agent
    never made: every commit in history must be the runs' own."""
    git(repo, "checkout", "-q", "-b", "agent/1")
    agent, _ = agent_run(repo, [{"src/a.py": "v1\n"}, {"src/a.py": "v2\n"}])
    commit_files(repo, {"docs/news.md": "news\n"}, branch="main", start="main")
    git(repo, "rebase", "-q", "main", "agent/1")
    first, *rest = commits_after(repo, "main")
    git(repo, "checkout", "-q", "--detach", first)
    (repo / "src/a.py").write_text("import os; os.system('evil')\n")
    git(repo, "commit", "-q", "-a", "--amend", "--no-edit")
    tip = head(repo)
    for later in rest:  # the same trees as before on top: only the first commit differs
        tip = git(repo, "commit-tree", f"{later}^{{tree}}", "-p", tip, "-m", "same").strip()
    git(repo, "checkout", "-q", "-B", "agent/1", tip)
    result = check(repo)
    assert (repo / "src/a.py").read_text() == "v2\n"
    assert ("uncovered-commit", head(repo, "HEAD~2")) in {
        (f.kind.value, f.commit) for f in result.findings
    }
    assert agent  # the originals are here: the rebased ones are compared with them


def test_only_one_empty_commit_follows_a_rebased_agent_run(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "agent/1")
    agent_run(repo, [{"src/a.py": "a\n"}])
    commit_files(repo, {"docs/news.md": "news\n"}, branch="main", start="main")
    git(repo, "rebase", "-q", "main", "agent/1")
    assert_clean(check(repo))
    extra = commit_files(repo, message="an empty commit by hand")
    assert {(f.kind.value, f.commit) for f in check(repo).findings} == {("uncovered-commit", extra)}


def test_a_landed_runs_receipt_does_not_cover_its_change_again(repo: Path) -> None:
    """A run's work is on main already; a later revert (by a run) and a hand commit that makes
    the landed run's exact change again: the landed receipt is spent."""
    git(repo, "checkout", "-q", "-b", "work")
    run(repo, {"src/feature.py": "x = 1\n"})
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--ff-only", "work")
    git(repo, "checkout", "-q", "-b", "agent/1")
    run(repo, {"src/feature.py": None})
    again = commit_files(repo, {"src/feature.py": "x = 1\n"}, message="by hand")
    uncovered = {f.commit for f in check(repo).findings if f.kind.value == "uncovered-commit"}
    assert uncovered == {again}


def test_a_copy_of_a_landed_run_forked_before_it_landed_does_not_bring_it_back(
    repo: Path,
) -> None:
    """A run lands on main and is reverted there; a branch forked before it landed makes the
    run's exact change again (a cherry-pick of its commit onto the run's own base). The run
    has landed on the target, whatever the branch's fork point: its receipt covers nothing."""
    fork = head(repo, "main")
    git(repo, "checkout", "-q", "-b", "work")
    landed = run(repo, {"src/feature.py": "x = 1\n"})
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--ff-only", "work")
    git(repo, "revert", "--no-edit", "HEAD")
    # The run's commit made again by hand on its own base: the same trees, another id.
    again = commit_files(repo, {"src/feature.py": "x = 1\n"}, branch="copy", start=fork,
                         message="the run's change, again")  # fmt: skip
    assert again != landed
    assert head(repo, f"{again}^{{tree}}") == head(repo, f"{landed}^{{tree}}")
    uncovered = {
        f.commit for f in check(repo, "copy").findings if f.kind.value == "uncovered-commit"
    }
    assert uncovered == {again}
    # Before it landed, the same copy was the run's work, and covered.
    git(repo, "branch", "-q", "-f", "old-main", fork)
    assert_clean(check(repo, "copy", base="old-main"))


def test_unverified_notes_never_put_options_on_gits_command_line(
    repo: Path, tmp_path: Path
) -> None:
    """Notes are read (unverified) to index receipts; a forged one whose tree id is an option
    (`--output=FILE` would make git diff-tree write a file) must never reach git."""
    main = head(repo, "main")
    hand = commit_files(repo, {"src/app.py": "by hand\n"}, branch="agent/1", start="main")
    target = tmp_path / "written-by-git"
    change = {
        "status": "M", "path": "src/app.py", "old_path": None, "old_mode": "100644",
        "new_mode": "100644", "old_blob": "1" * 40, "new_blob": "2" * 40, "score": None,
    }  # fmt: skip
    payload = {
        "subject": [{"name": "x", "digest": {"gitCommit": "0" * 40, "gitTree": f"--output={target}"}}],
        "predicate": {"base": {"commit": main, "tree": head(repo, "main^{tree}")},
                      "changes": [change], "agent_commits": [hand]},
    }  # fmt: skip
    line = json.dumps(
        {
            "payloadType": "application/vnd.in-toto+json",
            "payload": base64.b64encode(json.dumps(payload).encode()).decode(),
            "signatures": [],
        }
    )
    attach(repo, main, line)
    result = check(repo, "agent/1")
    assert not result.passed
    assert not list(tmp_path.glob("written-by-git*"))


@needs_bwrap
@pytest.mark.sandbox
def test_real_runs_whose_agent_committed_pass_rebased_with_and_without_the_empty_commit(
    server: Server,
) -> None:
    """Two real sandboxed runs whose agent committed with git inside: the first leaves the
    launcher's commit empty, the second leaves a file for the launcher to commit."""
    clone = server.clone
    first_script = "echo a > src/a.py && git add src/a.py && git commit -qm 'agent: a'"
    proc, one = run_json(clone, "sh", "-c", first_script, extra=["--base", "feature"])
    assert proc.returncode == 0, proc.stderr
    second_script = (
        "echo b > src/b.py && git add src/b.py && git commit -qm 'agent: b' && "
        "echo b2 > src/b.py && git commit -qam 'agent: b2' && echo c > src/c.py"
    )
    proc, two = run_json(clone, "sh", "-c", second_script, extra=["--base", one["commit"]])
    assert proc.returncode == 0, proc.stderr
    assert len(one["agent_commits"]) == 1 and len(two["agent_commits"]) == 2
    assert head(clone, f"{one['commit']}^{{tree}}") == head(clone, f"{one['commit']}~1^{{tree}}")
    git(clone, "checkout", "-q", "-B", "feature", two["commit"])
    # The second run's agent commits are compared with their originals: push its branch.
    assert server.push(f"{two['commit']}:refs/heads/agent/two", PUSH_NOTES).returncode == 0
    server.advance_main({"docs/news.md": "main moves on\n"})
    tip = head(clone)
    for keep in ([], ["--no-keep-empty"]):
        git(clone, "checkout", "-q", "-B", "feature", tip)
        git(clone, "rebase", "-q", *keep, "origin/main")
        assert len(commits_after(clone, "origin/main")) == (4 if keep else 5)
        assert_clean(check(clone, "HEAD", "origin/main"))
    git(clone, "commit", "-q", "--amend", "-m", "a better message for the launcher's commit")
    assert_pass(server.push_main())


def test_init_makes_receipts_follow_rebase_amend_and_squash(repo: Path) -> None:
    """`gatekeeper init` (run by make_repo) sets notes.rewriteRef once, even when run again;
    git then carries receipts to the rewritten commits, a squash keeping every run's."""
    assert gk("init", "--repo", str(repo), "--no-hooks").returncode == 0
    assert git(repo, "config", "--get-all", "notes.rewriteRef").split() == ["refs/notes/gatekeeper"]
    assert git(repo, "config", "notes.rewriteMode").strip() == "cat_sort_uniq"
    git(repo, "checkout", "-q", "-b", "agent/1")
    first = run(repo, {"src/a.py": "a\n"})
    second = run(repo, {"src/b.py": "b\n"})
    notes = [git(repo, "notes", "--ref=gatekeeper", "show", c).strip() for c in (first, second)]
    env = {"GIT_SEQUENCE_EDITOR": "sed -i '2s/^pick/fixup/'"}
    proc = gk_git(repo, env, "rebase", "-q", "-i", "main")
    assert proc.returncode == 0, proc.stderr
    squashed = git(repo, "notes", "--ref=gatekeeper", "show", "HEAD").split()
    assert sorted(squashed) == sorted(notes)
    git(repo, "commit", "-q", "--amend", "-m", "both runs")
    assert sorted(git(repo, "notes", "--ref=gatekeeper", "show", "HEAD").split()) == sorted(notes)
    assert_clean(check(repo))


def gk_git(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    full.update(GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"], GIT_CONFIG_NOSYSTEM="1", **env)
    return subprocess.run(["git", *args], cwd=repo, env=full, capture_output=True, text=True)


def test_receipt_show_tells_a_receipt_a_rebase_carried_from_an_invalid_one(repo: Path) -> None:
    """notes.rewriteRef (set by `gatekeeper init`) copies a run's note to its rebased or
    amended commit: `receipt show` there says whose receipt it is and what it describes, not
    that it is invalid; no receipt of that very commit verifies, so it still exits 1."""
    from fixtures.gate_receipts import receipted_commit

    original = receipted_commit(repo, {"src/feature.py": "x = 1\n"})
    git(repo, "commit", "-q", "--amend", "-m", "a better message")
    amended = head(repo, "agent/1")
    assert git(repo, "notes", "--ref=refs/notes/gatekeeper", "list", amended).strip()
    shown = gk("receipt", "show", "--repo", str(repo), amended)
    assert shown.returncode == 1
    assert f"CARRIED receipt on {amended[:12]}" in shown.stderr, shown.stderr
    assert f"describes commit {original[:12]}" in shown.stderr
    assert "INVALID" not in shown.stderr
