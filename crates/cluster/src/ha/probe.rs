//! Reading a node's replication state with the monitor account.

use super::gtid::GtidPos;
use super::HaError;
use crate::config::{BackendConfig, Config};
use crate::control::monitor_connect;
use crate::control::{BackendConn, BackendError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Largest packet read in control queries.
const MAX_PACKET: usize = 16 << 20;

/// A result with column names (for `SHOW SLAVE STATUS`, whose columns vary by version).
#[derive(Debug, Default, Clone)]
pub struct NamedResult {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<String>>>,
}

impl NamedResult {
    /// The rows as maps from column name to value.
    pub fn maps(&self) -> Vec<BTreeMap<String, Option<String>>> {
        self.rows
            .iter()
            .map(|r| {
                self.columns
                    .iter()
                    .cloned()
                    .zip(r.iter().cloned())
                    .collect()
            })
            .collect()
    }
}

/// A monitor-account connection to one node, with per-statement timeouts and a log line
/// for every statement that changes something.
pub struct NodeSession {
    pub name: String,
    pub address: String,
    conn: BackendConn,
    timeout: Duration,
}

impl NodeSession {
    /// Connects with the monitor account; `timeout` bounds the connect and each statement.
    pub async fn connect(
        cfg: &Config,
        node: &BackendConfig,
        timeout: Duration,
    ) -> Result<NodeSession, HaError> {
        let conn = tokio::time::timeout(timeout, monitor_connect(cfg, &node.address))
            .await
            .map_err(|_| HaError::Unreachable {
                node: node.name.clone(),
                source: Box::new(BackendError::Timeout(timeout)),
            })?
            .map_err(|source| HaError::Unreachable {
                node: node.name.clone(),
                source: Box::new(source),
            })?;
        Ok(NodeSession {
            name: node.name.clone(),
            address: node.address.clone(),
            conn,
            timeout,
        })
    }

    /// This connection's thread id on the node.
    pub fn thread(&self) -> u32 {
        self.conn.greeting.connection_id
    }

    /// Runs a statement that changes state, logged.
    pub async fn exec(&mut self, sql: &str) -> Result<(), HaError> {
        tracing::info!(node = %self.name, sql = %redact(sql), "ha: executing");
        self.query_within(sql, self.timeout).await.map(|_| ())
    }

    /// Runs a query and returns its rows (text values).
    pub async fn rows(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, HaError> {
        self.query_within(sql, self.timeout).await.map(|r| r.rows)
    }

    /// The first column of the first row.
    pub async fn value(&mut self, sql: &str) -> Result<Option<String>, HaError> {
        Ok(self
            .rows(sql)
            .await?
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next().flatten()))
    }

    /// Runs a query with its own time limit, keeping column names.
    pub async fn query_within(
        &mut self,
        sql: &str,
        limit: Duration,
    ) -> Result<NamedResult, HaError> {
        match tokio::time::timeout(limit, query_named(&mut self.conn, sql)).await {
            Err(_) => Err(HaError::StatementTimeout {
                node: self.name.clone(),
                sql: redact(sql),
                after: limit,
            }),
            Ok(Err(source)) => Err(HaError::Sql {
                node: self.name.clone(),
                sql: redact(sql),
                source: Box::new(source),
            }),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// Reads this node's replication state.
    pub async fn replication(&mut self) -> Result<NodeReplication, HaError> {
        let row = self
            .rows(
                "SELECT @@global.read_only, @@global.gtid_current_pos, @@global.gtid_binlog_pos, \
                 @@global.gtid_slave_pos, @@global.server_id, VERSION()",
            )
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| HaError::Unexpected {
                node: self.name.clone(),
                detail: "replication variables query returned no row".into(),
            })?;
        let col = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
        let gtid = |i: usize| {
            col(i)
                .parse::<GtidPos>()
                .map_err(|source| HaError::BadGtid {
                    node: self.name.clone(),
                    source,
                })
        };
        let read_only = col(0);
        let mut out = NodeReplication {
            name: self.name.clone(),
            address: self.address.clone(),
            reachable: true,
            error: None,
            read_only: Some(is_on(&read_only)),
            gtid_current_pos: gtid(1)?,
            gtid_binlog_pos: gtid(2)?,
            gtid_slave_pos: gtid(3)?,
            server_id: col(4).parse().ok(),
            version: col(5),
            slave: None,
        };
        let status = self.query_within("SHOW SLAVE STATUS", self.timeout).await?;
        if let Some(m) = status.maps().into_iter().next() {
            out.slave = Some(SlaveStatus::from_map(&self.name, &m)?);
        }
        Ok(out)
    }
}

/// A server variable's boolean as SELECT or SHOW returns it (`1`/`0`, `ON`/`OFF`).
pub fn is_on(value: &str) -> bool {
    value == "1" || value.eq_ignore_ascii_case("on")
}

/// Hides the replication password in logged SQL (everything after `MASTER_PASSWORD=`).
fn redact(sql: &str) -> String {
    match sql.find("MASTER_PASSWORD=") {
        // The manager always writes the password as the statement's last clause.
        Some(i) => format!("{}MASTER_PASSWORD=<redacted>", &sql[..i]),
        None => sql.to_string(),
    }
}

/// Runs `sql` and collects its last result with column names.
async fn query_named(conn: &mut BackendConn, sql: &str) -> Result<NamedResult, BackendError> {
    let r = conn.execute(sql.as_bytes(), MAX_PACKET).await?;
    Ok(NamedResult {
        rows: r.text_rows(),
        columns: r.columns,
    })
}

/// The parts of `SHOW SLAVE STATUS` the manager uses.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SlaveStatus {
    pub master_host: String,
    pub master_port: Option<u16>,
    pub io_running: String,
    pub sql_running: String,
    pub seconds_behind_master: Option<u64>,
    pub gtid_io_pos: GtidPos,
    pub last_io_errno: u32,
    pub last_io_error: String,
    pub last_sql_errno: u32,
    pub last_error: String,
    pub using_gtid: String,
}

impl SlaveStatus {
    /// The first row of a `SHOW SLAVE STATUS` answer (`None`: replication is not set up).
    pub(crate) fn of_answer(
        node: &str,
        answer: holdfast_client::Executed,
    ) -> Option<Result<SlaveStatus, HaError>> {
        let named = NamedResult {
            rows: answer.text_rows(),
            columns: answer.columns,
        };
        let map = named.maps().into_iter().next()?;
        Some(SlaveStatus::from_map(node, &map))
    }

    fn from_map(node: &str, m: &BTreeMap<String, Option<String>>) -> Result<Self, HaError> {
        let s = |k: &str| m.get(k).cloned().flatten().unwrap_or_default();
        Ok(SlaveStatus {
            master_host: s("Master_Host"),
            master_port: s("Master_Port").parse().ok(),
            io_running: s("Slave_IO_Running"),
            sql_running: s("Slave_SQL_Running"),
            seconds_behind_master: s("Seconds_Behind_Master").parse().ok(),
            gtid_io_pos: s("Gtid_IO_Pos")
                .parse()
                .map_err(|source| HaError::BadGtid {
                    node: node.to_string(),
                    source,
                })?,
            last_io_errno: s("Last_IO_Errno").parse().unwrap_or(0),
            last_io_error: s("Last_IO_Error"),
            last_sql_errno: s("Last_SQL_Errno").parse().unwrap_or(0),
            last_error: s("Last_Error"),
            using_gtid: s("Using_Gtid"),
        })
    }

    /// Where it replicates from, `host:port`.
    pub fn source(&self) -> String {
        match self.master_port {
            Some(p) => format!("{}:{p}", self.master_host),
            None => self.master_host.clone(),
        }
    }

    /// Whether both threads run.
    pub fn running(&self) -> bool {
        self.io_running == "Yes" && self.sql_running == "Yes"
    }

    /// Whether the IO thread is connected to its primary right now.
    pub fn io_connected(&self) -> bool {
        self.io_running == "Yes"
    }

    /// Whether this replica replicates from `host:port`.
    pub fn points_at(&self, address: &str) -> bool {
        match super::split_address(address) {
            Ok((host, port)) => self.master_host == host && self.master_port == Some(port),
            Err(_) => false,
        }
    }
}

/// What one node reports about replication; `reachable == false` with `error` when the
/// probe failed.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NodeReplication {
    pub name: String,
    pub address: String,
    pub reachable: bool,
    pub error: Option<String>,
    pub read_only: Option<bool>,
    pub gtid_current_pos: GtidPos,
    pub gtid_binlog_pos: GtidPos,
    pub gtid_slave_pos: GtidPos,
    pub server_id: Option<u32>,
    pub version: String,
    /// `None`: no replication configured (`SHOW SLAVE STATUS` is empty).
    pub slave: Option<SlaveStatus>,
}

impl NodeReplication {
    fn unreachable(node: &BackendConfig, error: String) -> Self {
        NodeReplication {
            name: node.name.clone(),
            address: node.address.clone(),
            reachable: false,
            error: Some(error),
            read_only: None,
            gtid_current_pos: GtidPos::default(),
            gtid_binlog_pos: GtidPos::default(),
            gtid_slave_pos: GtidPos::default(),
            server_id: None,
            version: String::new(),
            slave: None,
        }
    }

    /// Reachable and `read_only=OFF`.
    pub fn writable(&self) -> bool {
        self.reachable && self.read_only == Some(false)
    }

    /// Everything this node has: its binlog and its applied replication position merged.
    pub fn executed(&self) -> GtidPos {
        self.gtid_binlog_pos.merge_max(&self.gtid_slave_pos)
    }
}

/// Probes one node; a connection or query failure gives `reachable == false`.
pub async fn probe_node(cfg: &Config, node: &BackendConfig, timeout: Duration) -> NodeReplication {
    let result = async {
        let mut s = NodeSession::connect(cfg, node, timeout).await?;
        s.replication().await
    }
    .await;
    match result {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(node = %node.name, error = %e, "ha: probe failed");
            NodeReplication::unreachable(node, e.to_string())
        }
    }
}

/// Probes every node concurrently; results in `nodes` order.
pub async fn probe_all(
    cfg: &Config,
    nodes: &[BackendConfig],
    timeout: Duration,
) -> Vec<NodeReplication> {
    let mut set = tokio::task::JoinSet::new();
    for (i, n) in nodes.iter().enumerate() {
        let (cfg, n) = (cfg.clone(), n.clone());
        set.spawn(async move { (i, probe_node(&cfg, &n, timeout).await) });
    }
    let mut out: Vec<Option<NodeReplication>> = nodes.iter().map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        if let Ok((i, r)) = joined {
            if let Some(slot) = out.get_mut(i) {
                *slot = Some(r);
            }
        }
    }
    out.into_iter()
        .zip(nodes)
        .map(|(r, n)| {
            r.unwrap_or_else(|| NodeReplication::unreachable(n, "probe task failed".into()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_password() {
        let s = "CHANGE MASTER TO MASTER_USER='repl', MASTER_USE_GTID=slave_pos, MASTER_PASSWORD='x, y'";
        let r = redact(s);
        assert!(!r.contains("'x"), "{r}");
        assert!(r.contains("MASTER_PASSWORD=<redacted>"));
        assert_eq!(redact("SELECT 1"), "SELECT 1");
    }
}
