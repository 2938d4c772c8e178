//! Network cuts between holdfast and a node that keeps running (nftables rules on
//! loopback, scoped to this test's node port and holdfast's own source address,
//! `[proxy] backend_source_address`): the server still holds its side of a cut connection.

use holdfast_it::{metric, wait_for, Harness, Options};
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::process::Command;
use std::time::Duration;

const SOURCE: &str = "127.0.0.9";

fn nft(args: &[&str]) -> bool {
    Command::new("nft")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// holdfast cut off a node's port: its packets answered with TCP resets, the node's
/// dropped ([`Cut::reject`]), or every packet dropped ([`Cut::drop_all`]); healed when
/// dropped.
struct Cut {
    table: String,
}

impl Cut {
    fn reject(port: u16) -> Cut {
        Cut::new(
            port,
            "reject with tcp reset",
            // The server's packets vanish (the resets for holdfast pass): its side of the
            // connection stays open.
            "tcp flags & rst == 0 drop",
        )
    }

    /// A partition: both ways dropped, nobody told.
    fn drop_all(port: u16) -> Cut {
        Cut::new(port, "drop", "drop")
    }

    fn new(port: u16, to_node: &str, from_node: &str) -> Cut {
        let table = format!("holdfast_it_cut_{port}");
        nft(&["delete", "table", "inet", &table]);
        let cut = Cut { table };
        let t = cut.table.as_str();
        assert!(nft(&["add", "table", "inet", t]), "nft add table");
        assert!(
            nft(&[
                "add",
                "chain",
                "inet",
                t,
                "out",
                "{ type filter hook output priority 0; policy accept; }"
            ]),
            "nft add chain"
        );
        for rule in [
            format!("oifname \"lo\" ip saddr {SOURCE} tcp dport {port} {to_node}"),
            format!("oifname \"lo\" ip daddr {SOURCE} tcp sport {port} {from_node}"),
        ] {
            assert!(nft(&["add", "rule", "inet", t, "out", &rule]), "{rule}");
        }
        cut
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        nft(&["delete", "table", "inet", &self.table]);
    }
}

/// A lab (a primary, a replica) whose nodes take holdfast's connections from [`SOURCE`],
/// holdfast with `more` configuration, and a client with table `cut_t` holding row 0;
/// `None` when nftables cannot be used here (the test is skipped).
fn cut_lab(more: impl FnOnce(&mut holdfast_config::Config) + 'static) -> Option<(Harness, Conn)> {
    if !nft(&["list", "tables"]) {
        eprintln!("skipped: nftables is not usable here (apt-get install nftables; root)");
        return None;
    }
    let h = Harness::start_with(
        Options::default()
            .replicas(1)
            .server_args(&["--proxy-protocol-networks=127.0.0.1,127.0.0.9"])
            .config(|c| {
                c.proxy.backend_source_address = Some(SOURCE.parse().expect("ip"));
                more(c);
            }),
    );
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url")).prefer_socket(false);
    let mut c = Conn::new(opts).unwrap();
    c.query_drop("CREATE TABLE cut_t (id INT PRIMARY KEY)")
        .unwrap();
    c.query_drop("INSERT INTO cut_t VALUES (0)").unwrap();
    Some((h, c))
}

/// The server closes its side of the test account's connections (a KILL, as after its own
/// net timeouts) and lets them go; during a cut holdfast does not see the close.
fn server_closes_its_side(h: &Harness) {
    let user = h.user().to_string();
    let threads = || {
        h.root_sql(&format!(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{user}'"
        ))
    };
    for row in threads() {
        h.root_sql(&format!("KILL CONNECTION {}", row[0]));
    }
    wait_for(
        "the server to let the connection go",
        Duration::from_secs(20),
        || threads().is_empty().then_some(()),
    );
}

/// The long read the stuck-answer tests run: it runs a while on the server and is safe to
/// run again (the Sequence engine's table; `SLEEP` is never run twice).
const LONG_READ: &str = "SELECT COUNT(*) FROM seq_1_to_30000000 WHERE seq % 3 = 0";

/// Runs [`LONG_READ`] through `c` and, while the server (`commands`: its threads of the
/// test account) runs it, drops every packet between holdfast and the node on `port`; once
/// the server has answered into the partition and backed off its retransmissions five
/// times (its next try 6.4 s after the last), heals it. The read's answer, when it comes.
fn answer_sent_into_a_partition(
    mut c: Conn,
    port: u16,
    commands: impl Fn() -> Vec<String>,
) -> Option<i64> {
    let reader = std::thread::spawn(move || c.query_first::<i64, _>(LONG_READ));
    wait_for("the read to run", Duration::from_secs(20), || {
        commands().iter().any(|c| c == "Query").then_some(())
    });
    let cut = Cut::drop_all(port);
    wait_for(
        "the server to be done with the read",
        Duration::from_secs(20),
        || commands().iter().all(|c| c == "Sleep").then_some(()),
    );
    wait_for(
        "the server's retransmissions to back off",
        Duration::from_secs(30),
        || (server_backoff(port) >= 5).then_some(()),
    );
    drop(cut);
    reader
        .join()
        .expect("the reader")
        .expect("the read is answered")
}

/// `holdfast_backend_connections_lost_total` for `reason` (`idle`, `request`).
fn lost(h: &Harness, reason: &str) -> f64 {
    metric(
        &h.metrics(),
        &format!("holdfast_backend_connections_lost_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}

#[test]
fn a_session_survives_a_cut_between_holdfast_and_a_primary_that_kept_running() {
    let Some((h, mut c)) = cut_lab(|_| {}) else {
        return;
    };
    let port = h.node("node1").port;
    let cut = Cut::reject(port);
    // Sent into the cut: holdfast's side of its backend connection is reset; the server
    // keeps its own (idle) and keeps running.
    let writer =
        std::thread::spawn(move || c.query_drop("INSERT INTO cut_t VALUES (1)").map(|()| c));
    wait_for(
        "holdfast to see the primary cut off",
        Duration::from_secs(20),
        || (h.status_json()["ha"]["failed_probes"].as_u64()? > 0).then_some(()),
    );
    drop(cut);
    let mut c = writer
        .join()
        .expect("the writer")
        .expect("the INSERT sent into the cut is answered OK once the cut heals");
    // The same client connection goes on, and the row is there once.
    let rows: Vec<i32> = c.query("SELECT id FROM cut_t ORDER BY id").unwrap();
    assert_eq!(rows, vec![0, 1]);
    // Usually the request was lost in the cut and holdfast killed the old connection
    // (`cut_connections_fenced`); if the monitor saw the cut first, the request was held
    // and sent once it healed, on the same connection: both are right.
    let fenced = h.shared.metrics.cut_connections_fenced.get();
    println!("cut connections fenced: {fenced}");
}

#[test]
fn a_connection_the_network_reset_is_not_taken_for_a_kill_when_the_server_closed_its_side() {
    let Some((h, mut c)) = cut_lab(|_| {}) else {
        return;
    };
    let port = h.node("node1").port;
    let cut = Cut::reject(port);
    // While the network is cut, the server closes its side of the session's connection
    // (as after its own net timeouts); holdfast does not see the close (it is dropped).
    server_closes_its_side(&h);
    // Sent into the cut: reset. The request never reached the server.
    let writer =
        std::thread::spawn(move || c.query_drop("INSERT INTO cut_t VALUES (1)").map(|()| c));
    // Healed only once the session has lost its connection (a reset on the INSERT, or the
    // server's own reset while idle) and told whose loss it was (healed before that, the
    // monitor's record tells: the next test).
    wait_for(
        "holdfast to see the primary cut off and the session lose its connection",
        Duration::from_secs(20),
        || {
            let lost = lost(&h, "idle") + lost(&h, "request");
            (h.status_json()["ha"]["failed_probes"].as_u64()? > 0 && lost > 0.0).then_some(())
        },
    );
    drop(cut);
    let mut c = writer
        .join()
        .expect("the writer")
        .expect("the INSERT the network reset is recovered, not ended as a KILL");
    let rows: Vec<i32> = c.query("SELECT id FROM cut_t ORDER BY id").unwrap();
    assert_eq!(rows, vec![0, 1]);
}

#[test]
fn a_connection_the_network_cut_and_its_server_closed_is_recovered_when_the_loss_is_seen_after_the_heal(
) {
    let Some((h, mut c)) = cut_lab(|_| {}) else {
        return;
    };
    let port = h.node("node1").port;
    let cut = Cut::reject(port);
    // While the network is cut, the server closes its side of the session's connection
    // (as after its own net timeouts, or a reset it got for a reply); holdfast does not
    // see the close (it is dropped) and sends nothing: the session is idle.
    server_closes_its_side(&h);
    // The monitor loses the node too (its probe is reset), then the cut heals before the
    // session has used its connection: the loss is seen only afterwards, when the node
    // takes connections again, as a split session busy on a replica sees its primary's.
    let monitor_lost_it = || !h.shared.monitor_links.borrow().links.contains_key("node1");
    wait_for(
        "the monitor to lose its connection to the primary",
        Duration::from_secs(20),
        || monitor_lost_it().then_some(()),
    );
    drop(cut);
    wait_for(
        "the monitor to reach the primary again",
        Duration::from_secs(20),
        || (!monitor_lost_it()).then_some(()),
    );
    c.query_drop("INSERT INTO cut_t VALUES (1)")
        .expect("a connection lost to a cut is recovered, not ended as a KILL, though its loss is seen after the heal");
    let rows: Vec<i32> = c.query("SELECT id FROM cut_t ORDER BY id").unwrap();
    assert_eq!(rows, vec![0, 1]);
}

#[test]
fn a_request_sent_into_a_partition_is_given_up_after_the_tcp_user_timeout_and_answered_after_the_heal(
) {
    let Some((h, mut c)) = cut_lab(|c| c.proxy.backend_tcp_user_timeout_ms = 1_500) else {
        return;
    };
    let lost_on_request = || lost(&h, "request");
    assert_eq!(lost_on_request(), 0.0);
    let port = h.node("node1").port;
    let cut = Cut::drop_all(port);
    // Sent into the partition: TCP retransmits it at doubling intervals (0.2, 0.6, 1.4,
    // 3.0, 6.2, 12.6 s...). holdfast gives the connection up once its bytes have gone
    // unacknowledged for 1.5 s, instead of waiting on TCP's next try after the heal.
    let reader = std::thread::spawn(move || {
        c.query_first::<i64, _>("SELECT COUNT(*) FROM cut_t")
            .map(|n| (n, c))
    });
    // Without TCP_USER_TIMEOUT nothing is lost: the request waits on its connection.
    wait_for(
        "the request's connection to be given up",
        Duration::from_secs(20),
        || (lost_on_request() > 0.0).then_some(()),
    );
    drop(cut);
    let (n, mut c) = reader
        .join()
        .expect("the reader")
        .expect("the SELECT sent into the partition is answered once it heals");
    assert_eq!(n, Some(1));
    // The session goes on, on a new connection.
    c.query_drop("INSERT INTO cut_t VALUES (1)").unwrap();
    let rows: Vec<i32> = c.query("SELECT id FROM cut_t ORDER BY id").unwrap();
    assert_eq!(rows, vec![0, 1]);
}

/// The most times the server's connections from holdfast on `port` have backed off their
/// retransmissions (`ss`'s `backoff:N`): TCP's next try comes after 0.2 s * 2^N.
fn server_backoff(port: u16) -> u32 {
    let out = Command::new("ss")
        .args(["-tniH", "state", "established"])
        .arg(format!("( sport = :{port} and dst {SOURCE} )"))
        .output()
        .expect("ss (apt-get install iproute2)");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("backoff:")?.parse().ok())
        .max()
        .unwrap_or(0)
}

#[test]
fn an_answer_stuck_in_the_network_after_a_partition_healed_is_not_waited_for() {
    let Some((h, c)) = cut_lab(|_| {}) else {
        return;
    };
    let user = h.user().to_string();
    let commands = || {
        h.root_sql(&format!(
            "SELECT COMMAND FROM information_schema.PROCESSLIST WHERE USER = '{user}'"
        ))
        .into_iter()
        .map(|row| row[0].clone())
        .collect::<Vec<String>>()
    };
    let n = answer_sent_into_a_partition(c, h.node("node1").port, commands);
    assert_eq!(n, Some(10_000_000));
    // holdfast gave the connection up once the monitor had had trouble reaching the node
    // and the server had been done with the request for a second, and ran it again (a
    // read outside a transaction is run again after a loss): without that, the answer
    // would have come on the same connection with TCP's next retransmission, and no
    // connection would have been lost.
    assert_eq!(lost(&h, "request"), 1.0);
}

#[test]
fn a_split_reads_answer_stuck_on_a_replica_after_a_partition_healed_runs_on_the_primary() {
    let Some((h, c)) = cut_lab(|c| {
        c.proxy.routing = holdfast_config::Routing::Split;
        c.split.primary_read_weight = 0.0;
    }) else {
        return;
    };
    wait_for("the replica to take reads", Duration::from_secs(30), || {
        (h.shared.topology.borrow().read_nodes().count() == 1).then_some(())
    });
    let replica = h.node("node2").clone();
    let user = h.user().to_string();
    let commands = || {
        holdfast_lab::node_sql(
            &replica,
            &format!("SELECT COMMAND FROM information_schema.PROCESSLIST WHERE USER = '{user}'"),
        )
        .expect("the replica's processlist")
        .into_iter()
        .map(|row| row[0].clone())
        .collect::<Vec<String>>()
    };
    let n = answer_sent_into_a_partition(c, replica.port, commands);
    assert_eq!(n, Some(10_000_000));
    // The replica's answer was given up for lost once the monitor had had trouble with the
    // replica and its thread had been idle for a second: the read ran on the primary.
    let fallbacks = metric(
        &h.metrics(),
        "holdfast_reads_fallback_total{reason=\"replica_lost\"}",
    );
    assert_eq!(fallbacks, Some(1.0));
}
