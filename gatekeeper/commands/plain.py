"""Command lines in their plain forms, read without the command line's parser.

typer and the pydantic type adapter it builds for each parameter cost tens of milliseconds
before a command starts; `check` and `run`, run over and over by hooks and agents, read
their usual forms here instead. A plain form: each option at most once, as `--opt VALUE`
(no value empty or starting with `-`), flags as themselves. Anything else (`--help`,
`--opt=VALUE`, a repeated option, shell completion) returns None and is left to the command
line, with its own help and errors.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn


def plain_options(
    argv: list[str],
    environ: Mapping[str, str],
    options: Mapping[str, str],
    flags: Mapping[str, str] = {},  # noqa: B006 (read only)
    *,
    command: bool = False,
) -> tuple[dict[str, str | bool], list[str]] | None:
    """(the keyword each option and flag sets: its value, or True; the other words) of argv,
    or None when it is not in the plain form. command: the other words are the command after
    `--` (at least one), and none may come before it."""
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in environ):
        return None
    found: dict[str, str | bool] = {}
    words: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if "\0" in arg:
            return None
        if command and arg == "--":
            words = argv[i + 1 :]
            return (found, words) if words and all("\0" not in w for w in words) else None
        if not arg or (command and not arg.startswith("-")):
            return None
        if not arg.startswith("-"):
            words.append(arg)
            i += 1
            continue
        if arg in flags and flags[arg] not in found:
            found[flags[arg]] = True
            i += 1
            continue
        key = options.get(arg)
        if key is None or key in found or i + 1 == len(argv):
            return None
        value = argv[i + 1]
        if not value or value.startswith("-") or "\0" in value:
            return None
        found[key] = value
        i += 2
    return None if command else (found, words)


# run's options and flags in the plain form, each with the keyword argument it sets.
_RUN_OPTIONS = {"--repo": "repo", "--policy": "policy_file", "--base": "base",
                "--branch": "branch", "--timeout": "timeout"}  # fmt: skip
_RUN_FLAGS = {"--json": "json_out"}


def run_arguments(argv: list[str], environ: Mapping[str, str]) -> dict[str, object] | None:
    """run's keyword arguments (commands.run.run's) from argv (what follows `run`) in the
    plain form, its command after `--`; None for anything else (--check, --grant, --profile,
    --ask, --resume: the command line reads those)."""
    plain = plain_options(argv, environ, _RUN_OPTIONS, _RUN_FLAGS, command=True)
    if plain is None:
        return None
    found, cmd = plain
    timeout = found.get("timeout")
    if isinstance(timeout, str) and not (timeout.isascii() and timeout.isdigit()):
        return None
    policy = found.get("policy_file")
    return {
        "repo": Path(str(found.get("repo", "."))),
        "policy_file": Path(policy) if isinstance(policy, str) else None,
        "base": found.get("base", "HEAD"),
        "branch": found.get("branch"),
        "argv": cmd,
        "checks": [],
        "grants": [],
        "ask": "never",
        "timeout": int(timeout) if isinstance(timeout, str) else None,
        "json_out": found.get("json_out", False),
        "profile": None,
        "resume": None,
    }


class _PacifiedStream:
    """A stream whose flush says nothing of a closed pipe (nobody is left to read it)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def pacify_closed_pipe() -> None:
    """stdout and stderr flushed quietly from now on: after a reader closed the pipe, the
    interpreter's last flush would otherwise print a traceback (as the command line does)."""
    sys.stdout = _PacifiedStream(sys.stdout)
    sys.stderr = _PacifiedStream(sys.stderr)


def end_process(code: int) -> NoReturn:
    """End the process with code now, its output flushed: without the interpreter's own end,
    which frees every object still alive one by one (a large receipt's hundreds of
    thousands, tens of milliseconds) and has nothing else to do after a check or a run."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass  # nobody is left to read it
    os._exit(code)
