"""`gatekeeper check` reads its plain arguments without the command line's type adapters:
the values, the report, the exit code and the messages are the ones the command line gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from fixtures.gate_receipts import attach, commit_files, make_receipt, sign

from gatekeeper.cli import app
from gatekeeper.commands.check import plain_arguments

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
