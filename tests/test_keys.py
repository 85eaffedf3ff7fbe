from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gatekeeper.errors import BadSignatureError, UntrustedKeyError
from gatekeeper.receipt.dsse import pae, parse_envelope, sign, verify
from gatekeeper.receipt.keys import PublicKey, generate_key, load_key

from conftest import gk


def test_generate_writes_a_private_key_only_the_user_can_read(key: Path) -> None:
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    proc = gk("keys", "show")
    assert proc.returncode == 0
    line = proc.stdout.strip()
    assert line.startswith("ed25519 ")
    assert PublicKey.parse_line(line).raw == load_key().public.raw


def test_generate_refuses_to_overwrite(key: Path) -> None:
    proc = gk("keys", "generate")
    assert proc.returncode == 2
    assert "already exists" in proc.stderr and "--force" in proc.stderr


def test_show_without_key_says_how_to_make_one() -> None:
    proc = gk("keys", "show")
    assert proc.returncode == 2
    assert "gatekeeper keys generate" in proc.stderr


def test_key_readable_by_others_is_refused(key: Path) -> None:
    os.chmod(key, 0o644)
    proc = gk("keys", "show")
    assert proc.returncode == 2 and "chmod 600" in proc.stderr


def test_dsse_signs_the_pre_authentication_encoding(tmp_path: Path) -> None:
    assert pae("t", b"ab") == b"DSSEv1 1 t 2 ab"
    signer = generate_key(tmp_path / "k.pem")
    other = generate_key(tmp_path / "o.pem")
    envelope = sign(b'{"x":1}', signer)
    payload, who = verify(parse_envelope(envelope.to_json()), [signer.public])
    assert payload == b'{"x":1}' and who == signer.public
    with pytest.raises(UntrustedKeyError):
        verify(envelope, [other.public])
    forged = envelope.model_copy(update={"payload": sign(b'{"x":2}', signer).payload})
    with pytest.raises(BadSignatureError):
        verify(forged, [signer.public])
