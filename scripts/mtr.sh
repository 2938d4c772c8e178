#!/usr/bin/env bash
# MariaDB's own regression tests (mariadb-test-run, package mariadb-test), run against one lab
# node directly and through holdfast (the lab's default config: semi-sync, replay, commit
# markers), test by test, with the server's state reset between runs. Prints one line per test
# whose outcome differs and a summary; every test that passes directly must pass through
# holdfast.
#
#   bash scripts/mtr.sh                    # every test of the main suite
#   bash scripts/mtr.sh main.ps main.alias # these tests
#   MTR_SAMPLE=200 bash scripts/mtr.sh     # 200 tests of the main suite, chosen by MTR_SEED
#
# Results go to $MTR_DIR (default /tmp/holdfast-mtr): results.tsv (test, direct, holdfast)
# and each failing run's log.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=${MTR_DIR:-/tmp/holdfast-mtr}
base=${MTR_BASE_PORT:-4700}
suite=/usr/share/mysql/mysql-test
command -v mariadb-test-run >/dev/null 2>&1 || [ -x "$suite/mariadb-test-run" ] || {
  apt-get install -y mariadb-test socat >/dev/null
}
command -v socat >/dev/null || apt-get install -y socat >/dev/null
cargo build -q -p holdfast
holdfast=$root/target/debug/holdfast

cleanup() {
  [ -n "${serve_pid:-}" ] && kill "$serve_pid" 2>/dev/null || true
  [ -n "${socat_pid:-}" ] && kill "$socat_pid" 2>/dev/null || true
  "$holdfast" lab down --dir "$dir/lab" >/dev/null 2>&1 || true
}
trap cleanup EXIT

rm -rf "$dir" && mkdir -p "$dir/logs"
# The options mtr gives its own servers (include/default_mysqld.cnf) that tests' results
# depend on; and name resolution, so that accounts @localhost match TCP logins from
# 127.0.0.1 as they match socket logins (holdfast listens on TCP).
"$holdfast" lab up --dir "$dir/lab" --replicas 0 --base-port "$base" \
  --server-arg=--default-storage-engine=MyISAM --server-arg=--character-set-server=latin1 \
  --server-arg=--collation-server=latin1_swedish_ci --server-arg=--log-bin-trust-function-creators=1 \
  --server-arg=--local-infile --server-arg=--max-heap-table-size=1M \
  --server-arg=--sort-buffer-size=256K --server-arg=--key-buffer-size=1M \
  --server-arg=--skip-name-resolve=0 >"$dir/lab.log"
node_sock=$dir/lab/node1.sock
node_port=$((base + 10))
sql() { mariadb -uroot -S "$node_sock" "$@"; }

# mtr's own database, as mtr installs it (its file uses mysqltest's delimiter syntax).
sed -e 's/^delimiter ||;/delimiter ||/I' -e 's/^delimiter ;||/delimiter ;/I' \
  -e 's/^\(\s*\)--SELECT/\1-- SELECT/' "$suite/include/mtr_warnings.sql" >"$dir/mtr_warnings.sql"
sql -e "CREATE DATABASE IF NOT EXISTS mtr; CREATE DATABASE IF NOT EXISTS test"
sql mtr <"$dir/mtr_warnings.sql"
sql -e "DROP USER IF EXISTS test@localhost"

"$holdfast" serve --config "$dir/lab/holdfast.toml" >"$dir/holdfast.log" 2>&1 &
serve_pid=$!
# Tests connect to "localhost" through a socket: holdfast listens on TCP only, so a socket
# relays to its listener.
socat UNIX-LISTEN:"$dir/holdfast.sock",fork,mode=777 TCP:127.0.0.1:"$base" &
socat_pid=$!
for _ in $(seq 100); do
  mariadb -uroot -h127.0.0.1 -P"$base" -e 'SELECT 1' >/dev/null 2>&1 && break
  sleep 0.1
done

# What is there before any test: holdfast's own schema (commit markers) included.
for _ in $(seq 100); do
  sql -N -e "SELECT 1 FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA='holdfast' LIMIT 1" |
    grep -q 1 && break
  sleep 0.1
done
sql -N -e "SELECT CONCAT(QUOTE(user),'@',QUOTE(host)) FROM mysql.user" | sort >"$dir/users.base"
sql -N -e "SHOW DATABASES" | sort >"$dir/dbs.base"

# Undo what a test left behind: its databases, accounts, and the global settings tests
# most often change.
reset_state() {
  local db user
  sql -N -e "SHOW DATABASES" | sort | comm -23 - "$dir/dbs.base" | while read -r db; do
    sql -e "DROP DATABASE \`$db\`" || true
  done
  sql -e "DROP DATABASE IF EXISTS test; CREATE DATABASE test" || true
  sql -N -e "SELECT CONCAT(QUOTE(user),'@',QUOTE(host)) FROM mysql.user" | sort |
    comm -23 - "$dir/users.base" | while read -r user; do
    sql -e "DROP USER $user" || true
  done
  sql -e "SET GLOBAL read_only=0; SET GLOBAL event_scheduler=OFF; FLUSH PRIVILEGES" || true
}

run_one() { # test port socket label
  local out=$dir/logs/$1.$4.log
  if (cd "$suite" && timeout 300 perl ./mariadb-test-run --extern host=127.0.0.1 \
    --extern port="$2" --extern socket="$3" --extern user=root --vardir="$dir/var" \
    --testcase-timeout=4 --force --nocheck-testcases "$1") >"$out" 2>&1; then
    echo pass
  elif grep -q "\[ skipped \]" "$out"; then
    echo skip
  else
    echo fail
  fi
}

if [ $# -gt 0 ]; then
  tests=("$@")
else
  mapfile -t tests < <(cd "$suite/main" && ls ./*.test | sed 's|^\./|main.|; s|\.test$||' | sort)
  # Tests that stop or restart the server (mtr cannot do that to a server it did not start),
  # or change the structure of the system tables (the next tests' logins would fail).
  mapfile -t tests < <(for t in "${tests[@]}"; do
    grep -qiE 'restart_mysqld|restart_mariadbd|shutdown_server|shutdown_mysqld|start_mysqld|kill_mysqld|crash_mysqld|wait_until_disconnected|mysqladmin.*shutdown|--bootstrap|(alter|truncate|drop|rename) table mysql\.' \
      "$suite/main/${t#main.}.test" || echo "$t"
  done)
  if [ -n "${MTR_SAMPLE:-}" ]; then
    mapfile -t tests < <(printf '%s\n' "${tests[@]}" |
      shuf --random-source=<(yes "${MTR_SEED:-42}") -n "$MTR_SAMPLE" | sort)
  fi
fi

: >"$dir/results.tsv"
# A test that stopped the server anyway: start it again (with its data) before the next.
alive() {
  if ! mariadb-admin --no-defaults -S "$node_sock" ping >/dev/null 2>&1 &&
    ! mariadb-admin --no-defaults -h127.0.0.1 -P"$node_port" ping 2>&1 | grep -q 'Access denied'; then
    echo "the server stopped after $1: starting it again" >&2
    "$holdfast" lab up --dir "$dir/lab" --replicas 0 --base-port "$base" >>"$dir/lab.log" 2>&1 || true
  fi
}

for t in "${tests[@]}"; do
  reset_state >/dev/null 2>&1 || true
  direct=$(run_one "$t" "$node_port" "$node_sock" direct)
  alive "$t"
  reset_state >/dev/null 2>&1 || true
  through=$(run_one "$t" "$base" "$dir/holdfast.sock" holdfast)
  alive "$t"
  printf '%s\t%s\t%s\n' "$t" "$direct" "$through" >>"$dir/results.tsv"
  if [ "$direct" != "$through" ]; then
    printf 'DIFFERS %-45s direct %-5s holdfast %s\n' "$t" "$direct" "$through"
  fi
done

awk -F'\t' '
  $2 == "pass" { pd++; if ($3 == "pass") both++ }
  { n++ }
  END {
    printf "mtr: %d tests, %d pass directly, %d of those pass through holdfast (%.1f%%)\n",
      n, pd, both, pd ? 100 * both / pd : 0
  }' "$dir/results.tsv"
