#!/usr/bin/env bash
# The main job on an embedded default: builds holdfast, starts a local lab cluster (a GTID
# primary and two replicas, real mariadbd processes on loopback), runs holdfast in front of it,
# and drives the mariadb CLI and sysbench through it. Extra arguments go to `holdfast demo`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh
cargo build --release --locked -p holdfast
exec ./target/release/holdfast demo "$@"
