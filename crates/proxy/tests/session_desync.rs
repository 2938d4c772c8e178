//! A session must never fall out of step with its client: whatever becomes of the backend,
//! each command gets exactly the reply its shape calls for (none for COM_STMT_CLOSE and
//! COM_STMT_SEND_LONG_DATA, one OK/ERR after a LOCAL INFILE file), so the next reply the
//! client reads is its next command's. Against scripted backends over in-process pipes
//! (`common/mod.rs`), on a paused clock: tokio moves time only when every task waits, so
//! the order of events is the same on every run, and a hang is a deadline that passes
//! at once.

mod common;

use common::*;
use holdfast_client::DEFAULT_CAPABILITIES;
use holdfast_proxy::conn::PacketConn;
use holdfast_wire::caps::{CLIENT_DEPRECATE_EOF, CLIENT_LOCAL_FILES};
use holdfast_wire::codec::Reader;
use holdfast_wire::command::*;
use holdfast_wire::frame;
use holdfast_wire::packets::PrepareOk;
use holdfast_wire::response::{Event, Expect, Kind, ResponseMachine};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The codes holdfast answers a command lost with its backend with: rolled back (1213),
/// COMMIT outcome unknown (1180), statement interrupted (1317).
const LOST: [u16; 3] = [1213, 1180, 1317];

const CAPS: u32 = DEFAULT_CAPABILITIES | CLIENT_LOCAL_FILES;

// ---------------------------------------------------------------------------------------
// Reading replies as a client

/// A reply as the client read it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    Ok {
        seq: u8,
        affected: u64,
    },
    Err {
        seq: u8,
        code: u16,
    },
    Rows {
        seq: u8,
        rows: Vec<Vec<Option<String>>>,
    },
    Prepared {
        seq: u8,
        id: u32,
        column: String,
    },
    /// The server asks for a LOCAL INFILE file.
    Infile {
        seq: u8,
    },
    /// The connection closed after `packets` packets of the reply.
    Closed {
        packets: usize,
    },
    Garbled(String),
}

/// A column definition's name.
fn column_name(def: &[u8]) -> String {
    let mut r = Reader::new(def);
    for _ in 0..4 {
        let _ = r.lenenc_bytes("column");
    }
    r.lenenc_bytes("name")
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .unwrap_or_default()
}

/// A row's values: text protocol, or binary with every column a string.
fn row_values(row: &[u8], columns: usize, binary: bool) -> Vec<Option<String>> {
    let mut r = Reader::new(row);
    let mut nulls = Vec::new();
    if binary {
        let _ = r.u8("header");
        if let Ok(bitmap) = r.take((columns + 9) / 8, "null bitmap") {
            nulls = bitmap.to_vec();
        }
    }
    (0..columns)
        .map(|i| {
            let null = if binary {
                nulls
                    .get((i + 2) / 8)
                    .is_some_and(|b| b & (1 << ((i + 2) % 8)) != 0)
            } else {
                row.get(r.position()) == Some(&0xfb) && {
                    let _ = r.u8("null");
                    true
                }
            };
            if null {
                return None;
            }
            r.lenenc_bytes("value")
                .ok()
                .map(|v| String::from_utf8_lossy(v).into_owned())
        })
        .collect()
}

/// Reads one reply (or, for a LOCAL INFILE request, its first part: `m` then waits for
/// the answer that follows the file).
async fn read_reply(conn: &mut PacketConn, m: &mut ResponseMachine, binary: bool) -> Got {
    let mut first_seq = None;
    let mut packets = 0usize;
    let mut columns: Option<usize> = None;
    let mut defs: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    let mut prepared: Option<PrepareOk> = None;
    let mut result = None;
    while !m.is_done() {
        let p = match conn.read_packet(1 << 24).await {
            Ok(p) => p,
            Err(_) => return Got::Closed { packets },
        };
        packets += 1;
        let seq = *first_seq.get_or_insert(p.seq);
        let payload = &p.payload[..];
        match m.classify(payload.len(), payload.first().copied()) {
            Kind::Opaque => match columns {
                Some(n) if defs.len() >= n => rows.push(row_values(payload, n, binary)),
                _ => defs.push(column_name(payload)),
            },
            Kind::Inspect => match m.on_packet(payload) {
                Ok(Event::None) => {
                    let n = Reader::new(payload).lenenc_int("column count");
                    columns = n.ok().map(|n| n as usize);
                }
                Ok(Event::Ok(ok)) if columns.is_none() => {
                    result = Some(Got::Ok {
                        seq,
                        affected: ok.affected_rows,
                    })
                }
                Ok(Event::Ok(_)) | Ok(Event::Eof(_)) => {}
                Ok(Event::Err(e)) => return Got::Err { seq, code: e.code },
                Ok(Event::LocalInfile) => return Got::Infile { seq },
                Ok(Event::PrepareOk(ok)) => prepared = Some(ok),
                Err(e) => return Got::Garbled(format!("{e} in {payload:02x?}")),
            },
        }
    }
    let seq = first_seq.unwrap_or(0);
    if let Some(ok) = prepared {
        return Got::Prepared {
            seq,
            id: ok.statement_id,
            column: defs.last().cloned().unwrap_or_default(),
        };
    }
    match (result, columns) {
        (_, Some(_)) => Got::Rows { seq, rows },
        (Some(r), None) => r,
        (None, None) => Got::Garbled("an empty reply".into()),
    }
}

fn deprecate_eof(conn_caps: u32) -> bool {
    conn_caps & CLIENT_DEPRECATE_EOF != 0
}

fn one(value: &str) -> Vec<Vec<Option<String>>> {
    vec![vec![Some(value.to_string())]]
}

/// Sends `payload` as a new command; returns the machine to read its reply with.
async fn send(rig: &mut Rig, payload: &[u8], expect: Expect) -> ResponseMachine {
    let eof = deprecate_eof(rig.client.capabilities);
    let conn = &mut rig.client.conn;
    conn.write_packet(payload, 0).await.expect("request sent");
    ResponseMachine::new(expect, eof)
}

/// Reads (the next part of) a reply, within [`WAIT`].
async fn read(rig: &mut Rig, m: &mut ResponseMachine, binary: bool) -> Got {
    within("the reply", read_reply(&mut rig.client.conn, m, binary)).await
}

/// Sends `payload` as a new command and reads its reply.
async fn command(rig: &mut Rig, payload: &[u8], expect: Expect, binary: bool) -> Got {
    let mut m = send(rig, payload, expect).await;
    read(rig, &mut m, binary).await
}

/// A LOCAL INFILE file of `packets` packets of `size` bytes each, sequence ids from 2, and
/// the sequence id of the answer that follows it.
fn file_packets(packets: usize, size: usize, fill: &[u8]) -> (Vec<u8>, u8) {
    let mut out = Vec::new();
    let mut seq = 2u8;
    for _ in 0..packets {
        let data: Vec<u8> = fill.iter().copied().cycle().take(size).collect();
        seq = frame::put_packet(&mut out, &data, seq);
    }
    seq = frame::put_packet(&mut out, &[], seq);
    (out, seq)
}

// ---------------------------------------------------------------------------------------
// The cases seen in the code

/// The backend connection dies right after answering COM_STMT_PREPARE, so holdfast's
/// COM_STMT_CLOSE finds it gone. The close has no reply: the client must get nothing for
/// it, and the next query's reply must be that query's, byte for byte. The closed
/// statement is not prepared again on the new backend.
#[tokio::test(start_paused = true)]
async fn stmt_close_written_to_a_dead_backend_gets_no_reply() {
    let first_script = Script::default().fate(|seen| match seen.payload.first() {
        Some(&COM_STMT_PREPARE) => Fate::AnswerThenHangUp,
        _ => Fate::Answer,
    });
    let (first, first_log) = ScriptedServer::new(first_script);
    let (second, second_log) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![first, second]).await;
    let prepared = command(
        &mut rig,
        &[&[COM_STMT_PREPARE][..], b"SELECT ? AS c1"].concat(),
        Expect::Prepare,
        false,
    )
    .await;
    let Got::Prepared { id, .. } = prepared else {
        panic!("the statement was not prepared: {prepared:?}");
    };
    assert!(first_log.wait_ended().await.contains("after answering"));
    let conn = &mut rig.client.conn;
    conn.write_packet(&statement_request(COM_STMT_CLOSE, id, &[]), 0)
        .await
        .expect("close sent");
    let got = rig.raw_answer(&query("SELECT 7"), &second_log).await;
    assert_eq!(
        got,
        encode(&Reply::value("7"), true),
        "the reply to SELECT 7 (not an error for the close)"
    );
    assert_eq!(got, second_log.last_answer());
    assert_eq!(rig.anything_within(Duration::from_secs(1)).await, None);
    assert_eq!(
        second_log.count(COM_STMT_PREPARE),
        0,
        "the closed statement was prepared again on the new backend"
    );
    assert_eq!(rig.shared.metrics.requests_failed_on_backend_loss.get(), 0);
}

/// The backend hangs up on receiving COM_STMT_CLOSE: nothing reaches the client for the
/// close, the next query runs on a new backend and its reply is its own, byte for byte.
#[tokio::test(start_paused = true)]
async fn stmt_close_whose_backend_hangs_up_on_receiving_it_gets_no_reply() {
    let first_script = Script::default().fate(|seen| match seen.payload.first() {
        Some(&COM_STMT_CLOSE) => Fate::HangUp,
        _ => Fate::Answer,
    });
    let (first, first_log) = ScriptedServer::new(first_script);
    let (second, second_log) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![first, second]).await;
    let prepared = command(
        &mut rig,
        &[&[COM_STMT_PREPARE][..], b"SELECT ? AS c1"].concat(),
        Expect::Prepare,
        false,
    )
    .await;
    let Got::Prepared { id, .. } = prepared else {
        panic!("the statement was not prepared: {prepared:?}");
    };
    let conn = &mut rig.client.conn;
    conn.write_packet(&statement_request(COM_STMT_CLOSE, id, &[]), 0)
        .await
        .expect("close sent");
    let got = rig.raw_answer(&query("SELECT 8"), &second_log).await;
    assert_eq!(got, encode(&Reply::value("8"), true));
    assert_eq!(
        first_log.wait_ended().await,
        "hung up on receiving COM_STMT_CLOSE"
    );
    assert_eq!(rig.anything_within(Duration::from_secs(1)).await, None);
    assert_eq!(second_log.count(COM_STMT_PREPARE), 0);
}

/// The backend died inside a transaction while the session idled; the client's next
/// command is a COM_STMT_CLOSE. The 1213 that tells the client its transaction is gone
/// must answer the next command that has a reply, not the close.
#[tokio::test(start_paused = true)]
async fn a_lost_transaction_is_reported_to_the_next_command_with_a_reply() {
    let (first, first_log) = ScriptedServer::new(Script::default());
    let (second, second_log) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![first, second]).await;
    let prepared = command(
        &mut rig,
        &[&[COM_STMT_PREPARE][..], b"SELECT ? AS c1"].concat(),
        Expect::Prepare,
        false,
    )
    .await;
    let Got::Prepared { id, .. } = prepared else {
        panic!("the statement was not prepared: {prepared:?}");
    };
    let begin = command(&mut rig, &query("BEGIN"), Expect::ResultSets, false).await;
    assert!(matches!(begin, Got::Ok { .. }), "{begin:?}");
    first_log.hang_up.notify_one();
    assert_eq!(first_log.wait_ended().await, "hung up while idle");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let conn = &mut rig.client.conn;
    conn.write_packet(&statement_request(COM_STMT_CLOSE, id, &[]), 0)
        .await
        .expect("close sent");
    let select = command(&mut rig, &query("SELECT 1"), Expect::ResultSets, false).await;
    assert_eq!(select, Got::Err { seq: 1, code: 1213 });
    let select = command(&mut rig, &query("SELECT 2"), Expect::ResultSets, false).await;
    assert_eq!(
        select,
        Got::Rows {
            seq: 1,
            rows: one("2")
        }
    );
    assert_eq!(rig.anything_within(Duration::from_secs(1)).await, None);
    // The close reached the new backend, where the statement had been prepared again.
    assert_eq!(second_log.count(COM_STMT_CLOSE), 1);
}

/// Long data sent after a transaction was lost goes to the new backend (no reply, so no
/// error either); the execute it was for is refused with the 1213, and, as the server's own
/// execute would, that ends the long data: the backend is told to drop it
/// (COM_STMT_RESET), so the client's next try does not send it twice.
#[tokio::test(start_paused = true)]
async fn long_data_for_an_execute_refused_after_a_lost_transaction_is_dropped() {
    let (first, first_log) = ScriptedServer::new(Script::default());
    let (second, second_log) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![first, second]).await;
    let prepared = command(
        &mut rig,
        &[&[COM_STMT_PREPARE][..], b"SELECT ? AS c1"].concat(),
        Expect::Prepare,
        false,
    )
    .await;
    let Got::Prepared { id, .. } = prepared else {
        panic!("the statement was not prepared: {prepared:?}");
    };
    let begin = command(&mut rig, &query("BEGIN"), Expect::ResultSets, false).await;
    assert!(matches!(begin, Got::Ok { .. }), "{begin:?}");
    first_log.hang_up.notify_one();
    first_log.wait_ended().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let long_data = statement_request(COM_STMT_SEND_LONG_DATA, id, b"\0\0some bytes");
    rig.client
        .conn
        .write_packet(&long_data, 0)
        .await
        .expect("long data sent");
    let execute = command(
        &mut rig,
        &execute_one(id, 3, true),
        Expect::ResultSets,
        true,
    )
    .await;
    assert_eq!(execute, Got::Err { seq: 1, code: 1213 });
    let commands: Vec<u8> = second_log
        .commands()
        .iter()
        .filter_map(|c| c.first().copied())
        .filter(|&c| c != COM_QUERY)
        .collect();
    assert_eq!(
        commands,
        [COM_STMT_PREPARE, COM_STMT_SEND_LONG_DATA, COM_STMT_RESET],
        "re-prepared, long data, then dropped"
    );
    // The statement is usable, and the session movable, again.
    let execute = command(
        &mut rig,
        &execute_one(id, 4, true),
        Expect::ResultSets,
        true,
    )
    .await;
    assert_eq!(
        execute,
        Got::Rows {
            seq: 1,
            rows: one("4")
        }
    );
    let view = rig.shared.sessions.snapshot();
    assert_eq!(view.iter().map(|s| s.movable).collect::<Vec<_>>(), [true]);
}

/// An execute refused with the 1213 of a lost transaction still counts, for the client,
/// as having sent its parameter types: the next execute, which leaves them out, gets them
/// added for the backend that never saw them.
#[tokio::test(start_paused = true)]
async fn an_execute_refused_for_a_lost_transaction_keeps_its_parameter_types() {
    let (first, first_log) = ScriptedServer::new(Script::default());
    let (second, _) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![first, second]).await;
    let prepared = command(
        &mut rig,
        &[&[COM_STMT_PREPARE][..], b"SELECT ? AS c1"].concat(),
        Expect::Prepare,
        false,
    )
    .await;
    let Got::Prepared { id, .. } = prepared else {
        panic!("the statement was not prepared: {prepared:?}");
    };
    let begin = command(&mut rig, &query("BEGIN"), Expect::ResultSets, false).await;
    assert!(matches!(begin, Got::Ok { .. }), "{begin:?}");
    first_log.hang_up.notify_one();
    first_log.wait_ended().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let execute = command(
        &mut rig,
        &execute_one(id, 5, true),
        Expect::ResultSets,
        true,
    )
    .await;
    assert_eq!(execute, Got::Err { seq: 1, code: 1213 });
    let execute = command(
        &mut rig,
        &execute_one(id, 6, false),
        Expect::ResultSets,
        true,
    )
    .await;
    assert_eq!(
        execute,
        Got::Rows {
            seq: 1,
            rows: one("6")
        }
    );
}

/// A request of more than one packet (a 16 MiB query) lost with its backend: its error
/// comes at the sequence id after its last packet, where the client looks for it.
#[tokio::test(start_paused = true)]
async fn the_error_for_a_long_lost_request_follows_its_last_packet() {
    let script = Script::default().fate(|seen| match seen.payload.len() > 1 << 20 {
        true => Fate::HangUp,
        false => Fate::Answer,
    });
    let (first, _) = ScriptedServer::new(script);
    let (second, second_log) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![first, second]).await;
    // Exactly one full chunk: the logical packet ends with an empty second one.
    let mut sql = String::from("INSERT INTO t VALUES ('");
    sql.extend(std::iter::repeat_n(
        'x',
        frame::MAX_PAYLOAD - 1 - sql.len() - 2,
    ));
    sql.push_str("')");
    let request = query(&sql);
    assert_eq!(request.len(), frame::MAX_PAYLOAD);
    let got = command(&mut rig, &request, Expect::ResultSets, false).await;
    assert_eq!(got, Got::Err { seq: 2, code: 1317 });
    let got = command(&mut rig, &query("SELECT 3"), Expect::ResultSets, false).await;
    assert_eq!(
        got,
        Got::Rows {
            seq: 1,
            rows: one("3")
        }
    );
    let queries = second_log.queries();
    assert!(
        !queries.iter().any(|q| q.starts_with("INSERT")),
        "not run again"
    );
    assert_eq!(queries.last().map(String::as_str), Some("SELECT 3"));
}

/// COM_STMT_SEND_LONG_DATA has no reply either: lost with its backend (which hangs up on
/// its first bytes, so holdfast's write fails), it gets none. The data is gone with the
/// backend, so the session cannot go on: it is closed at the next command — without a
/// stray reply before.
#[tokio::test(start_paused = true)]
async fn long_data_lost_with_its_backend_gets_no_reply() {
    let first_script = Script::default().fate(|seen| match seen.payload.first() {
        Some(&COM_STMT_PREPARE) => Fate::AnswerThenHangUp,
        _ => Fate::Answer,
    });
    let (first, first_log) = ScriptedServer::new(first_script);
    let (second, _) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![first, second]).await;
    let prepared = command(
        &mut rig,
        &[&[COM_STMT_PREPARE][..], b"SELECT ? AS c1"].concat(),
        Expect::Prepare,
        false,
    )
    .await;
    let Got::Prepared { id, .. } = prepared else {
        panic!("the statement was not prepared: {prepared:?}");
    };
    first_log.wait_ended().await;
    let mut data = 0u16.to_le_bytes().to_vec();
    data.extend(std::iter::repeat_n(b'x', 100_000));
    let conn = &mut rig.client.conn;
    conn.write_packet(&statement_request(COM_STMT_SEND_LONG_DATA, id, &data), 0)
        .await
        .expect("long data sent");
    assert_eq!(rig.anything_within(Duration::from_secs(1)).await, None);
    // The session may have closed the connection already, or does so now.
    let _ = rig
        .client
        .conn
        .write_packet(&execute_one(id, 5, true), 0)
        .await;
    let mut m = ResponseMachine::new(Expect::ResultSets, true);
    assert_eq!(
        read(&mut rig, &mut m, true).await,
        Got::Closed { packets: 0 }
    );
}

/// The backend hangs up in the middle of a LOAD DATA LOCAL INFILE file. holdfast reads
/// the rest of the client's file without running any of it (the file holds what would be
/// a COM_QUERY if read as a command), answers with one ERR after the client's empty
/// packet, at the sequence id that follows it, and the next query works normally.
#[tokio::test(start_paused = true)]
async fn load_data_local_whose_backend_dies_mid_file_gets_one_err() {
    let mut file_packets_seen = 0;
    let first_script = Script::default().fate(move |seen| {
        if seen.file {
            file_packets_seen += 1;
            if file_packets_seen == 2 {
                return Fate::HangUp;
            }
        }
        Fate::Answer
    });
    let (first, first_log) = ScriptedServer::new(first_script);
    let (second, second_log) = ScriptedServer::new(Script::default());
    let mut rig = rig_with(ScriptedConnector::new(vec![first, second]), CAPS).await;
    let sql = "LOAD DATA LOCAL INFILE 'rows.tsv' INTO TABLE t";
    let mut m = send(&mut rig, &query(sql), Expect::ResultSets).await;
    assert_eq!(read(&mut rig, &mut m, false).await, Got::Infile { seq: 1 });
    // Each packet reads, as a command, COM_QUERY "DROP TABLE t;...".
    let (file, reply_seq) = file_packets(40, 16 * 1024, b"\x03DROP TABLE t;");
    rig.client
        .conn
        .write_raw(&file)
        .await
        .expect("the file sent");
    let answer = read(&mut rig, &mut m, false).await;
    assert_eq!(
        answer,
        Got::Err {
            seq: reply_seq,
            code: 1317
        }
    );
    assert_eq!(first_log.wait_ended().await, "hung up mid-file");
    let got = command(&mut rig, &query("SELECT 9"), Expect::ResultSets, false).await;
    assert_eq!(
        got,
        Got::Rows {
            seq: 1,
            rows: one("9")
        }
    );
    assert_eq!(rig.anything_within(Duration::from_secs(1)).await, None);
    // Nothing of the file ran anywhere as a statement.
    for q in first_log.queries().iter().chain(&second_log.queries()) {
        assert!(!q.contains("DROP"), "file content ran as SQL: {q:?}");
    }
    assert_eq!(
        second_log
            .file_bytes
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

/// The backend takes the whole file and dies before answering: the client, waiting for
/// the OK that follows its empty packet, gets one ERR there, and the session goes on.
#[tokio::test(start_paused = true)]
async fn load_data_local_whose_backend_dies_after_the_file_gets_one_err() {
    let first_script = Script::default().fate(|seen| match seen.file && seen.payload.is_empty() {
        true => Fate::HangUp,
        false => Fate::Answer,
    });
    let (first, first_log) = ScriptedServer::new(first_script);
    let (second, _) = ScriptedServer::new(Script::default());
    let mut rig = rig_with(ScriptedConnector::new(vec![first, second]), CAPS).await;
    let sql = "LOAD DATA LOCAL INFILE 'rows.tsv' INTO TABLE t";
    let mut m = send(&mut rig, &query(sql), Expect::ResultSets).await;
    assert_eq!(read(&mut rig, &mut m, false).await, Got::Infile { seq: 1 });
    let (file, reply_seq) = file_packets(3, 100, b"1\tone\n");
    rig.client
        .conn
        .write_raw(&file)
        .await
        .expect("the file sent");
    let answer = read(&mut rig, &mut m, false).await;
    assert_eq!(
        answer,
        Got::Err {
            seq: reply_seq,
            code: 1317
        }
    );
    assert_eq!(first_log.wait_ended().await, "hung up mid-file");
    let got = command(&mut rig, &query("SELECT 4"), Expect::ResultSets, false).await;
    assert_eq!(
        got,
        Got::Rows {
            seq: 1,
            rows: one("4")
        }
    );
}

/// A file exchange that goes well is relayed as it was: the server gets every byte and the
/// client its OK after the empty packet.
#[tokio::test(start_paused = true)]
async fn load_data_local_passes_the_file_through() {
    let (server, log) = ScriptedServer::new(Script::default());
    let mut rig = rig_with(ScriptedConnector::new(vec![server]), CAPS).await;
    let sql = "LOAD DATA LOCAL INFILE 'rows.tsv' INTO TABLE t";
    let mut m = send(&mut rig, &query(sql), Expect::ResultSets).await;
    assert_eq!(read(&mut rig, &mut m, false).await, Got::Infile { seq: 1 });
    let (file, reply_seq) = file_packets(10, 20_000, b"1\tone\n");
    rig.client
        .conn
        .write_raw(&file)
        .await
        .expect("the file sent");
    let answer = read(&mut rig, &mut m, false).await;
    assert_eq!(
        answer,
        Got::Ok {
            seq: reply_seq,
            affected: 200_000
        }
    );
    assert_eq!(
        log.file_bytes.load(std::sync::atomic::Ordering::SeqCst),
        200_000
    );
}

// ---------------------------------------------------------------------------------------
// The property: random commands, random backend deaths, replies always in step

/// splitmix64: small, seedable, and the same on every platform.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `per_mille`/1000.
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// How a case's servers die.
#[derive(Clone, Copy, Debug)]
struct Deaths {
    /// Per command received: hang up on receiving it, after answering, halfway through
    /// the answer (per mille).
    on_receiving: u64,
    after_answering: u64,
    mid_answer: u64,
    /// Per LOCAL INFILE packet received.
    mid_file: u64,
}

/// The fate hook of every server of a case: draws from the case's server-side generator
/// and writes what it decided to the case's journal. The session's first backend always
/// answers its first packet (holdfast's setup after the login: a backend lost there ends
/// the login, before the session and this test begin).
fn fates(
    rng: Arc<Mutex<Rng>>,
    deaths: Deaths,
    journal: Arc<Mutex<Vec<String>>>,
    first: bool,
) -> Script {
    let mut spare = first;
    Script::default().fate(move |seen| {
        let Ok(mut rng) = rng.lock() else {
            return Fate::Answer;
        };
        if std::mem::take(&mut spare) {
            return Fate::Answer;
        }
        let fate = if seen.file {
            match rng.chance(deaths.mid_file) {
                true => Fate::HangUp,
                false => Fate::Answer,
            }
        } else {
            let r = rng.below(1000);
            if r < deaths.on_receiving {
                Fate::HangUp
            } else if r < deaths.on_receiving + deaths.after_answering {
                Fate::AnswerThenHangUp
            } else if r < deaths.on_receiving + deaths.after_answering + deaths.mid_answer {
                Fate::HangUpMidAnswer
            } else {
                Fate::Answer
            }
        };
        if fate != Fate::Answer {
            let what = match seen.payload.first() {
                _ if seen.file => "a file packet".to_string(),
                Some(&COM_QUERY) => format!("{:?}", String::from_utf8_lossy(&seen.payload[1..])),
                Some(&c) => name(c).to_string(),
                None => "an empty packet".into(),
            };
            if let Ok(mut j) = journal.lock() {
                j.push(format!("  server: {fate:?} on {what}"));
            }
        }
        fate
    })
}

/// A statement the client holds.
struct Held {
    id: u32,
    /// Whether an execute sent its parameter types already.
    typed: bool,
}

/// What a command's reply must be when its backend did not get lost (a lost-backend ERR
/// is always acceptable).
enum Want {
    /// One row, one column: this value.
    Value(String),
    /// OK with this many affected rows.
    Affected(u64),
    /// PREPARE OK, the column named so.
    Prepared(String),
    /// A LOCAL INFILE request, then (after the file) OK with the file's size.
    File { packets: usize, size: usize },
    /// Nothing at all.
    Nothing,
}

/// One case: a session, a client that sends random commands, servers that die at random.
/// Returns an error describing the first reply out of step (the journal tells the story).
async fn run_case(seed: u64, journal: Arc<Mutex<Vec<String>>>) -> Result<(), String> {
    let mut rng = Rng(seed);
    let servers = Arc::new(Mutex::new(Rng(seed ^ 0x5eed_5eed_5eed_5eed)));
    let deaths = Deaths {
        on_receiving: rng.below(80),
        after_answering: rng.below(80),
        mid_answer: if rng.chance(250) { rng.below(15) } else { 0 },
        mid_file: rng.below(300),
    };
    let caps = if rng.chance(500) {
        CAPS
    } else {
        CAPS & !CLIENT_DEPRECATE_EOF
    };
    let log = |line: String| {
        if let Ok(mut j) = journal.lock() {
            j.push(line);
        }
    };
    log(format!("{deaths:?}, client capabilities {caps:#x}"));
    let j = journal.clone();
    let connector = ScriptedConnector::endless(move |n| {
        if let Ok(mut j) = j.lock() {
            j.push(format!("  backend connection {n}"));
        }
        ScriptedServer::new(fates(servers.clone(), deaths, j.clone(), n == 0)).0
    });
    let mut rig = rig_with(connector, caps).await;
    let mut held: Vec<Held> = Vec::new();
    let mut last_id = 0u32;
    let steps = 10 + rng.below(50);
    for step in 0..=steps {
        let tag = 1000 + step;
        // The last step is a plain query: whatever came before, it must get its own reply.
        let pick = if step == steps { 0 } else { rng.below(15) };
        let (what, payload, expect, want) = match pick {
            0 | 1 => {
                let sql = format!("SELECT {tag}");
                let p = query(&sql);
                (sql, p, Expect::ResultSets, Want::Value(tag.to_string()))
            }
            2 => {
                let sql = format!("INSERT INTO t VALUES ({tag})");
                let p = query(&sql);
                (sql, p, Expect::ResultSets, Want::Affected(tag))
            }
            3 => (
                "COM_PING".into(),
                vec![COM_PING],
                Expect::Status,
                Want::Affected(0),
            ),
            4 => {
                let db = format!("db{tag}");
                let p = [&[COM_INIT_DB][..], db.as_bytes()].concat();
                (
                    format!("COM_INIT_DB {db}"),
                    p,
                    Expect::Status,
                    Want::Affected(0),
                )
            }
            5 => {
                let sql = ["BEGIN", "COMMIT", "ROLLBACK"][rng.below(3) as usize];
                (
                    sql.into(),
                    query(sql),
                    Expect::ResultSets,
                    Want::Affected(0),
                )
            }
            6 | 7 => {
                let sql = format!("SELECT ? AS c{tag}");
                let p = [&[COM_STMT_PREPARE][..], sql.as_bytes()].concat();
                let want = Want::Prepared(format!("c{tag}"));
                (format!("PREPARE {sql}"), p, Expect::Prepare, want)
            }
            8..=10 if !held.is_empty() => {
                let i = rng.below(held.len() as u64) as usize;
                let h = &mut held[i];
                let p = execute_one(h.id, tag as i64, !h.typed);
                h.typed = true;
                let what = format!("EXECUTE {} ({tag})", h.id);
                (what, p, Expect::ResultSets, Want::Value(tag.to_string()))
            }
            11 if !held.is_empty() => {
                let h = held.remove(rng.below(held.len() as u64) as usize);
                let p = statement_request(COM_STMT_CLOSE, h.id, &[]);
                (format!("CLOSE {}", h.id), p, Expect::Nothing, Want::Nothing)
            }
            12 => {
                let packets = rng.below(6) as usize;
                let size = match rng.chance(200) {
                    true => 30_000,
                    false => 1 + rng.below(2000) as usize,
                };
                let sql = format!("LOAD DATA LOCAL INFILE 'f{tag}' INTO TABLE t");
                let p = query(&sql);
                let what = format!("{sql} ({packets} x {size} bytes)");
                (what, p, Expect::ResultSets, Want::File { packets, size })
            }
            14 if !held.is_empty() => {
                // Long data then its execute: the value must come back once, not twice.
                let i = rng.below(held.len() as u64) as usize;
                let h = &mut held[i];
                let what = format!("LONG DATA + EXECUTE {} ({tag})", h.id);
                log(format!("step {step}: {what}"));
                let data = long_data(h.id, tag.to_string().as_bytes());
                if rig.client.conn.write_packet(&data, 0).await.is_err() {
                    return Err(format!(
                        "step {step}: the session had closed the connection"
                    ));
                }
                let p = execute_long(h.id, !h.typed);
                h.typed = true;
                (what, p, Expect::ResultSets, Want::Value(tag.to_string()))
            }
            13 => {
                log(format!("step {step}: pause"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            _ => (
                "COM_PING".into(),
                vec![COM_PING],
                Expect::Status,
                Want::Affected(0),
            ),
        };
        let long = what.starts_with("LONG DATA");
        if !long {
            log(format!("step {step}: {what}"));
        }
        if rig.client.conn.write_packet(&payload, 0).await.is_err() {
            if long && backend_died(&journal) {
                // Long data lost with its backend cannot be recreated: the session closes
                // (at the execute that needs it).
                return Ok(());
            }
            return Err(format!(
                "step {step}: the session had closed the connection"
            ));
        }
        if matches!(want, Want::Nothing) {
            continue;
        }
        let binary = what.contains("EXECUTE");
        let mut m = ResponseMachine::new(expect, deprecate_eof(rig.client.capabilities));
        let got = reply_within(&mut rig, &mut m, binary, step).await?;
        log(format!("  got {got:?}"));
        let fine = match (&got, &want) {
            (Got::Err { seq: 1, code }, _) => LOST.contains(code),
            // A backend that died halfway through a reply that had begun to reach the client
            // ends the session: the client sees the connection close, never a wrong reply.
            (Got::Closed { .. }, _) if mid_answer_death(&journal) => return Ok(()),
            // Long data lost with its backend cannot be recreated: the session closes.
            (Got::Closed { packets: 0 }, _) if long && backend_died(&journal) => return Ok(()),
            (Got::Rows { seq: 1, rows }, Want::Value(v)) => *rows == one(v),
            (Got::Ok { seq: 1, affected }, Want::Affected(n)) => affected == n,
            (Got::Prepared { seq: 1, id, column }, Want::Prepared(c)) => {
                let fresh = *id > last_id;
                last_id = *id;
                held.push(Held {
                    id: *id,
                    typed: false,
                });
                fresh && column == c
            }
            (Got::Infile { seq: 1 }, Want::File { packets, size }) => {
                let (file, reply_seq) = file_packets(*packets, *size, b"\x03SELECT 666\n");
                if rig.client.conn.write_raw(&file).await.is_err() {
                    return Err(format!("step {step}: the session closed mid-file"));
                }
                let got = reply_within(&mut rig, &mut m, false, step).await?;
                log(format!("  got {got:?} after the file"));
                let seq = reply_seq;
                match got {
                    Got::Ok { seq: s, affected } => s == seq && affected == (packets * size) as u64,
                    Got::Err { seq: s, code } => s == seq && LOST.contains(&code),
                    Got::Closed { .. } if mid_answer_death(&journal) => return Ok(()),
                    _ => false,
                }
            }
            _ => false,
        };
        if !fine {
            return Err(format!("step {step}: {what} got {got:?}"));
        }
    }
    // Nothing more may come: every reply was read by the command it belongs to.
    if let Some(extra) = rig.anything_within(Duration::from_secs(1)).await {
        return Err(format!(
            "a stray reply after the last command: {extra:02x?}"
        ));
    }
    Ok(())
}

/// The next reply, or an error if none comes within a minute (of the paused clock: a
/// session that waits for nothing is noticed at once).
async fn reply_within(
    rig: &mut Rig,
    m: &mut ResponseMachine,
    binary: bool,
    step: u64,
) -> Result<Got, String> {
    let read = read_reply(&mut rig.client.conn, m, binary);
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .map_err(|_| format!("step {step}: no reply (a hang)"))
}

/// Whether the session's current backend connection (the last one opened) died.
fn backend_died(journal: &Mutex<Vec<String>>) -> bool {
    let Ok(j) = journal.lock() else {
        return false;
    };
    j.iter()
        .rev()
        .take_while(|l| !l.contains("backend connection"))
        .any(|l| l.contains("server: "))
}

/// Whether a server of the case died halfway through an answer since the last command.
fn mid_answer_death(journal: &Mutex<Vec<String>>) -> bool {
    let Ok(j) = journal.lock() else {
        return false;
    };
    j.iter()
        .rev()
        .take_while(|l| !l.starts_with("step "))
        .any(|l| l.contains("HangUpMidAnswer"))
}

/// Random sequences of commands (queries that each select a number of their own, inserts
/// that each affect a count of their own, COM_PING, COM_INIT_DB, transactions, prepared
/// statements prepared, executed with a value of their own and closed, LOAD DATA LOCAL
/// files, pauses long enough for the session to go idle) against servers that die at
/// random points: on receiving a command, right after answering it, halfway through an
/// answer, in the middle of a file. Every reply the client reads must be its command's
/// own (or a lost-backend ERR), at the right sequence id; none may be missing (a
/// deadline), none left over. `HOLDFAST_DESYNC_SEED` replays one case,
/// `HOLDFAST_DESYNC_CASES` sets how many run (default 300), `HOLDFAST_DESYNC_BASE` seeds
/// another series of cases.
#[test]
fn replies_stay_in_step_whatever_the_backend_does() {
    let cases: u64 = std::env::var("HOLDFAST_DESYNC_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let seeds: Vec<u64> = match std::env::var("HOLDFAST_DESYNC_SEED") {
        Ok(s) => vec![s.parse().expect("HOLDFAST_DESYNC_SEED is a number")],
        Err(_) => {
            let base = std::env::var("HOLDFAST_DESYNC_BASE")
                .ok()
                .and_then(|b| b.parse().ok())
                .unwrap_or(0x686f_6c64_6661_7374);
            let mut base = Rng(base);
            (0..cases).map(|_| base.next()).collect()
        }
    };
    let full_run = seeds.len() >= 100;
    let mut seen = Coverage::default();
    for seed in seeds {
        let journal = Arc::new(Mutex::new(Vec::new()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        let j = journal.clone();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(run_case(seed, j))
        }));
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(panic) => Some(
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into()),
            ),
        };
        if let Some(failure) = failure {
            let mut story = String::new();
            for line in journal.lock().map(|j| j.clone()).unwrap_or_default() {
                let _ = writeln!(story, "{line}");
            }
            panic!(
                "out of step with seed {seed} (replay: HOLDFAST_DESYNC_SEED={seed}): {failure}\n{story}"
            );
        }
        seen.add(&journal.lock().map(|j| j.clone()).unwrap_or_default());
    }
    eprintln!("{seen:?}");
    if full_run {
        // The cases must keep reaching the situations they are about.
        assert!(seen.backend_connections > 2 * seen.cases, "{seen:?}");
        assert!(seen.lost_errors > 50, "{seen:?}");
        assert!(seen.closes_after_a_death > 10, "{seen:?}");
        assert!(
            seen.files > 20 && seen.files_cut > 5 && seen.errors_after_a_file > 5,
            "{seen:?}"
        );
        assert!(seen.pauses > 50, "{seen:?}");
        assert!(seen.long_data_values > 50, "{seen:?}");
    }
}

/// What the cases went through, from their journals.
#[derive(Debug, Default)]
struct Coverage {
    cases: usize,
    steps: usize,
    backend_connections: usize,
    /// Replies that were a lost-backend ERR.
    lost_errors: usize,
    /// COM_STMT_CLOSE sent while (or right after) a backend died.
    closes_after_a_death: usize,
    files: usize,
    /// Servers that hung up in the middle of a file.
    files_cut: usize,
    errors_after_a_file: usize,
    pauses: usize,
    /// Long data executes answered with their value, or refused for a lost transaction.
    long_data_values: usize,
    long_data_refused: usize,
    /// Cases ended by holdfast closing the session (a backend died halfway through a
    /// reply, or holding long data).
    ended_early: usize,
}

impl Coverage {
    fn add(&mut self, journal: &[String]) {
        self.cases += 1;
        let mut death_since_close = false;
        for (i, line) in journal.iter().enumerate() {
            let has = |s: &str| line.contains(s);
            if line.starts_with("step ") {
                self.steps += 1;
            }
            self.backend_connections += usize::from(has("backend connection"));
            self.lost_errors += usize::from(has("got Err"));
            self.files += usize::from(has("LOAD DATA"));
            self.files_cut += usize::from(has("on a file packet"));
            self.errors_after_a_file += usize::from(has("got Err") && has("after the file"));
            self.pauses += usize::from(has(": pause"));
            if has("server: ") {
                death_since_close = true;
            }
            if has(": CLOSE ") {
                if death_since_close || journal.get(i + 1).is_some_and(|l| l.contains("server: ")) {
                    self.closes_after_a_death += 1;
                }
                death_since_close = false;
            }
        }
        for (i, line) in journal.iter().enumerate() {
            if line.contains("LONG DATA") {
                let got = journal[i + 1..].iter().find(|l| l.contains("got "));
                self.long_data_values += usize::from(got.is_some_and(|l| l.contains("got Rows")));
                self.long_data_refused += usize::from(got.is_some_and(|l| l.contains("1213")));
            }
        }
        if journal.last().is_some_and(|l| l.contains("Closed")) {
            self.ended_early += 1;
        }
    }
}
