"""`gatekeeper receipt show REV`: verify the receipts on a commit and print them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gatekeeper.errors import ReceiptError, VerificationError
from gatekeeper.gate.shown import visible
from gatekeeper.git import discover, rev_parse
from gatekeeper.receipt.approval import is_approval_line, verify_approval
from gatekeeper.receipt.keys import PublicKey
from gatekeeper.receipt.models import Statement
from gatekeeper.receipt.notes import note_envelopes
from gatekeeper.receipt.statement import verify_envelope
from gatekeeper.receipt.trust import read_trust_file, trust_file_at
from gatekeeper.text import short_command, times


def _render(statement: Statement, signer: PublicKey) -> str:
    p = statement.predicate
    lines = [
        f"receipt   verified, signed by {signer.comment or '(no comment)'} ({signer.keyid[:23]}…)",
        f"run       {p.run_id} on {p.branch}",
        f"result    {statement.result_commit} (tree {statement.result_tree[:12]})",
        f"base      {p.base.commit} (tree {p.base.tree[:12]})",
        f"policy    {p.policy.path} sha256:{p.policy.sha256[:16]}…",
        f"time      {p.started_at} .. {p.finished_at}",
        f"command   {short_command(p.command.argv)}  -> {p.command.ending(p.sandbox)}",
    ]
    for check in p.checks:
        lines.append(f"check     {short_command(check.argv)}  -> {check.ending(p.sandbox)}")
    c = p.counts
    lines.append(
        f"counts    files {c.files_touched}, denied writes {c.denied_writes}, escalations "
        f"{c.escalations}, commands {c.commands_run} ({c.failed_commands} failed), network "
        f"{c.network_requests}"
    )
    if p.processes_unlisted or p.writes_unlisted:
        lines.append(f"unlisted  {p.processes_unlisted} allowed processes that ended with exit "
                     f"code 0, {p.writes_unlisted} allowed writes (counted above)")  # fmt: skip
    for change in p.changes:
        shown = f"{change.old_path} -> {change.path}" if change.old_path else change.path
        lines.append(f"  {change.status} {change.old_mode}->{change.new_mode} {shown}")
    for write in p.writes:
        if write.decision != "allow":
            lines.append(f"  denied {write.op} {write.path}{times(write.count)}")
    for process in p.processes:
        if process.decision != "allow":
            lines.append(f"  denied command {short_command(process.argv, 80)}"
                         f"{times(process.count)}")  # fmt: skip
    for request in p.network:
        if request.decision != "allow":
            lines.append(f"  denied network {request.host}:{request.port} ({request.category})"
                         f"{times(request.count)}")  # fmt: skip
    for escalation in p.escalations:
        lines.append(f"  escalation {escalation.kind} `{escalation.value}`: {escalation.decision}")
    for path in p.secret_lookups:
        lines.append(f"  secret lookup {path}")
    # Paths, argv, hosts and names are the agent's or a note's: shown as escapes, a line each.
    return "\n".join(visible(line) for line in lines)


def show(*, repo: Path, rev: str, json_out: bool = False, trust_file: Path | None = None) -> int:
    """Exit 0 when every receipt on rev verifies, 1 when one does not or there is none."""
    paths = discover(repo)
    commit = rev_parse(paths.git_dir, rev)
    if trust_file is not None:
        trust = read_trust_file(trust_file)
    else:
        trust = trust_file_at(paths.git_dir, rev_parse(paths.git_dir, "HEAD"))
    trusted = trust.signers
    lines, problems = note_envelopes(paths.git_dir, commit)
    # Approvals share the note: shown as approvals, never read as (malformed) receipts.
    approvals = [line for _, line in lines if is_approval_line(line)]
    lines = [(ref, line) for ref, line in lines if not is_approval_line(line)]
    if not lines and not problems:
        print(f"error: no receipt on {commit[:12]} ({rev})", file=sys.stderr)
        print("hint: receipts live in refs/notes/gatekeeper; fetch them with `git fetch` "
              "after `gatekeeper init`", file=sys.stderr)  # fmt: skip
        return 1
    failures = len(problems)
    for ref, problem in problems:
        print(
            visible(f"MALFORMED receipt note on {commit[:12]} ({ref}): {problem}"), file=sys.stderr
        )
    shown = []
    for ref, line in lines:
        try:
            statement, signer = verify_envelope(line, trusted)
        except VerificationError as exc:
            failures += 1
            print(
                visible(f"INVALID receipt on {commit[:12]} ({ref}): {exc.message}"), file=sys.stderr
            )
            continue
        except ReceiptError as exc:
            failures += 1
            print(
                visible(f"MALFORMED receipt on {commit[:12]} ({ref}): {exc.message}"),
                file=sys.stderr,
            )
            continue
        if statement.result_commit != commit:
            # A rebase or an amend copies a note to the new commit (notes.rewriteRef, which
            # `gatekeeper init` sets): the receipt is genuine, and about the original. No
            # receipt of this very commit verifies, so the exit status says so.
            failures += 1
            print(visible(f"CARRIED receipt on {commit[:12]} ({ref}): the verified receipt of "
                          f"run {statement.predicate.run_id} describes commit "
                          f"{statement.result_commit[:12]}; a rebase or an amend copied it "
                          "here. `gatekeeper check` judges whether this commit is still that "
                          "run's work"), file=sys.stderr)  # fmt: skip
        shown.append((statement, signer))
    if json_out:
        print(json.dumps([
            {"verified": True, "signer": {"keyid": s.keyid, "comment": s.comment},
             "statement": st.model_dump(by_alias=True, mode="json")} for st, s in shown
        ], indent=2))  # fmt: skip
    else:
        print("\n\n".join(_render(st, s) for st, s in shown))
        for line in approvals:
            print(_render_approval(line, trust.approvers, commit))
    return 1 if failures else 0


def _render_approval(line: str, approvers: list[PublicKey], commit: str) -> str:
    """One approval beside the receipt: what it decides and who signed it, or why it does
    not count."""
    try:
        statement, signer = verify_approval(line, approvers)
    except ReceiptError as exc:
        return visible(f"approval  not honoured: {exc.message}")
    p = statement.predicate
    where = "" if statement.result_commit == commit else " (about another commit: ignored)"
    items = ", ".join(f"{e.kind} `{e.value}`" for e in p.escalations)
    return visible(f"approval  {p.decision} {items} of run {p.run_id} at {p.time}, signed by "
                   f"{signer.comment or signer.keyid}{where}")  # fmt: skip
