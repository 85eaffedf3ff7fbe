"""The gate never runs programs named by repository configuration or the branch under review.

Git runs programs from config in many places: signature checks (`gpg.program`, with
`log.showSignature`), external diff and textconv drivers (chosen by `.gitattributes`, which
the branch under review controls), fsmonitor and hooks. The gate reads only git objects.
"""

from __future__ import annotations

from pathlib import Path

from fixtures.gate_receipts import receipted_commit

from conftest import git, gk


def test_check_runs_no_program_from_config_or_attributes(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    program = tmp_path / "prog.sh"
    program.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\nexit 0\n')
    program.chmod(0o755)
    commit = receipted_commit(
        repo, {"src/feature.py": "x = 1\n", "src/.gitattributes": "*.py diff=conv\n"}
    )
    # A commit carrying a (bogus) signature, so that showing signatures would call gpg.program.
    raw = git(repo, "cat-file", "commit", commit)
    header, _, body = raw.partition("\n\n")
    signed = (
        header
        + "\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n -----END PGP SIGNATURE-----\n\n"
        + body
    )
    forged = git(
        repo, "hash-object", "-t", "commit", "-w", "--stdin", input=signed.encode()
    ).strip()
    git(repo, "branch", "-f", "signed", forged)
    git(repo, "checkout", "-q", "signed")
    for key, value in {
        "log.showSignature": "true",
        "gpg.program": str(program),
        "diff.external": str(program),
        "diff.conv.textconv": str(program),
        "diff.conv.command": str(program),
        "core.fsmonitor": str(program),
        "core.hooksPath": str(tmp_path / "hooks"),
    }.items():
        git(repo, "config", key, value)
    assert git(repo, "log", "-1", "--format=%H", check=False) and marker.exists()  # git runs it
    marker.unlink()
    for fmt in ("json", "html"):
        proc = gk("check", "--repo", str(repo), "--base", "main", "--format", fmt, "-o",
                  str(tmp_path / f"report.{fmt}"), "HEAD")  # fmt: skip
        assert proc.returncode in (0, 1), proc.stderr
    gk("receipt", "show", "HEAD", cwd=repo)
    assert not marker.exists(), marker.read_text()
