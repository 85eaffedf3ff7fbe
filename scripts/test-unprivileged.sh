#!/usr/bin/env bash
# The sandbox, supervisor, network and gate tests a second time, as an unprivileged user.
#
# Run as root after the root pass (scripts/test.sh does): it creates the user
# (GATEKEEPER_CI_USER, default gkci) if missing, stages a copy of the checkout and an
# interpreter that user may run, and runs the selected test files as that user. Tests marked
# `root` (they make users, network namespaces, mounts or cgroups) skip themselves there.
# Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GATEKEEPER_VENV:-$ROOT/.venv}"
CI_USER="${GATEKEEPER_CI_USER:-gkci}"
# What makes sense without root: the boundary, the supervisor, the proxy inside the sandbox,
# running, committing and the gate. Kept to a few minutes on two cores.
# The network tests that build namespaces of their own need root; the network boundary is
# covered here by the supervisor's and the runs' tests (direct connections refused, the
# proxy's answers, its bridge killed).
FILES=(
    tests/test_boundary.py
    tests/test_sandbox_writes.py
    tests/test_sandbox_gitdir.py
    tests/test_supervise.py
    tests/test_supervise_mkdir.py
    tests/test_run.py
    tests/test_faults.py
    tests/test_gate.py
)

if [[ $(id -u) -ne 0 ]]; then
    echo "test-unprivileged: run as root (it creates the user $CI_USER)" >&2
    exit 1
fi
if ! id -u "$CI_USER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /bin/sh "$CI_USER"
fi

STAGE="$(mktemp -d /tmp/gatekeeper-unprivileged-XXXXXX)"
trap 'rm -rf "$STAGE"' EXIT
chmod 755 "$STAGE"
mkdir -p "$STAGE/src" "$STAGE/home"
# A copy of the sources and tests: the checkout may live where the user cannot read.
tar -C "$ROOT" --exclude=./.venv --exclude=./.agents --exclude=./.git --exclude='*.pyc' \
    --exclude=__pycache__ -cf - . | tar -C "$STAGE/src" -xf -

as_user() {
    # A shell between runuser and the program: every exec is the user's own.
    runuser -u "$CI_USER" -- /bin/sh -c 'exec "$@"' sh "$@"
}

# An interpreter of the venv's version that the user may run: the venv's base, else python3.
version="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
python=""
system_path=/usr/local/bin:/usr/bin:/bin
for candidate in "$("$VENV/bin/python" -c 'import os, sys; print(os.path.realpath(sys._base_executable))')" \
    "$(PATH=$system_path command -v "python$version" || true)" \
    "$(PATH=$system_path command -v python3 || true)"; do
    [[ -n "$candidate" ]] || continue
    got="$(cd / && as_user "$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)"
    if [[ "$got" == "$version" ]]; then python="$candidate"; break; fi
done
if [[ -z "$python" ]]; then
    echo "test-unprivileged: no python$version that $CI_USER may run; install python$version" >&2
    exit 1
fi
"$python" -m venv --without-pip "$STAGE/venv"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pth="$STAGE/venv/lib/python$version/site-packages/gatekeeper-ci.pth"
printf '%s\n%s\n' "$STAGE/src" "$site" > "$pth"
chown -R "$CI_USER:" "$STAGE"
if ! (cd / && as_user "$STAGE/venv/bin/python" -c 'import gatekeeper, pygit2, pytest') 2>/dev/null; then
    # The dependencies live where the user cannot read: a copy of them.
    cp -a "$site" "$STAGE/site"
    rm -f "$STAGE"/site/__editable__*
    printf '%s\n%s\n' "$STAGE/src" "$STAGE/site" > "$pth"
    chown -R "$CI_USER:" "$STAGE"
fi

echo "test-unprivileged: ${FILES[*]} as $CI_USER" >&2
started=$SECONDS
cd "$STAGE/src"
status=0
as_user env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$STAGE/home" LANG=C.UTF-8 \
    TMPDIR=/tmp GATEKEEPER_REQUIRE_BWRAP=1 \
    "$STAGE/venv/bin/python" -m pytest -p no:cacheprovider "${FILES[@]}" "$@" || status=$?
echo "test-unprivileged: $((SECONDS - started)) s as $CI_USER (exit $status)" >&2
exit "$status"
