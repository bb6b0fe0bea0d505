#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need where it
# is missing, then runs every test. `.ci/run` calls this same script.
#
#   ./test.sh
#
# What it installs, each by its ordinary installer and pinned:
# - Debian's Chromium (apt-get; the dashboard test drives it with playwright-core,
#   pinned in tests/ui/package-lock.json), when /usr/bin/chromium is missing;
# - Debian's iproute2 (`ip`, `tc`), when missing: the one-way cut test puts each
#   node in a network namespace (root only; it skips, saying why, elsewhere);
# - the npm packages of tests/ui and client/typescript, from their lockfiles;
# - schemathesis, pinned in tests/schemathesis/run.sh, into a venv under the target dir;
# - the Python client's tools, pinned in client/python/constraints.txt, into another.
# The power-loss tests mount `powerfs` (FUSE, no libfuse needed): they need
# /dev/fuse and root, as on CI's machine.
#
# Knobs: CARGO_TARGET_DIR, PROPTEST_CASES, SCHEMATHESIS_MAX_EXAMPLES,
# CHAOS_SECONDS / POWER_LOSS_ROUNDS (longer soaks), SIM_SEEDS / SIM_SECONDS (the
# simulator's seed count and time budget, whichever runs out first; SIM_SEED=n
# replays one seed).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p "${CARGO_TARGET_DIR:-target}"
TARGET="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"

# Each step's wall time, printed after it and again at the end: CI's budget is
# 30 minutes, and this shows where it goes.
STEPS=()
STEP_STARTED=$SECONDS
mark() {
  local took=$((SECONDS - STEP_STARTED))
  STEPS+=("$(printf '%5d s  %s' "$took" "$1")")
  echo "test.sh: $1 took $took s"
  STEP_STARTED=$SECONDS
}
trap 'printf "test.sh: steps\n"; printf "  %s\n" "${STEPS[@]}"' EXIT

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "test.sh: $1 is needed ($2)" >&2; exit 1; }
}
need cargo "the Rust toolchain, from rustup"
need node "Node.js 20 or newer, for the dashboard test and the TypeScript client"
need npm "npm, with Node.js"
need python3 "Python 3 with venv, for schemathesis and the Python client"

apt_install() {
  local as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  "${as_root[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y --no-install-recommends "$@"
}
[ -x /usr/bin/chromium ] || apt_install chromium
{ command -v ip && command -v tc; } >/dev/null 2>&1 || apt_install iproute2
(cd tests/ui && npm ci --no-audit --no-fund)
mark "installs"

# Every binary first, so the end-to-end tests never run a stale permitctl/permitd.
cargo build --workspace --bins --locked
mark "debug build"
# powerfs's model test mounts a filesystem per case: its own, smaller case count
# (PROPTEST_CASES would override the test's 24). It also has a rare failure
# under investigation (a remounted session answering ECONNABORTED), kept visible.
PROPTEST_CASES="${POWERFS_PROPTEST_CASES:-24}" cargo test -p permitd-powerfs --locked
mark "powerfs tests"
cargo test --workspace --exclude permitd-powerfs --exclude permitd-sim --locked
mark "workspace tests"
# The cluster tests that check invariants rather than one leader's part, those
# that find each key's shard leader, and those that pause or cut off a follower
# of the shards they load, again at 8 shards (docs/operations.md, "Shards"):
# every test cluster gets [cluster] shards = 8. The suite above runs at 1, and
# tests/tests/shards.rs at 3 and 2.
PERMITD_TEST_SHARDS=8 CHAOS_SECONDS="${SHARDED_CHAOS_SECONDS:-40}" cargo test -p permitd-tests --locked \
  --test chaos --test power_loss --test restarts --test membership --test init_defaults \
  --test delete_key --test hostile_input --test account_concurrency --test batch \
  --test events --test auth_matrix --test failover --test operator_cli \
  --test steady_leader --test one_way_cut -- --skip power_loss_soak
mark "cluster tests at 8 shards"
PERMITD_TEST_SHARDS=8 cargo test -p permitd-tests --locked --test shipped_timings paused_follower
mark "paused follower at 8 shards"
# The deterministic simulator (docs/simulation.md): seeds 1–500 of a whole
# cluster under faults, or as many as 200 s allow, optimised (a debug build
# simulates several times slower) in the `ci` profile: release's optimisation,
# built incrementally, so a fresh clone rebuilds in seconds (Cargo.toml). The simulator's own default is 1,000; CI runs
# fewer to stay within its 30 minutes on a 2-core machine (0.45–0.7 s a seed
# there: 300–440 seeds), and a soak (SIM_SECONDS alone) runs more.
SIM_SEEDS="${SIM_SEEDS:-500}" SIM_SECONDS="${SIM_SECONDS:-200}" \
  cargo test -p permitd-sim --profile ci --locked -- --nocapture
mark "simulator"
# And seeds of clusters of 3 shards (each its own Raft group, leaders spread by
# handovers, a membership change going shard by shard): fewer, for CI's budget.
SIM_SHARDS=3 SIM_SEEDS="${SIM_SHARDED_SEEDS:-100}" SIM_SECONDS="${SIM_SHARDED_SECONDS:-50}" \
  cargo test -p permitd-sim --profile ci --locked --test seeds -- --nocapture
mark "simulator at 3 shards"
# schemathesis against a live three-node cluster of the permitd just built.
tests/schemathesis/run.sh "$TARGET/debug/permitd"
mark "schemathesis"
# The TypeScript client: build, type-check and test against real permitd processes.
(
  cd client/typescript
  npm ci --no-audit --no-fund
  npm run build
  npm run typecheck
  npm run build:test
  PERMITD_BIN="$TARGET/debug/permitd" node --test build/test/
)
mark "TypeScript client"
# The Python client: ruff, mypy --strict and pytest against real permitd processes
# (and the SQLite queue store under power cuts on powerfs), in a venv under the target dir.
PERMITD_BIN="$TARGET/debug/permitd" client/python/run-tests.sh "$TARGET"
mark "Python client"
# The leader must hold with the shipped timings through bursts of large requests,
# 100,000 keys and a minute of mixed load (tests/tests/shipped_timings.rs). Those
# scenarios are #[ignore]d in the debug run above: debug nodes decode megabytes
# several times slower and starve each other on a small machine. They run here on
# an optimised build: the `ci` profile, release's optimisation built incrementally.
# Its nodes spent as much CPU per log entry as release's in the bench or more
# (docs/architecture.md, "CI's 30 minutes"), never less: the test is no easier.
cargo build --profile ci -p permitd --bin permitd --locked
PERMITD_BIN="$TARGET/ci/permitd" cargo test -p permitd-tests --test shipped_timings --locked -- --ignored
mark "shipped timings (optimised)"
