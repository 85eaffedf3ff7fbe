"""Decision points of every kind, recorded by the launcher from real sandboxed runs.

Each run is real: a real repository, bubblewrap, the supervisor and (for destinations) the
proxy in namespaces of the test's own. Every escalation in the receipt and in `run --json`
has an id, a kind, a value, a time and a decision.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from net_ns import REMOTE_V4, IsolatedNet
from net_sandbox import needs_netns
from net_servers import RecordingHTTPServer

from gatekeeper.receipt.models import escalation_id
from gatekeeper.run.failures import is_failed, is_predicate

from conftest import gk, make_repo, needs_bwrap
from helpers import run_json

pytest_plugins = ["net_fixtures"]
pytestmark = [needs_bwrap, pytest.mark.sandbox]

POLICY = """\
paths: {write: ["src/**"]}
commands:
  ask: ["pnpm install"]
  deny: ["rm -rf"]
  external: ["git push"]
  default: allow
"""

# Each probe runs a real program (full paths: a shell's builtin `test` is no exec).
SCRIPT = r"""
set +e
echo one > README.md; echo two > README.md; echo three > README.md
mkdir -p . src; mkdir . ; mkdir src ; mkdir "$PWD"
python3 -c 'import os
for p in (".", "src", os.getcwd(), "/tmp"):
    try:
        os.mkdir(p)
    except FileExistsError:
        pass
os.makedirs(".", exist_ok=True); os.makedirs("src", exist_ok=True)'
mkdir -p /tmp/b && printf '#!/bin/sh\necho pnpm-ran\n' > /tmp/b/pnpm && chmod +x /tmp/b/pnpm
/tmp/b/pnpm install
rm -rf src/nothing
git push origin main
git push origin main
cat .env; cat .env; python3 -c 'open(".env").read(); open(".env").read()'
cat ~/.netrc; cat ~/.netrc; python3 -c 'import netrc, os; open(os.path.expanduser("~/.netrc")).read()'
echo changed >> src/app.py
/usr/bin/test -f no-such-file
/usr/bin/[ -d no-such-folder ]
grep -q zzz src/app.py
git check-ignore src/app.py
cmp -s README.md src/app.py
diff -q README.md src/app.py
git diff --quiet
git -C . diff --exit-code --stat
ls /no/such/folder
grep zzz /no/such/file
exit 0
"""


@pytest.fixture
def recorded(tmp_path: Path, key: Path) -> tuple[dict, dict, str]:  # type: ignore[type-arg]
    repo = make_repo(tmp_path / "repo", policy=POLICY,
                     files={"README.md": "# demo\n", "src/app.py": "print('hi')\n",
                            ".env": "TOKEN=planted-secret\n"})  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr
    shown = gk("receipt", "show", "--repo", str(repo), "--json", data["commit"])
    assert shown.returncode == 0, shown.stderr
    predicate = json.loads(shown.stdout)[0]["statement"]["predicate"]
    return data, predicate, proc.stderr


def _by_kind(escalations: list[dict], kind: str) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in escalations if e["kind"] == kind]


def test_every_kind_is_a_pending_decision_point_with_an_id(recorded) -> None:  # type: ignore[no-untyped-def]
    data, pred, _ = recorded
    for escalations in (pred["escalations"], data["escalations"]):
        for e in escalations:
            assert set(e) >= {"id", "kind", "value", "time", "decision"}, e
            assert e["id"] == escalation_id(e["kind"], e["value"]), e
            assert e["time"], e
        # A write outside the write set: one per distinct path, however often it was tried.
        writes = _by_kind(escalations, "write")
        assert [(e["value"], e["decision"]) for e in writes] == [("README.md", "pending")]
        # An ask rule and an overridable deny rule of the policy.
        commands = {e["value"]: e["decision"] for e in _by_kind(escalations, "command")}
        assert commands == {"/tmp/b/pnpm install": "pending", "rm -rf src/nothing": "pending"}
        # An external write: refused, recorded once for the command line.
        external = _by_kind(escalations, "external-write")
        assert [(e["value"], e["decision"]) for e in external] == [
            ("git push origin main", "pending")
        ]
        # Secrets: one per secret, however often probed.
        secrets = sorted(e["value"] for e in _by_kind(escalations, "secret"))
        assert len(secrets) == 2, secrets
        assert secrets[0].endswith("/.env") or secrets[1].endswith("/.env"), secrets
        assert any(s.endswith("/.netrc") for s in secrets), secrets
        assert all(e["decision"] == "pending" for e in _by_kind(escalations, "secret"))
    assert pred["escalations"] == data["escalations"]
    assert pred["counts"]["escalations"] == len(pred["escalations"]) == 6


def test_an_external_write_never_runs_and_the_agent_is_told(recorded) -> None:  # type: ignore[no-untyped-def]
    data, pred, stderr = recorded
    pushes = [p for p in pred["processes"] if p["argv"][:2] == ["git", "push"]]
    assert pushes and all(p["decision"] == "deny" for p in pushes)
    assert all(p["rule"].startswith("external: git push") for p in pushes), pushes
    # Told once per attempt (two pushes), not once per PATH entry the shell tried.
    assert stderr.count("it never runs inside the sandbox") == 2, stderr
    assert "the person performs it after review" in stderr
    assert "pnpm-ran" not in stderr


def test_predicates_answering_no_are_not_failures(recorded) -> None:  # type: ignore[no-untyped-def]
    _, pred, _ = recorded
    failed = [p["argv"] for p in pred["processes"]
              if p["decision"] == "allow" and p["exit_code"] not in (0, None)]  # fmt: skip
    shown = [" ".join(a) for a in failed]
    # Eight predicates answered no, and two commands really failed (exit 2).
    for probe in ("/usr/bin/test -f", "/usr/bin/[ -d", "grep -q", "git check-ignore", "cmp -s",
                  "diff -q", "git diff", "git -C", "ls /no/such/folder", "grep zzz"):  # fmt: skip
        assert any(line.startswith(probe) for line in shown), (probe, failed)
    assert pred["counts"]["failed_commands"] == 5, "\n".join(map(str, failed))


def test_mkdir_of_existing_folders_is_no_denied_write(recorded) -> None:  # type: ignore[no-untyped-def]
    data, pred, _ = recorded
    denied = sorted({w["path"] for w in pred["writes"] if w["decision"] != "allow"})
    assert denied == ["README.md"], denied
    assert pred["counts"]["denied_writes"] == 1
    assert data["denied_writes"] == ["README.md"]
    assert not any(w["op"] == "mkdir" for w in pred["writes"]), pred["writes"]


FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "for url in sys.argv[1:]:\n"
    "    try:\n"
    "        print('FETCH', url, urllib.request.urlopen(url, timeout=10).read().decode())\n"
    "    except urllib.error.HTTPError as e:\n"
    "        print('FETCH', url, e.code)\n"
)


@pytest.fixture
def remote_http(outer: IsolatedNet) -> Iterator[RecordingHTTPServer]:
    with outer.inside("remote"):
        server = RecordingHTTPServer((REMOTE_V4, 0), files={"/pkg": b"package-bytes"}).start()
    yield server
    server.close()


@needs_netns
def test_an_ask_destination_is_one_pending_network_decision_point(
    tmp_path: Path, key: Path, outer: IsolatedNet, remote_http: RecordingHTTPServer
) -> None:
    policy = "network: {arbitrary_web: ask, internal_services: deny, localhost: deny}\n"
    repo = make_repo(tmp_path / "r", policy=policy, files={"fetch.py": FETCH})
    url = f"http://{REMOTE_V4}:{remote_http.port}/pkg"
    outer.assert_inside()
    proc, data = run_json(repo, "sh", "-c", f"python3 fetch.py {url} {url}; curl -s {url}; exit 0")
    assert proc.returncode == 0, proc.stderr
    assert f"FETCH {url} 403" in proc.stderr and remote_http.requests == []
    where = f"{REMOTE_V4}:{remote_http.port}"
    network = [e for e in data["escalations"] if e["kind"] == "network"]
    assert [(e["value"], e["decision"], e["id"]) for e in network] == [
        (where, "pending", escalation_id("network", where))
    ]
    assert network[0]["time"]
    shown = gk("receipt", "show", "--repo", str(repo), "--json", data["commit"])
    assert (
        json.loads(shown.stdout)[0]["statement"]["predicate"]["escalations"]
        == (data["escalations"])
    )


def test_the_failure_rule() -> None:
    assert is_predicate(["git", "-C", "x", "check-ignore", "a"])
    assert is_predicate(["/usr/bin/grep", "-q", "x"])
    assert not is_predicate(["git", "diff"])  # without --quiet, exit 1 is not an answer
    assert not is_predicate(["git", "-c", "diff", "push"])
    assert is_failed(["grep", "x"], 2) and not is_failed(["grep", "x"], 1)
    assert is_failed(["pytest"], 1) and is_failed(["test"], 0, killed=True)
    assert not is_failed(["make"], None)


NOOP_CREATES = r"""
import errno, os
for name in ("README.md", os.path.abspath("README.md"), "src/app.py"):
    os.close(os.open(name, os.O_RDONLY | os.O_CREAT))  # exists: the kernel only opens it
    try:
        os.open(name, os.O_RDONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        pass
try:
    os.open("NEW.md", os.O_RDONLY | os.O_CREAT)  # does not exist: a creation, refused
except PermissionError:
    print("NEW refused")
print("OPENED")
"""


def test_an_o_creat_open_of_an_existing_file_is_no_denied_write(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "repo", policy=POLICY)
    proc, data = run_json(repo, "python3", "-c", NOOP_CREATES)
    assert proc.returncode == 0, proc.stderr
    assert "OPENED" in proc.stderr and "NEW refused" in proc.stderr
    assert data["denied_writes"] == ["NEW.md"], data["denied_writes"]
    writes = [e["value"] for e in data["escalations"] if e["kind"] == "write"]
    assert writes == ["NEW.md"], data["escalations"]


def test_an_escalation_id_names_the_redacted_value(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "repo", policy=POLICY)
    token = "tok-5e3c9a71d2"
    proc, data = run_json(repo, "sh", "-c", 'echo x > "top-$GK_TEST_TOKEN.md"; exit 0',
                          extra=["--grant", "secret=GK_TEST_TOKEN"],
                          env={"GK_TEST_TOKEN": token})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown = gk("receipt", "show", "--repo", str(repo), "--json", data["commit"])
    pred = json.loads(shown.stdout)[0]["statement"]["predicate"]
    (write,) = [e for e in pred["escalations"] if e["kind"] == "write"]
    assert token not in json.dumps(pred) and token not in json.dumps(data)
    assert write["id"] == escalation_id("write", write["value"]), write
    assert data["escalations"] == pred["escalations"]


def test_a_refused_commit_of_the_agent_is_a_timed_write_decision_point(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo", policy=POLICY)
    script = ("blob=$(echo evil | git hash-object -w --stdin) && "
              "git update-index --add --cacheinfo 100644,$blob,README.md && "
              "git commit -qm sneaky")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert data["agent_commits"] == [] and data["agent_commits_refused"]
    (write,) = [e for e in data["escalations"] if e["kind"] == "write"]
    assert (write["value"], write["decision"]) == ("README.md", "pending")
    assert write["time"] and write["id"] == escalation_id("write", "README.md")


def test_a_grant_of_the_exact_command_line_overrides_a_policy_deny_and_nothing_else(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo", policy=POLICY)
    script = ("mkdir -p src/a src/b; rm -rf src/a && echo A-GONE; rm -rf src/b && echo B-GONE; "
              "git push origin main || echo PUSH-REFUSED; exit 0")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script,
                          extra=["--grant", "command=rm -rf src/a", "--grant", "command=rm -rf",
                                 "--grant", "command=git push origin main"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "A-GONE" in proc.stderr and "B-GONE" not in proc.stderr
    assert "PUSH-REFUSED" in proc.stderr  # an external write is never run inside, granted or not
    decided = {(e["kind"], e["value"]): e["decision"] for e in data["escalations"]}
    assert decided[("command", "rm -rf src/a")] == "granted"
    assert decided[("command", "rm -rf src/b")] == "pending"
    assert decided[("external-write", "git push origin main")] == "pending"


UNLIFTABLE = r"""
import os
for what, attempt in [
    ("other", lambda: open("/proc/1/cwd/planted", "w")),  # bubblewrap's links: another process's
    ("root", lambda: os.chmod(".", 0o700)),  # the worktree's own folder
    ("git", lambda: open(".git", "a")),
    ("readme", lambda: open("README.md", "a")),
]:
    try:
        attempt()
        print(what, "WROTE")
    except OSError as exc:
        print(what, "refused", exc.errno)
"""


def test_a_refusal_no_approval_could_lift_is_recorded_with_why_and_is_no_escalation(
    tmp_path: Path, key: Path
) -> None:
    repo = make_repo(tmp_path / "repo", policy=POLICY, files={"README.md": "# demo\n"})
    proc, data = run_json(repo, "python3", "-c", UNLIFTABLE)
    assert proc.returncode == 0, proc.stderr
    assert "WROTE" not in proc.stderr, proc.stderr
    assert {"another process's /proc links", ".", ".git", "README.md"} <= set(
        data["denied_writes"]
    ), data["denied_writes"]
    # Only the path a person could allow is a decision point.
    writes = [(e["value"], e["decision"]) for e in data["escalations"] if e["kind"] == "write"]
    assert writes == [("README.md", "pending")], data["escalations"]
    shown = gk("receipt", "show", "--repo", str(repo), "--json", data["commit"])
    pred = json.loads(shown.stdout)[0]["statement"]["predicate"]
    reasons = {w["path"]: w.get("reason") for w in pred["writes"] if w["decision"] == "deny"}
    assert "another process's /proc links" in reasons["another process's /proc links"], reasons
    assert "own folder" in reasons["."] and ".git" in reasons[".git"], reasons
    assert reasons["README.md"] is None, reasons
    assert pred["counts"]["denied_writes"] == len(reasons), pred["counts"]
    # Approving everything pending and resuming grants the path, and no label.
    approved = gk("approve", "--repo", str(repo), data["run_id"])
    assert approved.returncode == 0, approved.stderr
    proc, again = run_json(repo, "python3", "-c", UNLIFTABLE,
                           extra=["--resume", data["run_id"]])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert again["grants"] == ["write=README.md"], again["grants"]
    assert "readme refused" not in proc.stderr and "other refused" in proc.stderr, proc.stderr
    granted = [(e["value"], e["decision"]) for e in again["escalations"] if e["kind"] == "write"]
    assert granted == [("README.md", "granted")], again["escalations"]
