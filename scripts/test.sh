#!/usr/bin/env bash
# Install what the tests need, then run them all (real git, real bubblewrap).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Chromium renders the HTML report in a test; iproute2 builds the network test hosts.
export GATEKEEPER_EXTRA_PACKAGES="${GATEKEEPER_EXTRA_PACKAGES:-chromium iproute2 curl}"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
# The sandbox tests must run, not skip, wherever this script is used.
export GATEKEEPER_REQUIRE_BWRAP=1 GATEKEEPER_REQUIRE_BROWSER=1
exec "$ROOT/.venv/bin/python" -m pytest "$@"
