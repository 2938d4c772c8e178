//! Running one operation of the chaos workload on a connection (text or prepared, in a
//! transaction or autocommit) and deciding its outcome from the error, if any.

use mysql::prelude::Queryable;
use mysql::Conn;

use super::history::{parse_list, Body, Mop, OpError, Outcome};

/// The tables (in the database `chaos`).
pub const LIST_TABLE: &str = "chaos.la";
pub const BANK_TABLE: &str = "chaos.bank";
/// One row per leg of each transfer, written in the transfer's transaction:
/// `(transfer, account, delta)`, keyed by `(transfer, account)`.
pub const LEDGER_TABLE: &str = "chaos.ledger";

/// Codes with which the server (or holdfast) says the statement, and with it the whole
/// transaction, did not happen: deadlock victim (also holdfast's rollback), lock wait
/// timeout, record changed, read-only refusals.
const FAILED: [u16; 5] = [1213, 1205, 1020, 1290, 1792];

/// How an operation failed.
#[derive(Debug)]
pub struct Failed {
    pub outcome: Outcome,
    pub error: OpError,
    /// The connection is not usable any more (log in again).
    pub broken: bool,
}

/// An error of the driver or the server, with whether it left the connection broken.
fn op_error(e: &mysql::Error, at_commit: bool) -> (OpError, bool) {
    match e {
        mysql::Error::MySqlError(m) => (
            OpError {
                code: m.code,
                message: m.message.clone(),
                at_commit,
            },
            // The server (or holdfast) ended the connection.
            matches!(m.code, 1927 | 1053 | 1077 | 1158 | 1159 | 1160 | 1161),
        ),
        other => (
            OpError {
                code: 0,
                message: other.to_string(),
                at_commit,
            },
            true,
        ),
    }
}

/// The outcome of an error answering the statement that would have committed: failed
/// when the server said so, unknown otherwise.
fn commit_outcome(code: u16) -> Outcome {
    match FAILED.contains(&code) {
        true => Outcome::Fail,
        false => Outcome::Info,
    }
}

/// A statement, as text or prepared (cached by the driver, per connection).
fn run(conn: &mut Conn, prepared: bool, sql: &str) -> mysql::Result<()> {
    match prepared {
        true => conn.exec_drop(sql, ()),
        false => conn.query_drop(sql),
    }
}

/// A list-append micro-operation; reads fill in their list.
fn list_mop(conn: &mut Conn, prepared: bool, m: &mut Mop) -> mysql::Result<()> {
    match m {
        Mop::Append { key, value } => {
            let sql = format!(
                "INSERT INTO {LIST_TABLE} (k, v) VALUES (?, ?) \
                 ON DUPLICATE KEY UPDATE v = CONCAT(v, ',', VALUES(v))"
            );
            match prepared {
                true => conn.exec_drop(sql, (*key, value.to_string())),
                false => conn.query_drop(sql.replacen('?', &key.to_string(), 1).replacen(
                    '?',
                    &format!("'{value}'"),
                    1,
                )),
            }
        }
        Mop::Read { key, list } => {
            let v: Option<Option<String>> = match prepared {
                true => {
                    conn.exec_first(format!("SELECT v FROM {LIST_TABLE} WHERE k = ?"), (*key,))?
                }
                false => conn.query_first(format!("SELECT v FROM {LIST_TABLE} WHERE k = {key}"))?,
            };
            *list = Some(parse_list(v.flatten().as_deref()));
            Ok(())
        }
    }
}

fn bank_step(conn: &mut Conn, prepared: bool, body: &mut Body) -> mysql::Result<()> {
    match body {
        Body::Transfer {
            id: transfer,
            from,
            to,
            amount,
        } => {
            for (id, delta) in [(*from, -*amount), (*to, *amount)] {
                let update = format!("UPDATE {BANK_TABLE} SET balance = balance + ? WHERE id = ?");
                let leg = format!(
                    "INSERT INTO {LEDGER_TABLE} (transfer, account, delta) VALUES (?, ?, ?)"
                );
                match prepared {
                    true => {
                        conn.exec_drop(update, (delta, id))?;
                        conn.exec_drop(leg, (*transfer, id, delta))?;
                    }
                    false => {
                        conn.query_drop(format!(
                            "UPDATE {BANK_TABLE} SET balance = balance + {delta} WHERE id = {id}"
                        ))?;
                        conn.query_drop(format!(
                            "INSERT INTO {LEDGER_TABLE} (transfer, account, delta) \
                             VALUES ({transfer}, {id}, {delta})"
                        ))?;
                    }
                }
            }
            Ok(())
        }
        Body::Balances(out) => {
            let sql = format!("SELECT id, balance FROM {BANK_TABLE} ORDER BY id");
            let rows: Vec<(u32, i64)> = match prepared {
                true => conn.exec(sql, ())?,
                false => conn.query(sql)?,
            };
            *out = Some(rows.into_iter().map(|(_, b)| b).collect());
            Ok(())
        }
        Body::List(_) | Body::Connect => Ok(()),
    }
}

/// The statements of one operation, without the transaction around them.
fn steps(conn: &mut Conn, prepared: bool, body: &mut Body) -> mysql::Result<()> {
    match body {
        Body::List(mops) => {
            for m in mops.iter_mut() {
                list_mop(conn, prepared, m)?;
            }
            Ok(())
        }
        other => bank_step(conn, prepared, other),
    }
}

/// Runs `body` (explicit: inside a transaction, read-only when `read_only`; else one
/// autocommit statement) and returns how it failed, if it did.
pub fn execute(
    conn: &mut Conn,
    body: &mut Body,
    explicit: bool,
    read_only: bool,
    prepared: bool,
) -> Result<(), Failed> {
    if !explicit {
        return steps(conn, prepared, body).map_err(|e| {
            let (error, broken) = op_error(&e, true);
            Failed {
                outcome: commit_outcome(error.code),
                error,
                broken,
            }
        });
    }
    let begin = match read_only {
        true => "START TRANSACTION READ ONLY",
        false => "START TRANSACTION",
    };
    let before_commit = run(conn, prepared, begin).and_then(|()| steps(conn, prepared, body));
    if let Err(e) = before_commit {
        // The COMMIT was never sent: whatever ran is rolled back.
        let (error, mut broken) = op_error(&e, false);
        if !broken {
            broken = conn.query_drop("ROLLBACK").is_err();
        }
        return Err(Failed {
            outcome: Outcome::Fail,
            error,
            broken,
        });
    }
    run(conn, prepared, "COMMIT").map_err(|e| {
        let (error, mut broken) = op_error(&e, true);
        if !broken {
            broken = conn.query_drop("ROLLBACK").is_err();
        }
        Failed {
            outcome: commit_outcome(error.code),
            error,
            broken,
        }
    })
}
