#!/usr/bin/env bash
# Set-up shared by demo.sh and test.sh: system packages, then the project's virtual environment.
# Safe to run again: it installs only what is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GATEKEEPER_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

need_packages=()
command -v bwrap >/dev/null 2>&1 || need_packages+=(bubblewrap)
command -v git >/dev/null 2>&1 || need_packages+=(git)
# Agent CLIs for the agent tests come from the npm registry: node and npm are needed then.
if [[ -n "${GATEKEEPER_AGENTS:-}" ]]; then
    command -v npm >/dev/null 2>&1 || need_packages+=(nodejs npm)
fi
for extra in ${GATEKEEPER_EXTRA_PACKAGES:-}; do
    case "$extra" in
        chromium) command -v chromium >/dev/null 2>&1 || need_packages+=(chromium) ;;
        *) dpkg -s "$extra" >/dev/null 2>&1 || need_packages+=("$extra") ;;
    esac
done

if ((${#need_packages[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing ${need_packages[*]} with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends "${need_packages[@]}" >/dev/null
    else
        echo "setup: missing system packages: ${need_packages[*]}" >&2
        echo "setup: install them first, e.g.: sudo apt-get install -y ${need_packages[*]}" >&2
        exit 1
    fi
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "setup: creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.gatekeeper-installed"
if [[ ! -f "$stamp" || "$ROOT/pyproject.toml" -nt "$stamp" ]]; then
    echo "setup: installing gatekeeper and its dependencies into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]"
    touch "$stamp"
fi
# Compiled bytecode, as an installed package has it: every command starts a fresh interpreter
# (and PYTHONDONTWRITEBYTECODE, where it is set, would have each one compile every module).
"$VENV/bin/python" -m compileall -q "$ROOT/gatekeeper" >/dev/null || true

# Real agent CLIs (the agent tests run them against a scripted model server on loopback).
if [[ -n "${GATEKEEPER_AGENTS:-}" ]]; then
    AGENTS_DIR="${GATEKEEPER_AGENTS_DIR:-$ROOT/.agents}"
    stamp="$AGENTS_DIR/.installed-$(echo "$GATEKEEPER_AGENTS" | sha256sum | cut -c1-16)"
    if [[ ! -f "$stamp" ]]; then
        echo "setup: installing agent CLIs into $AGENTS_DIR: $GATEKEEPER_AGENTS" >&2
        mkdir -p "$AGENTS_DIR/npm"
        npm install --prefix "$AGENTS_DIR/npm" --no-audit --no-fund --loglevel=error \
            $GATEKEEPER_AGENTS >/dev/null
        touch "$stamp"
    fi
fi
