#!/usr/bin/env bash
# The main job on an embedded default: builds holdfast and holdfast-bench, starts a local lab
# cluster (a GTID primary and two replicas, real mariadbd processes on loopback), runs holdfast
# in front of it, drives the mariadb CLI and sysbench through it (`holdfast-bench demo`), then
# runs the keep-alive drill: sysbench oltp_read_write (20 threads, 20 tables x 10,000 rows,
# prepared statements) through holdfast while the primary is switched over, restarted and
# killed, and prints connections kept, errors and the longest stall per scenario; last, the
# serverless drill (an instance that pauses whenever idle, a pool of idle connections kept
# across the pauses, sysbench connecting to the paused instance). Extra arguments go to
# `holdfast-bench drill`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh
cargo build --release --locked -p holdfast -p holdfast-bench
# holdfast-bench runs the holdfast binary beside it (target/release/holdfast).
./target/release/holdfast-bench demo
exec ./target/release/holdfast-bench drill --scenario all "$@"
