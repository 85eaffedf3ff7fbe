#!/usr/bin/env bash
# Install what the tests need, then run them all (real git, real bubblewrap).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Chromium renders the HTML report in a test; iproute2 builds the network test hosts.
export GATEKEEPER_EXTRA_PACKAGES="${GATEKEEPER_EXTRA_PACKAGES:-chromium iproute2 curl}"
# Two real agent CLIs, pinned, for tests/test_agents.py.
export GATEKEEPER_AGENTS="${GATEKEEPER_AGENTS-@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0}"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
# The sandbox tests must run, not skip, wherever this script is used.
export GATEKEEPER_REQUIRE_BWRAP=1 GATEKEEPER_REQUIRE_BROWSER=1
if [[ -n "$GATEKEEPER_AGENTS" ]]; then export GATEKEEPER_REQUIRE_AGENTS=1; fi
exec "$ROOT/.venv/bin/python" -m pytest "$@"
