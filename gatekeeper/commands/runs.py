"""`gatekeeper runs`: every run of the repository with its state, from run records and receipts."""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gatekeeper.commands.check_early import default_branch
from gatekeeper.errors import GitError, UsageError
from gatekeeper.gate.notes import blob_spans
from gatekeeper.gate.shown import visible
from gatekeeper.git import discover, git, is_ancestor
from gatekeeper.receipt.approval import is_approval_line
from gatekeeper.receipt.models import PREDICATE_TYPE
from gatekeeper.receipt.notes import MAX_NOTE_BYTES, NOTES_REF
from gatekeeper.run.records import RunRecord, all_records, settle

MAX_NOTES = 100_000  # notes read for the listing
MAX_NOTES_BYTES = 256 << 20  # and their bytes, in all


@dataclass
class RunRow:
    run_id: str
    branch: str
    commit: str | None
    state: str  # running | finished | accepted | killed | failed | discarded
    started_at: str | None
    finished_at: str | None
    exit_code: int | None
    counts: dict[str, int] | None
    reason: str | None = None

    def as_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _receipt_claims(git_dir: Path) -> dict[str, tuple[str, dict[str, object]]]:
    """run id -> (result commit, predicate) from the receipts in the notes (not verified here:
    the listing shows what receipts say; `receipt show` and `check` verify them)."""
    try:
        listing = git("notes", f"--ref={NOTES_REF}", "list", git_dir=git_dir).decode()
    except GitError:
        return {}
    pairs = [line.split(" ", 1) for line in listing.splitlines()[:MAX_NOTES] if " " in line]
    if not pairs:
        return {}
    # Sizes first: what is read is bounded (notes anyone may push), each note as the gate
    # bounds it and all of them together.
    sizes = git("cat-file", "--batch-check=%(objectsize)", git_dir=git_dir,
                input="".join(f"{blob}\n" for blob, _ in pairs).encode()).decode()  # fmt: skip
    chosen: list[tuple[str, str]] = []
    total = 0
    for (blob, commit), size in zip(pairs, sizes.splitlines(), strict=True):
        if not size.isdigit() or int(size) > MAX_NOTE_BYTES:
            continue  # missing, or a note the gate would not read either
        if total + int(size) > MAX_NOTES_BYTES:
            break
        total += int(size)
        chosen.append((blob, commit))
    out, spans = blob_spans(git_dir, [blob for blob, _ in chosen])  # (read in place)
    found: dict[str, tuple[str, dict[str, object]]] = {}
    for blob, commit in chosen:
        start, end = spans.get(blob, (0, 0))
        data = out[start:end]
        for envelope in data.decode("utf-8", "replace").splitlines():
            if is_approval_line(envelope):
                continue  # an approval beside the receipt, not a run of its own
            try:
                payload = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
                if payload["predicateType"] != PREDICATE_TYPE:
                    continue
                predicate = payload["predicate"]
                if _plausible(predicate):
                    found[str(predicate["run_id"])] = (commit, predicate)
            except (ValueError, KeyError, TypeError, RecursionError):  # notes anyone may push
                continue
    return found


def _plausible(predicate: object) -> bool:
    """Whether an unverified predicate has the shape the listing reads (anyone may push a
    note: a list where a field is expected must not break the listing)."""
    if not isinstance(predicate, dict) or not isinstance(predicate.get("run_id"), str):
        return False
    command, counts = predicate.get("command"), predicate.get("counts")
    shapes = (
        (command, dict),
        (counts, dict),
        (predicate.get("branch"), str),
        (predicate.get("started_at"), str),
        (predicate.get("finished_at"), str),
        ((command or {}).get("exit_code") if isinstance(command, dict) else None, int),
    )
    if isinstance(counts, dict) and not all(isinstance(v, int) for v in counts.values()):
        return False
    return all(value is None or isinstance(value, kind) for value, kind in shapes)


def _row(git_dir: Path, record: RunRecord | None, claim, default: str | None) -> RunRow:  # type: ignore[no-untyped-def]
    commit, predicate = claim if claim else (None, None)
    counts = predicate.get("counts") if predicate else None
    if record is None:
        assert predicate is not None
        state, reason = "finished", None
        row = RunRow(str(predicate["run_id"]), str(predicate.get("branch", "")), commit, state,
                     predicate.get("started_at"), predicate.get("finished_at"),
                     (predicate.get("command") or {}).get("exit_code"), counts)  # fmt: skip
    else:
        record = settle(git_dir, record)  # a launcher that is gone: killed, in its record
        state, reason = record.state, record.reason
        row = RunRow(record.run_id, record.branch, record.commit or commit, state,
                     _iso(record.started_at), _iso(record.finished_at), record.exit_code,
                     counts, reason)  # fmt: skip
    if row.state == "finished" and row.commit and default:
        try:
            if is_ancestor(git_dir, row.commit, default):
                row.state = "accepted"
        except GitError:
            pass
    return row


def _accepting_branch(repo: Path) -> str | None:
    """The branch a result must reach to count as accepted: the target `check` uses."""
    try:
        return default_branch(repo)
    except UsageError:
        return None


def list_runs(git_dir: Path, repo: Path) -> list[RunRow]:
    records = {r.run_id: r for r in all_records(git_dir)}
    claims = _receipt_claims(git_dir)
    default = _accepting_branch(repo)
    rows = [_row(git_dir, records.get(rid), claims.get(rid), default)
            for rid in sorted(set(records) | set(claims))]  # fmt: skip
    return sorted(rows, key=lambda r: (r.started_at or "", r.run_id))


def runs(*, repo: Path, json_out: bool = False) -> int:
    paths = discover(repo)
    rows = list_runs(paths.git_dir, repo)
    if json_out:
        print(json.dumps([r.as_json() for r in rows], indent=2))
        return 0
    if not rows:
        print("no runs in this repository", file=sys.stderr)
        return 0
    print(f"{'RUN':<26} {'STATE':<10} {'EXIT':>4}  {'FILES':>5}  {'COMMIT':<12}  BRANCH")
    for r in rows:
        files = (r.counts or {}).get("files_touched")
        note = f"  ({r.reason})" if r.reason and r.state in ("killed", "failed") else ""
        # (a run's id, branch and reason may come from a note anyone may push: escaped)
        print(visible(f"{r.run_id:<26} {r.state:<10} "
                      f"{'' if r.exit_code is None else r.exit_code:>4}  "
                      f"{'' if files is None else files:>5}  {(r.commit or '')[:12]:<12}  "
                      f"{r.branch}" + note))  # fmt: skip
    return 0
