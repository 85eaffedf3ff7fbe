"""Real agent CLIs, installed from their registry by the test set-up, under `--profile`.

Each agent talks to a scripted model server on the host's loopback (granted for the run and
bridged into the sandbox); the server tells it to make one edit. The worktrees are in their
default place under HOME and the repository is only `gatekeeper init`-ed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from model_server import ModelServer

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json

ROOT = Path(__file__).resolve().parent.parent
AGENTS = Path(os.environ.get("GATEKEEPER_AGENTS_DIR") or ROOT / ".agents")
REQUIRED = bool(os.environ.get("GATEKEEPER_REQUIRE_AGENTS"))
API_KEY = "sk-ant-api03-gatekeeper-test-key-0123456789abcdef"

pytestmark = [needs_bwrap, pytest.mark.sandbox, pytest.mark.slow]


def agent(name: str) -> Path:
    path = AGENTS / "npm" / "node_modules" / ".bin" / name
    if not path.exists():
        if REQUIRED:
            pytest.fail(f"{path} is missing: scripts/test.sh installs the agents")
        pytest.skip(f"{name} is not installed (GATEKEEPER_AGENTS_DIR={AGENTS})")
    return path


def assert_secret_nowhere(repo: Path, key: str, *texts: str) -> None:
    for text in texts:
        assert key not in text
    for ref in git(repo, "for-each-ref", "--format=%(refname)").split():
        assert key not in git(repo, "log", "-p", "--format=%B", ref)
    notes = git(repo, "log", "-p", "refs/notes/gatekeeper")
    assert key not in notes


def judge_branch(repo: Path, branch: str, key: str) -> None:
    for fmt in ("text", "json", "md", "html"):
        proc = gk("check", "--repo", str(repo), "--base", "main", "--format", fmt, branch)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert key not in proc.stdout + proc.stderr


@pytest.fixture
def model() -> ModelServer:
    server = ModelServer("printf 'fixed\\n' > src/app.py")
    yield server
    server.stop()


def test_claude_code_edits_in_the_sandbox(tmp_path: Path, key: Path, model: ModelServer) -> None:
    claude = agent("claude")
    repo = make_repo(tmp_path / "repo")
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{model.port}"}
    proc, data = run_json(
        repo, str(claude), "-p", f"fix src/app.py (use the key {API_KEY})",
        extra=["--profile", "claude-code", "--grant", f"network=localhost:{model.port}"],
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [c["path"] for c in data["changes"]] == ["src/app.py"]
    assert git(repo, "show", f"{data['commit']}:src/app.py") == "fixed\n"
    posts = [r for r in model.requests if r["method"] == "POST"]
    keys = [{k.lower(): v for k, v in r["headers"].items()}.get("x-api-key") for r in posts]
    assert posts and keys == [API_KEY] * len(posts)
    receipt = json.loads(
        gk("receipt", "show", data["branch"], "--repo", str(repo), "--json").stdout
    )
    predicate = receipt[0]["statement"]["predicate"] if isinstance(receipt, list) else receipt
    requests = [r for r in data["network"] if r.get("port") == model.port]
    assert requests and all(r["decision"] == "allow" for r in requests)
    assert {"secret=ANTHROPIC_API_KEY", "network=api.anthropic.com:443"} <= set(data["grants"])
    assert_secret_nowhere(repo, API_KEY, proc.stdout, proc.stderr, json.dumps(predicate))
    judge_branch(repo, data["branch"], API_KEY)


CODEX_PROFILE = """\
version: 1
name: codex-local
description: Codex CLI against a model server on this machine
program: codex
network: [{{host: localhost, ports: [{port}]}}]
secrets: [OPENAI_API_KEY]
env: {{CODEX_HOME: "{{home}}/.codex"}}
home_files:
  .codex/config.toml: |
    model = "scripted"
    model_provider = "local"
    sandbox_mode = "danger-full-access"
    approval_policy = "never"
    check_for_update_on_startup = false
    [model_providers.local]
    name = "local"
    base_url = "http://127.0.0.1:{port}/v1"
    env_key = "OPENAI_API_KEY"
    wire_api = "responses"
"""


def test_codex_cli_edits_in_the_sandbox_with_a_user_profile(
    tmp_path: Path, key: Path, model: ModelServer
) -> None:
    codex = agent("codex")
    repo = make_repo(tmp_path / "repo")
    profile = tmp_path / "codex-local.yaml"
    profile.write_text(CODEX_PROFILE.format(port=model.port))
    proc, data = run_json(
        repo, str(codex), "exec", "--skip-git-repo-check", f"fix src/app.py, key {API_KEY}",
        extra=["--profile", str(profile)], env={"OPENAI_API_KEY": API_KEY},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [c["path"] for c in data["changes"]] == ["src/app.py"]
    assert git(repo, "show", f"{data['commit']}:src/app.py") == "fixed\n"
    posts = [r for r in model.requests if r["method"] == "POST"]
    auth = [{k.lower(): v for k, v in r["headers"].items()}.get("authorization") for r in posts]
    assert posts and auth == [f"Bearer {API_KEY}"] * len(posts)
    assert any(r.get("port") == model.port for r in data["network"])
    assert_secret_nowhere(repo, API_KEY, proc.stdout, proc.stderr)
    judge_branch(repo, data["branch"], API_KEY)


def test_agents_are_installed_where_the_test_script_puts_them() -> None:
    if not REQUIRED:
        pytest.skip("only where scripts/test.sh installed the agents")
    for name in ("claude", "codex"):
        assert (AGENTS / "npm" / "node_modules" / ".bin" / name).exists()
    assert shutil.which("node")


def test_aider_edits_in_the_sandbox_when_installed(tmp_path: Path, key: Path) -> None:
    """aider is large (a Python environment of several hundred MB): run where it is installed
    (GATEKEEPER_AGENTS_DIR/aider/bin/aider, e.g. `python3 -m venv .agents/aider &&
    .agents/aider/bin/pip install aider-chat`)."""
    aider = AGENTS / "aider" / "bin" / "aider"
    if not aider.exists():
        pytest.skip(f"aider is not installed at {aider}")
    server = ModelServer("true", whole_file=("src/app.py", "fixed\n"))
    try:
        repo = make_repo(tmp_path / "repo")
        proc, data = run_json(
            repo, str(aider), "--model", "openai/scripted", "--no-show-model-warnings",
            "--openai-api-key", API_KEY, "--message", "fix src/app.py", "src/app.py",
            extra=["--profile", "aider", "--grant", f"network=localhost:{server.port}"],
            env={"OPENAI_API_KEY": API_KEY, "OPENAI_API_BASE": f"http://127.0.0.1:{server.port}/v1"},
        )  # fmt: skip
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    assert [c["path"] for c in data["changes"]] == ["src/app.py"]
    assert git(repo, "show", f"{data['commit']}:src/app.py") == "fixed\n"
    assert all(n["path"].startswith(".aider") for n in data["not_committed"])
    assert_secret_nowhere(repo, API_KEY, proc.stdout)
    judge_branch(repo, data["branch"], API_KEY)
