"""Property-based tests of the policy loader and the path patterns.

Any input gives a policy or a PolicyError with a message, never another exception; pattern
matching agrees with a small reference matcher written here, segment by segment, from the
documented rules (README "Policies", gatekeeper/policy/patterns.py).
"""

from __future__ import annotations

import json
import unicodedata
import warnings
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gatekeeper.errors import PolicyError
from gatekeeper.policy.model import DEFAULT_PROTECTED, Policy, parse_policy, policy_warnings
from gatekeeper.policy.patterns import (
    check_pattern,
    covers_subtree,
    explicit_rule,
    fold_path,
    has_git_segment,
    is_explicit,
    is_protected,
    is_write_allowed,
    matches,
    static_prefix,
    subtree_rule,
    write_rule,
)
from gatekeeper.policy.profile import load_profile

from conftest import needs_bwrap

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# --- a reference matcher, written from the documented rules ---------------------------------


def ref_normalize(pattern: str) -> str:
    pattern = pattern.strip()
    while pattern.startswith("./"):
        pattern = pattern[2:]
    while "//" in pattern:
        pattern = pattern.replace("//", "/")
    return pattern.rstrip("/") or "**"


def ref_class(pat: str, i: int) -> tuple[set[str] | None, list[tuple[str, str]], bool, int] | None:
    """The class opening at pat[i] as (members, ranges, negated, index after `]`), or None."""
    state = "start"
    negated = False
    items: list[str] = []
    j = i + 1
    while j < len(pat):
        c = pat[j]
        if state == "start" and c in "!^" and not negated:
            negated = True
            j += 1
            continue
        if c == "]" and state != "start":
            break
        items.append(c)
        state = "body"
        j += 1
    else:
        return None
    members: set[str] = set()
    ranges: list[tuple[str, str]] = []
    k = 0
    while k < len(items):
        if k + 2 < len(items) and items[k + 1] == "-":
            ranges.append((items[k], items[k + 2]))
            k += 3
        else:
            members.add(items[k])
            k += 1
    return members, ranges, negated, j + 1


def ref_segment(pat: str, name: str) -> bool:
    """Does one pattern segment match one path segment?"""

    def go(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(name)
        c = pat[i]
        if c == "*":
            return any(go(i + 1, k) for k in range(j, len(name) + 1))
        if c == "?":
            return j < len(name) and go(i + 1, j + 1)
        if c == "[":
            cls = ref_class(pat, i)
            if cls is not None:
                members, ranges, negated, after = cls
                if j >= len(name):
                    return False
                ch = name[j]
                inside = ch in members or any(lo <= ch <= hi for lo, hi in ranges)
                return inside != negated and go(after, j + 1)
        return j < len(name) and name[j] == c and go(i + 1, j + 1)

    return go(0, 0)


def ref_matches(pattern: str, path: str) -> bool:
    pattern = ref_normalize(pattern)
    if pattern in ("**", "."):
        return True
    psegs, ssegs = pattern.split("/"), path.split("/")

    def go(i: int, j: int) -> bool:
        if i == len(psegs):
            return True  # what is left of the path lies beneath what the pattern named
        if psegs[i] == "**":
            return any(go(i + 1, k) for k in range(j, len(ssegs) + 1))
        return j < len(ssegs) and ref_segment(psegs[i], ssegs[j]) and go(i + 1, j + 1)

    return go(0, 0)


# --- strategies ------------------------------------------------------------------------------

NAME_CHARS = "ab.-_ ]![^é"
path_segment = st.text(NAME_CHARS, min_size=1, max_size=4).filter(lambda s: s not in (".", ".."))
paths = st.lists(path_segment, min_size=1, max_size=4).map("/".join)
pattern_segment = st.one_of(
    st.just("**"),
    st.text("ab*?[]!^-.é", min_size=1, max_size=5),
)
patterns = st.one_of(
    st.lists(pattern_segment, min_size=1, max_size=4).map("/".join),
    st.text("ab*?[]!^-./ ", max_size=10),
)


@FUZZ
@given(pattern=patterns, path=paths)
@example(pattern="**/**", path="a/b")
@example(pattern="a/**/**", path="a/x/y")
@example(pattern="a[!x]b", path="a/b")
@example(pattern="[]a]", path="a")
@example(pattern="[!]a]", path="b")
def test_patterns_match_like_the_reference(pattern: str, path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning from re is a class read as regex
        problem = check_pattern(pattern)
        got = matches(pattern, path)
    if problem is None:
        assert got == ref_matches(pattern, path), (pattern, path)


@FUZZ
@given(pattern=st.text(max_size=12), path=st.text(max_size=12))
def test_patterns_never_crash(pattern: str, path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_pattern(pattern)
        matches(pattern, path)
        static_prefix(pattern)
        covers_subtree(pattern, path)
        is_protected([pattern], path)
        is_write_allowed([pattern], [pattern], path)


@pytest.mark.parametrize(
    "pattern, path, expected",
    [("**/**", "a/b", True), ("a/**/**", "a/x/y", True), (".github/**/**", ".github/w.yml", True),
     ("a[!x]b", "a/b", False), ("a[^x]b", "a/b", False), ("[]a]", "]", True), ("[!]a]", "b", True),
     ("[a-c]", "b", True), ("[a-]", "-", True), ("[]", "[]", True), ("[!]", "[!]", True)],
)  # fmt: skip
def test_pattern_regressions(pattern: str, path: str, expected: bool) -> None:
    """Found by the reference test: `**/**` matched nothing (so a protected `.github/**/**`
    protected nothing), a negated class matched the `/` between segments, and `[]` crashed."""
    assert matches(pattern, path) is expected


def test_protected_double_star_pattern_protects() -> None:
    assert not is_write_allowed(["**"], [".github/**/**"], ".github/workflows/ci.yml")


# --- protected paths under case folding --------------------------------------------------------

IGNORABLE = ["\u200b", "\u200c", "\u200d", "\ufeff", "\u00ad", "\u2060"]
protected_examples = st.sampled_from(
    [".github/workflows/ci.yml", ".gitattributes", "src/.gitattributes", ".vscode/tasks.json",
     ".claude/settings.json", ".envrc", "a/b/.envrc", "Jenkinsfile", ".gitmodules",
     ".gatekeeper/policy.yaml", "x.code-workspace", ".devcontainer/devcontainer.json",
     ".pre-commit-config.yaml", ".mcp.json"]
)  # fmt: skip


@st.composite
def disguised(draw: st.DrawFn, path: str) -> str:
    """path as another name that a case-insensitive, normalising filesystem opens as path."""
    out = []
    for segment in path.split("/"):
        chars = []
        for ch in segment:
            chars.append(ch.upper() if draw(st.booleans()) else ch)
            if draw(st.integers(0, 5)) == 0:
                chars.append(draw(st.sampled_from(IGNORABLE)))
        segment = "".join(chars)
        if draw(st.booleans()):
            segment += draw(st.sampled_from([".", " ", ". ", ".."]))
        out.append(unicodedata.normalize(draw(st.sampled_from(["NFC", "NFD"])), segment))
    return "/".join(out)


@FUZZ
@given(data=st.data(), path=protected_examples)
def test_protected_paths_stay_protected_in_any_disguise(data: st.DataObject, path: str) -> None:
    assert is_protected(DEFAULT_PROTECTED, path)
    variant = data.draw(disguised(path))
    assert is_protected(DEFAULT_PROTECTED, variant), variant
    assert not is_write_allowed(["**"], DEFAULT_PROTECTED, variant), variant


@FUZZ
@given(data=st.data(), before=st.lists(path_segment, max_size=2))
def test_git_segments_are_never_writable(data: st.DataObject, before: list[str]) -> None:
    path = "/".join([*before, data.draw(disguised(".git")), "config"])
    assert has_git_segment(path)
    assert not is_write_allowed(["**"], [], path)


@FUZZ
@given(
    write=st.lists(patterns, max_size=3),
    protected=st.one_of(st.lists(patterns, max_size=3), st.just(list(DEFAULT_PROTECTED))),
    path=st.one_of(paths, protected_examples, st.sampled_from([".GIT/x", "a/.Git./b"])),
)
@example(write=["**"], protected=list(DEFAULT_PROTECTED), path="jenkinsfile")
@example(write=["**"], protected=list(DEFAULT_PROTECTED), path="a/.GitAttributes")
@example(write=["**", ".github/**"], protected=list(DEFAULT_PROTECTED), path=".github/w.yml")
@example(write=["./**"], protected=[], path="a/b")
@example(write=["**/**/"], protected=[], path="é")
@example(write=["."], protected=["a"], path="a/b")
@example(write=["**/a"], protected=[], path="b")
def test_the_compiled_write_rule_decides_as_each_pattern_alone(
    write: list[str], protected: list[str], path: str
) -> None:
    """write_rule compiles a policy's patterns into one expression per list, looked up once
    for all paths (the gate asks it of every path of a change); it decides as the patterns
    taken one at a time do."""
    in_protected = any(
        matches(p, path) or matches(fold_path(p), fold_path(path)) for p in protected
    )
    expected = (
        not has_git_segment(path)
        and any(matches(p, path) for p in write)
        and (not in_protected or any(is_explicit(p, path, protected) for p in write))
    )
    assert write_rule(tuple(write), tuple(protected))(path) is expected
    assert is_write_allowed(write, protected, path) is expected


@FUZZ
@given(
    patterns_=st.lists(patterns, max_size=4),
    protected=st.one_of(st.lists(patterns, max_size=3), st.just(list(DEFAULT_PROTECTED))),
    path=st.one_of(st.just(""), paths, protected_examples),
)
@example(patterns_=["src/*", "**/b"], protected=[], path="src")
@example(patterns_=["**/*"], protected=[], path="")
@example(patterns_=[".github/workflows/**", "x"], protected=list(DEFAULT_PROTECTED),
         path=".github/workflows/ci.yml")  # fmt: skip
@example(patterns_=["a/.gitattributes"], protected=["**/.gitattributes"], path="a/.gitattributes")
def test_the_compiled_list_rules_decide_as_each_pattern_alone(
    patterns_: list[str], protected: list[str], path: str
) -> None:
    """subtree_rule and explicit_rule ask a whole list in a few expressions (the mount plan
    asks them of every folder and protected path of the worktree); they decide as the
    patterns taken one at a time do."""
    covered = any(covers_subtree(p, path) for p in patterns_)
    assert subtree_rule(tuple(patterns_))(path) is covered
    named = any(is_explicit(p, path, protected) for p in patterns_)
    assert explicit_rule(tuple(patterns_), tuple(protected))(path) is named


# --- the loader -------------------------------------------------------------------------------


def _load(data: bytes) -> Policy | None:
    try:
        policy = parse_policy(data, "fuzz.yaml")
    except PolicyError as exc:
        assert exc.message.startswith("fuzz.yaml: ")
        return None
    # A policy that loads must be usable: its patterns match and its warnings render.
    for probe in ("a", "src/a.py", ".github/x", "docs"):
        policy.allows_write(probe)
    policy_warnings(policy)
    return policy


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_load_or_fail_cleanly(data: bytes) -> None:
    _load(data)


YAML_TOKENS = ["paths", "write", "read", "protected", "commands", "allow", "deny", "ask",
               "network", "grants", "host", "ports", "limits", "timeout", "secrets", "extra",
               "version", ":", " ", "\n", "  ", "- ", "[", "]", "{", "}", ",", "'", '"', "&a ",
               "*a", "!!binary ", "!!str ", "!!python/object ", "1", "-1", "1e999", "0x1F",
               ".nan", "null", "~", "true", "**", "src/**", "../x", "/abs", "[]", "[z-a]",
               "\t", "#", "%YAML 1.1\n", "---\n", "...\n", "? ", "<<: ", "\x00", "\u2028", "é"]  # fmt: skip


@FUZZ
@given(tokens=st.lists(st.sampled_from(YAML_TOKENS), max_size=40))
def test_yamlish_text_loads_or_fails_cleanly(tokens: list[str]) -> None:
    _load("".join(tokens).encode("utf-8", "surrogatepass"))


KEYS = ["version", "paths", "read", "write", "protected", "commit_ignored", "commands", "allow",
        "ask", "deny", "default", "network", "localhost", "package_registry", "arbitrary_web",
        "internal_services", "registries", "grants", "host", "ports", "secrets", "environment",
        "dotfiles", "credential_helpers", "extra", "pass_env", "limits", "timeout",
        "max_processes", "max_file_size", "max_added_bytes", "bogus"]  # fmt: skip
ODD_VALUES = ["allow", "ask", "deny", "**", "src/**", "[]", "[z-a]", "a/**/**", "..", ".git",
              "*.example.com", "exa mple", "stripped", "", " ", "1"]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_VALUES),
    st.text(max_size=8),
)
structures = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
    ),
    max_leaves=20,
)


@FUZZ
@given(document=st.dictionaries(st.sampled_from(KEYS), structures, max_size=5))
def test_random_structures_load_or_fail_cleanly(document: dict[str, object]) -> None:
    _load(json.dumps(document, allow_nan=True).encode())
    _load(yaml.safe_dump(document).encode())


@pytest.mark.parametrize(
    "text",
    ["[" * 5000, "- " * 3000 + "x", "{a: " * 3000, "paths: " + "{a: " * 3000],
)  # fmt: skip
def test_deep_nesting_is_a_policy_error(text: str) -> None:
    """PyYAML recursed past Python's stack limit: a RecursionError, not a PolicyError."""
    with pytest.raises(PolicyError, match="nested too deeply"):
        parse_policy(text.encode(), "deep.yaml")


@pytest.mark.parametrize(
    "field, value",
    [("timeout", 10**30), ("max_processes", 2**40), ("max_file_size", 2**64),
     ("max_added_bytes", 2**80)],
)  # fmt: skip
def test_limits_past_what_the_kernel_takes_are_refused(field: str, value: int) -> None:
    """Accepted before, then setrlimit, pids.max or the run's timer failed in the middle of a
    run (OverflowError): the loader names the field instead."""
    with pytest.raises(PolicyError, match=rf"limits\.{field}"):
        parse_policy(f"limits: {{{field}: {value}}}".encode(), "x.yaml")


@pytest.mark.parametrize("pattern", ["[z-a]", "src/[9-0]*.py"])
def test_reversed_class_ranges_are_refused(pattern: str) -> None:
    with pytest.raises(PolicyError, match="reversed range"):
        parse_policy(f"paths: {{write: ['{pattern}']}}".encode(), "x.yaml")


@pytest.mark.parametrize("pattern", ["[]", "[!]", "[[:alpha:]]", "[a&&b]", "[a||b]"])
def test_odd_classes_load_and_match_without_crashing(pattern: str) -> None:
    """`[]` loaded, then crashed every match with re.error (the class went into a regex as is)."""
    policy = parse_policy(f"paths: {{write: ['{pattern}']}}".encode(), "x.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy.allows_write("x")


# --- whole folders: what the mount plan binds writable --------------------------------------


@st.composite
def names_against(draw: st.DrawFn, pattern: str) -> str:
    """A name made to fail a pattern: one character of the pattern's own (or none of them),
    repeated, so that a class or a literal that a probe name happens to satisfy is caught."""
    pool = sorted(set(pattern) - {"/", "*", "?", "[", "]", "!", "^"}) + ["\x01", "x"]
    return draw(st.sampled_from(pool)) * draw(st.integers(1, 4))


@FUZZ
@given(data=st.data(), pattern=patterns, directory=st.sampled_from(["", "a", "a/b", "[a]"]))
@example(data=None, pattern="a/[!x]*", directory="a")
def test_a_covered_folder_has_every_path_beneath_it_named(
    data: st.DataObject | None, pattern: str, directory: str
) -> None:
    """covers_subtree decides which folders are bound writable whole: it probed one name,
    so `src/[!x]*` (which leaves out `src/x...`) made all of src writable by the mounts."""
    if check_pattern(pattern) is not None or not covers_subtree(pattern, directory):
        return
    names = (
        ["x", "xx", "\x01"]
        if data is None
        else [data.draw(names_against(pattern)) for _ in range(3)]
    )
    for depth in (1, 2):
        rest = "/".join(names[:depth])
        path = f"{directory}/{rest}" if directory else rest
        assert matches(pattern, path), (pattern, directory, path)


@pytest.mark.parametrize(
    "pattern, directory, expected",
    [("src/[!x]*", "src", False), ("src/[!.]*", "src", False), ("src/*[!~]", "src", False),
     ("**/[!.]*", "", False), ("src/*", "src", True), ("src/**/*", "src", True),
     ("src/?*", "src", True), ("**/*", "", True), ("src/*/*", "src", False)],
)  # fmt: skip
def test_covers_subtree_regressions(pattern: str, directory: str, expected: bool) -> None:
    assert covers_subtree(pattern, directory) is expected


@needs_bwrap
def test_a_negated_class_does_not_make_its_folder_writable(tmp_path: Path, key: Path) -> None:
    """With `write: ["src/[!d]*"]` the mounts bound all of src writable, so src/data.txt,
    which the pattern leaves out, could be overwritten inside the sandbox (only the supervisor,
    the launcher and the gate stood in the way)."""
    from test_sandbox_writes import _plan, _run_unsupervised

    _, wt, plan = _plan(tmp_path, ["src/[!d]*"])
    assert "src" not in plan.writable and "." not in plan.writable, plan.writable
    script = ("echo x > src/data.txt 2>/dev/null && echo WROTE; echo y >> src/a.py && echo OK; "
              "exit 0")  # fmt: skip
    text = _run_unsupervised(plan, script, tmp_path / "out.txt")
    assert "WROTE" not in text and "OK" in text, text
    assert (wt.path / "src" / "data.txt").read_text() == "d\n"


# --- agent profiles (the other YAML the policy package reads) ---------------------------------


@settings(FUZZ, max_examples=100)
@given(
    tokens=st.lists(
        st.sampled_from(
            YAML_TOKENS + ["name", "env", "pass_env", "secrets", "home_files", "state_files"]
        ),
        max_size=30,
    )
)
def test_profile_files_load_or_fail_cleanly(tmp_path: Path, tokens: list[str]) -> None:
    path = tmp_path / "profile.yaml"
    path.write_bytes("".join(tokens).encode("utf-8", "surrogatepass"))
    try:
        load_profile(str(path))
    except PolicyError as exc:
        assert exc.message


def test_a_deeply_nested_profile_is_a_policy_error(tmp_path: Path) -> None:
    """The same RecursionError as the policy's, in the profile loader."""
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 5000)
    with pytest.raises(PolicyError, match="nested too deeply"):
        load_profile(str(path))
