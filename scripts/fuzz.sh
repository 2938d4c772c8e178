#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets) for SECS seconds each (default 600), on its
# corpus in fuzz/corpus/TARGET (kept in the repo), then minimises that corpus. Needs the
# nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). A crash stops the run and
# leaves its input in fuzz/artifacts/TARGET. Prints one line per target: executions, time,
# corpus size.
set -euo pipefail
secs=${1:-600}
cd "$(dirname "$0")/../fuzz"
mkdir -p ../target
targets=$(cargo +nightly fuzz list)
for t in $targets; do
  mkdir -p "corpus/$t"
  log="../target/fuzz-$t.log"
  if ! cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" \
      -print_final_stats=1 >"$log" 2>&1; then
    echo "$t: FAILED (see fuzz/$log and fuzz/artifacts/$t)"
    exit 1
  fi
  cargo +nightly fuzz cmin "$t" "corpus/$t" >/dev/null 2>&1
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  echo "$t: ${execs} executions in ${secs} s, corpus $(ls "corpus/$t" | wc -l) inputs"
done
