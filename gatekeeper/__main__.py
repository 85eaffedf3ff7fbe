from __future__ import annotations

from gatekeeper.cli import main

main()
