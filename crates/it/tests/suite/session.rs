//! What holdfast observes about a session, and session-state bytes towards clients.

use holdfast_it::raw::{RawConn, Response, BASE_CAPS};
use holdfast_it::Harness;
use holdfast_wire::caps::*;
use holdfast_wire::packets::OkPacket;
use holdfast_wire::session_track::{items, TrackItem};
use std::time::Duration;

/// Waits until the single open session shows `blocked_by` == `want`.
fn wait_blocker(h: &Harness, want: Option<&str>) {
    let mut last = None;
    let ok = holdfast_it::poll(Duration::from_secs(10), || {
        let st = h.status();
        let s = st.sessions.first()?;
        last = Some((s.movable, s.blocked_by.clone()));
        (s.blocked_by.as_deref() == want && s.movable == want.is_none()).then_some(())
    });
    assert!(
        ok.is_some(),
        "expected blocked_by {want:?}, /status shows (movable, blocked_by) = {last:?}"
    );
}

#[test]
fn status_tracks_transactions_temporary_tables_locks_and_cursors() {
    let h = Harness::start();
    let mut c = RawConn::connect(
        h.proxy,
        h.user(),
        h.password(),
        Some(h.database()),
        BASE_CAPS | CLIENT_DEPRECATE_EOF,
    )
    .unwrap();
    c.query("SET sql_mode='ANSI_QUOTES'").unwrap();
    c.query("USE mysql").unwrap();
    c.query("SET NAMES latin1").unwrap();
    wait_blocker(&h, None);
    assert_eq!(
        c.query_value("SELECT CONCAT(@@sql_mode, ' ', DATABASE(), ' ', @@character_set_client)")
            .unwrap()
            .as_deref(),
        Some("ANSI_QUOTES mysql latin1")
    );

    c.query("START TRANSACTION").unwrap();
    wait_blocker(&h, Some("open transaction"));
    c.query("COMMIT").unwrap();
    wait_blocker(&h, None);

    c.query("SET autocommit = 0").unwrap();
    c.query("SELECT 1").unwrap();
    c.query("CREATE TABLE IF NOT EXISTS sbtest.k (x INT) ENGINE=InnoDB")
        .unwrap();
    c.query("INSERT INTO sbtest.k VALUES (1)").unwrap();
    wait_blocker(&h, Some("open transaction"));
    c.query("ROLLBACK").unwrap();
    c.query("SET autocommit = 1").unwrap();
    wait_blocker(&h, None);

    c.query("CREATE TEMPORARY TABLE tmp (x INT)").unwrap();
    wait_blocker(&h, Some("temporary table"));
    c.command(&[0x1f]).unwrap(); // COM_RESET_CONNECTION drops it
    c.read_results().unwrap();
    wait_blocker(&h, None);

    c.query("LOCK TABLES sbtest.k READ").unwrap();
    wait_blocker(&h, Some("LOCK TABLES"));
    c.query("UNLOCK TABLES").unwrap();
    wait_blocker(&h, None);

    c.query("DO GET_LOCK('holdfast-it', 1)").unwrap();
    wait_blocker(&h, Some("GET_LOCK"));
    c.command(&[0x1f]).unwrap();
    c.read_results().unwrap();
    wait_blocker(&h, None);

    let stmt = c.prepare("SELECT seq FROM seq_1_to_10").unwrap();
    c.execute_no_params(stmt.id, holdfast_wire::command::CURSOR_TYPE_READ_ONLY)
        .unwrap();
    wait_blocker(&h, Some("open cursor"));
    let (rows, status) = c.fetch(stmt.id, 100).unwrap();
    assert_eq!(rows.len(), 10);
    assert!(status & SERVER_STATUS_LAST_ROW_SENT != 0);
    wait_blocker(&h, None);
}

/// The OK packets of `statements`, each the whole payload.
fn ok_payloads(c: &mut RawConn, statements: &[&str]) -> Vec<Vec<u8>> {
    statements
        .iter()
        .map(|sql| match c.query(sql).unwrap().remove(0) {
            Response::Ok { payload, .. } => payload,
            other => panic!("{sql}: OK expected, got {other:?}"),
        })
        .collect()
}

/// Statements whose OK packets carry session state on a tracking backend but no info text.
const STATEMENTS: [&str; 7] = [
    "SET sql_mode='ANSI_QUOTES'",
    "USE mysql",
    "SET NAMES latin1",
    "CREATE TEMPORARY TABLE sbtest.tt (x INT)",
    "INSERT INTO sbtest.tt VALUES (1)",
    "START TRANSACTION",
    "COMMIT",
];

/// Statements whose OK packets carry an info text.
const WITH_INFO: [&str; 3] = [
    "CREATE TEMPORARY TABLE sbtest.ti (x INT)",
    "INSERT INTO sbtest.ti VALUES (1), (2)",
    "UPDATE sbtest.ti SET x = x + 1",
];

#[test]
fn client_without_session_track_gets_plain_ok_packets() {
    let h = Harness::start();
    compare_ok_packets(&h, &STATEMENTS);
}

#[test]

fn ok_packets_with_info_text_match_the_server() {
    let h = Harness::start();
    compare_ok_packets(&h, &WITH_INFO);
}

fn compare_ok_packets(h: &Harness, statements: &[&str]) {
    for caps in [BASE_CAPS, BASE_CAPS | CLIENT_DEPRECATE_EOF] {
        let mut via =
            RawConn::connect(h.proxy, h.user(), h.password(), Some(h.database()), caps).unwrap();
        let mut direct =
            RawConn::connect(h.direct(), h.user(), h.password(), Some(h.database()), caps).unwrap();
        assert_eq!(via.caps & CLIENT_SESSION_TRACK, 0);
        let got = ok_payloads(&mut via, statements);
        let want = ok_payloads(&mut direct, statements);
        for ((sql, g), w) in statements.iter().zip(&got).zip(&want) {
            let ok = OkPacket::parse(g, false).unwrap();
            assert_eq!(
                ok.status & SERVER_SESSION_STATE_CHANGED,
                0,
                "{sql}: {g:02x?}"
            );
            assert_eq!(
                g, w,
                "{sql}: holdfast's OK (left) differs from the server's (right)"
            );
        }
        // COM_INIT_DB, too.
        via.command(b"\x02sbtest").unwrap();
        direct.command(b"\x02sbtest").unwrap();
        let p = via.read_packet().unwrap().payload;
        assert_eq!(p, direct.read_packet().unwrap().payload, "COM_INIT_DB OK");
        assert_eq!(p.len(), 7, "COM_INIT_DB OK: {p:02x?}");
        // Result-set terminators under DEPRECATE_EOF carry no state either.
        let res = via
            .query("SET @a = 1; SELECT @a; USE mysql; SELECT DATABASE()")
            .unwrap();
        assert_eq!(res.len(), 4);
        for r in res {
            let status = match r {
                Response::Ok { status, .. } | Response::Rows { status, .. } => status,
            };
            assert_eq!(status & SERVER_SESSION_STATE_CHANGED, 0);
        }
        via.ping().unwrap();
    }
}

/// The session-state block of each OK packet, for a client that asked for every system
/// variable and the transaction characteristics (by default it would see neither
/// `sql_mode` nor characteristics: `differential::clients_with_session_track_...`).
fn tracked_ok(h: &Harness, statements: &[&str]) -> Vec<Vec<u8>> {
    let caps = BASE_CAPS | CLIENT_DEPRECATE_EOF | CLIENT_SESSION_TRACK;
    let mut c =
        RawConn::connect(h.proxy, h.user(), h.password(), Some(h.database()), caps).unwrap();
    assert!(c.session_track());
    c.query(
        "SET session_track_system_variables = '*', \
         session_track_transaction_info = 'CHARACTERISTICS'",
    )
    .unwrap();
    ok_payloads(&mut c, statements)
        .into_iter()
        .map(|p| {
            let ok = OkPacket::parse(&p, true).unwrap();
            assert!(ok.status & SERVER_SESSION_STATE_CHANGED != 0, "{p:02x?}");
            ok.session_state.to_vec()
        })
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn client_with_session_track_receives_state_changes() {
    let h = Harness::start();
    let states = tracked_ok(&h, &["SET sql_mode='ANSI_QUOTES'", "USE mysql"]);
    // SESSION_TRACK_SYSTEM_VARIABLES: lenenc name, lenenc value.
    assert!(
        contains(&states[0], b"\x08sql_mode\x0bANSI_QUOTES"),
        "{:02x?}",
        states[0]
    );
    // SESSION_TRACK_SCHEMA: type 1, length 6, lenenc "mysql".
    assert!(
        contains(&states[1], b"\x01\x06\x05mysql"),
        "{:02x?}",
        states[1]
    );
}

#[test]

fn session_state_blocks_decode_completely() {
    let h = Harness::start();
    let states = tracked_ok(
        &h,
        &[
            "SET sql_mode='ANSI_QUOTES'",
            "USE mysql",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        ],
    );
    let mut vars = Vec::new();
    let mut schemas = Vec::new();
    let mut characteristics = Vec::new();
    for st in &states {
        for item in items(st) {
            match item.unwrap_or_else(|e| panic!("undecodable record in {st:02x?}: {e}")) {
                TrackItem::SystemVariable { name, value } => vars.push((
                    String::from_utf8_lossy(name).into_owned(),
                    String::from_utf8_lossy(value).into_owned(),
                )),
                TrackItem::Schema(s) => schemas.push(String::from_utf8_lossy(s).into_owned()),
                TrackItem::TransactionCharacteristics(c) => {
                    characteristics.push(String::from_utf8_lossy(c).into_owned())
                }
                _ => {}
            }
        }
    }
    assert!(
        vars.contains(&("sql_mode".into(), "ANSI_QUOTES".into())),
        "{vars:?}"
    );
    assert_eq!(schemas, vec!["mysql".to_string()]);
    assert!(
        characteristics.iter().any(|c| c.contains("SERIALIZABLE")),
        "{characteristics:?}"
    );
}
