"""`python -m gatekeeper` and the `gatekeeper` command."""

from __future__ import annotations

import gc
import os
import sys


def main() -> None:
    if sys.argv[1:2] == ["check"]:
        # A check is short, and what its imports and receipts make lives until it exits:
        # the collector's passes over those objects would free nothing. A plain one needs
        # none of the command line's parser, so it runs before that is loaded, and its first
        # reads of git start before the judgement is loaded.
        gc.disable()
        from gatekeeper.commands.check_early import plain_arguments, start

        kwargs = plain_arguments(sys.argv[2:], os.environ)
        if kwargs is not None:
            from gatekeeper.git import judging_offline

            with judging_offline():  # (a check fetches nothing)
                early = start(kwargs["repo"], kwargs["base"], kwargs["rev"])
                from gatekeeper.commands.check import run_plain

                run_plain(kwargs, early)  # ends the process
        gc.enable()
    from gatekeeper.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
