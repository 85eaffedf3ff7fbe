"""`gatekeeper selftest`: the real battery on this machine, its JSON, a machine that cannot
build the sandbox, and a boundary the policy opens reported as not holding."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gatekeeper.commands.selftest import selftest
from gatekeeper.commands.selftest_scratch import POLICY
from gatekeeper.sandbox import machine

from conftest import gk, make_repo, needs_bwrap


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short TMPDIR of the test's own (Unix socket paths are short), to show that no scratch
    folder is left behind."""
    path = Path(tempfile.mkdtemp(prefix="gkst-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _untouched(tmp: Path) -> None:
    assert list(tmp.iterdir()) == []  # the scratch world is gone
    assert not Path(os.environ["GATEKEEPER_HOME"]).exists()  # no key made in the user's
    assert not (Path(os.environ["XDG_DATA_HOME"]) / "gatekeeper").exists()


@needs_bwrap
@pytest.mark.sandbox
def test_the_selftest_passes_on_this_machine(short_tmp: Path) -> None:
    proc = gk("selftest", env={"TMPDIR": str(short_tmp)}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    checks = [line for line in lines if line[:5].strip() in ("ok", "note", "FAIL")]
    assert len(checks) >= 30
    assert not [line for line in checks if line.startswith("FAIL")]
    names = {line[6:].split(":", 1)[0] for line in checks}
    for expected in ("machine.bubblewrap", "machine.user_namespaces",
                     "machine.seccomp_user_notification", "write.outside", "write.symlink",
                     "write.dotdot", "write.hardlink", "git.hook", "git.config",
                     "secret.environment", "secret.dotfiles", "secret.signing_key",
                     "net.direct", "net.dns", "net.host_loopback", "net.unix_sockets",
                     "proc.outlive", "cmd.denied_abs", "cmd.denied_sh", "cmd.denied_env",
                     "cmd.denied_interpreter", "cmd.denied_shebang", "cmd.denied_loader",
                     "proc.memory", "receipt.verifies",
                     "receipt.tamper_payload", "gate.pass", "gate.tamper"):  # fmt: skip
        assert expected in names, expected
    assert "(agent, child, grandchild)" in proc.stdout
    assert lines[-1].startswith("selftest: ") and " 0 failed" in lines[-1]
    _untouched(short_tmp)


@needs_bwrap
@pytest.mark.sandbox
def test_the_json_report_has_a_stable_shape(short_tmp: Path) -> None:
    proc = gk("selftest", "--json", env={"TMPDIR": str(short_tmp)}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert {"checks", "passed", "failed", "seconds", "machine"} <= set(data)
    assert data["failed"] == 0 and data["passed"] == len(data["checks"])
    assert isinstance(data["seconds"], (int, float)) and data["seconds"] > 0
    for check in data["checks"]:
        assert {"name", "ok", "detail"} <= set(check)
        assert isinstance(check["name"], str) and isinstance(check["detail"], str)
        assert check["ok"] is True
    names = [c["name"] for c in data["checks"]]
    assert len(names) == len(set(names))
    assert {"kernel", "arch", "uid", "bwrap", "bwrap_version"} <= set(data["machine"])
    _untouched(short_tmp)


def test_without_bubblewrap_it_says_how_to_install_it_and_runs_nothing(
    tmp_path: Path, short_tmp: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "python3", "sh"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    env = {"TMPDIR": str(short_tmp), "PATH": str(bin_dir)}
    proc = gk("selftest", env=env, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL  machine.bubblewrap: bubblewrap (bwrap) is not installed" in proc.stdout
    assert "apt-get install bubblewrap" in proc.stdout
    assert "not run: this machine cannot build the sandbox" in proc.stdout
    assert "receipt.verifies" not in proc.stdout
    data = json.loads(gk("selftest", "--json", env=env, timeout=60).stdout)
    assert data["failed"] >= 1 and data["ran"] is False
    bwrap = next(c for c in data["checks"] if c["name"] == "machine.bubblewrap")
    assert bwrap["ok"] is False and "apt-get install bubblewrap" in bwrap["fix"]
    _untouched(short_tmp)


def test_a_bubblewrap_too_old_for_the_sandbox_is_named(tmp_path: Path, short_tmp: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Ubuntu 22.04's bubblewrap: no --disable-userns.
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bubblewrap 0.6.1'\n")
    fake.chmod(0o755)
    proc = gk("selftest", env={"TMPDIR": str(short_tmp), "PATH": str(bin_dir)}, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAIL  machine.bubblewrap: bubblewrap 0.6.1 at {fake} is too old" in proc.stdout
    assert "not run: this machine cannot build the sandbox" in proc.stdout
    hint = subprocess.run(
        [sys.executable, "-c", "from gatekeeper.sandbox.machine import setup_failure_hint as h;"
         "print(h())"], env={**os.environ, "PATH": str(bin_dir)}, capture_output=True,
        text=True, check=True,
    ).stdout  # fmt: skip
    assert "too old" in hint and "0.8.0" in hint
    _untouched(short_tmp)


@pytest.mark.parametrize(
    "setting, value, euid, expected",
    [
        ("MAX_USERNS", "0", 0, "user.max_user_namespaces"),
        ("USERNS_CLONE", "0", 1000, "kernel.unprivileged_userns_clone=1"),
        ("APPARMOR_USERNS", "1", 1000, "kernel.apparmor_restrict_unprivileged_userns=0"),
    ],
)  # fmt: skip
def test_disabled_user_namespaces_are_named_with_their_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, value: str, euid: int,
    expected: str,
) -> None:  # fmt: skip
    for name in ("MAX_USERNS", "USERNS_CLONE", "APPARMOR_USERNS"):
        monkeypatch.setattr(machine, name, tmp_path / "missing")
    (tmp_path / setting).write_text(value + "\n")
    monkeypatch.setattr(machine, setting, tmp_path / setting)
    monkeypatch.setattr(machine.os, "geteuid", lambda: euid)
    found = machine.userns_restriction()
    assert found is not None and not found.ok and expected in (found.fix or "")
    hint = machine.setup_failure_hint()
    assert hint is not None and expected in hint
    if setting == "APPARMOR_USERNS":
        assert "apparmor_parser" in (found.fix or "") and "userns," in (found.fix or "")


@needs_bwrap
@pytest.mark.sandbox
def test_address_randomization_off_is_named_by_selftest_and_each_run(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """kernel.randomize_va_space=0 weakens the supervisor's evidence of a thread's exec: an
    optional need, shown by selftest with its fix, and each run warns of it. (Read from a
    stand-in of the setting: the host's own is not changed under the other tests.)"""
    setting = tmp_path / "randomize_va_space"
    setting.write_text("2\n")
    monkeypatch.setattr(machine, "RANDOMIZE_VA_SPACE", setting)
    assert machine.check_address_randomization().ok
    assert machine.randomization_warning() is None
    setting.write_text("0\n")
    found = machine.check_address_randomization()
    assert not found.ok and not found.required
    assert "kernel.randomize_va_space=2" in (found.fix or "")
    assert (
        found in machine.machine_checks() and machine.machine_facts()["randomize_va_space"] == "0"
    )

    from gatekeeper.run.runner import run_agent

    repo = make_repo(tmp_path / "repo")
    capsys.readouterr()
    result = run_agent(repo=repo, argv=["true"])
    assert result.exit_code == 0
    err = capsys.readouterr().err
    assert "gatekeeper: warning: address randomization is off for every process" in err, err
    assert "sysctl -w kernel.randomize_va_space=2" in err


def test_address_randomization_is_seen_where_its_setting_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container may hide /proc/sys: the check then looks at two programs' stacks, and
    says it cannot tell when it cannot see them, rather than counting the need as met."""
    monkeypatch.setattr(machine, "RANDOMIZE_VA_SPACE", tmp_path / "hidden")
    if machine.stacks_differ() is not True:
        pytest.skip("address randomization is off on this machine")
    found = machine.check_address_randomization()
    assert found.ok and "cannot be read" in found.detail, found
    assert machine.randomization_warning() is None
    monkeypatch.setattr(machine, "stacks_differ", lambda: None)
    found = machine.check_address_randomization()
    assert not found.ok and not found.required and found.detail.startswith("unknown"), found
    warning = machine.randomization_warning() or ""
    assert "address randomization is unknown" in warning and "readable" in warning
    monkeypatch.setattr(machine, "stacks_differ", lambda: False)
    found = machine.check_address_randomization()
    assert not found.ok and found.detail.startswith("off: kernel.randomize_va_space cannot be")
    assert "on the host of a container" in (found.fix or "")
    setarch = shutil.which("setarch")
    if setarch is not None:  # started with randomization off: its programs cannot tell
        code = "from gatekeeper.sandbox import machine; print(machine.stacks_differ())"
        out = subprocess.run([setarch, "-R", sys.executable, "-c", code], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        assert out.strip() == "None"


@needs_bwrap
@pytest.mark.sandbox
def test_a_boundary_the_policy_opens_is_reported_as_failed(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TMPDIR", str(short_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    opened = POLICY.replace('write: ["out/**"]', 'write: ["out/**", "locked/**"]')
    assert opened != POLICY
    code = selftest(policy_override=opened)
    out = capsys.readouterr().out
    assert code == 1, out
    failed = {line[6:].split(":", 1)[0] for line in out.splitlines() if line.startswith("FAIL")}
    assert {"write.outside", "write.create", "write.dotdot"} <= failed, out
    assert "ok    write.inside" in out and "ok    git.hook" in out
    assert "BOUNDARIES DID NOT HOLD" in out.splitlines()[-1]
    assert "agent: the probe's write.outside succeeded" in out
    _untouched(short_tmp)
