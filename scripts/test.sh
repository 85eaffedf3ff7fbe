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
status=0
"$ROOT/.venv/bin/python" -m pytest "$@" || status=$?
# The whole suite as root (CI): then the sandbox tests again as an unprivileged user it makes.
# Not when pytest was given arguments (one file, -k ...), unless GATEKEEPER_UNPRIVILEGED=1.
if [[ $(id -u) -eq 0 && "${GATEKEEPER_UNPRIVILEGED:-$(( $# == 0 ))}" == 1 ]]; then
    bash "$ROOT/scripts/test-unprivileged.sh" -q || status=$((status ? status : $?))
fi
exit "$status"
