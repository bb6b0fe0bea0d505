#!/usr/bin/env bash
# schemathesis against a live three-node cluster: every operation of the node's own
# OpenAPI document, fed generated (valid and invalid) inputs with the admin token,
# with schemathesis' default checks (no 5xx, every status, header and body as
# documented). Fails on any failure.
#
#   tests/schemathesis/run.sh [path/to/permitd]
#
# The binary defaults to $CARGO_TARGET_DIR/debug/permitd (build it first). The
# pinned schemathesis is installed into a venv under $CARGO_TARGET_DIR. Knobs:
# SCHEMATHESIS_MAX_EXAMPLES (per operation and phase, default 50) bounds the run.
set -euo pipefail
cd "$(dirname "$0")/../.."

SCHEMATHESIS_VERSION=4.32.5
repo="$PWD"
mkdir -p "${CARGO_TARGET_DIR:-target}"
TARGET="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"
PERMITD="${1:-$TARGET/debug/permitd}"
MAX_EXAMPLES="${SCHEMATHESIS_MAX_EXAMPLES:-50}"
VENV="$TARGET/schemathesis-venv"
ADMIN_TOKEN="schemathesis-admin-token-$RANDOM$RANDOM"

if [ ! -x "$VENV/bin/schemathesis" ] ||
    ! "$VENV/bin/pip" show schemathesis 2>/dev/null | grep -qx "Version: $SCHEMATHESIS_VERSION"; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

work="$(mktemp -d)"
cluster_pid=""
cleanup() {
    if [ -n "$cluster_pid" ]; then
        kill -TERM "$cluster_pid" 2>/dev/null || true
        wait "$cluster_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# Six free loopback ports, asked of the kernel.
read -r -a ports < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)

cat >"$work/cluster.toml" <<TOML
secret = "schemathesis-peer-secret-$RANDOM$RANDOM"

[auth]
admin_token = "$ADMIN_TOKEN"

# Patient timings: this cluster is not here to fail over, and an election
# (every call 503 until it ends) would fail the no-5xx check on a busy CI machine.
[raft]
heartbeat_interval_ms = 200
election_timeout_min_ms = 2000
election_timeout_max_ms = 4000
rpc_timeout_ms = 2000
snapshot_every_logs = 5000

# Short rounds: a generated request waits for its key's round.
[defaults]
limit = 100
roundWaitMs = 5
roundPeriodMs = 10
grantTimeoutMs = 10000

[[node]]
id = 1
api_addr = "127.0.0.1:${ports[0]}"
raft_addr = "127.0.0.1:${ports[1]}"
data_dir = "data/node-1"

[[node]]
id = 2
api_addr = "127.0.0.1:${ports[2]}"
raft_addr = "127.0.0.1:${ports[3]}"
data_dir = "data/node-2"

[[node]]
id = 3
api_addr = "127.0.0.1:${ports[4]}"
raft_addr = "127.0.0.1:${ports[5]}"
data_dir = "data/node-3"
TOML

RUST_LOG=warn "$PERMITD" up --config "$work/cluster.toml" >"$work/cluster.log" 2>&1 &
cluster_pid=$!

# Ask a follower-or-leader node: every node serves every route.
base="http://127.0.0.1:${ports[2]}"
for _ in $(seq 1 100); do
    if curl -fsS "$base/readyz" >/dev/null 2>&1; then break; fi
    sleep 0.2
done
curl -fsS "$base/readyz" >/dev/null || {
    echo "the cluster did not become ready" >&2
    cat "$work/cluster.log" >&2
    exit 1
}

# The key generated messages go to, with short rounds (schemathesis.toml).
curl -fsS -X PUT "$base/v1/semaphores/schemathesis-messages/config" \
    -H "Authorization: Bearer $ADMIN_TOKEN" -H "Content-Type: application/json" \
    -d '{"limit": 100, "roundWaitMs": 5, "roundPeriodMs": 10, "grantTimeoutMs": 10000}' >/dev/null

# Left out, with the reason:
# - POST /cluster/members: generated membership changes would tear the cluster
#   under test apart (tests/tests/membership.rs covers the route);
# - POST /cluster/restore: a generated backup may replace the state under test
#   (tests/tests/operator_cli.rs covers the route);
# - GET /v1/events: a stream that stays open by design, so every call would hit
#   the request timeout (tests/tests/events.rs covers the route);
# - the check positive_data_acceptance (a schema-valid request must be
#   accepted): the node is stricter than JSON Schema can say. Integers must be
#   written without a fraction (`5.0` is refused, JSON Schema calls it an
#   integer), name limits count UTF-8 bytes (`maxLength` counts characters), a
#   group appears once in `demand`, and a runner token needs keys and client
#   ids (docs/protocol.md states each rule).
# One worker: hypothesis' lambda descriptions hit a CPython 3.11 `ast.parse`
# bug when drawn from several threads at once.
# Run from a scratch folder: schemathesis and hypothesis keep caches (and replay
# earlier failures first) in the working directory; each run starts clean.
status=0
cd "$work"
"$VENV/bin/schemathesis" --config-file "$repo/tests/schemathesis/schemathesis.toml" \
    run "$base/openapi.json" \
    --header "Authorization: Bearer $ADMIN_TOKEN" \
    --max-examples "$MAX_EXAMPLES" \
    --exclude-path /cluster/members \
    --exclude-path /cluster/restore \
    --exclude-path /v1/events \
    --exclude-checks positive_data_acceptance \
    --request-timeout 10 \
    --workers 1 \
    --report junit --report-dir "$TARGET/schemathesis-report" ||
    status=$?
if [ "$status" -ne 0 ]; then
    echo "--- cluster log (last 50 lines) ---" >&2
    tail -n 50 "$work/cluster.log" >&2
fi
exit "$status"
