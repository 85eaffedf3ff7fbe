"""Files that run code when a repository is opened are protected; rules on builtins warn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fixtures.gate_receipts import git_dir_of, receipted_commit

from gatekeeper.gate import judge
from gatekeeper.policy.model import parse_policy, policy_warnings

from conftest import git, make_repo, needs_bwrap
from helpers import run_json

OPEN_TO_RUN = [
    ".vscode/settings.json",
    ".vscode/tasks.json",
    ".vscode/launch.json",
    ".idea/workspace.xml",
    "project.code-workspace",
    ".mcp.json",
    ".claude/commands/deploy.md",
    ".claude/agents/helper.md",
    ".claude/settings.json",
    ".codex/config.toml",
    ".cursor/mcp.json",
    ".devcontainer/devcontainer.json",
    ".devcontainer.json",
    ".envrc",
    "src/.envrc",
    ".pre-commit-config.yaml",
    ".aider.conf.yml",
    # Pipelines of other forges and CI services, hook managers' other file names, LFS.
    ".forgejo/workflows/ci.yml",
    ".gitea/workflows/ci.yml",
    ".woodpecker/ci.yml",
    ".travis.yml",
    "azure-pipelines.yml",
    "bitbucket-pipelines.yml",
    ".drone.yml",
    ".buildkite/pipeline.yml",
    ".cirrus.yml",
    "appveyor.yml",
    ".gitpod.yml",
    "lefthook.yaml",
    "lefthook-local.yml",
    ".config/lefthook.yml",
    ".zed/tasks.json",
    ".lfsconfig",
]

BROAD = "version: 1\npaths:\n  write: ['**']\n"


@pytest.mark.parametrize("path", OPEN_TO_RUN)
def test_the_gate_blocks_files_that_run_code_when_the_repository_is_opened(
    tmp_path: Path, key: Path, path: str
) -> None:
    repo = make_repo(tmp_path / "r", policy=BROAD)
    receipted_commit(repo, {path: "{}\n"})
    git_dir = git_dir_of(repo)
    result = judge(git_dir, git(repo, "rev-parse", "main").strip(),
                   git(repo, "rev-parse", "agent/1").strip(), target_name="main",
                   head_name="agent/1")  # fmt: skip
    assert {(f.kind.value, f.path) for f in result.findings} == {("protected-path", path)}
    assert result.verdict.value == "block"


def test_naming_a_protected_folder_opens_it(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy="version: 1\npaths:\n  write: ['**', '.vscode/**']\n")
    receipted_commit(repo, {".vscode/settings.json": "{}\n"})
    result = judge(git_dir_of(repo), git(repo, "rev-parse", "main").strip(),
                   git(repo, "rev-parse", "agent/1").strip(), target_name="main",
                   head_name="agent/1")  # fmt: skip
    assert result.findings == [] and result.verdict.value == "pass"


@needs_bwrap
def test_an_agent_cannot_plant_editor_or_agent_settings(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy=BROAD, files={"src/a.py": "a\n"})
    script = (
        "mkdir -p .vscode .claude/commands; echo '{}' > .vscode/tasks.json; "
        "echo x > .claude/commands/x.md; echo '{}' > .mcp.json; echo 'eval x' > .envrc; "
        "echo b > src/a.py; exit 0"
    )
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert "src/a.py" in files
    for path in (".vscode/tasks.json", ".claude/commands/x.md", ".mcp.json", ".envrc"):
        assert path not in files
    assert {".vscode", ".claude", ".mcp.json", ".envrc"} <= {
        p.split("/")[0] for p in data["denied_writes"]
    }


def _run_beside_a_workflow(
    tmp_path: Path, folder: str, opened: str, script: str
) -> tuple[Path, dict[str, Any]]:
    """A run of script in a repository holding FOLDER/workflows/ci.yml, whose policy writes
    everything and names opened as well."""
    repo = make_repo(tmp_path / "r", files={f"{folder}/workflows/ci.yml": "on: push\n"},
                     policy=f"version: 1\npaths:\n  write: ['**', '{opened}']\n")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0 and data is not None, proc.stderr
    return repo, data


@needs_bwrap
def test_a_protected_file_the_policy_names_is_writable_and_nothing_beside_it(
    tmp_path: Path, key: Path
) -> None:
    """`.github/**` is protected and the policy names `.github/workflows/ci.yml` in its write
    set: the agent may rewrite that file (the folders around it stayed read-only, so it got
    EROFS, and the receipt called the write allowed); a new file beside it is still refused
    and recorded."""
    repo, data = _run_beside_a_workflow(tmp_path, ".github", ".github/workflows/ci.yml",
                                        "echo 'on: pull_request' > .github/workflows/ci.yml && "
                                        "(echo x > .github/workflows/new.yml; "
                                        "echo y > .github/other.yml; exit 0)")  # fmt: skip
    assert git(repo, "show", f"{data['commit']}:.github/workflows/ci.yml") == "on: pull_request\n"
    assert [c["path"] for c in data["changes"]] == [".github/workflows/ci.yml"]
    assert sorted(data["denied_writes"]) == [".github/other.yml", ".github/workflows/new.yml"]


@needs_bwrap
def test_a_case_variant_of_a_protected_folder_named_literally_is_not_mounted_writable(
    tmp_path: Path, key: Path
) -> None:
    """`.GitHub/workflows` named in the write set: the policy refuses the protected files in
    it (a case-insensitive checkout opens them as `.github/...`), so no writable mount may
    cover them, or a name swapped under the supervisor's check could be made there."""
    # access(2) answers EROFS for a read-only mount, and the supervisor does not watch it.
    repo, data = _run_beside_a_workflow(tmp_path, ".GitHub", ".GitHub/workflows",
                                        "for d in .GitHub .GitHub/workflows "
                                        ".GitHub/workflows/ci.yml; do if [ -w $d ]; then "
                                        "echo $d rw; else echo $d ro; fi; done > m.txt")  # fmt: skip
    assert git(repo, "show", f"{data['commit']}:m.txt").split("\n")[:3] == [
        ".GitHub ro", ".GitHub/workflows ro", ".GitHub/workflows/ci.yml ro"]  # fmt: skip


def test_rules_on_shell_builtins_warn_with_the_reason() -> None:
    policy = parse_policy(
        b"commands: {deny: ['cd /', 'source env.sh', 'rm -rf'], ask: ['echo hi', 'exec']}\n", "t"
    )
    warnings = policy_warnings(policy)
    assert len(warnings) == 4
    assert any("'cd /' can never match" in w and "shell builtin" in w for w in warnings)
    assert any("'source env.sh' can never match" in w for w in warnings)
    assert any("'exec' can never match" in w for w in warnings)
    assert any("'echo hi' matches only when `echo` is run as a program" in w for w in warnings)
    assert not any("rm -rf" in w for w in warnings)


@needs_bwrap
def test_run_prints_the_builtin_warning(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy="version: 1\npaths: {write: ['**']}\n"
                     "commands: {deny: ['source secrets.sh']}\n")  # fmt: skip
    proc, _ = run_json(repo, "true")
    assert proc.returncode == 0
    assert "warning" in proc.stderr and "'source secrets.sh' can never match" in proc.stderr


def test_a_registry_entry_is_one_host_never_a_pattern() -> None:
    from gatekeeper.errors import PolicyError

    with pytest.raises(PolicyError, match=r"registries.*a registry is one host name"):
        parse_policy(b"network: {registries: ['*.test']}\n", "t")
    assert parse_policy(b"network: {registries: ['pkgs.example.com']}\n", "t")


@pytest.mark.parametrize(
    "path",
    [".VSCODE/tasks.json", ".Claude/settings.json", ".ENVRC", "src/.EnvRc", ".GITATTRIBUTES",
     ".vs\u200ccode/settings.json", ".envrc.", ".Github/workflows/ci.yml"],
)  # fmt: skip
def test_protected_paths_are_matched_as_a_case_insensitive_checkout_opens_them(
    tmp_path: Path, key: Path, path: str
) -> None:
    repo = make_repo(tmp_path / "r", policy=BROAD)
    receipted_commit(repo, {path: "{}\n"})
    result = judge(git_dir_of(repo), git(repo, "rev-parse", "main").strip(),
                   git(repo, "rev-parse", "agent/1").strip(), target_name="main",
                   head_name="agent/1")  # fmt: skip
    assert {(f.kind.value, f.path) for f in result.findings} == {("protected-path", path)}


@needs_bwrap
def test_an_agent_cannot_plant_case_variants_of_protected_files(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "r", policy=BROAD, files={"src/a.py": "a\n"})
    script = ("mkdir -p .VSCODE .Claude && echo '{}' > .VSCODE/tasks.json && "
              "echo '{}' > .Claude/settings.json && echo 'echo pwned' > .ENVRC; "
              "echo b > src/a.py; exit 0")  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    files = git(repo, "ls-tree", "-r", "--name-only", data["commit"]).split()
    assert "src/a.py" in files
    assert not [f for f in files if f.lower().startswith((".vscode", ".claude", ".envrc"))]
    result = judge(git_dir_of(repo), git(repo, "rev-parse", "main").strip(), data["commit"],
                   target_name="main", head_name=data["branch"])  # fmt: skip
    assert result.verdict.value == "pass"


def test_git_segments_in_any_case_are_never_writable() -> None:
    from gatekeeper.policy.patterns import has_git_segment, is_write_allowed

    for path in (".GIT/config", "sub/.Git/hooks/x", ".git./x", ".git /x"):
        assert has_git_segment(path)
        assert not is_write_allowed(["**"], [], path)
    assert not has_git_segment(".github/x") and not has_git_segment("x.git/y")


def test_thousands_of_patterns_are_compiled_once_per_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of write and protected patterns (bulk approvals resumed into a run) are
    compiled a few times per list, never once per path asked: past the cache of compiled
    patterns that would be every pattern again for each of the worktree's paths."""
    import re

    from gatekeeper.policy import patterns

    write = tuple(f"w{i}/**" for i in range(3000)) + (".github/workflows/**",)
    protected = tuple(f"p{i}/**" for i in range(3000)) + (".github/**",)
    compiled: list[str] = []
    compile_ = re.compile
    monkeypatch.setattr(re, "compile", lambda p, *a: compiled.append(p) or compile_(p, *a))
    allowed = patterns.write_rule(write, protected)
    covers = patterns.subtree_rule(write)
    explicit = patterns.explicit_rule(write, protected)
    assert [allowed(f"p{i}/x") for i in range(0, 3000, 3)] == [False] * 1000
    assert allowed(".github/workflows/ci.yml") and explicit(".github/workflows/ci.yml")
    assert [covers(f"w{i}") for i in range(0, 3000, 3)] == [True] * 1000
    assert not covers("p1") and not explicit("p1/x")
    assert len(compiled) < 20
