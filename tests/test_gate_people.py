"""People sign, agents carry receipts: commits accounted for by a person's own git signature.

Real repositories, real `gatekeeper run` commits, real SSH and OpenPGP signatures made by git,
and real pushes to a bare repository served by `git daemon` with the server hook installed.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_push
from cryptography.hazmat.primitives import serialization
from fixtures.gate_receipts import commit_files, git_dir_of, receipted_commit
from test_push import Setup, assert_accepted, assert_blocked

from gatekeeper.errors import KeyFileError
from gatekeeper.gate.judgement import judge
from gatekeeper.receipt.keys import load_key
from gatekeeper.receipt.notes import NOTES_REF
from gatekeeper.receipt.trust import PersonKey, parse_trust_file

from conftest import git, gk, needs_bwrap

pytestmark = pytest.mark.slow
daemon = test_push.daemon
setup = test_push.setup
TRUST = ".gatekeeper/trusted_keys"
POLICY = ".gatekeeper/policy.yaml"
NOTES = f"{NOTES_REF}:{NOTES_REF}"


# --- people and their keys ---------------------------------------------------------------------


def ssh_person(tmp_path: Path, name: str) -> tuple[Path, str]:
    """A person's SSH key: the private key file and the public line (`ssh-ed25519 ... name`)."""
    path = tmp_path / "people" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True
    )
    return path, Path(f"{path}.pub").read_text().strip()


@pytest.fixture
def gpg_home(tmp_path: Path) -> Iterator[Path]:
    """A person's GnuPG home with one signing key, Bob's; its agent is stopped afterwards."""
    if shutil.which("gpg") is None:
        pytest.skip("gpg is not installed")
    home = tmp_path / "bob-gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(
        ["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Bob <bob@example.invalid>",
         "ed25519", "sign", "never"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    yield home
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], check=False)


def openpgp_line(home: Path) -> str:
    exported = subprocess.run(
        ["gpg", "--export", "bob@example.invalid"],
        env={**os.environ, "GNUPGHOME": str(home)}, check=True, capture_output=True,
    ).stdout  # fmt: skip
    return f"openpgp {base64.b64encode(exported).decode()} bob"


def signed_commit(
    repo: Path,
    files: dict[str, str],
    message: str,
    *,
    ssh_key: Path | None = None,
    gpg: Path | None = None,
) -> str:
    """A human commit of files on the current branch, signed by git with ssh_key or gpg's key."""
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.environ["GIT_CONFIG_GLOBAL"], GIT_CONFIG_NOSYSTEM="1")
    if ssh_key is not None:
        how = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={ssh_key}"]
    else:
        assert gpg is not None
        env["GNUPGHOME"] = str(gpg)
        how = ["-c", "gpg.format=openpgp", "-c", "user.signingkey=bob@example.invalid"]
    subprocess.run(
        ["git", *how, "commit", "-q", "-S", "-m", message],
        cwd=repo, env=env, check=True, capture_output=True,
    )  # fmt: skip
    return git(repo, "rev-parse", "HEAD").strip()


def on_main(setup: Setup) -> None:
    git(setup.clone, "fetch", "-q", "origin", "+refs/heads/main:refs/remotes/origin/main")
    git(setup.clone, "checkout", "-q", "-B", "main", "refs/remotes/origin/main")


def admin_sets_main(setup: Setup, edits: dict[str, str]) -> str:
    """The administrator commits edits (trust file, policy) on main and moves the server's main
    there directly (a fetch into the bare repository runs no hook). Returns the new main."""
    on_main(setup)
    for name, text in edits.items():
        (setup.clone / name).write_text(text)
    git(setup.clone, "commit", "-q", "-am", "administrator: trust and policy")
    git(setup.bare, "fetch", "-q", str(setup.clone), "+refs/heads/main:refs/heads/main")
    git(setup.clone, "fetch", "-q", "origin", "+refs/heads/main:refs/remotes/origin/main")
    return git(setup.clone, "rev-parse", "HEAD").strip()


def trust_people(setup: Setup, *lines: str, policy: str | None = None) -> str:
    on_main(setup)
    trust = (setup.clone / TRUST).read_text()
    edits = {TRUST: trust + "".join(f"person {line}\n" for line in lines)}
    if policy is not None:
        edits[POLICY] = policy
    return admin_sets_main(setup, edits)


def agent_run(setup: Setup, base: str, script: str) -> str:
    """A real `gatekeeper run` from base; returns its result commit (checked out afterwards)."""
    proc = gk("run", "--repo", str(setup.clone), "--base", base, "--json", "--",
              "sh", "-c", script)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    commit = json.loads(proc.stdout)["commit"]
    git(setup.clone, "checkout", "-q", "--detach", commit)
    return commit


def check_json(repo: Path, rev: str = "HEAD") -> dict:
    proc = gk("check", "--repo", str(repo), "--base", "refs/remotes/origin/main",
              "--format", "json", rev)  # fmt: skip
    return json.loads(proc.stdout)


# --- the everyday case: people and agents on one branch ----------------------------------------


@needs_bwrap
@pytest.mark.sandbox
def test_a_trusted_persons_ssh_commit_between_agent_runs_passes(
    setup: Setup, tmp_path: Path
) -> None:
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    main = trust_people(setup, alice)
    run1 = agent_run(setup, main, "echo 'def f(): return 1' > src/feature.py")
    human = signed_commit(setup.clone, {"README.md": "# demo, reviewed\n"}, "docs by hand",
                          ssh_key=alice_key)  # fmt: skip
    run2 = agent_run(setup, human, "echo 'def g(): return 2' >> src/feature.py")

    report = check_json(setup.clone, run2)
    assert report["verdict"] == "pass", report["findings"]
    by = {c["commit"]: c for c in report["commits"]}
    assert by[run1]["covered_by"] and by[run2]["covered_by"]
    assert by[human]["covered_by"] is None
    assert by[human]["signed_by"].startswith("alice@example.invalid (ssh-ed25519 SHA256:")
    text = gk("check", "--repo", str(setup.clone), "--base", "refs/remotes/origin/main", run2)
    assert f"{human[:12]} docs by hand  [person: alice@example.invalid (ssh-ed25519" in text.stdout
    md = gk("check", "--repo", str(setup.clone), "--base", "refs/remotes/origin/main",
            "--format", "md", run2).stdout  # fmt: skip
    assert "| person: alice@example.invalid (ssh-ed25519 SHA256:" in md
    html = gk("check", "--repo", str(setup.clone), "--base", "refs/remotes/origin/main",
              "--format", "html", run2).stdout  # fmt: skip
    assert "<td>docs by hand</td><td>person: alice@example.invalid (ssh-ed25519 SHA256:" in html

    proc = setup.push(f"{run2}:refs/heads/main", NOTES)
    assert_accepted(proc)
    assert setup.server_rev("refs/heads/main") == run2

    # The same history with one unsigned human commit more is not accounted for.
    git(setup.clone, "checkout", "-q", "--detach", run2)
    unsigned = commit_files(setup.clone, {"README.md": "# demo, edited again\n"},
                            message="unsigned edit")  # fmt: skip
    assert_blocked(setup.push(f"{unsigned}:refs/heads/main", NOTES), "uncovered-commit")
    assert setup.server_rev("refs/heads/main") == run2


@needs_bwrap
@pytest.mark.sandbox
def test_an_unsigned_human_commit_between_agent_runs_blocks(setup: Setup, tmp_path: Path) -> None:
    _, alice = ssh_person(tmp_path, "alice@example.invalid")
    main = trust_people(setup, alice)
    agent_run(setup, main, "echo 'x = 1' > src/feature.py")
    human = commit_files(setup.clone, {"README.md": "# by hand\n"}, message="unsigned")
    run2 = agent_run(setup, human, "echo 'y = 2' >> src/feature.py")
    proc = setup.push(f"{run2}:refs/heads/main", NOTES)
    assert_blocked(proc, "uncovered-commit", "unclaimed-change")
    assert f"no receipt covers commit {human[:12]}" in proc.stderr


def test_a_commit_signed_by_an_untrusted_key_blocks(setup: Setup, tmp_path: Path) -> None:
    _, alice = ssh_person(tmp_path, "alice@example.invalid")
    mallory_key, _ = ssh_person(tmp_path, "mallory@example.invalid")
    trust_people(setup, alice)
    commit = signed_commit(setup.clone, {"README.md": "# mallory\n"}, "mallory's",
                           ssh_key=mallory_key)  # fmt: skip
    proc = setup.push(f"{commit}:refs/heads/main")
    assert_blocked(proc, "untrusted-signature")
    assert "does not list as a person" in proc.stderr
    assert "uncovered-commit" not in proc.stderr  # one finding that says why, not two
    assert setup.server_rev("refs/heads/main") != commit


def test_a_signature_by_a_receipt_signer_key_is_not_a_persons(setup: Setup, tmp_path: Path) -> None:
    """The launcher's key (a signer and approver line, not person) signs a commit with SSH."""
    private = load_key().private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    launcher = tmp_path / "launcher_ssh"
    launcher.write_bytes(private)
    launcher.chmod(0o600)
    _, alice = ssh_person(tmp_path, "alice@example.invalid")
    trust_people(setup, alice)
    commit = signed_commit(setup.clone, {"README.md": "# launcher\n"}, "by the launcher key",
                           ssh_key=launcher)  # fmt: skip
    proc = setup.push(f"{commit}:refs/heads/main")
    assert_blocked(proc, "untrusted-signature")
    assert "as a receipt signer" in proc.stderr and "only a `person` line" in proc.stderr


# --- protected paths: as the policy says ----------------------------------------------------


def _policy(setup: Setup, writers: str | None) -> str:
    text = (setup.clone / POLICY).read_text()
    if writers is None:
        return text
    return text.replace("paths:\n", f"paths:\n  protected_writers: {writers}\n", 1)


@pytest.mark.parametrize("writers", [None, "nobody", "person"])
def test_a_persons_change_to_the_policy_passes_only_when_the_policy_says(
    setup: Setup, tmp_path: Path, writers: str | None
) -> None:
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    on_main(setup)
    policy = _policy(setup, writers)
    trust_people(setup, alice, policy=policy)
    looser = policy.replace("max_added_bytes: 4294967296", "max_added_bytes: 4294967297")
    assert looser != policy
    _, bob = ssh_person(tmp_path, "bob@example.invalid")
    trust = (setup.clone / TRUST).read_text() + f"person {bob}\n"
    commit = signed_commit(setup.clone, {POLICY: looser, TRUST: trust}, "policy by hand",
                           ssh_key=alice_key)  # fmt: skip
    proc = setup.push(f"{commit}:refs/heads/main")
    if writers == "person":
        assert_accepted(proc)
        assert setup.server_rev("refs/heads/main") == commit
    else:
        assert_blocked(proc, "protected-path")
        assert f"'{POLICY}' is a protected path" in proc.stderr
        assert f"'{TRUST}' is a protected path" in proc.stderr


def test_protected_writers_person_does_not_open_protected_paths_to_agents(
    setup: Setup, tmp_path: Path
) -> None:
    _, alice = ssh_person(tmp_path, "alice@example.invalid")
    on_main(setup)
    trust_people(setup, alice, policy=_policy(setup, "person"))
    commit = receipted_commit(setup.clone, {".github/workflows/ci.yml": "on: push\n"})
    assert_blocked(setup.push(f"{commit}:refs/heads/main", NOTES), "protected-path")


def test_a_persons_commit_is_held_to_the_write_set(setup: Setup, tmp_path: Path) -> None:
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    on_main(setup)
    policy = _policy(setup, "person").replace('write: ["**"]', 'write: ["src/**"]')
    trust_people(setup, alice, policy=policy)
    commit = signed_commit(setup.clone, {"README.md": "# outside\n", "src/ok.py": "x = 1\n"},
                           "outside the write set", ssh_key=alice_key)  # fmt: skip
    proc = setup.push(f"{commit}:refs/heads/main")
    assert_blocked(proc, "unapproved-write")
    assert "'README.md' is outside the target policy's paths.write" in proc.stderr
    assert "src/ok.py" not in proc.stderr


# --- OpenPGP -----------------------------------------------------------------------------------


def test_an_openpgp_signed_commit_passes_when_its_key_is_a_person_line(
    setup: Setup, gpg_home: Path, tmp_path: Path
) -> None:
    on_main(setup)
    commit = signed_commit(setup.clone, {"README.md": "# bob\n"}, "bob's edit", gpg=gpg_home)
    # Not trusted yet: signed, but by no person of the target.
    assert_blocked(setup.push(f"{commit}:refs/heads/main"), "untrusted-signature")
    main = trust_people(setup, openpgp_line(gpg_home))
    git(setup.clone, "checkout", "-q", "--detach", main)
    commit = signed_commit(setup.clone, {"README.md": "# bob\n"}, "bob's edit", gpg=gpg_home)
    report = check_json(setup.clone)
    assert report["verdict"] == "pass", report["findings"]
    (row,) = report["commits"]
    assert row["signed_by"].startswith("bob (openpgp ")
    assert_accepted(setup.push(f"{commit}:refs/heads/main"))
    # Verification started no gpg-agent of its own (no-autostart), so none outlives the check.
    agents = subprocess.run(["pgrep", "-af", "gatekeeper-signatures"], capture_output=True)
    assert agents.stdout == b""


# --- attacks -----------------------------------------------------------------------------------

FAKE_SSH = """#!/bin/sh
echo run >> {marker}
echo 'Good "git" signature for person-0 with ED25519 key {fpr}'
exit 0
"""
FAKE_GPG = """#!/bin/sh
echo run >> {marker}
echo '[GNUPG:] NEWSIG'
echo '[GNUPG:] GOODSIG 0000000000000000 Alice'
echo '[GNUPG:] VALIDSIG {fpr} 2020-01-01 0 4 0 22 8 00 {fpr}'
echo '[GNUPG:] TRUST_ULTIMATE 0 pgp'
exit 0
"""


def test_repository_config_cannot_swap_in_a_verifier_that_says_good(
    setup: Setup, tmp_path: Path
) -> None:
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    mallory_key, mallory = ssh_person(tmp_path, "mallory@example.invalid")
    trust_people(setup, alice)
    fpr = PersonKey.parse(alice, "alice").fingerprint
    marker = tmp_path / "fake-verifier-ran"
    fake_ssh, fake_gpg = tmp_path / "fake-ssh-keygen", tmp_path / "fake-gpg"
    fake_ssh.write_text(FAKE_SSH.format(marker=marker, fpr=fpr))
    fake_gpg.write_text(FAKE_GPG.format(marker=marker, fpr="A" * 40))
    fake_ssh.chmod(0o755)
    fake_gpg.chmod(0o755)
    allowed = tmp_path / "mallory_allowed"
    allowed.write_text(f"person-0 {mallory}\n")
    for name, value in (
        ("gpg.program", fake_gpg),
        ("gpg.openpgp.program", fake_gpg),
        ("gpg.x509.program", fake_gpg),
        ("gpg.ssh.program", fake_ssh),
        ("gpg.ssh.allowedSignersFile", allowed),
        ("gpg.minTrustLevel", "undefined"),
        ("log.showSignature", "true"),
    ):
        git(setup.bare, "config", name, str(value))
    commit = signed_commit(setup.clone, {"README.md": "# mallory\n"}, "mallory's",
                           ssh_key=mallory_key)  # fmt: skip
    # The clone, where `gatekeeper check` runs, is configured the same way.
    for name in ("gpg.program", "gpg.ssh.program", "gpg.ssh.allowedSignersFile"):
        git(setup.clone, "config", name, git(setup.bare, "config", name).strip())
    report = check_json(setup.clone, commit)
    assert report["verdict"] == "block"
    kinds = [f["kind"] for f in report["findings"]]
    assert "untrusted-signature" in kinds and "uncovered-commit" not in kinds
    proc = setup.push(f"{commit}:refs/heads/main")
    assert_blocked(proc, "untrusted-signature")
    assert not marker.exists(), "a verifier from repository config ran"
    # And alice's genuine commit still passes under that config: nothing but git's own
    # verification with the trust file's keys decided either way.
    on_main(setup)
    git(setup.clone, "reset", "-q", "--hard", "refs/remotes/origin/main")
    git(setup.clone, "config", "--unset", "gpg.ssh.program")  # to sign; the server keeps it
    good = signed_commit(setup.clone, {"README.md": "# alice\n"}, "alice's", ssh_key=alice_key)
    assert_accepted(setup.push(f"{good}:refs/heads/main"))
    assert not marker.exists()


def test_a_trusted_signature_copied_onto_another_commit_fails(setup: Setup, tmp_path: Path) -> None:
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    trust_people(setup, alice)
    genuine = signed_commit(setup.clone, {"README.md": "# harmless\n"}, "harmless",
                            ssh_key=alice_key)  # fmt: skip
    git(setup.clone, "reset", "-q", "--hard", "HEAD~1")
    evil = commit_files(setup.clone, {"src/app.py": "import os; os.system('evil')\n"},
                        message="harmless")  # fmt: skip
    raw = git(setup.clone, "cat-file", "commit", genuine)
    header, _, _ = raw.partition("\n\n")
    signature = header[header.index("gpgsig ") :]
    evil_raw = git(setup.clone, "cat-file", "commit", evil)
    evil_header, _, evil_message = evil_raw.partition("\n\n")
    forged_text = f"{evil_header}\n{signature}\n\n{evil_message}"
    forged = git(setup.clone, "hash-object", "-t", "commit", "-w", "--stdin",
                 input=forged_text.encode()).strip()  # fmt: skip
    assert "gpgsig" in git(setup.clone, "cat-file", "commit", forged)
    proc = setup.push(f"{forged}:refs/heads/main")
    assert_blocked(proc, "untrusted-signature")
    assert "does not match the commit" in proc.stderr


def test_replace_refs_cannot_lend_a_signed_commits_content(setup: Setup, tmp_path: Path) -> None:
    """A replace ref on the server points the unsigned commit at alice's signed one."""
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    main = trust_people(setup, alice)
    signed = signed_commit(setup.clone, {"README.md": "# signed\n"}, "signed",
                           ssh_key=alice_key)  # fmt: skip
    git(setup.clone, "checkout", "-q", "--detach", main)
    unsigned = commit_files(setup.clone, {"src/app.py": "print('evil')\n"}, message="evil")
    # Both objects reach the server (the signed one on a side ref), then the replace ref.
    assert_accepted(setup.push(f"{signed}:refs/heads/side"))
    git(setup.bare, "fetch", "-q", str(setup.clone), f"{unsigned}:refs/tmp/unsigned")
    git(setup.bare, "replace", unsigned, signed)
    git(setup.bare, "update-ref", "-d", "refs/tmp/unsigned")
    proc = setup.push(f"{unsigned}:refs/heads/main")
    assert_blocked(proc, "uncovered-commit")
    assert setup.server_rev("refs/heads/main") == main
    # Locally too: the gate reads the real object, whatever refs/replace says.
    git(setup.clone, "replace", unsigned, signed)
    report = check_json(setup.clone, unsigned)
    assert report["verdict"] == "block"
    assert "uncovered-commit" in [f["kind"] for f in report["findings"]]
    assert report["commits"][0]["signed_by"] is None


def test_judge_reports_people_in_the_json(setup: Setup, tmp_path: Path) -> None:
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    main = trust_people(setup, alice)
    commit = signed_commit(setup.clone, {"README.md": "# alice\n"}, "alice", ssh_key=alice_key)
    result = judge(git_dir_of(setup.clone), main, commit)
    assert result.passed, result.findings
    assert result.receipts_verified == 0
    assert result.to_json()["commits"][0]["signed_by"] == result.signed_by[commit]
    assert result.accounted_for(commit) == "person: " + result.signed_by[commit]


# --- person lines: what the trust file pins ----------------------------------------------------


def test_a_person_line_must_hold_the_key_type_it_states(tmp_path: Path) -> None:
    _, alice = ssh_person(tmp_path, "alice@example.invalid")
    _, blob, _ = alice.split(" ", 2)
    with pytest.raises(KeyFileError, match="says ecdsa-sha2-nistp256 but the key inside"):
        parse_trust_file(f"person ecdsa-sha2-nistp256 {blob} alice\n", "t")
    with pytest.raises(KeyFileError, match="not an SSH public key blob"):
        parse_trust_file("person ssh-ed25519 AAAA alice\n", "t")


def _gpg(home: Path, *args: str) -> bytes:
    env = {**os.environ, "GNUPGHOME": str(home)}
    return subprocess.run(["gpg", "--batch", *args], env=env, check=True,
                          capture_output=True).stdout  # fmt: skip


def test_an_openpgp_line_pins_one_public_key_by_its_fingerprint(
    gpg_home: Path, tmp_path: Path
) -> None:
    line = openpgp_line(gpg_home)
    (person,) = parse_trust_file(f"person {line}\n", "t").people
    listed = _gpg(gpg_home, "--with-colons", "--fingerprint", "bob@example.invalid").decode()
    fpr = next(row.split(":")[9] for row in listed.splitlines() if row.startswith("fpr:"))
    assert person.fingerprint == fpr
    assert person.label == f"bob (openpgp {fpr})"
    secret = _gpg(gpg_home, "--passphrase", "", "--pinentry-mode", "loopback",
                  "--export-secret-keys", "bob@example.invalid")  # fmt: skip
    with pytest.raises(KeyFileError, match="secret key"):
        parse_trust_file(f"person openpgp {base64.b64encode(secret).decode()}\n", "t")
    raw = base64.b64decode(line.split()[1])
    with pytest.raises(KeyFileError, match="exactly one OpenPGP public key, found 2"):
        parse_trust_file(f"person openpgp {base64.b64encode(raw + raw).decode()}\n", "t")
    with pytest.raises(KeyFileError, match="truncated or malformed"):
        parse_trust_file(f"person openpgp {base64.b64encode(raw[:-7]).decode()}\n", "t")


def test_trust_add_takes_a_gpg_export_and_lists_fingerprints(
    repo: Path, gpg_home: Path, tmp_path: Path
) -> None:
    armored = tmp_path / "bob.asc"
    armored.write_bytes(_gpg(gpg_home, "--armor", "--export", "bob@example.invalid"))
    binary = tmp_path / "bob.gpg"
    binary.write_bytes(_gpg(gpg_home, "--export", "bob@example.invalid"))
    proc = gk("trust", "add", "--person", str(armored), "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    again = gk("trust", "add", "--person", str(binary), "--repo", str(repo))
    assert again.returncode == 0 and "already" in again.stderr
    _, alice = ssh_person(tmp_path, "alice@example.invalid")
    assert gk("trust", "add", "--person", alice, "--repo", str(repo)).returncode == 0
    rows = json.loads(gk("trust", "list", "--json", "--repo", str(repo)).stdout)
    people = [r for r in rows if r["role"] == "person"]
    expected = parse_trust_file(f"person {openpgp_line(gpg_home)}\nperson {alice}\n", "t").people
    assert [r["id"] for r in people] == [p.fingerprint for p in expected]
    assert people[1]["id"].startswith("SHA256:")


def test_protected_writers_is_validated() -> None:
    from gatekeeper.errors import PolicyError
    from gatekeeper.policy.model import parse_policy

    assert parse_policy(b"paths: {write: []}\n", "p").paths.protected_writers == "nobody"
    assert (
        parse_policy(b"paths: {protected_writers: person}\n", "p").paths.protected_writers
        == "person"
    )
    with pytest.raises(PolicyError) as caught:
        parse_policy(b"paths: {protected_writers: agent}\n", "p")
    assert "paths.protected_writers" in caught.value.message
    assert "'nobody' or 'person'" in caught.value.message


def test_only_the_header_git_verifies_counts_as_the_signature() -> None:
    from gatekeeper.gate.people import signature_format

    ssh = b"-----BEGIN SSH SIGNATURE-----\n U1NI\n -----END SSH SIGNATURE-----"
    pgp = b"-----BEGIN PGP SIGNATURE-----\n iQ\n -----END PGP SIGNATURE-----"
    head = b"tree " + b"0" * 40 + b"\nauthor a <a> 1 +0000\ncommitter a <a> 1 +0000\n"
    both = head + b"gpgsig-sha256 " + ssh + b"\ngpgsig " + pgp + b"\n\nmsg\ngpgsig " + ssh
    assert signature_format(both, "sha1") == "openpgp"
    assert signature_format(both, "sha256") == "ssh"
    assert signature_format(head + b"\ngpgsig " + ssh + b"\n", "sha1") is None  # message only
    x509 = head + b"gpgsig -----BEGIN SIGNED MESSAGE-----\n x\n\nm"
    assert signature_format(x509, "sha1") == "other"


def test_a_person_added_on_the_branch_under_review_is_not_trusted_yet(
    setup: Setup, tmp_path: Path
) -> None:
    """Alice (trusted, protected_writers: person) adds Bob; Bob's commit in the same push is
    judged by the target's trust file, which does not name him until Alice's commit lands."""
    alice_key, alice = ssh_person(tmp_path, "alice@example.invalid")
    bob_key, bob = ssh_person(tmp_path, "bob@example.invalid")
    on_main(setup)
    trust_people(setup, alice, policy=_policy(setup, "person"))
    trust = (setup.clone / TRUST).read_text() + f"person {bob}\n"
    adds_bob = signed_commit(setup.clone, {TRUST: trust}, "trust bob", ssh_key=alice_key)
    by_bob = signed_commit(setup.clone, {"README.md": "# bob\n"}, "bob's", ssh_key=bob_key)
    proc = setup.push(f"{by_bob}:refs/heads/main")
    assert_blocked(proc, "untrusted-signature")
    (line,) = [ln for ln in proc.stderr.splitlines() if "untrusted-signature" in ln]
    assert f"commit {by_bob[:12]} " in line and "does not list as a person" in line
    assert_accepted(setup.push(f"{adds_bob}:refs/heads/main"))
    assert_accepted(setup.push(f"{by_bob}:refs/heads/main"))


def test_the_signatures_checked_and_the_commit_bytes_read_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each signature costs a verifier's process, and each commit read for one its bytes: a
    push of under a megabyte carried thousands of copies of one signature (a minute and a
    half of ssh-keygen), or dozens of messages of megabytes each (gigabytes held). Past
    MAX_SIGNATURES_CHECKED (here 2) a signed commit is not checked, past
    MAX_COMMIT_BYTES_IN_ALL a commit is not read: each says so, and accounts for nothing."""
    from gatekeeper.gate import people
    from gatekeeper.gate.history import range_commits

    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    base = commit_files(repo, {"README.md": "x\n"}, message="base")
    key, alice = ssh_person(tmp_path, "alice@example.invalid")
    for i in range(4):
        signed_commit(repo, {f"f{i}.txt": f"{i}\n"}, f"signed {i}", ssh_key=key)
    commits = range_commits(repo / ".git", base, "HEAD")
    trust = parse_trust_file(f"person {alice}\n", "t")
    inside = {c.oid for c in commits}

    def account() -> people.People:
        return people.account_for_people(repo / ".git", commits, trust, None, lambda c: [],
                                         joined=inside)  # fmt: skip

    assert len(account().signed) == 4
    monkeypatch.setattr(people, "MAX_SIGNATURES_CHECKED", 2)
    found = account()
    assert len(found.signed) == 2 and len(found.rejected) == 2
    assert sum("its signature is not checked (land it in parts)" in f.message
               for f in found.findings) == 2  # fmt: skip
    monkeypatch.setattr(people, "MAX_SIGNATURES_CHECKED", 500)
    size = len(people.read_commits(repo / ".git", [commits[0].oid])[commits[0].oid] or b"")
    monkeypatch.setattr(people, "MAX_COMMIT_BYTES_IN_ALL", 3 * size + size // 2)
    found = account()
    assert len(found.signed) == 3 and len(found.rejected) == 1
    assert "its signature is not checked" in found.findings[0].message


def test_a_subject_of_megabytes_is_shown_cut(tmp_path: Path) -> None:
    """A pushed commit's subject may be megabytes long, and each finding, report and hook
    answer quoted it whole."""
    from gatekeeper.gate.history import SUBJECT_COLUMNS, range_commits

    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    base = commit_files(repo, {"README.md": "x\n"}, message="base")
    (tmp_path / "message").write_text("s" * 2_000_000)
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-F", str(tmp_path / "message"))
    commit_files(repo, {"b.txt": "b\n"}, message="short")
    subjects = [c.subject for c in range_commits(repo / ".git", base, "HEAD")]
    assert subjects[1] == "short"
    assert len(subjects[0]) == SUBJECT_COLUMNS and subjects[0].endswith("..")


# --- what a verifier is given, and for how long ------------------------------------------------


def _armored(packets: bytes, *, header: str = "") -> bytes:
    body = base64.b64encode(packets).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return ("-----BEGIN PGP SIGNATURE-----\n" + header + "\n" + "\n".join(lines)
            + "\n-----END PGP SIGNATURE-----").encode()  # fmt: skip


def _signed_by_hand(repo: Path, signature: bytes, message: str = "a signed-looking commit") -> str:
    """A commit on HEAD whose gpgsig header holds signature, as written (no signing program)."""
    tree = git(repo, "write-tree").strip()
    parent = git(repo, "rev-parse", "HEAD").strip()
    folded = signature.replace(b"\n", b"\n ")
    body = (f"tree {tree}\nparent {parent}\nauthor a <a@example.invalid> 1700000000 +0000\n"
            f"committer a <a@example.invalid> 1700000000 +0000\n").encode()  # fmt: skip
    body += b"gpgsig " + folded + b"\n\n" + message.encode() + b"\n"
    oid = subprocess.run(["git", "-C", str(repo), "hash-object", "-t", "commit", "-w", "--stdin"],
                         input=body, capture_output=True, check=True).stdout.decode().strip()  # fmt: skip
    git(repo, "update-ref", "HEAD", oid)
    return oid


# A legacy-format compressed packet (tag 8, no stated length, ZIP) holding a marker packet:
# the shape of a signature that inflates to terabytes inside gpg, in a few bytes.
COMPRESSED = b"\xa3\x01" + __import__("zlib").compress(b"\xa8\x03PGP" * 1000)[2:-4]
SIGNATURE_PACKET = b"\xc2\x05" + b"\x04\x00\x16\x08\x00"  # tag 2 (current format), 5 bytes


@pytest.mark.parametrize(
    ("signature", "why"),
    [
        (_armored(COMPRESSED), "no stated length"),
        (_armored(b"\xc8\x10" + b"\x01" * 16), "packet of type 8"),
        (_armored(SIGNATURE_PACKET + b"\xa8\x03PGP"), "packet of type 10"),
        (_armored(b"\xc2\xe1" + b"\x00" * 4), "partial lengths"),
        (_armored(b"\xc2\x40" + b"\x00" * 4), "last packet is cut"),
        (_armored(SIGNATURE_PACKET) + b"\n-----BEGIN PGP SIGNATURE-----", "not one armoured"),
        (
            _armored(SIGNATURE_PACKET).replace(b"-----\n\n", b"-----\nVersion: \xff\n\n", 1),
            "not UTF-8",
        ),
        (_armored(SIGNATURE_PACKET * 5), "5 signature packets"),
        (_armored(b"\xc2\xff\x00\x00\x50\x00" + b"\x00" * 20480), "over 16 KiB"),
        # What follows `=` on the last line is more data to gpg, not only a checksum.
        (
            _armored(SIGNATURE_PACKET).replace(b"\n-----END", b"\n=" + b"A" * 20 + b"\n-----END"),
            "not base64",
        ),
        (
            _armored(SIGNATURE_PACKET).replace(
                b"-----BEGIN PGP SIGNATURE-----",
                b"-----BEGIN PGP SIGNATURE-----\n" + b"X: y\n" * 14000,
            ),
            "over 64 KiB",
        ),
        # gpg cuts a line past 19,998 characters short: what the rest held would shift what
        # it decodes from what was checked (a second signature packet's header, say).
        (
            b"-----BEGIN PGP SIGNATURE-----\n\n"
            + base64.b64encode(SIGNATURE_PACKET * 12)
            + b"\n-----END PGP SIGNATURE-----",
            "data line of over 76",
        ),
        (_armored(SIGNATURE_PACKET, header="Comment: " + "x" * 1000 + "\n"), "over 1000"),
        # git verifies an OpenPGP "message" with gpg too.
        (_armored(COMPRESSED).replace(b"PGP SIGNATURE", b"PGP MESSAGE"), "not one armoured"),
    ],
)
def test_a_signature_of_anything_but_signature_packets_never_reaches_gpg(
    tmp_path: Path, signature: bytes, why: str
) -> None:
    """An armoured "PGP SIGNATURE" may hold any packets: 23 KB of nested compressed ones kept
    gpg (and with it `check` and the server's hook) busy for an hour. Only signature packets
    of stated lengths, one header, one block and 16 KiB at most, are given to gpg."""
    from gatekeeper.gate import people
    from gatekeeper.gate.history import range_commits

    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    base = commit_files(repo, {"README.md": "x\n"}, message="base")
    oid = _signed_by_hand(repo, signature)
    raw = people.read_commits(repo / ".git", [oid])[oid]
    assert raw is not None and people.signature_format(raw) == "openpgp", raw[:300]
    assert why in (people.openpgp_problem(raw) or ""), people.openpgp_problem(raw)
    commits = range_commits(repo / ".git", base, "HEAD")
    trust = parse_trust_file("", "t")
    found = people.account_for_people(repo / ".git", commits, trust, None, lambda c: [],
                                      joined={oid})  # fmt: skip
    (finding,) = found.findings
    assert finding.kind.value == "untrusted-signature" and "not checked: its" in finding.message
    # A second signature header is handed to gpg with the first: refused as well.
    second = _signed_by_hand(repo, _armored(SIGNATURE_PACKET))
    twice = (people.read_commits(repo / ".git", [second])[second] or b"").replace(
        b"\n\n", b"\ngpgsig " + _armored(SIGNATURE_PACKET).replace(b"\n", b"\n ") + b"\n\n", 1
    )
    assert "2 signature headers" in (people.openpgp_problem(twice) or "")
    assert (
        people.openpgp_problem(people.read_commits(repo / ".git", [second])[second] or b"") is None
    )
    # An armour header in UTF-8 (gpg writes a Comment so) is no reason to refuse one.
    commented = _armored(SIGNATURE_PACKET, header="Comment: Schl\u00fcssel von Jos\u00e9\n")
    third = _signed_by_hand(repo, commented)
    assert people.openpgp_problem(people.read_commits(repo / ".git", [third])[third] or b"") is None


def test_a_signature_in_no_format_a_person_key_uses_runs_no_verifier(tmp_path: Path) -> None:
    from gatekeeper.gate import people
    from gatekeeper.gate.history import range_commits

    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    base = commit_files(repo, {"README.md": "x\n"}, message="base")
    oid = _signed_by_hand(
        repo, b"-----BEGIN SIGNED MESSAGE-----\nMII\n-----END SIGNED MESSAGE-----"
    )
    commits = range_commits(repo / ".git", base, "HEAD")
    found = people.account_for_people(repo / ".git", commits, parse_trust_file("", "t"), None,
                                      lambda c: [], joined={oid})  # fmt: skip
    (finding,) = found.findings
    assert "in a format other than SSH or OpenPGP" in finding.message


def test_signature_checks_past_their_time_are_ended_with_all_they_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier that does not end (a signature gpg takes hours over) is ended at
    MAX_VERIFY_SECONDS with every process it started, and its signatures count for nothing."""
    from gatekeeper.gate import people
    from gatekeeper.gate.history import range_commits

    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    base = commit_files(repo, {"README.md": "x\n"}, message="base")
    oid = _signed_by_hand(repo, _armored(SIGNATURE_PACKET))
    pids = tmp_path / "pids"
    slow = tmp_path / "slow-gpg"
    slow.write_text(
        f'#!/bin/sh\nsleep 300 &\necho $$ $! >> {pids}\necho "$@" >> {pids}.args\nwait\n'
    )
    slow.chmod(0o755)
    real = people._program
    monkeypatch.setattr(people, "_program", lambda name: str(slow) if name == "gpg" else real(name))
    monkeypatch.setattr(people, "MAX_VERIFY_SECONDS", 2)
    commits = range_commits(repo / ".git", base, "HEAD")
    found = people.account_for_people(repo / ".git", commits, parse_trust_file("", "t"), None,
                                      lambda c: [], joined={oid})  # fmt: skip
    (finding,) = found.findings
    assert (
        "took over 2 s (for this judgement, or in a hook for this push) and was ended"
        in finding.message
    ), finding.message
    assert found.rejected == {oid} and not found.signed
    started = [int(p) for p in pids.read_text().split()]
    assert started
    for pid in started:  # the verifier and the process it started: both ended
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        )

    # git's copy of the signature it handed the verifier went with the verifier's folder.
    copies = [a for a in Path(f"{pids}.args").read_text().split() if "vtag" in a]
    assert copies and all("gatekeeper-signatures-" in c and not Path(c).exists() for c in copies)
    # In a hook, the judgements of one push share the time: once it is spent, the next
    # judgement's signatures are not checked, and no verifier is started for them.
    from gatekeeper.gate.diffread import git_time
    from gatekeeper.gate.hooks import PUSH_LISTINGS

    pids.unlink()
    with git_time(PUSH_LISTINGS):
        for _ in range(2):
            found = people.account_for_people(repo / ".git", commits, parse_trust_file("", "t"),
                                              None, lambda c: [], joined={oid})  # fmt: skip
            assert (
                "took over 2 s (for this judgement, or in a hook for this push) and was ended"
                in found.findings[0].message
            )
    assert len(pids.read_text().splitlines()) == 1  # the first judgement's verifier only
