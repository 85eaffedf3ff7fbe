"""Receipt: the signed record of a run, and where it is kept.

`models` and `statement` are the in-toto Statement and its making, signing and verifying;
`dsse` the envelope; `keys` and `trust` the Ed25519 keys and trust files; `changes` the change
set read from git objects; `notes` and `sync` storage as git notes and their exchange.

May import `policy` and the helpers only: every later stage reads receipts.
"""
