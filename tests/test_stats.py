"""`gatekeeper stats` over a scripted history of real runs, and its dashboard in a real browser.

Four real sandboxed runs on a real repository: A writes outside the write set and is merged
into main; B tries an external write and reads a planted secret twice, and is discarded; C
writes outside the write set, has a predicate answer no and a command fail, and gets a human
commit on its branch after the run (a receipt/diff mismatch); D is a plain finished run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fixtures.gate_receipts import attach, make_receipt, sign

from gatekeeper.receipt import dsse
from gatekeeper.receipt.keys import generate_key

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json

pytestmark = [needs_bwrap, pytest.mark.sandbox, pytest.mark.slow]

POLICY = """\
paths: {write: ["src/**"]}
commands: {external: ["git push"], default: allow}
"""
LONG = "x" * 150  # makes C's command line longer than a report shows unfolded


@dataclass
class History:
    repo: Path
    runs: dict[str, dict]  # type: ignore[type-arg]  # name -> `run --json`
    predicates: dict[str, dict]  # type: ignore[type-arg]  # name -> verified receipt predicate

    def id(self, name: str) -> str:
        return str(self.runs[name]["run_id"])


def _predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    root = tmp_path_factory.mktemp("stats")
    home = root / "home"
    home.mkdir()
    gitconfig = home / ".gitconfig"
    gitconfig.write_text("[user]\n\tname = Test User\n\temail = test@example.invalid\n"
                         "[init]\n\tdefaultBranch = main\n")  # fmt: skip
    saved = {k: os.environ.get(k) for k in ("HOME", "GATEKEEPER_HOME", "XDG_CONFIG_HOME",
                                            "XDG_DATA_HOME", "GIT_CONFIG_GLOBAL")}  # fmt: skip
    os.environ.update(HOME=str(home), GATEKEEPER_HOME=str(home / ".config" / "gatekeeper"),
                      XDG_CONFIG_HOME=str(home / ".config"),
                      XDG_DATA_HOME=str(home / ".local" / "share"),
                      GIT_CONFIG_GLOBAL=str(gitconfig), GIT_CONFIG_NOSYSTEM="1")  # fmt: skip
    try:
        assert gk("keys", "generate").returncode == 0
        repo = make_repo(root / "repo", policy=POLICY,
                         files={"README.md": "# demo\n", "src/app.py": "print('hi')\n",
                                ".env": "TOKEN=planted\n"})  # fmt: skip
        scripts = {
            "A": "echo a > src/a.py; echo x > README.md; exit 0",
            "B": "echo b > src/b.py; git push origin main; cat .env; cat .env; exit 0",
            "C": f": {LONG}; echo c > src/c.py; echo no > README.md; /usr/bin/test -f nope; "
            "ls /nope; exit 0",
            "D": "echo d > src/d.py",
        }
        runs = {}
        for name, script in scripts.items():
            proc, data = run_json(repo, "sh", "-c", script)
            assert proc.returncode == 0, proc.stderr
            runs[name] = data
        predicates = {n: _predicate(repo, d["commit"]) for n, d in runs.items()}
        # A is merged into main; B is discarded; C gets a human commit after the run.
        git(repo, "merge", "-q", "--no-edit", runs["A"]["branch"])
        proc = gk("discard", "--repo", str(repo), runs["B"]["run_id"])
        assert proc.returncode == 0, proc.stderr
        branch_c = runs["C"]["branch"]
        tree = git(repo, "rev-parse", f"{branch_c}^{{tree}}").strip()
        blob = git(repo, "hash-object", "-w", "--stdin", input=b"edited by hand\n").strip()
        listing = git(repo, "ls-tree", tree) + f"100644 blob {blob}\thuman.py\n"
        new_tree = git(repo, "mktree", input=listing.encode()).strip()
        human = git(repo, "commit-tree", new_tree, "-p", branch_c, "-m", "human edit").strip()
        git(repo, "update-ref", f"refs/heads/{branch_c}", human)
        return History(repo, runs, predicates)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stats_json(h: History, *args: str) -> dict:  # type: ignore[type-arg]
    proc = gk("stats", "--repo", str(h.repo), "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


EXPECTED = {
    "runs": 4,
    "files_touched": 4,  # one file each
    "denied_writes": 2,  # README.md in A and in C
    "escalations": 4,  # A: write; B: external-write, secret (one, read twice); C: write
    "commands_run": 8,  # A: sh; B: sh, cat, cat; C: sh, test, ls; D: sh
    "failed_commands": 1,  # C's ls (test answering no is not a failure)
    "network_requests": 0,
    "discarded_runs": 1,
    "accepted_runs": 1,
    "mismatches": 1,
}


def test_the_figures_are_exact(history: History) -> None:
    got = stats_json(history)
    assert {k: got[k] for k in EXPECTED} == EXPECTED, got
    # Every receipt figure is the sum of the verified receipts' own counts.
    for name in ("files_touched", "denied_writes", "escalations", "commands_run",
                 "failed_commands", "network_requests"):  # fmt: skip
        assert got[name] == sum(p["counts"][name] for p in history.predicates.values()), name
    rows = {r["run_id"]: r for r in got["rows"]}
    a, b, c, d = (rows[history.id(n)] for n in "ABCD")
    assert (a["state"], a["accepted"], a["mismatch"]) == ("accepted", True, [])
    assert (b["state"], b["discarded"], b["accepted"]) == ("discarded", True, False)
    assert c["mismatch"] == ["unclaimed-change", "uncovered-commit"]
    assert (d["state"], d["mismatch"], d["accepted"]) == ("finished", [], False)
    assert [r["failed_commands"] for r in (a, b, c, d)] == [0, 0, 1, 0]
    assert [r["escalations"] for r in (a, b, c, d)] == [1, 2, 1, 0]
    assert all(r["verified"] for r in (a, b, c, d))
    assert got["escalations_by_kind"] == {
        "external-write": {"pending": 1}, "secret": {"pending": 1}, "write": {"pending": 2}
    }  # fmt: skip
    assert got["most_denied"]["paths"] == [{"value": "README.md", "count": 2}]
    assert got["most_denied"]["commands"] == [{"value": "git push origin main", "count": 1}]
    assert got["unverified_receipts"] == 0


def test_by_day_and_since(history: History) -> None:
    got = stats_json(history)
    today = datetime.now(UTC).date().isoformat()
    assert got["by_day"] == [{"day": today, **EXPECTED}]
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    later = stats_json(history, "--since", tomorrow)
    assert later["runs"] == 0 and later["rows"] == [] and later["by_day"] == []
    assert stats_json(history, "--since", today)["runs"] == 4
    bad = gk("stats", "--repo", str(history.repo), "--since", "last tuesday")
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_a_receipt_that_does_not_verify_counts_nowhere(history: History, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    shutil.copytree(history.repo, clone, symlinks=True)
    # Another key signs the trust file: none of the receipts verifies any more.
    trust = clone / ".gatekeeper" / "trusted_keys"
    trust.write_text("ed25519 " + "A" * 43 + "= someone else\n")
    git(clone, "commit", "-qam", "trust someone else")
    # A statement that is not a receipt (an approval) next to one is neither counted nor a
    # failure, whoever signed it.
    approval = {"_type": "https://in-toto.io/Statement/v1", "subject": [],
                "predicateType": "urn:gatekeeper:approval:v1", "predicate": {}}  # fmt: skip
    other = generate_key(tmp_path / "k.pem")
    line = dsse.sign(json.dumps(approval).encode(), other).to_json()
    attach(clone, history.runs["D"]["commit"], line)
    # A receipt of a run this repository never saw, by an untrusted key: no run of its own.
    commit = history.runs["D"]["commit"]
    attach(clone, commit, sign(make_receipt(clone, commit), other))
    got = stats_json(History(clone, history.runs, history.predicates))
    assert got["runs"] == 4 and got["unverified_receipts"] == 5
    assert got["files_touched"] == got["commands_run"] == got["escalations"] == 0


# --- the dashboard and a report in a real browser --------------------------------------------


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which(
        "google-chrome")  # fmt: skip


class Dom(HTMLParser):
    """Elements with an id or data-* attributes, their text, and links."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[dict[str, str]] = []
        self.elements: list[dict[str, str]] = []
        self.links: list[str] = []
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        a["_tag"], a["_text"] = tag, ""
        if tag == "a":
            self.links.append(a.get("href", ""))
        for name in ("src", "href"):
            if re.match(r"^[a-z]+://", a.get(name, "")):
                self.external.append(a[name])
        if tag == "script" or (tag == "link" and a.get("rel") == "stylesheet"):
            self.external.append(tag)
        if tag not in ("br", "meta", "rect", "line", "input", "img"):
            self.stack.append(a)
        self.elements.append(a)

    def handle_endtag(self, tag: str) -> None:
        if self.stack and tag not in ("br", "meta", "rect", "line"):
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        for a in self.stack:
            a["_text"] += data

    def find(self, **attrs: str) -> list[dict[str, str]]:
        return [e for e in self.elements if all(e.get(k) == v for k, v in attrs.items())]


def browse(url: str, tmp_path: Path, shot: Path | None = None) -> Dom:
    browser = _chromium()
    assert browser is not None, "GATEKEEPER_REQUIRE_BROWSER is set but chromium is not installed"
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert dom.returncode == 0, dom.stderr
    if shot is not None:
        subprocess.run([*base, f"--screenshot={shot}", "--window-size=1280,1700", url],
                       capture_output=True, timeout=120, check=False)  # fmt: skip
        assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = Dom()
    page.feed(dom.stdout)
    return page


needs_browser = pytest.mark.skipif(
    _chromium() is None and not os.environ.get("GATEKEEPER_REQUIRE_BROWSER"),
    reason="chromium is not installed (set GATEKEEPER_REQUIRE_BROWSER to insist)",
)


@needs_browser
def test_the_dashboard_in_a_real_browser(history: History, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "reports").mkdir(parents=True)
    for name in "CD":  # reports by the documented convention: reports/<run-id>.html
        proc = gk("check", "--repo", str(history.repo), "--base", "main", "--format", "html",
                  "-o", str(site / "reports" / f"{history.id(name)}.html"),
                  history.runs[name]["branch"])  # fmt: skip
        assert proc.returncode == (1 if name == "C" else 0), proc.stderr
    proc = gk("stats", "--repo", str(history.repo), "--html", "-o", str(site / "stats.html"))
    assert proc.returncode == 0, proc.stderr
    shot = tmp_path / "dashboard.png"
    page = browse((site / "stats.html").as_uri(), tmp_path, shot)
    if os.environ.get("GATEKEEPER_DASHBOARD_PNG"):  # how docs/dashboard.png is made
        shutil.copyfile(shot, os.environ["GATEKEEPER_DASHBOARD_PNG"])
    assert page.external == [], page.external  # self-contained: nothing fetched, no script
    figures = {e["data-figure"]: int(e["data-value"]) for e in page.find(_tag="div")
               if e.get("data-figure")}  # fmt: skip
    assert figures == EXPECTED
    today = datetime.now(UTC).date().isoformat()
    (day,) = page.find(_tag="tr", **{"data-day": today})
    cells = [e for e in page.elements if e["_tag"] == "td" and e.get("data-figure")]
    by_day = {e["data-figure"]: int(e["_text"]) for e in cells[: len(EXPECTED)]}
    assert by_day == EXPECTED
    rows = {e["data-run-id"]: e for e in page.find(_tag="tr") if e.get("data-run-id")}
    assert {rows[history.id(n)]["data-state"] for n in "ABCD"} == {
        "accepted", "discarded", "finished"}  # fmt: skip
    assert "unclaimed-change" in rows[history.id("C")]["_text"]
    assert sorted(page.links) == sorted(f"reports/{history.id(n)}.html" for n in "CD")
    # The charts: runs over time, escalations by kind and decision, the most denied.
    bars = {(e.get("data-label"), e.get("data-total")) for e in page.find(_tag="g")}
    assert (today, "4") in bars
    assert {("write", "2"), ("secret", "1"), ("external-write", "1")} <= bars
    assert ("README.md", "2") in bars and ("git push origin main", "1") in bars
    # The report a row links to, in the same browser: every finding and decision point.
    report = browse((site / "reports" / f"{history.id('C')}.html").as_uri(), tmp_path)
    kinds = {e["data-kind"] for e in report.find(_tag="tr") if e.get("data-kind")}
    assert {"unclaimed-change", "uncovered-commit"} <= kinds
    (esc,) = [e for e in report.find(_tag="tr") if e.get("data-id")]
    assert (esc["data-kind"], esc["data-decision"]) == ("write", "pending")
    assert "README.md" in esc["_text"] and "no signed decision" in esc["_text"]
    denied = [e["_text"] for e in report.elements if e.get("class") == "denied-writes"]
    assert denied == ["README.md"]
    # C's long command is shown short, its full text folded away.
    folds = [e for e in report.elements if e.get("class") == "fold"]
    assert any(LONG in e["_text"] and "…" in e["_text"] for e in folds)
