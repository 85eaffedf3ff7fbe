"""`gatekeeper keys generate|show`."""

from __future__ import annotations

import sys

from gatekeeper.receipt.keys import generate_key, load_key


def generate(*, force: bool = False) -> int:
    key = generate_key(force=force)
    print(f"signing key written to {key.path} (mode 0600)", file=sys.stderr)
    print("add this line to .gatekeeper/trusted_keys (or run `gatekeeper init`):", file=sys.stderr)
    print(key.public.line)
    return 0


def show() -> int:
    key = load_key()
    print(key.public.line)
    print(f"key id: {key.public.keyid}\nfile:   {key.path}", file=sys.stderr)
    return 0
