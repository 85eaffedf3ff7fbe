"""Every report format for a pass and a block, produced by the real `gatekeeper check`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fixtures.gate_receipts import commit_files, receipted_commit

from gatekeeper.gate.findings import RULES, Kind
from gatekeeper.receipt.keys import load_key
from gatekeeper.report import ReportFormat

from conftest import git, gk


@dataclass
class Scenario:
    repo: Path
    main: str
    agent: str
    human: str | None

    def check(self, *args: str) -> subprocess.CompletedProcess[str]:
        return gk("check", "--repo", str(self.repo), "--base", "main", *args, "agent/1")


def _scenario(repo: Path, block: bool) -> Scenario:
    main = git(repo, "rev-parse", "main").strip()
    agent = receipted_commit(
        repo, {"docs/x_y|z.md": "# notes\n", "src/feature.py": "def f():\n    return 1\n"}
    )
    human = None
    if block:
        human = commit_files(
            repo, {"src/app.py": "print('<b>edited</b> by hand')\n"}, message="human <edit>"
        )
    return Scenario(repo, main, agent, human)


@pytest.fixture
def passing(repo: Path) -> Scenario:
    return _scenario(repo, block=False)


@pytest.fixture
def blocking(repo: Path) -> Scenario:
    return _scenario(repo, block=True)


def esc(text: str) -> str:
    """What the Markdown report does to text in a table cell."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]~|#])", r"\\\1", text)


def blob(repo: Path, rev: str) -> str:
    return git(repo, "rev-parse", rev).strip()[:12]


def receipt_rows(s: Scenario) -> list[str]:
    key = load_key().public
    return [
        "<details>",
        "<summary>Receipts (1 verified)</summary>",
        "",
        "| Run | Command | Ended | Checks | Changes | Covers | Signed by |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| run-{s.agent[:8]} | sh -c 'edit files' | exit 0 | 1/1 passed | 2 | `{s.agent[:12]}` | "
        f"{esc(key.keyid + ' ' + key.comment)} |",
        "",
        "| Commit | Subject | Receipt |",
        "| --- | --- | --- |",
        f"| `{s.agent[:12]}` | agent work | run-{s.agent[:8]} |",
    ]


# --- Markdown: exact text ----------------------------------------------------------------------


def test_markdown_for_a_pass(passing: Scenario) -> None:
    proc = passing.check("--format", "md")
    assert proc.returncode == 0, proc.stderr
    s = passing
    expected = [
        "<!-- gatekeeper-report -->",
        "## ✅ gatekeeper: PASS",
        "",
        f"**agent/1** (`{s.agent[:12]}`) into **main** (`{s.main[:12]}`): 0 finding(s), "
        "1 receipt(s) verified, 1 commit(s), 2 changed path(s).",
        "",
        "Every change is covered by a verified receipt and allowed by the target branch's policy.",
        "",
        *receipt_rows(s),
        "",
        "</details>",
    ]
    assert proc.stdout == "\n".join(expected) + "\n"


def test_markdown_for_a_block(blocking: Scenario) -> None:
    proc = blocking.check("--format", "md")
    assert proc.returncode == 1, proc.stderr
    s = blocking
    assert s.human is not None
    old, new = blob(s.repo, "main:src/app.py"), blob(s.repo, f"{s.human}:src/app.py")
    rows = receipt_rows(s) + [f"| `{s.human[:12]}` | human &lt;edit&gt; | none |"]
    expected = [
        "<!-- gatekeeper-report -->",
        "## ❌ gatekeeper: BLOCK",
        "",
        f"**agent/1** (`{s.human[:12]}`) into **main** (`{s.main[:12]}`): 2 finding(s), "
        "1 receipt(s) verified, 2 commit(s), 3 changed path(s).",
        "",
        "| Kind | Path | Commit | Message |",
        "| --- | --- | --- | --- |",
        f"| `unclaimed-change` | src/app.py | `{s.human[:12]}` | 'src/app.py' is modified (file "
        f"100644 {old} -&gt; file 100644 {new}) in the diff, and no verified receipt claims it |",
        f"| `uncovered-commit` |  | `{s.human[:12]}` | no receipt covers commit {s.human[:12]} "
        "('human &lt;edit&gt;'): it was not made by a receipted run, or was changed after one |",
        "",
        *rows,
        "",
        "</details>",
    ]
    assert proc.stdout == "\n".join(expected) + "\n"


def test_markdown_escapes_table_breaking_text(repo: Path) -> None:
    commit_files(
        repo, {"a|b_c`d.md": "x\n"}, branch="agent/1", start="main", message="pipe | and *stars*"
    )
    proc = gk("check", "--repo", str(repo), "--base", "main", "--format", "md", "agent/1")
    assert proc.returncode == 1
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| `unclaimed-change`"))
    assert "| a\\|b\\_c\\`d.md |" in row
    assert row.count(" | ") == 3  # still four cells
    assert "pipe \\| and \\*stars\\*" in proc.stdout


# --- JSON ---------------------------------------------------------------------------------------


def test_json_has_the_design_shape(passing: Scenario, tmp_path: Path) -> None:
    proc = passing.check("--format", "json")
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    assert data["verdict"] == "pass" and data["receipts_verified"] == 1 and data["findings"] == []
    assert data["receipts"][0]["covers"] == [passing.agent]
    assert "gatekeeper: PASS" in proc.stderr  # the human summary goes to stderr


def test_json_for_a_block_lists_each_finding(blocking: Scenario) -> None:
    proc = blocking.check("--format", "json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["verdict"] == "block"
    assert data["receipts_verified"] == 1
    assert [(f["kind"], f["path"], f["commit"]) for f in data["findings"]] == [
        ("unclaimed-change", "src/app.py", blocking.human),
        ("uncovered-commit", None, blocking.human),
    ]
    assert all(set(f) >= {"kind", "path", "commit", "message"} for f in data["findings"])


# --- text ---------------------------------------------------------------------------------------


def test_text_for_a_pass_and_a_block(passing: Scenario) -> None:
    proc = passing.check()
    assert proc.returncode == 0
    assert proc.stdout.startswith("verdict: PASS\n")
    assert "receipts verified: 1" in proc.stdout
    commit_files(passing.repo, {"src/app.py": "edit\n"}, message="human")
    proc = passing.check()
    assert proc.returncode == 1
    assert proc.stdout.startswith("verdict: BLOCK\n")
    assert "[uncovered-commit]" in proc.stdout and "[unclaimed-change]" in proc.stdout


def test_report_to_a_file_and_summary_to_stderr(blocking: Scenario, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = blocking.check("--format", "json", "-o", str(out))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert json.loads(out.read_text())["verdict"] == "block"
    assert "gatekeeper: BLOCK agent/1 into main" in proc.stderr
    assert "[uncovered-commit]" in proc.stderr


def test_bad_usage_exits_2(repo: Path) -> None:
    assert gk("check", "--repo", str(repo), "--base", "no-such-branch", "HEAD").returncode == 2
    assert gk("check", "--repo", str(repo), "--format", "pdf", "HEAD").returncode == 2
    assert gk("check", "--repo", str(repo), "--base", "main", "nope").returncode == 2


def test_every_format_renders(passing: Scenario) -> None:
    for fmt in ReportFormat:
        proc = passing.check("--format", fmt.value)
        assert proc.returncode == 0, (fmt, proc.stderr)
        assert proc.stdout.strip(), fmt


# --- SARIF --------------------------------------------------------------------------------------

STABLE_IDS = {
    "no-receipt": "GK001",
    "malformed-receipt": "GK002",
    "bad-signature": "GK003",
    "untrusted-key": "GK004",
    "base-mismatch": "GK005",
    "result-mismatch": "GK006",
    "unclaimed-change": "GK007",
    "missing-change": "GK008",
    "change-differs": "GK009",
    "unapproved-write": "GK010",
    "protected-path": "GK011",
    "policy-mismatch": "GK012",
    "uncovered-commit": "GK013",
    "internal-error": "GK014",
    "untrusted-signature": "GK015",
    "change-too-large": "GK016",
}


def test_rule_ids_are_stable() -> None:
    assert {k.value: r.id for k, r in RULES.items()} == STABLE_IDS
    assert set(RULES) == set(Kind)


def test_sarif_for_a_pass_and_a_block(blocking: Scenario) -> None:
    proc = blocking.check("--format", "sarif")
    assert proc.returncode == 1
    log = json.loads(proc.stdout)
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert {r["name"]: r["id"] for r in rules} == STABLE_IDS
    results = run["results"]
    assert [r["ruleId"] for r in results] == ["GK007", "GK013"]
    for result in results:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] == "error"
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert result["partialFingerprints"]
    assert results[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "src/app.py"
    assert run["properties"]["verdict"] == "block"

    git(blocking.repo, "reset", "-q", "--hard", blocking.agent)
    log = json.loads(blocking.check("--format", "sarif").stdout)
    assert log["runs"][0]["results"] == []
    assert log["runs"][0]["properties"]["verdict"] == "pass"


def test_sarif_uris_are_encoded(repo: Path) -> None:
    commit_files(repo, {"dir with space/ü\nx.txt": "x\n"}, branch="agent/1", start="main")
    log = json.loads(
        gk("check", "--repo", str(repo), "--base", "main", "--format", "sarif", "agent/1").stdout
    )
    uris = [
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        for r in log["runs"][0]["results"]
    ]
    assert "dir%20with%20space/%C3%BC%0Ax.txt" in uris


# --- HTML ---------------------------------------------------------------------------------------


class Page(HTMLParser):
    """The parts of the HTML report a reader relies on."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.verdict: str | None = None
        self.finding_rows: list[list[str]] = []
        self.cells: list[str] | None = None
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.sections: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        self.stack.append((tag, a))
        if tag == "tr" and "finding" in (a.get("class") or ""):
            self.cells = []
        if tag == "td" and self.cells is not None:
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            open_tag, _ = self.stack.pop()
            if open_tag == tag:
                break
        if tag == "tr" and self.cells is not None:
            self.finding_rows.append([c.strip() for c in self.cells])
            self.cells = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.stack and self.stack[-1][1].get("id") == "verdict":
            self.verdict = data.strip()
        if self.cells is not None and self.cells:
            self.cells[-1] += data
        for _, attrs in self.stack:
            if "data-path" in attrs:
                self.sections.setdefault(attrs["data-path"] or "", []).append(data)

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    return page


def assert_self_contained(page: Page) -> None:
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "iframe", "img", "object", "embed"), tag
        for name in ("src", "href"):
            assert not attrs.get(name), (tag, attrs)


def test_html_for_a_pass(passing: Scenario) -> None:
    proc = passing.check("--format", "html")
    assert proc.returncode == 0
    page = parse(proc.stdout)
    assert page.verdict == "PASS"
    assert page.finding_rows == []
    assert_self_contained(page)
    text = page.all_text
    assert "sh -c 'edit files'" in text  # the run's command, quoted as a shell would
    assert "pytest -q" in text  # and its checks
    feature = "".join(page.sections["src/feature.py"])
    assert "+def f():" in feature and "+    return 1" in feature  # the real diff's hunk
    assert f"run-{passing.agent[:8]}" in feature  # beside the receipt's claim


def test_html_for_a_block_shows_every_finding(blocking: Scenario, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    proc = blocking.check("--format", "html", "-o", str(out))
    assert proc.returncode == 1
    html = out.read_text()
    page = parse(html)
    assert page.verdict == "BLOCK"
    data = json.loads(blocking.check("--format", "json").stdout)
    assert [row[0] for row in page.finding_rows] == [f["kind"] for f in data["findings"]]
    assert [row[3] for row in page.finding_rows] == [f["message"] for f in data["findings"]]
    assert_self_contained(page)
    app = "".join(page.sections["src/app.py"])
    assert "No receipt claims this path." in app
    assert "+print('<b>edited</b> by hand')" in app  # shown as text: autoescaped
    assert "<b>edited</b>" not in html


def test_html_escapes_hostile_names(repo: Path) -> None:
    name = "<script>alert(1)</script>.txt"
    commit_files(
        repo,
        {name: "<img src=x onerror=alert(1)>\n"},
        branch="agent/1",
        start="main",
        message="<script>alert(2)</script>",
    )
    proc = gk("check", "--repo", str(repo), "--base", "main", "--format", "html", "agent/1")
    page = parse(proc.stdout)
    assert_self_contained(page)
    assert name in page.all_text
    assert "+<img src=x onerror=alert(1)>" in page.all_text


def _chromium() -> str | None:
    return (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )


@pytest.mark.slow
@pytest.mark.skipif(
    _chromium() is None and not os.environ.get("GATEKEEPER_REQUIRE_BROWSER"),
    reason="chromium is not installed (set GATEKEEPER_REQUIRE_BROWSER to insist)",
)
def test_html_renders_in_a_real_browser(blocking: Scenario, tmp_path: Path) -> None:
    browser = _chromium()
    assert browser is not None, "GATEKEEPER_REQUIRE_BROWSER is set but chromium is not installed"
    out = tmp_path / "report.html"
    blocking.check("--format", "html", "-o", str(out))
    base = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [*base, "--dump-dom", out.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr
    page = parse(dom.stdout)
    assert page.verdict == "BLOCK"
    assert {row[0] for row in page.finding_rows} == {"unclaimed-change", "uncovered-commit"}
    shot = tmp_path / "report.png"
    subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1200,1600", out.as_uri()],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_defaults_are_the_remote_default_branch_and_this_worktrees_head(
    passing: Scenario, tmp_path: Path
) -> None:
    git(passing.repo, "checkout", "-q", "main")  # the clone's origin/HEAD follows it
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(passing.repo), str(clone))
    git(
        clone,
        "fetch",
        "-q",
        "origin",
        "+refs/notes/gatekeeper:refs/notes/remotes/origin/gatekeeper",
    )
    worktree = tmp_path / "wt"
    git(clone, "worktree", "add", "-q", str(worktree), "origin/agent/1")
    proc = gk("check", "--format", "json", cwd=worktree)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["target"] == {"name": "origin/main", "commit": passing.main}
    assert data["head"]["commit"] == passing.agent


def test_every_format_survives_a_non_utf8_path(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "agent/1")
    with open(os.path.join(os.fsencode(repo), b"raw\xffname.txt"), "wb") as fh:
        fh.write(b"\xff\xfe not text\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "odd bytes")
    for fmt in ReportFormat:
        proc = gk("check", "--repo", str(repo), "--base", "main", "--format", fmt.value, "agent/1")
        assert proc.returncode == 1, (fmt, proc.stderr)
        assert "raw" in proc.stdout, fmt
