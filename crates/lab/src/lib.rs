//! holdfast's lab: real MariaDB servers on loopback for tests, demos and benchmarks.
//!
//! * [`up`] / [`status`] / [`down`] manage a lab in a directory: node1 is a GTID primary,
//!   node2… are read-only replicas of it, every node runs `mariadbd --no-defaults` with
//!   explicit options, detached in its own session. `DIR/lab.json` records the
//!   [`LabStatus`]; `DIR/holdfast.toml` points holdfast at the nodes. [`status`] also asks
//!   each running node for its role now (`live_role`), which a switchover changes.
//! * [`add_replica`] / [`remove_node`] grow and shrink a running lab: a new replica is
//!   seeded from a dump of the current primary, then replicates from it by GTID.
//! * [`TestLab`] is the same in a temp directory on free ports, torn down on drop.
//! * [`node_sql`] runs SQL as root on a node through its unix socket.
//! * [`LabCommand`] / [`run`] are the `holdfast lab` CLI.
//! * [`wait_for`] / [`poll`]: polling until a condition holds, for tests and tools.
//! * [`procs`]: process and port helpers (also used by `holdfast-bench`).
//! * [`progress`]: a long phase shown while it lasts (lab start, sysbench prepare).
//!
//! # Port layout
//! With base port `P` ([`DEFAULT_BASE_PORT`] = 3310 for the CLI): holdfast's proxy
//! listener `P`, its admin listener `P+1`, its read/write-split listener `P+2` (not for a
//! serverless lab), node *i* (1-based) `P+10+i-1`; a node added later takes the first free
//! port from its own slot on (`nodeK`: `P+10+K-1`; another name: from `P+10`). Without a
//! base port (tests) every listener gets a free port.
//!
//! # Speed
//! `mariadb-install-db` runs once per server version into a cached template
//! (`$TMPDIR/holdfast-lab-template-v2-<version>/`); nodes get a `cp -a` of it.

mod certs;
mod cli;
pub mod etcd;
mod lab;
pub mod mysql_client;
mod node_driver;
pub mod procs;
pub mod progress;
mod template;
mod wait;

pub use certs::{generate as generate_tls, LabTls};
pub use cli::{run, status_table, LabCommand};
pub use lab::{
    add_replica, down, holdfast_config, kill_node, node_command, node_sql, node_sql_maps,
    node_sql_value, purge, register_aux, remove_node, resolve_mariadbd, restart_node,
    serverless_section, start_node, status, stop_node, unregister_aux, up, AuxProcess, LabOptions,
    LabStatus, NodeStatus, TestLab, ADMIN_PORT_OFFSET, APP_PASSWORD, APP_USER, DATABASE,
    DEFAULT_BASE_PORT, ED25519_PASSWORD, ED25519_USER, MONITOR_PASSWORD, MONITOR_USER,
    NODE_PORT_OFFSET, PROXY_PORT_OFFSET, REPL_PASSWORD, REPL_USER, SPLIT_PORT_OFFSET,
};
pub use node_driver::LabNodeDriver;
pub use wait::{poll, wait_for};
