"""The command line: parses arguments and dispatches to gatekeeper.commands; no logic here."""

from __future__ import annotations

import gc
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from gatekeeper.commands import outcome

app = typer.Typer(
    name="gatekeeper",
    help="Sandboxed agent runs with signed receipts, and a pre-merge gate that checks them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
keys_app = typer.Typer(
    help="Manage the Ed25519 signing key (kept outside any repository).", no_args_is_help=True
)
receipt_app = typer.Typer(help="Read and verify receipts.", no_args_is_help=True)
hooks_app = typer.Typer(help="Install the git hooks that run the gate.", no_args_is_help=True)
trust_app = typer.Typer(
    help="The trust file: keys that sign receipts, approve escalations, or sign as people.",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys")
app.add_typer(receipt_app, name="receipt")
app.add_typer(hooks_app, name="hooks")
app.add_typer(trust_app, name="trust")

RepoOpt = Annotated[Path, typer.Option("--repo", help="The repository (default: current folder).")]


class Format(str, Enum):
    text = "text"
    json = "json"
    md = "md"
    html = "html"
    sarif = "sarif"


class AskMode(str, Enum):
    never = "never"
    tty = "tty"


def _run(fn, /, **kwargs) -> None:  # type: ignore[no-untyped-def]
    """Call a command function and exit with its code; errors print their diagnostics."""
    raise typer.Exit(outcome(fn, **kwargs))


@app.command()
def init(
    repo: RepoOpt = Path("."),
    policy: Annotated[str, typer.Option(help="Built-in policy to start from.")] = "default",
    no_hooks: Annotated[
        bool, typer.Option("--no-hooks", help="Do not install local hooks.")
    ] = False,
) -> None:
    """Write a default policy and trust file, configure notes refspecs, install local hooks."""
    from gatekeeper.commands.init import init as cmd

    _run(cmd, repo=repo, policy_name=policy, install_hooks=not no_hooks)


@keys_app.command("generate")
def keys_generate(
    force: Annotated[bool, typer.Option(help="Replace an existing key.")] = False,
) -> None:
    """Create the signing key (mode 0600) and print its public line for a trust file."""
    from gatekeeper.commands.keys import generate

    _run(generate, force=force)


@keys_app.command("show")
def keys_show() -> None:
    """Print the public key line that goes into a repository's trust file."""
    from gatekeeper.commands.keys import show

    _run(show)


@trust_app.command("add")
def trust_add(
    line: Annotated[
        str | None,
        typer.Argument(help="A key line or a .pub file (default: your own signing key)."),
    ] = None,
    approver: Annotated[
        bool, typer.Option("--approver", help="Trust the key to approve escalations.")
    ] = False,
    person: Annotated[
        bool, typer.Option("--person", help="Trust a person's SSH or OpenPGP commit key.")
    ] = False,
    repo: RepoOpt = Path("."),
) -> None:
    """Add a key to .gatekeeper/trusted_keys in the working tree (commit it on the target)."""
    from gatekeeper.commands.trust import add

    _run(add, repo=repo, line=line, approver=approver, person=person)


@trust_app.command("list")
def trust_list(
    repo: RepoOpt = Path("."),
    at: Annotated[
        str | None, typer.Option(help="Read the file committed at this revision.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """List the trust file's keys with their roles."""
    from gatekeeper.commands.trust import listing

    _run(listing, repo=repo, at=at, json_out=json_out)


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    cmd: Annotated[
        list[str] | None,
        typer.Argument(help="The agent command, after `--` (with --resume: default RUN's)."),
    ] = None,
    repo: RepoOpt = Path("."),
    policy: Annotated[
        Path | None,
        typer.Option(help="Policy file (default: .gatekeeper/policy.yaml at the base)."),
    ] = None,
    base: Annotated[str, typer.Option(help="Revision the run starts from.")] = "HEAD",
    branch: Annotated[
        str | None, typer.Option(help="Agent branch (default agent/<run-id>).")
    ] = None,
    check: Annotated[
        list[str] | None,
        typer.Option("--check", help="A check command run after the agent (repeatable)."),
    ] = None,
    grant: Annotated[
        list[str] | None, typer.Option("--grant", help="Pre-approve KIND=VALUE for this run.")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(help="Agent profile: a shipped name (claude-code, codex, aider) or a file."),
    ] = None,
    ask: Annotated[AskMode, typer.Option(help="How `ask` rules are answered.")] = AskMode.never,
    timeout: Annotated[int | None, typer.Option(help="Wall-clock limit in seconds.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    resume: Annotated[
        str | None,
        typer.Option(
            help="Continue RUN (id, branch or commit) on its branch, with its "
            "approved escalations granted."
        ),
    ] = None,
) -> None:
    """Run CMD in a sandboxed worktree on a new branch, commit the result and sign a receipt."""
    from gatekeeper.commands.run import run as cmd_run

    _run(
        cmd_run, repo=repo, policy_file=policy, base=base, branch=branch, argv=cmd or [],
        checks=check or [], grants=grant or [], ask=ask.value, timeout=timeout, json_out=json_out,
        profile=profile, resume=resume,
    )  # fmt: skip


@app.command()
def escalations(
    run_ref: Annotated[str, typer.Argument(metavar="RUN", help="Run id, branch or commit.")],
    repo: RepoOpt = Path("."),
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """A run's escalations, the decision in force on each and who signed it."""
    from gatekeeper.commands.approvals import escalations as cmd

    _run(cmd, repo=repo, run=run_ref, json_out=json_out)


SelectorArg = Annotated[
    list[str] | None,
    typer.Argument(help="Escalation ids or KIND=VALUE (default: every pending one)."),
]


@app.command()
def approve(
    run_ref: Annotated[str, typer.Argument(metavar="RUN", help="Run id, branch or commit.")],
    selectors: SelectorArg = None,
    repo: RepoOpt = Path("."),
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Sign an approval of a run's escalations and store it beside the run's receipt."""
    from gatekeeper.commands.approvals import decide

    _run(decide, repo=repo, run=run_ref, selectors=selectors or [], decision="approved",
         json_out=json_out)  # fmt: skip


@app.command()
def deny(
    run_ref: Annotated[str, typer.Argument(metavar="RUN", help="Run id, branch or commit.")],
    selectors: SelectorArg = None,
    repo: RepoOpt = Path("."),
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Sign a denial of a run's escalations and store it beside the run's receipt."""
    from gatekeeper.commands.approvals import decide

    _run(decide, repo=repo, run=run_ref, selectors=selectors or [], decision="denied",
         json_out=json_out)  # fmt: skip


@app.command()
def discard(
    run_id: Annotated[
        str | None, typer.Argument(help="Run id (default: every leftover run).")
    ] = None,
    repo: RepoOpt = Path("."),
    keep_branch: Annotated[bool, typer.Option(help="Keep the agent branch.")] = False,
) -> None:
    """Remove what unfinished runs left behind (a live run is never touched); with RUN_ID, that
    run's worktree and (unless --keep-branch) its branch."""
    from gatekeeper.commands.discard import discard as cmd

    _run(cmd, repo=repo, run_id=run_id, keep_branch=keep_branch)


@app.command()
def runs(
    repo: RepoOpt = Path("."),
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """Every run of the repository: id, branch, result commit, state, exit code, counts."""
    from gatekeeper.commands.runs import runs as cmd

    _run(cmd, repo=repo, json_out=json_out)


@app.command()
def stats(
    repo: RepoOpt = Path("."),
    since: Annotated[
        str | None, typer.Option(help="Only runs started on or after this date (UTC).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    html: Annotated[bool, typer.Option("--html", help="Write the HTML dashboard.")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here.")] = None,
) -> None:
    """The nine numbers across the repository's runs, by run and by day."""
    from gatekeeper.commands.stats import stats as cmd

    _run(cmd, repo=repo, since=since, json_out=json_out, html=html, output=output)


@app.command()
def check(
    rev: Annotated[str, typer.Argument(help="The revision under review.")] = "HEAD",
    repo: RepoOpt = Path("."),
    base: Annotated[
        str | None, typer.Option(help="Target branch (default: the default branch).")
    ] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Report format.")] = Format.text,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the report here.")
    ] = None,
) -> None:
    """Check REV against its receipts and the target branch's policy: exit 0 pass, 1 block."""
    # A check is short, and what its imports and receipts make lives until it exits: the
    # collector's passes over those tens of thousands of objects would free nothing.
    gc.disable()
    from gatekeeper.commands.check import check as cmd

    _run(cmd, repo=repo, base=base, rev=rev, fmt=fmt.value, output=output)  # (main freezes)


@receipt_app.command("show")
def receipt_show(
    rev: Annotated[str, typer.Argument(help="The commit whose receipt to show.")],
    repo: RepoOpt = Path("."),
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the verified statement as JSON.")
    ] = False,
    trust: Annotated[
        Path | None, typer.Option(help="Trust file (default: .gatekeeper/trusted_keys at HEAD).")
    ] = None,
) -> None:
    """Verify and print the receipt attached to REV."""
    from gatekeeper.commands.receipt import show

    _run(show, repo=repo, rev=rev, json_out=json_out, trust_file=trust)


@receipt_app.command("sync")
def receipt_sync(
    repo: RepoOpt = Path("."),
    remote: Annotated[str, typer.Option(help="The remote to exchange receipts with.")] = "origin",
) -> None:
    """Fetch the remote's receipts, merge them with yours and push them (retrying on races)."""
    from gatekeeper.commands.sync import sync

    _run(sync, repo=repo, remote=remote)


@hooks_app.command("install")
def hooks_install(
    repo: RepoOpt = Path("."),
    server: Annotated[
        Path | None, typer.Option(help="Install the pre-receive hook in this bare repository.")
    ] = None,
    protect: Annotated[
        list[str] | None, typer.Option("--protect", help="Protected ref (repeatable).")
    ] = None,
    allow_rewind: Annotated[
        list[str] | None,
        typer.Option("--allow-rewind", help="Protected ref (pattern) that may be force-pushed."),
    ] = None,
    no_protect_default: Annotated[
        bool, typer.Option(help="Do not protect the default branch when --protect names others.")
    ] = False,
) -> None:
    """Install pre-push and pre-merge-commit locally, or pre-receive on a server."""
    from gatekeeper.commands.hooks import install

    _run(install, repo=repo, server=server, protect=protect or [],
         allow_rewind=allow_rewind or [],
         protect_default=False if no_protect_default else None)  # fmt: skip


@hooks_app.command("pre-commit")
def hooks_pre_commit(
    every_branch: Annotated[
        bool,
        typer.Option(
            "--every-branch",
            help="Judge any pushed branch against the remote's default branch, not only "
            "protected ones.",
        ),
    ] = False,
) -> None:
    """The pre-push entry for the pre-commit framework (reads its PRE_COMMIT_* variables)."""
    from gatekeeper.commands.hooks import pre_commit

    _run(pre_commit, every_branch=every_branch)


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Folder for the demo repository and reports.")] = Path(
        "demo-out"
    ),
) -> None:
    """Walk through a sandboxed run, its receipt and the gate on a small built-in repository."""
    from gatekeeper.commands.demo import run_demo

    _run(run_demo, out=out)


@app.command()
def selftest(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Check that this machine can build the sandbox and every boundary holds (exit 0, else 1)."""
    from gatekeeper.commands.selftest import selftest as cmd

    _run(cmd, json_out=json_out)


def main() -> None:
    # (No pydantic plugin is loaded: gatekeeper/__init__.py turns them off for every use.)
    try:
        app()
    finally:
        # What is left lives until the process exits: frozen, it is spared the collector's
        # last passes at exit (tens of milliseconds after a run or a check of a large change).
        gc.freeze()
