//! A session stays in step with its client when its backend connection is killed around
//! commands without a reply (COM_STMT_CLOSE) and in the middle of a LOAD DATA LOCAL
//! INFILE file: every reply the client reads is its own command's. Byte-level, with the
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

/// `SELECT n` answered with its own reply. When the query reaches the killed connection
/// before holdfast noticed the kill, it is not run again (someone killed that connection
/// on purpose) and gets its own ERR 1317; then it runs on the new connection. Returns how
/// many such errors there were.
fn select_in_step(c: &mut RawConn, n: u32) -> u32 {
    match c.query_value(&format!("SELECT {n}")) {
        Ok(v) => {
            assert_eq!(v, Some(n.to_string()), "the reply to SELECT {n}");
            0
        }
        Err(e) => {
            assert_eq!(server_err(&e).map(|e| e.code), Some(1317), "{e:#}");
            let v = c.query_value(&format!("SELECT {n}")).unwrap();
            assert_eq!(
                v,
                Some(n.to_string()),
                "the reply to SELECT {n}, asked again"
            );
            1
        }
    }
}

/// COM_STMT_CLOSE has no reply. Closed, then the backend connection killed, the next query
/// gets its own result; killed, then closed at once (the close may meet the dead
/// connection), likewise. The closed statements stay closed on the new backend.
#[test]
fn stmt_close_around_a_killed_backend_connection_gets_no_reply() {
    let h = Harness::start();
    let mut c = RawConn::connect(
        h.proxy,
        h.user(),
        h.password(),
        Some(h.database()),
        BASE_CAPS,
    )
    .unwrap();
    let first = c.prepare("SELECT 1").unwrap();
    let second = c.prepare("SELECT 2").unwrap();
    let kept = c.prepare("SELECT 3").unwrap();

    let id = backend_id(&mut c);
    c.close_statement(first.id).unwrap();
    kill(&h, &id);
    let mut interrupted = select_in_step(&mut c, 42);

    let id2 = backend_id(&mut c);
    assert_ne!(id2, id, "the session moved to a new backend connection");
    kill(&h, &id2);
    c.close_statement(second.id).unwrap();
    interrupted += select_in_step(&mut c, 43);

    for closed in [first.id, second.id] {
        let e = c.execute_no_params(closed, 0).unwrap_err();
        assert_eq!(server_err(&e).map(|e| e.code), Some(1243), "{e:#}");
    }
    let rows = c.execute_no_params(kept.id, 0).unwrap();
    assert_eq!(rows.len(), 1, "the statement still open works: {rows:?}");
    c.ping().unwrap();
    let m = h.metrics();
    assert_eq!(
        metric(&m, "holdfast_requests_failed_on_backend_loss_total"),
        Some(f64::from(interrupted)),
        "no command but the interrupted SELECTs was answered with an error: {m}"
    );
}

/// LOAD DATA LOCAL INFILE of a big file, the backend connection killed after 2 MiB of it:
/// holdfast reads the rest of the file without running any of it (each packet would read,
/// as a command, as an INSERT into a marker table), answers with one ERR at the sequence id
/// after the client's empty packet, and the connection goes on.
#[test]
fn load_data_local_with_its_backend_killed_mid_file_gets_one_err() {
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

    let answer = c.read_packet().unwrap();
    assert_eq!(
        answer.payload.first(),
        Some(&0xff),
        "one ERR for the file: {answer:?}"
    );
    assert_eq!(answer.seq, seq.wrapping_add(1), "after the empty packet");
    let e = holdfast_it::raw::ServerErr::parse(&answer.payload).unwrap();
    assert_eq!(e.code, 1317, "{e:?}");
    // The next reply is the next command's.
    assert_eq!(c.query_value("SELECT 7").unwrap().as_deref(), Some("7"));
    c.ping().unwrap();
    assert_ne!(backend_id(&mut c), id);
    assert_eq!(
        h.root_sql("SELECT COUNT(*) FROM sbtest.marker"),
        vec![vec!["0".to_string()]],
        "file content ran as SQL"
    );
    let m = h.metrics();
    assert_eq!(
        metric(&m, "holdfast_requests_failed_on_backend_loss_total"),
        Some(1.0),
        "{m}"
    );
}
