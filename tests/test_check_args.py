"""`gatekeeper check` reads its plain arguments without the command line's type adapters:
the values, the report, the exit code and the messages are the ones the command line gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from fixtures.gate_receipts import attach, commit_files, make_receipt, sign

from gatekeeper.cli import app
from gatekeeper.commands.check_early import plain_arguments

from conftest import gk

PLAIN = [
    [],
    ["agent/1"],
    ["--repo", "r", "--base", "main", "--format", "json", "agent/1"],
    ["agent/1", "--format", "sarif", "-o", "out.sarif"],
    ["--output", "x/report.html", "--format", "html", "--base", "origin/main", "HEAD~1"],
    ["--base", "main", "a b", "--repo", "/tmp/some where"],
    ["--format", "text"],
    ["--format", "md", "--repo", "."],
]
OTHER = [
    ["--help"],
    ["-h"],
    ["--format=json"],
    ["--repo=r", "agent/1"],
    ["--format", "JSON"],
    ["--format", "xml"],
    ["--base", "main", "--base", "other"],
    ["-o", "a", "--output", "b"],
    ["one", "two"],
    ["--", "agent/1"],
    ["--base"],
    ["--base", ""],
    ["--base", "-x"],
    [""],
    ["-"],
    ["--unknown", "x"],
    ["-ofile"],
]


def parsed_by_command_line(argv: list[str]) -> dict[str, object]:
    command = typer.main.get_command(app).commands["check"]  # type: ignore[attr-defined]
    with command.make_context("check", list(argv)) as ctx:
        params = dict(ctx.params)
    params["fmt"] = params["fmt"].value
    return params


@pytest.mark.parametrize("argv", PLAIN)
def test_plain_arguments_are_the_ones_the_command_line_reads(argv: list[str]) -> None:
    plain = plain_arguments(argv, {})
    assert plain is not None
    assert plain == parsed_by_command_line(argv)


@pytest.mark.parametrize("argv", OTHER)
def test_every_other_form_is_left_to_the_command_line(argv: list[str]) -> None:
    assert plain_arguments(argv, {}) is None


def test_shell_completion_is_left_to_the_command_line() -> None:
    assert plain_arguments(["agent/1"], {"_GATEKEEPER_COMPLETE": "bash_complete"}) is None


def test_check_answers_alike_in_plain_and_other_forms(repo: Path, tmp_path: Path) -> None:
    """The same report bytes, exit code and messages whichever way the arguments are read
    (`--opt=VALUE` goes through the command line's own parsing)."""
    commit = commit_files(repo, {"src/new.py": "x = 1\n"}, branch="agent/1", start="main")
    attach(repo, commit, sign(make_receipt(repo, commit)))
    commit_files(repo, {"src/other.py": "y = 2\n"}, branch="agent/2", start="main")
    cases = [
        ("agent/1", "json", 0),
        ("agent/1", "text", 0),
        ("agent/2", "json", 1),
        ("agent/2", "md", 1),
        ("no-such-rev", "json", 2),
    ]
    for rev, fmt, code in cases:
        plain = gk("check", "--repo", str(repo), "--base", "main", "--format", fmt, rev)
        other = gk("check", f"--repo={repo}", "--base=main", f"--format={fmt}", rev)
        assert plain.returncode == other.returncode == code, (plain.stderr, other.stderr)
        assert (plain.stdout, plain.stderr) == (other.stdout, other.stderr)
    out = tmp_path / "report.sarif"
    plain = gk("check", "--repo", str(repo), "--base", "main", "--format", "sarif", "-o",
               str(out), "agent/2")  # fmt: skip
    first = out.read_bytes()
    other = gk(
        "check", f"--repo={repo}", "--base=main", "--format=sarif", f"--output={out}", "agent/2"
    )
    assert plain.returncode == other.returncode == 1
    assert plain.stderr == other.stderr and out.read_bytes() == first
    bad = gk("check", "--repo", str(repo), "--format", "JSON", "agent/1")
    assert bad.returncode == 2 and "JSON" in bad.stderr


def test_a_closed_pipe_ends_check_as_it_ends_the_command_line(repo: Path) -> None:
    commit = commit_files(repo, {"src/new.py": "x = 1\n"}, branch="agent/1", start="main")
    attach(repo, commit, sign(make_receipt(repo, commit)))
    results = []
    for args in (["--repo", str(repo), "--format", "json"], [f"--repo={repo}", "--format=json"]):
        read, write = os.pipe()
        os.close(read)  # nobody reads the report
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "gatekeeper", "check", *args, "--base", "main", "agent/1"],
                stdout=write, stderr=subprocess.PIPE, text=True, check=False, timeout=120,
            )  # fmt: skip
        finally:
            os.close(write)
        results.append((proc.returncode, proc.stderr))
    assert results[0] == results[1]
    assert results[0][0] == 1 and "Traceback" not in results[0][1]


def test_the_plain_forms_know_every_report_format() -> None:
    from gatekeeper.commands.check_early import FORMATS
    from gatekeeper.report import ReportFormat

    assert set(FORMATS) == {f.value for f in ReportFormat}


def test_what_a_plain_check_reads_first_loads_no_models() -> None:
    """The early reads of git start while the judgement loads: the module that starts them
    loads none of pydantic, the models, cryptography or yaml (else they would wait for it)."""
    code = (
        "import sys\n"
        "import gatekeeper.commands.check_early\n"
        "print(sorted(m for m in ('pydantic', 'cryptography', 'yaml', 'typer',\n"
        "  'gatekeeper.receipt.models', 'gatekeeper.policy.model') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_plain_check_judges_with_the_notes_it_read_early(repo: Path) -> None:
    """The notes on head read before the judgement loads are the ones it uses (one blob read
    of head's note, not two), and a failed early read only means they are read again."""
    from gatekeeper.commands import check_early
    from gatekeeper.commands.check import check

    commit = commit_files(repo, {"src/new.py": "x = 1\n"}, branch="agent/1", start="main")
    attach(repo, commit, sign(make_receipt(repo, commit)))
    reads: list[list[str]] = []
    real = check_early.read_ahead

    def counted(git_dir: Path, sources: list[tuple[str, str]], annotated: str) -> object:
        reads.append([annotated])
        return real(git_dir, sources, annotated)

    args = {"repo": repo, "base": "main", "rev": "agent/1", "fmt": "json", "output": None}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(check_early, "read_ahead", counted)
        early = check_early.start(repo, "main", "agent/1")
        assert early.head_notes()  # the receipt's blob, read
        assert check(**args, early=early) == 0
    assert reads == [[commit]]

    def failing() -> dict[str, tuple[bytes, int, int]]:
        return {}

    located = check_early.start(repo, "main", "agent/1").located
    assert check(**args, early=check_early.Early(located, failing)) == 0


def test_a_plain_check_judges_the_range_it_found_early(repo: Path) -> None:
    """The merge-base and the range found before the judgement loads are the ones judged
    (found once), and judge the same as finding them in turn."""
    import importlib

    from gatekeeper.commands import check_early
    from gatekeeper.commands.check import check

    judgement = importlib.import_module("gatekeeper.gate.judgement")
    commit = commit_files(repo, {"src/new.py": "x = 1\n"}, branch="agent/1", start="main")
    attach(repo, commit, sign(make_receipt(repo, commit)))
    found: list[str] = []

    def spied(real: Any, where: str) -> Any:
        def spy(*args: Any) -> Any:
            found.append(where)
            return real(*args)

        return spy

    args = {"repo": repo, "base": "main", "rev": "agent/1", "fmt": "json", "output": None}
    with pytest.MonkeyPatch.context() as patch:
        for module, where in ((check_early, "early"), (judgement, "judge")):
            for name in ("merge_base", "range_commits"):
                patch.setattr(module, name, spied(getattr(module, name), f"{where} {name}"))
        assert check(**args, early=check_early.start(repo, "main", "agent/1")) == 0
        assert sorted(found) == ["early merge_base", "early range_commits"]
        found.clear()
        assert check(**args) == 0
        assert sorted(found) == ["judge merge_base", "judge range_commits"]


def test_a_plain_check_judges_with_the_target_files_and_notes_it_read_early(
    repo: Path,
) -> None:
    """The target's trust file and policy, the notes refs and the notes on the range are read
    once, before the judgement loads, and judged as reading them in turn judges them; a
    judgement of another rules commit reads its own."""
    import gatekeeper.git
    import gatekeeper.proc
    from gatekeeper.commands import check_early
    from gatekeeper.commands.check import check
    from gatekeeper.gate import judge

    commit = commit_files(repo, {"src/new.py": "x = 1\n"}, branch="agent/1", start="main")
    attach(repo, commit, sign(make_receipt(repo, commit)))
    asked: list[str] = []
    real = gatekeeper.proc.cmd_output_b

    def spy(*argv: str, **kw: Any) -> Any:
        asked.append(" ".join(a for a in argv if not a.startswith(("-c", "core.", "--git-dir"))))
        return real(*argv, **kw)

    args = {"repo": repo, "base": "main", "rev": "agent/1", "fmt": "json", "output": None}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gatekeeper.git, "cmd_output_b", spy)
        early = check_early.start(repo, "main", "agent/1")
        assert check(**args, early=early) == 0
        read_early = list(asked)
        asked.clear()
        assert check(**args) == 0
        in_turn = list(asked)

    def count(calls: list[str], what: str) -> int:
        return sum(what in call for call in calls)

    for what in (":.gatekeeper/trusted_keys", ":.gatekeeper/policy.yaml", "refs/notes/",
                 "--is-shallow-repository"):  # fmt: skip
        assert count(read_early, what) == count(in_turn, what) == 1, what
    # The note lookups: head's for the notes read ahead, then the range's; read early, the
    # range is head alone, and its note blob is read from git once either way.
    assert count(read_early, "--batch-check=%(objectname) %(objecttype)") == 2
    blobs_read = [sum(c.endswith("cat-file --batch") for c in cs) for cs in (read_early, in_turn)]
    assert blobs_read == [1, 1]

    paths, (_, target), head = early.located()
    reads = early.reads  # read at target
    assert reads is not None and reads.at() == (paths.git_dir, target)
    # Rules from a commit whose policy no longer lets the run write where it did.
    policy = "version: 1\npaths:\n  write: [docs]\n"
    other = commit_files(repo, {".gatekeeper/policy.yaml": policy}, branch="main")
    with_reads = judge(paths.git_dir, target, head, rules=other, reads=reads)
    without = judge(paths.git_dir, target, head, rules=other)
    assert [f.to_json() for f in with_reads.findings] == [f.to_json() for f in without.findings]
    assert "unapproved-write" in with_reads.kinds()


def test_check_through_a_link_swapped_midway_reads_one_repository(tmp_path: Path) -> None:
    """`check --repo LINK` finds the repository, the target and head at once, on threads; the
    link is resolved before they start, so a link swapped to another clone between those
    reads cannot give one clone's head with the other's objects and receipts."""
    import threading

    from gatekeeper.commands import check_early

    first, second = tmp_path / "first", tmp_path / "second"
    for repo, text in ((first, "one\n"), (second, "two\n")):
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
        (repo / "f").write_text(text)
        subprocess.run(["git", "-C", str(repo), "add", "f"], check=True)
        subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b",
             "commit", "-q", "-m", text],
            check=True,
        )  # fmt: skip
    link = tmp_path / "link"
    link.symlink_to(first)
    resolved = threading.Semaphore(0)
    real_resolve, real_discover = check_early.resolve, check_early.discover

    def resolve(repo: Path, rev: str) -> str:
        try:
            return real_resolve(repo, rev)
        finally:
            resolved.release()

    def discover(repo: Path) -> Any:
        # Both names resolved in one clone; then the link moves to the other.
        resolved.acquire()
        resolved.acquire()
        link.unlink()
        link.symlink_to(second)
        return real_discover(repo)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(check_early, "resolve", resolve)
        patch.setattr(check_early, "discover", discover)
        paths, (_, target), head = check_early.locate(link, "main", "HEAD")
    assert paths.git_dir.resolve() == (first / ".git").resolve()
    shown = subprocess.run(["git", "--git-dir", str(paths.git_dir), "cat-file", "-e", head])
    assert shown.returncode == 0 and target == head


@pytest.mark.parametrize("entry", ["plain", "typer"])
def test_a_partial_clone_is_judged_without_fetching(tmp_path: Path, key: Path, entry: str) -> None:
    """In a partial clone, git fetched the objects the gate read from the promisor remote: it
    ran the program the repository's config names for it (`remote.origin.uploadpack`) and
    waited on it with no bound. Now nothing is fetched while judging, and the check blocks,
    saying why."""
    from conftest import git, make_repo

    lines = "".join(f"line {i}\n" for i in range(40))
    source = make_repo(tmp_path / "source", files={f"src/f{i}.py": lines for i in range(3)})
    commit_files(source, {f"src/f{i}.py": None for i in range(3)}
                 | {f"src/g{i}.py": lines + "edit\n" for i in range(3)}, branch="feature")  # fmt: skip
    git(source, "checkout", "-q", "main")
    git(source, "config", "uploadpack.allowFilter", "true")
    clone = tmp_path / "partial"
    git(tmp_path, "clone", "-q", "--no-local", "--filter=blob:none", "--no-checkout",
        f"file://{source}", str(clone))  # fmt: skip
    git(clone, "branch", "-q", "feature", "origin/feature")
    spy = tmp_path / "spy.sh"
    spy.write_text(f"#!/bin/sh\necho ran >> {tmp_path}/spy.log\nsleep 60\n")
    spy.chmod(0o755)
    git(clone, "config", "remote.origin.uploadpack", str(spy))
    args = ["--repo", str(clone), "--base", "main", "feature"]
    proc = gk("check", *args) if entry == "plain" else gk("check", "--format", "text", *args)
    assert proc.returncode == 1, proc.stderr
    assert not (tmp_path / "spy.log").exists()
    assert "the repository is a partial clone" in proc.stdout + proc.stderr


def test_judging_offline_lasts_only_while_the_gate_judges() -> None:
    """The environment that keeps git from fetching is the gate's only: a command that
    fetches afterwards in the same process (`receipt sync`) still may."""
    from gatekeeper.git import clean_env, judging_offline

    assert "GIT_ALLOW_PROTOCOL" not in clean_env()
    with judging_offline():
        env = clean_env()
        assert env["GIT_ALLOW_PROTOCOL"] == "" and env["GIT_NO_LAZY_FETCH"] == "1"
    assert "GIT_ALLOW_PROTOCOL" not in clean_env() and "GIT_NO_LAZY_FETCH" not in clean_env()


def test_judging_offline_is_the_judging_threads_own() -> None:
    """Another thread of the process (a `receipt sync` beside a check, in a bot or a test)
    may fetch while one judges; work the judging thread starts (gate.later) may not."""
    import threading

    from gatekeeper.gate.later import later
    from gatekeeper.git import clean_env, judging_offline

    seen: list[dict[str, str]] = []
    inside, done = threading.Event(), threading.Event()

    def beside() -> None:
        inside.wait(10)
        seen.append(clean_env())
        done.set()

    thread = threading.Thread(target=beside)
    thread.start()
    with judging_offline():
        started = later(clean_env)
        inside.set()
        done.wait(10)
        assert started()["GIT_ALLOW_PROTOCOL"] == ""
    thread.join()
    assert "GIT_ALLOW_PROTOCOL" not in seen[0] and "GIT_NO_LAZY_FETCH" not in seen[0]
