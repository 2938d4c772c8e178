#!/usr/bin/env bash
# Installs what holdfast's demo, tests and benchmarks run against: MariaDB server and client,
# sysbench, HAProxy, openssl, nftables (the chaos drill's network cuts), systemd (its
# unit checker), etcd and protoc (the fleet), Chromium (the dashboard's test) from the OS packages, and the Python drivers used by the tests.
# Idempotent: skips what is already there.
set -euo pipefail

need=()
command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || need+=(mariadb-client)
command -v sysbench >/dev/null 2>&1 || need+=(sysbench)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need+=(nftables)
# ss shows the TCP retransmissions a network-cut test waits on (crates/it netcut).
command -v ss >/dev/null 2>&1 || [ -x /usr/bin/ss ] || need+=(iproute2)
command -v python3 >/dev/null 2>&1 || need+=(python3 python3-pip)
# systemd-analyze checks the packaged unit (packaging/holdfast.service).
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
# An idle JDBC connection across upgrades (crates/holdfast/tests/upgrade.rs).
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
[ -f /usr/share/java/mariadb-java-client.jar ] || need+=(libmariadb-java)
# A fleet of holdfast processes coordinates through etcd (crates/fleet); the etcd client's
# protocol files are compiled at build time (protoc).
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# The dashboard is tested in a real browser (crates/holdfast/tests/dashboard.rs).
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing OS packages: ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The Debian package may start a system mariadbd; holdfast's lab runs its own.
if ! python3 -c 'import mysql.connector, pymysql' >/dev/null 2>&1; then
  echo "installing Python drivers: mysql-connector-python pymysql"
  python3 -m pip install -q mysql-connector-python pymysql 2>/dev/null \
    || python3 -m pip install -q --break-system-packages mysql-connector-python pymysql
fi
