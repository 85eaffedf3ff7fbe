"""DSSE envelopes: sign and verify exact payload bytes through the pre-authentication encoding."""

from __future__ import annotations

import base64
import binascii
import json

from pydantic import BaseModel, ConfigDict, ValidationError

from gatekeeper.errors import BadSignatureError, ReceiptError, UntrustedKeyError, VerificationError
from gatekeeper.receipt.keys import PublicKey, SigningKey
from gatekeeper.receipt.limits import MAX_ENVELOPE_BYTES

PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_SIGNATURES = 16


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSEv1 pre-authentication encoding: `DSSEv1 <len type> <type> <len body> <body>`."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


class Signature(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    keyid: str = ""
    sig: str


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    payload: str
    payloadType: str  # noqa: N815 (the DSSE field name)
    signatures: list[Signature]

    def payload_bytes(self) -> bytes:
        try:
            # b64decode(validate=True) itself, without its ASCII copy of the payload (megabytes
            # for a large run): binascii takes ASCII text as it is and refuses any other.
            return binascii.a2b_base64(self.payload, strict_mode=True)
        except ValueError as exc:
            raise ReceiptError("malformed envelope: payload is not base64") from exc

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), separators=(",", ":"), sort_keys=True)


def sign(payload: bytes, key: SigningKey, payload_type: str = PAYLOAD_TYPE) -> Envelope:
    sig = key.sign(pae(payload_type, payload))
    return Envelope(
        payload=base64.b64encode(payload).decode(),
        payloadType=payload_type,
        signatures=[Signature(keyid=key.public.keyid, sig=base64.b64encode(sig).decode())],
    )


def parse_envelope(text: str | bytes) -> Envelope:
    """Parse envelope JSON; raise ReceiptError when it is not a DSSE envelope or is over the
    limits (MAX_ENVELOPE_BYTES, MAX_SIGNATURES)."""
    if isinstance(text, bytes) or text.isascii():  # (the common case: no copy to count)
        size = len(text)
    else:
        size = len(text.encode("utf-8", "surrogateescape"))
    if size > MAX_ENVELOPE_BYTES:
        raise ReceiptError(
            f"malformed envelope: {size} bytes, over the limit of {MAX_ENVELOPE_BYTES}; not read"
        )
    try:
        envelope = Envelope.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ReceiptError(f"malformed envelope: {where}: {first['msg']}") from exc
    if len(envelope.signatures) > MAX_SIGNATURES:
        raise ReceiptError(
            f"malformed envelope: {len(envelope.signatures)} signatures, over the limit of "
            f"{MAX_SIGNATURES}"
        )
    return envelope


def verify(
    envelope: Envelope, trusted: list[PublicKey], payload_type: str = PAYLOAD_TYPE
) -> tuple[bytes, PublicKey]:
    """Verify envelope against trusted keys; return (payload bytes, signer).

    Raises VerificationError when the payload type is not payload_type or no signature
    verifies, saying whether the key was untrusted or the signature bad. A signature is checked
    only against the trusted key its keyid names, so one without a matching keyid costs nothing.
    """
    if envelope.payloadType != payload_type:
        raise VerificationError(f"unexpected payload type {envelope.payloadType!r}")
    if not envelope.signatures:
        raise UntrustedKeyError("the envelope carries no signature (unsigned receipt)")
    if not trusted:
        raise UntrustedKeyError("no trusted keys: the trust file is empty or missing")
    payload = envelope.payload_bytes()
    message = pae(envelope.payloadType, payload)
    by_id = {k.keyid: k for k in trusted}
    known_but_bad = False
    tried: set[str] = set()
    for signature in envelope.signatures:
        key = by_id.get(signature.keyid) if signature.keyid else None
        if key is None or key.keyid in tried:
            # Each trusted key is tried once: a key signs an envelope once, and each try
            # hashes the whole payload (megabytes, in a note anyone may push).
            continue
        tried.add(key.keyid)
        try:
            raw_sig = base64.b64decode(signature.sig, validate=True)
        except ValueError:
            known_but_bad = True
            continue
        if key.verify(raw_sig, message):
            return payload, key
        known_but_bad = True
    if known_but_bad:
        raise BadSignatureError("bad signature: the receipt was changed after it was signed")
    ids = ", ".join(s.keyid or "(no keyid)" for s in envelope.signatures)
    raise UntrustedKeyError(f"untrusted key: signed by {ids}, which is not in the trust file")
