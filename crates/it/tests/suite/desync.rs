//! A session stays in step with its client when its backend connection is killed around
//! commands without a reply (COM_STMT_CLOSE) and in the middle of a LOAD DATA LOCAL
//! INFILE file: the client never reads another command's reply, and the session ends as
//! the server ended the connection. Byte-level, with the
//! raw client; the backend connection is killed with `KILL` on the server (its id read
//! through holdfast with `CONNECTION_ID()`).

use holdfast_it::raw::{server_err, RawConn, BASE_CAPS};
use holdfast_it::{metric, Harness, Options};
use holdfast_wire::caps::CLIENT_LOCAL_FILES;

fn backend_id(c: &mut RawConn) -> String {
    c.query_value("SELECT CONNECTION_ID()")
        .unwrap()
        .expect("a connection id")
}

fn kill(h: &Harness, id: &str) {
    h.root_sql(&format!("KILL {id}"));
}

/// The client's next command after its backend connection was killed: the connection is
/// closed, as the server closes a killed direct connection; never another command's reply.
fn closed_at_next_command(c: &mut RawConn, n: u32) {
    match c.query_value(&format!("SELECT {n}")) {
        Ok(v) => panic!("SELECT {n} answered {v:?} on a killed session"),
        Err(e) => assert!(
            server_err(&e).is_none(),
            "SELECT {n}: the connection closed, not an ERR: {e:#}"
        ),
    }
}

/// COM_STMT_CLOSE has no reply. Closed, then the backend connection killed, the next query
/// finds the connection closed (as a direct client's would be); killed, then closed at
/// once (the close may meet the dead connection), likewise: no reply of another command.
#[test]
fn stmt_close_around_a_killed_backend_connection_gets_no_reply() {
    let h = Harness::start();
    let connect = || {
        RawConn::connect(
            h.proxy,
            h.user(),
            h.password(),
            Some(h.database()),
            BASE_CAPS,
        )
        .unwrap()
    };
    let mut c = connect();
    let first = c.prepare("SELECT 1").unwrap();
    let id = backend_id(&mut c);
    c.close_statement(first.id).unwrap();
    kill(&h, &id);
    closed_at_next_command(&mut c, 42);

    let mut c = connect();
    let second = c.prepare("SELECT 2").unwrap();
    let id = backend_id(&mut c);
    kill(&h, &id);
    c.close_statement(second.id).unwrap();
    closed_at_next_command(&mut c, 43);
    h.wait_sessions(0, std::time::Duration::from_secs(10));
    let m = h.metrics();
    assert_eq!(
        metric(&m, "holdfast_requests_failed_on_backend_loss_total"),
        Some(0.0),
        "no command was answered with an error: {m}"
    );
}

/// LOAD DATA LOCAL INFILE of a big file, the backend connection killed after 2 MiB of it:
/// holdfast reads the rest of the file without running any of it (each packet would read,
/// as a command, as an INSERT into a marker table), then ends the session as the server
/// ended the connection (not logged in again).
#[test]
fn load_data_local_with_its_backend_killed_mid_file_runs_none_of_it_and_ends() {
    let h = Harness::start_with(Options::default().server_args(&["--local-infile=1"]));
    let mut c = RawConn::connect(
        h.proxy,
        h.user(),
        h.password(),
        Some(h.database()),
        BASE_CAPS | CLIENT_LOCAL_FILES,
    )
    .unwrap();
    c.query("CREATE TABLE sbtest.loaded (v VARCHAR(200))")
        .unwrap();
    c.query("CREATE TABLE sbtest.marker (v INT)").unwrap();
    let id = backend_id(&mut c);

    let mut load = vec![0x03];
    load.extend_from_slice(b"LOAD DATA LOCAL INFILE 'big.tsv' INTO TABLE sbtest.loaded");
    c.command(&load).unwrap();
    let ask = c.read_packet().unwrap();
    assert_eq!((ask.payload.first(), ask.seq), (Some(&0xfb), 1), "{ask:?}");

    // 16 KiB packets: a COM_QUERY if taken for a command, plain lines as file data.
    let mut chunk = b"\x03INSERT INTO sbtest.marker VALUES (1)\n".to_vec();
    while chunk.len() < 16 * 1024 - 64 {
        chunk.extend_from_slice(b"-- filler line of the file, as a comment in SQL\n");
    }
    let mut seq = 2u8;
    for _ in 0..128 {
        c.write_packet(&chunk, seq).unwrap();
        seq = seq.wrapping_add(1);
    }
    kill(&h, &id);
    for _ in 0..2048 {
        c.write_packet(&chunk, seq).unwrap();
        seq = seq.wrapping_add(1);
    }
    c.write_packet(&[], seq).unwrap();

    // Ended as the server ends a connection killed mid-file: no reply, closed.
    assert!(
        c.read_packet().is_err(),
        "the killed session's connection is closed"
    );
    assert_eq!(
        h.root_sql("SELECT COUNT(*) FROM sbtest.marker"),
        vec![vec!["0".to_string()]],
        "file content ran as SQL"
    );
    let m = h.metrics();
    assert_eq!(
        metric(
            &m,
            r#"holdfast_sessions_closed_by_holdfast_total{reason="killed"}"#
        ),
        Some(1.0),
        "{m}"
    );
}
