#!/bin/bash
# What topology changes cost a holdfast process while N TLS sessions idle (parked).
# Needs a lab with one replica on base port 4310 (TLS to clients and nodes, the default):
#   holdfast lab up --dir /tmp/l27 --replicas 1 --base-port 4310
# then, one holdfast at a time:  scripts/bench/topology_change_cpu.sh BIN [N] [TOGGLES]
# Each toggle stops and starts the replica's SQL thread: two topology changes.
set -euo pipefail
BIN=$1; N=${2:-1000}; T=${3:-5}; LAB=${LAB:-/tmp/l27}
ulimit -n "$(ulimit -Hn)"
"$BIN" serve --config "$LAB/holdfast.toml" > "$LAB/serve.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:4311/ && break; sleep 0.1; done
sleep 1
python3 "$(dirname "$0")/topology_change_cpu.py" "$LAB" 4310 4311 "$N" "$T" "$PID" "$LAB/tls/ca.pem"
