"""Entry point of the installed hook scripts: `python -I -m gatekeeper.hookrun NAME [ARGS]`."""

from __future__ import annotations

import sys

from gatekeeper.commands.hooks import main_hook

if __name__ == "__main__":
    sys.exit(main_hook(sys.argv[1:]))
