//! The differential harness: one scripted client session run directly against the server
//! and through holdfast, whose outcomes must be identical where a client can tell.
//!
//! Each [`Step`] is run with the raw client ([`crate::raw`]) and reduced to an [`Outcome`]:
//! every OK packet's fields (affected rows, last insert id, status flags, warning count,
//! info text and, when the client negotiated CLIENT_SESSION_TRACK, the decoded session
//! state records), every result set's rows and terminator status, ERR codes, SQLSTATEs
//! and messages; prepared statements give their column and parameter counts and binary
//! rows byte for byte.
//!
//! What legitimately differs is normalised here, explicitly, and nothing else:
//! - statement ids of prepared statements (holdfast hands out its own) are left out;
//! - the order of system variable records within one OK packet (see
//!   [`describe_session_state`]);
//! - connection ids and timings are not in the scripts' results: scripts must not select
//!   them (`CONNECTION_ID()`, `NOW()`, `SHOW PROCESSLIST`), or mask their columns with
//!   [`Step::Masked`].
//!
//! Between steps the runner waits [`QUIET`], longer than holdfast takes to treat a silent
//! session as idle, so that whatever holdfast does on an idle session (captures) happens
//! between the steps, where a client would notice it.

use crate::raw::{server_err, RawConn, Response};
use anyhow::{Context, Result};
use holdfast_client::parse_text_row;
use holdfast_wire::packets::OkPacket;
use holdfast_wire::session_track::{items, TrackItem};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

/// Longer than holdfast's idle probe (20 ms) plus a capture.
pub const QUIET: Duration = Duration::from_millis(120);

/// One client action.
#[derive(Debug, Clone)]
pub enum Step {
    /// COM_QUERY with all its responses.
    Query(String),
    /// COM_QUERY whose result columns at these indexes differ legitimately (ids, times).
    Masked(String, Vec<usize>),
    /// COM_STMT_PREPARE, COM_STMT_EXECUTE (no parameters, no cursor), COM_STMT_CLOSE:
    /// the binary protocol.
    Binary(String),
    /// COM_CHANGE_USER to (user, password, database).
    ChangeUser(String, String, String),
}

pub fn q(sql: &str) -> Step {
    Step::Query(sql.to_string())
}

pub fn binary(sql: &str) -> Step {
    Step::Binary(sql.to_string())
}

/// What a client saw for one step, normalised (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Err {
        code: u16,
        state: String,
        message: String,
    },
    Responses(Vec<Seen>),
    Prepared {
        columns: u16,
        params: u16,
        executed: Box<Outcome>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Ok {
        affected_rows: u64,
        last_insert_id: u64,
        status: u16,
        warnings: u16,
        info: String,
        session_state: Vec<String>,
    },
    Rows {
        columns: usize,
        rows: Vec<Vec<Option<String>>>,
        status: u16,
    },
}

/// Runs `steps` on a new connection to `addr` with capabilities `caps`.
pub fn run(
    addr: SocketAddr,
    login: (&str, &str, Option<&str>),
    caps: u32,
    steps: &[Step],
) -> Result<Vec<Outcome>> {
    let (user, password, database) = login;
    let mut c = RawConn::connect(addr, user, password, database, caps)
        .with_context(|| format!("connecting to {addr}"))?;
    let mut out = Vec::with_capacity(steps.len() + 1);
    // The login's OK packet first.
    out.push(login_outcome(&c));
    for step in steps {
        out.push(step_outcome(&mut c, step)?);
        std::thread::sleep(QUIET);
    }
    Ok(out)
}

/// Runs one step on `c`: its outcome, or an error when the connection failed (anything but
/// an ERR packet).
pub fn step_outcome(c: &mut RawConn, step: &Step) -> Result<Outcome> {
    Ok(match step {
        Step::Query(sql) => {
            let r = c.query(sql);
            outcome_of(c, r, &[], false)?
        }
        Step::Masked(sql, cols) => {
            let r = c.query(sql);
            outcome_of(c, r, cols, false)?
        }
        Step::ChangeUser(user, password, database) => {
            match c.change_user(user, password, database) {
                Ok(ok) => Outcome::Responses(vec![seen_ok(c, &ok)]),
                Err(e) => error_outcome(e)?,
            }
        }
        Step::Binary(sql) => match c.prepare(sql) {
            Err(e) => error_outcome(e)?,
            Ok(p) => {
                let r = c.execute_no_params(p.id, 0);
                let executed = outcome_of(c, r, &[], true)?;
                c.close_statement(p.id)?;
                Outcome::Prepared {
                    columns: p.columns,
                    params: p.params,
                    executed: Box::new(executed),
                }
            }
        },
    })
}

/// The login's OK packet as an outcome (outcome 0 of a session).
pub fn login_outcome(c: &RawConn) -> Outcome {
    Outcome::Responses(vec![seen_ok(c, &c.login_ok.clone())])
}

fn error_outcome(e: anyhow::Error) -> Result<Outcome> {
    match server_err(&e) {
        Some(se) => Ok(Outcome::Err {
            code: se.code,
            state: se.state.clone(),
            message: se.message.clone(),
        }),
        None => Err(e),
    }
}

fn outcome_of(
    c: &RawConn,
    r: Result<Vec<Response>>,
    masked: &[usize],
    binary: bool,
) -> Result<Outcome> {
    let responses = match r {
        Ok(r) => r,
        Err(e) => return error_outcome(e),
    };
    Ok(Outcome::Responses(
        responses
            .into_iter()
            .map(|r| match r {
                Response::Ok { payload, .. } => seen_ok(c, &payload),
                Response::Rows {
                    columns,
                    rows,
                    status,
                } => Seen::Rows {
                    columns,
                    rows: rows
                        .iter()
                        .map(|row| {
                            let mut cells = if binary {
                                // A binary row: compared byte for byte.
                                vec![Some(hex(row))]
                            } else {
                                parse_text_row(row)
                            };
                            for &i in masked {
                                if let Some(cell) = cells.get_mut(i) {
                                    *cell = Some("<masked>".into());
                                }
                            }
                            cells
                        })
                        .collect(),
                    status,
                },
            })
            .collect(),
    ))
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

fn seen_ok(c: &RawConn, payload: &[u8]) -> Seen {
    let ok = OkPacket::parse(payload, c.session_track())
        .unwrap_or_else(|e| panic!("bad OK packet {payload:02x?}: {e}"));
    Seen::Ok {
        affected_rows: ok.affected_rows,
        last_insert_id: ok.last_insert_id,
        status: ok.status,
        warnings: ok.warnings,
        info: String::from_utf8_lossy(ok.info).into_owned(),
        session_state: describe_session_state(ok.session_state),
    }
}

/// Session state records, one readable line each. The system variable records of one OK
/// are sorted by name (in the places they occupy): the server lists them in the order of
/// its hash of the tracked variables, which differs between a list of names and `*`
/// (holdfast's); clients take them as a set.
pub fn describe_session_state(block: &[u8]) -> Vec<String> {
    let mut lines: Vec<String> = items(block)
        .map(|item| match item {
            Ok(TrackItem::SystemVariable { name, value }) => format!(
                "variable {}={}",
                String::from_utf8_lossy(name),
                String::from_utf8_lossy(value)
            ),
            Ok(TrackItem::Schema(s)) => format!("schema {}", String::from_utf8_lossy(s)),
            Ok(TrackItem::StateChanged(b)) => format!("state changed {b}"),
            Ok(TrackItem::Gtids(g)) => format!("gtids {}", String::from_utf8_lossy(g)),
            Ok(TrackItem::TransactionCharacteristics(t)) => {
                format!("characteristics {}", String::from_utf8_lossy(t))
            }
            Ok(TrackItem::TransactionState(t)) => {
                format!("transaction state {}", String::from_utf8_lossy(t))
            }
            Ok(TrackItem::Unknown(k)) => format!("unknown record type {k}"),
            Err(e) => format!("undecodable: {e}"),
        })
        .collect();
    let at: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("variable "))
        .collect();
    let mut variables: Vec<String> = at.iter().map(|&i| lines[i].clone()).collect();
    variables.sort();
    for (i, v) in at.into_iter().zip(variables) {
        lines[i] = v;
    }
    lines
}

/// The steps whose outcomes differ, side by side (empty: none). Outcome 0 is the login's
/// OK packet, outcome `i + 1` step `i`'s.
pub fn differences(steps: &[Step], direct: &[Outcome], via: &[Outcome]) -> String {
    let mut out = String::new();
    let names = std::iter::once("login".to_string()).chain(
        steps
            .iter()
            .enumerate()
            .map(|(i, s)| format!("step {i} {s:?}")),
    );
    for (i, name) in names.enumerate() {
        let (d, v) = (direct.get(i), via.get(i));
        if d != v {
            let _ = writeln!(out, "{name}\n  server:   {d:?}\n  holdfast: {v:?}");
        }
    }
    out
}
