#!/usr/bin/env bash
# Install what gatekeeper needs, then run the built-in demo: an agent run in the sandbox,
# its signed receipt, the gate, and the reports (written to ./demo-out).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/gatekeeper" demo --out "${1:-$ROOT/demo-out}"
