"""`run` and `check` in their plain forms are read without the command line's parser: what
they read is what the command line would have passed."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

import gatekeeper.commands.run as run_command
from gatekeeper.cli import app
from gatekeeper.commands.plain import run_arguments


def _via_command_line(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(run_command, "run", lambda **kwargs: seen.update(kwargs) or 0)
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 0, result.output
    return seen


@pytest.mark.parametrize(
    "args",
    [
        ["--", "true"],
        ["--repo", "r", "--json", "--", "sh", "-c", "echo --json"],
        ["--json", "--timeout", "30", "--base", "main~1", "--branch", "b", "--", "x", "--"],
        ["--policy", "p.yaml", "--repo", "/tmp/x y", "--", "--help"],
        ["--timeout", "007", "--", "a"],
    ],
)
def test_a_plain_run_reads_as_the_command_line_does(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    assert run_arguments(args, {}) == _via_command_line(monkeypatch, args)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--"],
        ["true"],  # (no `--`)
        ["--json", "--json", "--", "x"],
        ["--repo=r", "--", "x"],
        ["--repo", "", "--", "x"],
        ["--repo", "-r", "--", "x"],
        ["--timeout", "-1", "--", "x"],
        ["--timeout", "1.5", "--", "x"],
        ["--timeout", "²", "--", "x"],
        ["--check", "make test", "--", "x"],
        ["--grant", "write=a", "--", "x"],
        ["--help"],
        ["--repo", "r\0", "--", "x"],
        ["--", "x\0y"],
    ],
)
def test_anything_else_is_left_to_the_command_line(args: list[str]) -> None:
    assert run_arguments(args, {}) is None


def test_shell_completion_is_left_to_the_command_line() -> None:
    assert run_arguments(["--", "x"], {"_GATEKEEPER_COMPLETE": "bash_complete"}) is None


def test_a_plain_run_loads_no_profile_models_nor_registry_parsers() -> None:
    """What a plain run does not use is not loaded at its start: the agent profiles' models,
    the package managers' configuration parsers, the gate's finding kinds."""
    unused = ("gatekeeper.policy.profile", "gatekeeper.sandbox.net.registries",
              "gatekeeper.sandbox.net.installed", "gatekeeper.gate.shown", "xml.etree.ElementTree",
              "tomllib", "configparser")  # fmt: skip
    code = (
        "import sys, gatekeeper.commands.run\n"
        f"print([name for name in {unused!r} if name in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
