"""`python -m gatekeeper` and the `gatekeeper` command."""

from __future__ import annotations

import gc
import sys


def main() -> None:
    if sys.argv[1:2] == ["check"]:
        # A check is short, and what its imports and receipts make lives until it exits:
        # the collector's passes over those objects would free nothing. A plain one needs
        # none of the command line's parser, so it runs before that is loaded.
        gc.disable()
        from gatekeeper.commands.check import run_plain

        run_plain(sys.argv[2:])  # ends the process, unless the arguments need the parser
        gc.enable()
    from gatekeeper.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
