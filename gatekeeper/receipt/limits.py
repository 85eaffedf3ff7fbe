"""Bounds on what a receipt may cost a reader, shared by the envelope and the notes that hold
it (the notes load without the envelope's models)."""

from __future__ import annotations

# Envelopes are read from notes anyone can push: bound what one may cost before parsing it.
MAX_ENVELOPE_BYTES = 128 << 20  # the receipt of a very large run, with room
