from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import PolicyError
from gatekeeper.policy.model import Policy, builtin_policy, load_policy_file, parse_policy
from gatekeeper.policy.patterns import matches
from gatekeeper.resources import resource_path


@pytest.mark.parametrize("name", ["default", "docs-only", "example"])
def test_shipped_policies_load(name: str) -> None:
    loaded = builtin_policy(name)
    assert isinstance(loaded.policy, Policy)
    assert (resource_path("policies") / f"{name}.yaml").is_file()


def test_unknown_key_is_an_error_naming_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("paths:\n  read: ['**']\n  wirte: ['src/**']\n")
    with pytest.raises(PolicyError, match=r"p\.yaml.*\n.*paths\.wirte: unknown key"):
        load_policy_file(path)


def test_wrong_type_names_field_and_expectation() -> None:
    with pytest.raises(PolicyError, match=r"network\.localhost: .*allow.*ask.*deny"):
        parse_policy(b"network: {localhost: maybe}\n", "x.yaml")


def test_yaml_syntax_error_gives_line() -> None:
    with pytest.raises(PolicyError, match=r"x\.yaml: not valid YAML at line 3"):
        parse_policy(b"paths:\n  read: [\n", "x.yaml")


@pytest.mark.parametrize(
    "bad, reason",
    [("/etc/**", "absolute"), ("../outside", r"'\.\.'"), ("src/../../x", r"'\.\.'"),
     (".git/hooks", r"\.git"), ("", "empty")],
)  # fmt: skip
def test_paths_must_stay_in_the_repository(bad: str, reason: str) -> None:
    with pytest.raises(PolicyError, match=reason):
        parse_policy(f"paths: {{write: [{bad!r}]}}\n".encode(), "x.yaml")


def test_json_is_valid_yaml() -> None:
    policy = parse_policy(b'{"paths": {"read": ["**"], "write": ["docs/**"]}}', "p.json")
    assert policy.paths.write == ["docs/**"]


def test_empty_policy_is_an_error() -> None:
    with pytest.raises(PolicyError, match="empty"):
        parse_policy(b"\n", "x.yaml")


def test_grant_host_patterns() -> None:
    policy = parse_policy(b"network: {grants: [{host: '*.example.com', ports: [443]}]}", "x")
    assert policy.network.grants[0].host == "*.example.com"
    with pytest.raises(PolicyError, match="not a host name"):
        parse_policy(b"network: {grants: [{host: 'exa mple'}]}", "x")


@pytest.mark.parametrize(
    "pattern, path, expected",
    [("docs/**", "docs/a/b.md", True), ("docs/**", "docs", True), ("docs/**", "docsx/a", False),
     ("docs", "docs/a.md", True), ("*.md", "README.md", True), ("*.md", "a/README.md", False),
     ("**/*.md", "a/b/c.md", True), ("**/*.md", "c.md", True), ("src/*.py", "src/a/b.py", False),
     ("**", "anything/at/all", True), ("a/**/b", "a/x/y/b", True)],
)  # fmt: skip
def test_pattern_semantics(pattern: str, path: str, expected: bool) -> None:
    assert matches(pattern, path) is expected
