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
    elif sys.argv[1:2] == ["run"]:
        # A plain run (an agent's command after `--`, with the usual options) needs none of
        # the command line's parser either: that is time before the agent starts.
        from gatekeeper.commands.plain import run_arguments

        run_kwargs = run_arguments(sys.argv[2:], os.environ)
        if run_kwargs is not None:
            from gatekeeper.sandbox.ahead import start_ahead

            start_ahead()  # the agent's supervisor loads on another core while this one does
            from gatekeeper.run import early as reads

            reads.start_plain(run_kwargs)  # git reads on, in processes of their own
            # Loading the run's modules makes hundreds of thousands of objects that live
            # until the end: the collector's passes over them while they load free nothing.
            # Once loaded they are set aside (frozen), so that later passes skip them too.
            gc.disable()
            from gatekeeper.commands import outcome
            from gatekeeper.commands.plain import end_process, pacify_closed_pipe
            from gatekeeper.commands.run import run

            gc.freeze()
            gc.enable()

            try:
                code = outcome(run, **run_kwargs)
            except BrokenPipeError:  # as the command line ends on a closed pipe
                pacify_closed_pipe()
                code = 1
            # The run is over (its worktree, record, receipt and sandbox settled): what the
            # interpreter's own end would do is free its objects one by one.
            end_process(code)
    from gatekeeper.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
