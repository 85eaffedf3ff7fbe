"""Attacks on signed approvals and the gate that honours them, on real repositories, real runs
and real pushes to a bare repository with the server hook (docs/security.md, rows P...)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
from fixtures.gate_receipts import git_dir_of, receipted_commit
from test_approvals import (
    POLICY,
    approvals_of,
    check,
    decide,
    escalations,
    note_lines,
    predicate,
    resume,
    run,
    set_note,
    unapproved,
)

from gatekeeper.receipt.approval import ApprovedEscalation, is_approval_line, make_approval
from gatekeeper.receipt.keys import load_key
from gatekeeper.receipt.models import escalation_id
from gatekeeper.receipt.notes import MAX_NOTE_LINES, NOTES_REF, add_receipt_note

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = needs_bwrap


@pytest.fixture
def repo(tmp_path: Path, key: Path) -> Path:
    return make_repo(tmp_path / "repo", policy=POLICY)


def _server(repo: Path, tmp_path: Path) -> Path:
    bare = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    assert gk("hooks", "install", "--server", str(bare)).returncode == 0
    git(repo, "remote", "add", "origin", str(bare))
    return bare


def _push(repo: Path, *refs: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"], GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "push", "--no-verify", "origin", *refs], cwd=repo, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_a_denial_pushed_past_the_note_line_limit_is_not_lost(repo: Path, tmp_path: Path) -> None:
    """P1: a run approved for docs/x.md, merged, then denied; its branch resumed. Whoever may
    push notes reorders the merged run's note (no line removed) so that the denial sits after
    MAX_NOTE_LINES junk lines, where no reader looks. The server refuses it (the gate would
    lose the line: W7); where the note is so anyway (a local notes ref), the gate takes a
    note not read whole for one that may hide a denial."""
    bare = _server(repo, tmp_path)
    first = run(repo, "echo a > src/a.py", "--grant", "write=docs/x.md")
    decide(repo, "approve", first["run_id"], "write=docs/x.md")
    second = resume(repo, first["run_id"], "mkdir -p docs && echo x > docs/x.md")
    landed = _push(repo, f"{first['commit']}:refs/heads/main", NOTES_REF)
    assert landed.returncode == 0, landed.stderr
    git(repo, "fetch", "-q", "origin", "main")
    git(repo, "merge", "-q", "--ff-only", first["commit"])
    decide(repo, "deny", first["run_id"], "write=docs/x.md")
    assert _push(repo, NOTES_REF).returncode == 0
    assert unapproved(check(repo, second["branch"])) == ["docs/x.md"]

    lines = note_lines(repo, first["commit"])
    [denial] = [x for x in lines if is_approval_line(x) and "denied" in _payload(x)]
    junk = [f"junk-{n}" for n in range(MAX_NOTE_LINES)]
    set_note(repo, first["commit"], [x for x in lines if x != denial] + junk + [denial])
    pushed = _push(repo, NOTES_REF)
    assert pushed.returncode != 0, pushed.stderr
    assert f"the note on {first['commit'][:12]} would lose 1 receipt or approval line(s)" in (
        pushed.stderr
    )

    result = check(repo, second["branch"])
    assert unapproved(result) == ["docs/x.md"], result["findings"]
    [finding] = [f for f in result["findings"] if f["kind"] == "unapproved-write"]
    assert "could not be read whole" in finding["message"]
    refused = _push(repo, f"{second['commit']}:refs/heads/main")
    assert refused.returncode != 0 and "unapproved-write" in refused.stderr, refused.stderr
    assert git(bare, "rev-parse", "main").strip() == first["commit"]


def _payload(line: str) -> str:
    return base64.b64decode(json.loads(line)["payload"]).decode()


def test_a_note_not_read_whole_resumes_with_no_approval(repo: Path) -> None:
    """P1 (sibling): `escalations` and `run --resume` read the same note; a denial hidden past
    the line limit must not turn into a grant inside the resumed run."""
    first = run(repo, "echo a > src/a.py", "--grant", "write=docs/x.md")
    decide(repo, "approve", first["run_id"], "write=docs/x.md")
    decide(repo, "deny", first["run_id"], "write=docs/x.md")
    lines = note_lines(repo, first["commit"])
    [denial] = [x for x in lines if is_approval_line(x) and "denied" in _payload(x)]
    junk = [f"junk-{n}" for n in range(MAX_NOTE_LINES)]
    set_note(repo, first["commit"], [x for x in lines if x != denial] + junk + [denial])
    proc = gk("escalations", "--repo", str(repo), "--json", first["run_id"])
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    [row] = [e for e in shown["escalations"] if e["kind"] == "write"]
    assert row["decision"] == "granted" and row["decided_by"] is None
    assert all("could not be read whole" in i["status"] for i in shown["ignored_approvals"])
    second = resume(repo, first["run_id"], "mkdir -p docs && echo x > docs/x.md || true")
    assert "docs/x.md" not in git(repo, "ls-tree", "-r", "--name-only", second["commit"])


def test_an_approval_dated_in_the_future_does_not_outlive_a_later_denial(repo: Path) -> None:
    """P2: an approver's approval dated in 2099 (a clock set forward, or on purpose) was the
    latest decision for ever: no later denial by any approver could take it back."""
    granted = run(repo, "mkdir -p docs && echo x > docs/x.md", "--grant", "write=docs/x.md")
    statement = predicate(repo, granted["commit"])
    future = make_approval(
        run_id=granted["run_id"], branch=granted["branch"], commit=granted["commit"],
        tree=git(repo, "rev-parse", f"{granted['commit']}^{{tree}}").strip(),
        escalations=[ApprovedEscalation(id=escalation_id("write", "docs/x.md"), kind="write",
                                        value="docs/x.md")],
        decision="approved", time="2099-01-01T00:00:00+00:00", key=load_key(),
    )  # fmt: skip
    add_receipt_note(Path(git(repo, "rev-parse", "--absolute-git-dir").strip()),
                     granted["commit"], future)  # fmt: skip
    assert statement["run_id"] == granted["run_id"]
    decide(repo, "deny", granted["run_id"], "write=docs/x.md")
    result = check(repo, granted["branch"])
    assert unapproved(result) == ["docs/x.md"], result["findings"]
    seen = {a["decision"]: a["status"] for a in approvals_of(result, granted["run_id"])}
    assert seen["approved"].startswith("ignored: dated 2099-01-01"), seen
    assert seen["denied"] == "honoured"
    listed = escalations(repo, granted["run_id"])["write=docs/x.md"]
    assert listed["decision"] == "denied"
    ignored = gk("escalations", "--repo", str(repo), "--json", granted["run_id"]).stdout
    assert "in the future" in ignored
    # Without the denial, the future approval is not in force either.
    other = run(repo, "mkdir -p docs && echo y > docs/y.md", "--grant", "write=docs/y.md")
    future = make_approval(
        run_id=other["run_id"], branch=other["branch"], commit=other["commit"], tree="0" * 40,
        escalations=[ApprovedEscalation(id=escalation_id("write", "docs/y.md"), kind="write",
                                        value="docs/y.md")],
        decision="approved", time="2099-01-01T00:00:00+00:00", key=load_key(),
    )  # fmt: skip
    add_receipt_note(Path(git(repo, "rev-parse", "--absolute-git-dir").strip()),
                     other["commit"], future)  # fmt: skip
    assert unapproved(check(repo, other["branch"])) == ["docs/y.md"]


def _approve(repo: Path, commit: str, run_id: str, *values: str) -> None:
    envelope = make_approval(
        run_id=run_id, branch=f"agent/{commit[:8]}", commit=commit,
        tree=git(repo, "rev-parse", f"{commit}^{{tree}}").strip(),
        escalations=[ApprovedEscalation(id=escalation_id("write", v), kind="write", value=v)
                     for v in values],
        decision="approved", time="2026-01-01T00:00:00+00:00", key=load_key(),
    )  # fmt: skip
    add_receipt_note(git_dir_of(repo), commit, envelope)


def test_an_approval_of_every_path_never_lifts_a_protected_path(tmp_path: Path, key: Path) -> None:
    """Held: an approver's `write=**` (or `.`, or the trust file by name) lifts the paths
    outside the write set, never a protected one, in any letter case or spelling."""
    repo = make_repo(tmp_path / "repo", policy=POLICY)
    trust = (repo / ".gatekeeper" / "trusted_keys").read_text() + "# looser\n"
    commit = receipted_commit(repo, {
        "docs/x.md": "outside the write set\n",
        ".github/workflows/ci.yml": "on: push\n",
        ".GitHub/workflows/x.yml": "on: push\n",
        ".gatekeeper/trusted_keys": trust,
    })  # fmt: skip
    git(repo, "checkout", "-q", "main")
    before = check(repo, commit)
    assert unapproved(before) == ["docs/x.md"], before["findings"]
    _approve(repo, commit, f"run-{commit[:8]}", "**", ".", ".gatekeeper/trusted_keys",
             ".github", ".GitHub/**")  # fmt: skip
    result = check(repo, commit)
    assert unapproved(result) == []
    protected = sorted(f["path"] for f in result["findings"] if f["kind"] == "protected-path")
    assert protected == [".GitHub/workflows/x.yml", ".gatekeeper/trusted_keys",
                         ".github/workflows/ci.yml"]  # fmt: skip
    assert result["verdict"] == "block"


def test_a_denied_approval_is_not_carried_down_a_resume_chain(repo: Path) -> None:
    """P5: run A's write is approved; B resumes A (its receipt lists the approval it used);
    then the approval is denied. C resumes B: the launcher took B's list as it stood and
    granted the denied write inside C's sandbox (a secret, a command or a destination the
    same way)."""
    first = run(repo, "echo a > src/a.py", "--grant", "write=docs/x.md")
    decide(repo, "approve", first["run_id"], "write=docs/x.md")
    second = resume(repo, first["run_id"], "echo b > src/b.py")
    assert [a["value"] for a in predicate(repo, second["commit"])["approvals"]] == ["docs/x.md"]
    decide(repo, "deny", first["run_id"], "write=docs/x.md")
    third = resume(repo, second["run_id"], "mkdir -p docs; echo x > docs/x.md; true")
    tree = git(repo, "ls-tree", "-r", "--name-only", third["commit"]).split()
    assert "docs/x.md" not in tree
    assert predicate(repo, third["commit"])["approvals"] == []
    # Approved again (a later decision), it is carried down once more.
    decide(repo, "approve", first["run_id"], "write=docs/x.md")
    fourth = resume(repo, third["run_id"], "mkdir -p docs; echo x > docs/x.md; true")
    assert "docs/x.md" in git(repo, "ls-tree", "-r", "--name-only", fourth["commit"]).split()
    assert [a["run_id"] for a in predicate(repo, fourth["commit"])["approvals"]] == [
        first["run_id"]
    ]


def test_approving_a_path_named_like_a_pattern_approves_that_path_only(repo: Path) -> None:
    # The agent chooses the names it tries: a file called `*.md`, refused, is a decision point
    # whose value reads like a pattern. Approving it must not approve every Markdown file.
    first = run(repo, "echo x > '*.md' || true")
    point = escalations(repo, first["run_id"])["write=*.md"]
    assert point["decision"] == "pending"
    decide(repo, "approve", first["run_id"], point["id"])
    proc, data = run_json(
        repo, "sh", "-c", "echo changed > README.md",
        extra=["--resume", first["run_id"], "--grant", "write=README.md"],
    )  # fmt: skip
    assert proc.returncode == 0 and data is not None, proc.stderr
    assert "grants nothing inside a run" in proc.stderr
    assert unapproved(check(repo, data["branch"])) == ["README.md"]


ASK_PYTHON = """\
version: 1
paths: {read: ["**"], write: ["src/**"]}
commands: {allow: [], ask: ["python3 -c"], deny: [], default: allow}
network: {localhost: deny, package_registry: ask, arbitrary_web: deny, internal_services: deny}
"""


def test_an_approved_command_line_runs_exactly_that_line_and_program(
    tmp_path: Path, key: Path
) -> None:
    # The approval is of what the agent ran: `python3 -c 'print(1)'`. On resume, an argv that
    # holds its words and more (other code before them) is not it, nor is a shell named
    # python3 by a link or a copy of the agent's.
    repo = make_repo(tmp_path / "repo", policy=ASK_PYTHON)
    first = run(repo, "python3 -c 'print(1)' || true")
    point = escalations(repo, first["run_id"])["command=python3 -c 'print(1)'"]
    assert point["decision"] == "pending"
    decide(repo, "approve", first["run_id"], point["id"])
    script = (
        "python3 -c 'print(1)' && echo EXACT-RAN; "
        """python3 -c 'open("src/wider","w").write("x")' 'print(1)'; """
        "ln -s /bin/sh /tmp/python3; /tmp/python3 -c 'echo x > src/linked' 'print(1)'; "
        "mkdir -p /tmp/c && cp /bin/sh /tmp/c/python3 && "
        "/tmp/c/python3 -c 'echo x > src/copied' 'print(1)'; "
        # The approved words exactly, run by a program of the agent's called python3.
        "/tmp/c/python3 -c 'print(1)'; cp /bin/sh /dev/python3 && /dev/python3 -c 'print(1)'; "
        "true"
    )
    proc, data = run_json(repo, "sh", "-c", script, extra=["--resume", first["run_id"]])
    assert proc.returncode == 0 and data is not None, proc.stderr
    assert "EXACT-RAN" in proc.stderr, proc.stderr
    assert data["changes"] == [], data["changes"]
    decisions = {(e["value"], e["decision"]) for e in data["escalations"] if e["kind"] == "command"}
    assert ("python3 -c 'print(1)'", "granted") in decisions, decisions
    pred = predicate(repo, data["commit"])
    ran = {tuple(p["argv"]): p["decision"] for p in pred["processes"]}
    assert ran[("python3", "-c", "print(1)")] == "allow", ran
    for argv0 in ("python3", "/tmp/python3", "/tmp/c/python3"):
        wider = [d for a, d in ran.items() if a[0] == argv0 and len(a) == 4]
        assert wider == ["deny"], (argv0, ran)
    for argv0 in ("/tmp/c/python3", "/dev/python3"):
        assert ran[(argv0, "-c", "print(1)")] == "deny", ran


def test_an_approved_path_with_blanks_at_its_ends_grants_no_other_path(
    tmp_path: Path, key: Path
) -> None:
    # A refused write to `README.md ` (a trailing space) or `README.md` + U+00A0, approved,
    # must not grant README.md or a protected `.gatekeeper/policy.yaml`.
    repo = make_repo(tmp_path / "repo", policy=POLICY)
    first = run(repo, "for p in 'README.md ' '.gatekeeper/policy.yaml ' \"$(printf "
                      "'README.md\\302\\240')\"; do echo x > \"$p\"; done; true")  # fmt: skip
    pending = [k for k, e in escalations(repo, first["run_id"]).items() if k.startswith("write=")]
    assert len(pending) == 3, pending
    decide(repo, "approve", first["run_id"])
    proc, data = run_json(
        repo, "sh", "-c", "for p in README.md .gatekeeper/policy.yaml; do echo x > $p; done; true",
        extra=["--resume", first["run_id"]],
    )  # fmt: skip
    assert proc.returncode == 0 and data is not None, proc.stderr
    assert proc.stderr.count("a write pattern cannot name exactly") == 3, proc.stderr
    assert data["grants"] == [] and data["changes"] == [], data
    assert {"README.md", ".gatekeeper/policy.yaml"} <= set(data["denied_writes"]), data


def test_a_look_alike_space_in_a_name_is_shown_as_an_escape() -> None:
    from gatekeeper.report.decisions import visible

    assert visible("README.md\u00a0") == "README.md\\xa0"
    assert visible("a\u2003b\u3000") == "a\\u2003b\\u3000"
    assert visible("two words") == "two words"


def test_a_denied_path_inside_an_approved_folder_stays_unwritten_on_resume(repo: Path) -> None:
    # The approval of a refused `mkdir docs` grants the folder; a later denial of one file in
    # it is in force too: the resumed run writes the folder's other files, never that one.
    first = run(repo, "mkdir docs; echo x > docs/secret.txt; true")
    points = escalations(repo, first["run_id"])
    assert {"write=docs", "write=docs/secret.txt"} <= set(points), points
    decide(repo, "approve", first["run_id"], "write=docs")
    decide(repo, "deny", first["run_id"], "write=docs/secret.txt")
    data = resume(repo, first["run_id"],
                  "mkdir -p docs; echo a > docs/readme.md; echo b > docs/secret.txt; true")  # fmt: skip
    assert [c["path"] for c in data["changes"]] == ["docs/readme.md"], data["changes"]
    assert "docs/secret.txt" in data["denied_writes"], data["denied_writes"]
    assert check(repo, data["branch"])["verdict"] == "pass"


@pytest.mark.parametrize("name", ["docs/a[1].txt", "docs/s*.txt", "docs/t.txt "])
def test_a_denied_name_no_pattern_can_hold_keeps_the_folder_approval_out_of_the_run(
    repo: Path, name: str
) -> None:
    # A denied name inside an approved folder that a write pattern cannot name as it is (glob
    # characters, a blank at its end) cannot be protected for the run: the folder's approval
    # grants nothing there, and the file stays unwritten.
    first = run(repo, f"mkdir docs; echo x > '{name}'; true")
    decide(repo, "approve", first["run_id"], "write=docs")
    decide(repo, "deny", first["run_id"], f"write={name}")
    proc, data = run_json(repo, "sh", "-c", f"mkdir -p docs; echo b > '{name}'; true",
                          extra=["--resume", first["run_id"]])  # fmt: skip
    assert proc.returncode == 0 and data is not None, proc.stderr
    assert "a denial in force names" in proc.stderr, proc.stderr
    assert data["changes"] == [] and name in data["denied_writes"], data


def test_a_grant_of_a_repository_script_names_that_file_only(tmp_path: Path, key: Path) -> None:
    # `--grant command="./gradlew build"` beats `deny: [gradlew]` for the repository's gradlew;
    # a gradlew of the agent's elsewhere (scratch space, its own folder in the worktree) is
    # not that file, whatever the folder it is run from.
    policy = POLICY.replace('deny: ["git push"]', 'deny: ["git push", gradlew]')
    repo = make_repo(tmp_path / "repo", policy=policy,
                     files={"gradlew": "#!/bin/sh\necho REAL-RAN\n"})  # fmt: skip
    os.chmod(repo / "gradlew", 0o755)
    git(repo, "add", "gradlew")
    git(repo, "commit", "-qm", "gradlew executable")
    fake = "printf '#!/bin/sh\\necho FAKE-RAN\\n' > {0}/gradlew; chmod +x {0}/gradlew"
    script = (f"./gradlew build; mkdir -p /tmp/x src/x; {fake.format('/tmp/x')}; "
              f"{fake.format('src/x')}; (cd /tmp/x && ./gradlew build); "
              "(cd src/x && ./gradlew build); true")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script, extra=["--grant", "command=./gradlew build"])
    assert proc.returncode == 0 and data is not None, proc.stderr
    assert "REAL-RAN" in proc.stderr and "FAKE-RAN" not in proc.stderr, proc.stderr
