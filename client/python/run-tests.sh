#!/usr/bin/env bash
# The Python client's checks, on a fresh machine: a venv under the target dir, the
# pinned tools (constraints.txt) and the package installed by pip, then ruff,
# mypy --strict and pytest against real permitd processes.
#
#   client/python/run-tests.sh [DIR]      # DIR: where the venv goes (default: $CARGO_TARGET_DIR, else target/)
#
# PERMITD_BIN: the permitd to test against (default DIR/debug/permitd). The power-loss
# test runs when DIR/debug/powerfs (or POWERFS_BIN), root and /dev/fuse are there;
# with POWERFS_BIN set it fails rather than skips without them. POWER_LOSS_CUTS (50)
# sets its number of power cuts. PYTHON picks the interpreter (default python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-${CARGO_TARGET_DIR:-$here/../../target}}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
venv="$dir/python-client-venv"

[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$here/constraints.txt" -r "$here/requirements-test.txt" hatchling
# The package itself, as a user installs it (not editable), built with the pinned hatchling.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps "$here"

cd "$here"
export MYPY_CACHE_DIR="$dir/python-client-mypy-cache" RUFF_CACHE_DIR="$dir/python-client-ruff-cache"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy" --strict

export PERMITD_BIN="${PERMITD_BIN:-$dir/debug/permitd}"
[ -x "$PERMITD_BIN" ] || { echo "run-tests.sh: no permitd at $PERMITD_BIN (cargo build -p permitd --bin permitd)" >&2; exit 1; }
if [ -z "${POWERFS_BIN:-}" ] && [ -x "$dir/debug/powerfs" ] && [ "$(id -u)" -eq 0 ] && [ -e /dev/fuse ]; then
  export POWERFS_BIN="$dir/debug/powerfs"
fi
status=0
"$venv/bin/python" -m pytest -p no:cacheprovider || status=$?
# pytest's 5 is "no tests collected": never a pass.
if [ "$status" -eq 5 ]; then
  echo "run-tests.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
