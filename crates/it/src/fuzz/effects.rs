//! What a fuzzed session did on the servers, read by a checker connected to each node
//! directly: the primary's binlog events of the session, the data it left, the locks it
//! held at its end (on any node), and anything binlogged on a replica under another
//! server id than the primary's (a write on a replica).

use super::{Targets, SETUP};
use crate::raw::{RawConn, Response, BASE_CAPS};
use anyhow::{bail, Context, Result};
use holdfast_client::parse_text_row;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// The effects compared between targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effects {
    /// The session's transactions in the primary's binlog, one line each (see
    /// [`summarise_binlog`]).
    pub binlog: Vec<String>,
    /// Rows of the fuzz schemas, the sequence, the tables and their counters.
    pub data: Vec<String>,
    /// Metadata locks and InnoDB transactions of the session's connections at its end,
    /// on whichever node they are.
    pub locks: Vec<String>,
    /// Not compared but required empty: GTIDs a replica binlogged under its own server id
    /// (or any id but the primary's) during the session.
    pub replica_writes: Vec<String>,
}

impl Effects {
    /// The compared fields: (name, direct, via).
    pub fn fields<'a>(
        &'a self,
        other: &'a Effects,
    ) -> [(&'static str, &'a Vec<String>, &'a Vec<String>); 3] {
        [
            ("binlog events", &self.binlog, &other.binlog),
            ("data left", &self.data, &other.data),
            ("locks held at the end", &self.locks, &other.locks),
        ]
    }
}

/// Where the session started: the primary's binlog position and each replica's
/// `gtid_binlog_state`.
pub struct Mark {
    file: String,
    pos: u64,
    replica_states: Vec<BTreeSet<String>>,
}

pub struct Checker {
    user: String,
    primary: RawConn,
    replicas: Vec<RawConn>,
    primary_server_id: String,
    /// When `INNODB_TRX` was last read (see [`TRX_CACHE_INTERVAL`]).
    trx_read: Option<std::time::Instant>,
}

/// InnoDB answers `information_schema.INNODB_TRX` from a cache that it refreshes only
/// when it was last read more than 100 ms ago (`TRX_I_S_CACHE_MIN_READ_INTERVAL_MS`): a
/// read sooner after the last one shows the transactions of then. The checker's reads
/// are spaced by more than that.
const TRX_CACHE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(120);

fn rows(c: &mut RawConn, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
    let mut out = Vec::new();
    for r in c.query(sql)? {
        if let Response::Rows { rows, .. } = r {
            out.extend(rows.iter().map(|row| parse_text_row(row)));
        }
    }
    Ok(out)
}

fn value(c: &mut RawConn, sql: &str) -> Result<String> {
    Ok(c.query_value(sql)?.unwrap_or_default())
}

fn cell(row: &[Option<String>], i: usize) -> String {
    row.get(i).cloned().flatten().unwrap_or_default()
}

impl Checker {
    pub fn connect(t: &Targets) -> Result<Checker> {
        let open = |addr| {
            RawConn::connect(addr, &t.user, &t.password, None, BASE_CAPS)
                .with_context(|| format!("the checker's connection to {addr}"))
        };
        let mut primary = open(t.direct)?;
        let mut replicas = t
            .replicas
            .iter()
            .map(|&a| open(a))
            .collect::<Result<Vec<_>>>()?;
        for c in std::iter::once(&mut primary).chain(replicas.iter_mut()) {
            let loaded = value(
                c,
                "SELECT COUNT(*) FROM information_schema.PLUGINS \
                 WHERE PLUGIN_NAME = 'METADATA_LOCK_INFO'",
            )?;
            if loaded == "0" {
                bail!(
                    "the metadata_lock_info plugin is not loaded on every node \
                     (INSTALL SONAME 'metadata_lock_info' as root, with sql_log_bin = 0)"
                );
            }
        }
        let primary_server_id = value(&mut primary, "SELECT @@server_id")?;
        Ok(Checker {
            user: t.user.clone(),
            primary,
            replicas,
            primary_server_id,
            trx_read: None,
        })
    }

    pub fn server_version(&mut self) -> Result<u32> {
        super::version_number(&value(&mut self.primary, "SELECT VERSION()")?)
    }

    /// The fuzz schemas made again, and applied by every replica.
    pub fn reset(&mut self) -> Result<()> {
        self.primary.query(SETUP)?;
        let pos = value(&mut self.primary, "SELECT @@gtid_binlog_pos")?;
        for r in &mut self.replicas {
            let waited = value(r, &format!("SELECT MASTER_GTID_WAIT('{pos}', 30)"))?;
            if waited != "0" {
                bail!("a replica did not apply {pos} within 30 s");
            }
        }
        Ok(())
    }

    pub fn mark(&mut self) -> Result<Mark> {
        let status = rows(&mut self.primary, "SHOW MASTER STATUS")?;
        let row = status.first().context("SHOW MASTER STATUS: no binlog")?;
        let file = cell(row, 0);
        let pos = cell(row, 1).parse().context("binlog position")?;
        let mut replica_states = Vec::new();
        for r in &mut self.replicas {
            replica_states.push(gtid_set(&value(r, "SELECT @@gtid_binlog_state")?));
        }
        Ok(Mark {
            file,
            pos,
            replica_states,
        })
    }

    /// Locks of the session's connections (the user's, but the checkers'), on every node.
    pub fn locks(&mut self) -> Result<Vec<String>> {
        let user = self.user.replace('\'', "''");
        let mdl = format!(
            "SELECT m.LOCK_MODE, m.LOCK_TYPE, m.TABLE_SCHEMA, m.TABLE_NAME \
             FROM information_schema.METADATA_LOCK_INFO m \
             JOIN information_schema.PROCESSLIST p ON p.ID = m.THREAD_ID \
             WHERE p.USER = '{user}' AND p.ID <> CONNECTION_ID() \
             AND IFNULL(m.TABLE_SCHEMA, '') <> 'holdfast'"
        );
        let trx = format!(
            // Not trx_rows_locked: it counts delete-marked records the purge thread has
            // not removed yet, which depends on when it ran.
            "SELECT x.trx_state, x.trx_rows_modified, x.trx_is_read_only \
             FROM information_schema.INNODB_TRX x \
             JOIN information_schema.PROCESSLIST p ON p.ID = x.trx_mysql_thread_id \
             WHERE p.USER = '{user}' AND p.ID <> CONNECTION_ID()"
        );
        if let Some(wait) = self
            .trx_read
            .and_then(|t| TRX_CACHE_INTERVAL.checked_sub(t.elapsed()))
        {
            std::thread::sleep(wait);
        }
        self.trx_read = Some(std::time::Instant::now());
        let mut out = Vec::new();
        for c in std::iter::once(&mut self.primary).chain(self.replicas.iter_mut()) {
            for row in rows(c, &mdl)? {
                out.push(format!("mdl {:?}", row));
            }
            for row in rows(c, &trx)? {
                out.push(format!("innodb trx {:?}", row));
            }
        }
        // Where a lock is held (a read-only transaction on a replica) is the split's
        // business; that it is held is what the client can tell. Such a transaction is
        // held on the primary too once a statement of it that is not a plain read ran
        // there (beside it, in a read-only transaction of the primary's own): the same
        // lock on both nodes is one lock to the client.
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Waits until no connection of the user but the checkers' is left on any node.
    pub fn wait_sessions_gone(&mut self) -> Result<()> {
        let user = self.user.replace('\'', "''");
        let sql = format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE USER = '{user}' AND ID <> CONNECTION_ID()"
        );
        let mut conns: Vec<&mut RawConn> = std::iter::once(&mut self.primary)
            .chain(self.replicas.iter_mut())
            .collect();
        let mut last = String::new();
        let gone = crate::poll(Duration::from_secs(15), || {
            for c in conns.iter_mut() {
                match value(c, &sql) {
                    Ok(n) if n == "0" => {}
                    Ok(n) => {
                        last = format!("{n} connections left");
                        return None;
                    }
                    Err(e) => {
                        last = format!("{e:#}");
                        return None;
                    }
                }
            }
            Some(())
        });
        if gone.is_none() {
            bail!("the session's connections stayed open: {last}");
        }
        Ok(())
    }

    pub fn effects(&mut self, mark: &Mark, locks: Vec<String>) -> Result<Effects> {
        let binlog = self.binlog_since(mark)?;
        let mut data = Vec::new();
        for sql in [
            "SELECT * FROM fuzz.t ORDER BY id",
            "SELECT * FROM fuzz.u ORDER BY id",
            "SELECT * FROM fuzz_b.t ORDER BY k",
            "SELECT * FROM fuzz.s",
            "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE, AUTO_INCREMENT \
             FROM information_schema.TABLES WHERE TABLE_SCHEMA IN ('fuzz', 'fuzz_b') \
             ORDER BY 1, 2",
        ] {
            match rows(&mut self.primary, sql) {
                Ok(rs) => data.extend(rs.into_iter().map(|r| format!("{sql}: {r:?}"))),
                Err(e) => data.push(format!("{sql}: {e:#}")),
            }
        }
        let mut replica_writes = Vec::new();
        for (r, before) in self.replicas.iter_mut().zip(&mark.replica_states) {
            let now = gtid_set(&value(r, "SELECT @@gtid_binlog_state")?);
            for g in now.difference(before) {
                let server = g.split('-').nth(1).unwrap_or("");
                if server != self.primary_server_id {
                    replica_writes.push(g.clone());
                }
            }
        }
        Ok(Effects {
            binlog,
            data,
            locks,
            replica_writes,
        })
    }

    /// The primary's binlog events from `mark` on, across rotations.
    fn binlog_since(&mut self, mark: &Mark) -> Result<Vec<String>> {
        let logs: Vec<String> = rows(&mut self.primary, "SHOW BINARY LOGS")?
            .iter()
            .map(|r| cell(r, 0))
            .filter(|f| f.as_str() >= mark.file.as_str())
            .collect();
        let mut events = Vec::new();
        for f in logs {
            let sql = if f == mark.file {
                format!("SHOW BINLOG EVENTS IN '{f}' FROM {}", mark.pos)
            } else {
                format!("SHOW BINLOG EVENTS IN '{f}'")
            };
            for row in rows(&mut self.primary, &sql)? {
                events.push((cell(&row, 2), cell(&row, 5)));
            }
        }
        Ok(summarise_binlog(&events))
    }
}

/// `0-1-5,0-2-7` as a set of its entries.
fn gtid_set(s: &str) -> BTreeSet<String> {
    s.split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(String::from)
        .collect()
}

/// Binlog events (type, info) as one line per transaction, without what legitimately
/// differs between a session run directly and through holdfast:
/// - numbers that only count (GTID sequence numbers, table ids, xids);
/// - holdfast's own writes: its commit marker (`CALL holdfast.mark_v1` inside the
///   autocommit wrap or before COMMIT) lands in `holdfast.commit_marker`, in the same
///   transaction as the client's writes. Its events are left out, and a transaction with
///   nothing else in it (a wrapped statement that changed no row: directly nothing is
///   binlogged) is left out whole: the marker is holdfast's bookkeeping, in its own schema,
///   which no client reads;
/// - the statements' texts (`Annotate_rows`: the row events are compared) and the writes
///   of sequences: MariaDB binlogs a sequence's cache refill in its own transaction when
///   the statement runs inside an explicit transaction (a sequence is not transactional),
///   so a `NEXTVAL` in an autocommit statement that holdfast wraps in BEGIN .. COMMIT for
///   its marker gives two GTIDs where the server alone gives one. The rows written and
///   their order are the same; the sequence's state is compared in [`Effects::data`].
pub fn summarise_binlog(events: &[(String, String)]) -> Vec<String> {
    let mut tables: HashMap<String, String> = HashMap::new();
    let mut txns: Vec<(String, Vec<String>)> = Vec::new();
    for (kind, info) in events {
        let kind = kind.as_str();
        match kind {
            "Gtid" => {
                // "BEGIN GTID 0-1-12" / "GTID 0-1-13" (a DDL).
                let head: Vec<&str> = info
                    .split_whitespace()
                    .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
                    .collect();
                txns.push((head.join(" "), Vec::new()));
                continue;
            }
            "Gtid_list" | "Binlog_checkpoint" | "Rotate" | "Format_desc" | "Stop"
            | "Start_encryption" => continue,
            _ => {}
        }
        let line = match kind {
            "Table_map" => {
                // "table_id: 35 (fuzz.t)"
                let id = info.split_whitespace().nth(1).unwrap_or("").to_string();
                let name = info
                    .rsplit_once('(')
                    .map_or(info.as_str(), |(_, n)| n.trim_end_matches(')'))
                    .to_string();
                tables.insert(id, name.clone());
                if skipped_table(&name) {
                    continue;
                }
                format!("Table_map {name}")
            }
            k if k.contains("_rows") && k != "Annotate_rows" => {
                // "table_id: 35 flags: STMT_END_F"
                let id = info.split_whitespace().nth(1).unwrap_or("");
                let name = tables.get(id).cloned().unwrap_or_default();
                if skipped_table(&name) {
                    continue;
                }
                let flags = info.split_once("flags:").map_or("", |(_, f)| f.trim());
                format!("{k} {name} {flags}")
            }
            "Annotate_rows" => continue,
            "Query" if info.to_ascii_lowercase().contains("holdfast") => continue,
            "Xid" => "COMMIT".to_string(),
            _ => format!("{kind} {}", mask_xid(info)),
        };
        match txns.last_mut() {
            Some((_, body)) => body.push(line),
            None => txns.push((String::new(), vec![line])),
        }
    }
    txns.into_iter()
        .filter(|(_, body)| {
            body.iter()
                .any(|l| l != "COMMIT" && l != "Query COMMIT" && l != "Query BEGIN")
        })
        .map(|(head, body)| format!("{head}: {}", body.join(" | ")))
        .collect()
}

/// holdfast's tables and the fuzz schema's sequence (see [`summarise_binlog`]).
fn skipped_table(name: &str) -> bool {
    name.starts_with("holdfast.") || name == "fuzz.s"
}

fn mask_xid(info: &str) -> String {
    match info.find("xid=") {
        Some(at) => {
            let rest = &info[at + 4..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            format!("{}xid=N{}", &info[..at], &rest[end..])
        }
        None => info.to_string(),
    }
}
