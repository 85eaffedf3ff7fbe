"""Agent profiles: what they may set, that they reach only the sandbox, and that the receipt
names them; secrets passed in stay out of every field of the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gatekeeper.errors import PolicyError
from gatekeeper.policy.profile import load_profile

from conftest import gk, make_repo, needs_bwrap
from helpers import run_json

SECRET = "zq9SUPERSECRETtoken77"


def predicate(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


@pytest.mark.parametrize("name", ["HOME", "PATH", "LD_PRELOAD", "GATEKEEPER_RUN_ID",
                                  "https_proxy", "GIT_CONFIG_COUNT", "BASH_ENV"])  # fmt: skip
def test_a_profile_may_not_set_what_the_boundary_depends_on(tmp_path: Path, name: str) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text(f"version: 1\nname: p\nenv: {{{name}: x}}\n")
    with pytest.raises(PolicyError, match="may not"):
        load_profile(str(profile))


@needs_bwrap
def test_a_profiles_environment_reaches_the_sandbox_only(tmp_path: Path, key: Path) -> None:
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "supervisor-loaded-it"
    (evil / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    profile = tmp_path / "p.yaml"
    profile.write_text(f"version: 1\nname: p\nenv: {{PYTHONPATH: '{evil}', MY_SETTING: 'on'}}\n")
    repo = make_repo(tmp_path / "repo")
    proc, data = run_json(repo, "sh", "-c", 'echo "setting=$MY_SETTING path=$PYTHONPATH"',
                          extra=["--profile", str(profile)])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "setting=on" in proc.stderr and f"path={evil}" in proc.stderr
    assert not marker.exists(), "the profile's PYTHONPATH reached a process outside the sandbox"
    ref = predicate(repo, data["commit"])["profile"]
    assert ref["name"] == "p" and ref["source"] == str(profile) and len(ref["sha256"]) == 64
    assert ref["env"] == ["MY_SETTING", "PYTHONPATH"]


@needs_bwrap
def test_a_passed_in_secret_is_in_no_field_of_the_record(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    script = ('touch "/usr/$MYTOK"; cd /tmp && mkdir "$MYTOK" && cd "$MYTOK" && sh -c true; '
              'python3 -c "import urllib.request as u; u.urlopen(\'http://api.$MYTOK.io/x\')" '
              "2>/dev/null; echo out=$MYTOK; exit 0")  # fmt: skip
    env = {"MYTOK": SECRET}
    proc, data = run_json(repo, "sh", "-c", script, extra=["--grant", "secret=MYTOK"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert SECRET.lower() not in (proc.stdout + proc.stderr).lower()
    text = json.dumps(predicate(repo, data["commit"]))
    assert SECRET.lower() not in text.lower()
    summary = gk("run", "--repo", str(repo), "--grant", "secret=MYTOK", "--", "sh", "-c", script,
                 env=env)  # fmt: skip
    assert SECRET.lower() not in (summary.stdout + summary.stderr).lower()


@needs_bwrap
def test_a_pass_env_value_is_redacted_too(tmp_path: Path, key: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("version: 1\nname: p\npass_env: [DB_PASSWORD]\n")
    repo = make_repo(tmp_path / "repo")
    proc, data = run_json(repo, "sh", "-c", 'sh -c "true $DB_PASSWORD"',
                          extra=["--profile", str(profile)],
                          env={"DB_PASSWORD": "hunter2isthepass"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "hunter2isthepass" not in json.dumps(predicate(repo, data["commit"]))
    assert "hunter2isthepass" not in proc.stdout
