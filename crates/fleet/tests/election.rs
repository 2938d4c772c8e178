//! Members of a fleet against a real etcd (`/usr/bin/etcd`, Debian's `etcd-server`) on
//! loopback ports: one leader at a time; a member that goes leaves the lead to another
//! within the lease's TTL, with a higher epoch; with etcd gone, the leader stops leading.

use holdfast_config::ClusterConfig;
use holdfast_fleet::{Fleet, Leadership, MemberInfo};
use holdfast_lab::etcd::Etcd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// An etcd in a directory of the test's own.
fn etcd(name: &str) -> (Etcd, PathBuf) {
    let dir = std::env::temp_dir().join(format!("holdfast-etcd-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    (Etcd::start(&dir).expect("etcd"), dir)
}

async fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config(etcd: &Etcd) -> ClusterConfig {
    ClusterConfig {
        name: "test".into(),
        etcd: vec![etcd.endpoint.clone()],
        member: None,
        lease_ttl_secs: 2,
    }
}

fn member(name: &str) -> MemberInfo {
    MemberInfo {
        member: name.into(),
        listen: "127.0.0.1:3306".into(),
        admin: "127.0.0.1:8080".into(),
        version: "test".into(),
        pid: std::process::id(),
    }
}

fn standing(f: &Fleet) -> Leadership {
    *f.leadership().borrow()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_the_lead_moves_when_the_leader_goes() {
    let (etcd, dir) = etcd("election");
    let a = Fleet::join(config(&etcd), member("a"));
    let b = Fleet::join(config(&etcd), member("b"));
    let limit = Duration::from_secs(20);
    wait_until("a leader", limit, || {
        standing(&a).leader || standing(&b).leader
    })
    .await;
    // Never two: watched for a while.
    for _ in 0..50 {
        assert!(!(standing(&a).leader && standing(&b).leader));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (leader, other) = if standing(&a).leader { (a, b) } else { (b, a) };
    let first = standing(&leader).epoch;
    assert!(first > 0);
    // Any member finds the leader's registration (where its admin API answers).
    let found = other.leader().await.expect("the leader's registration");
    assert_eq!(found.member, leader.member());
    assert_eq!(found.admin, "127.0.0.1:8080");
    // The leader's process goes (its task stops; its lease runs out at etcd).
    drop(leader);
    wait_until("the other member to lead", limit, || {
        standing(&other).leader
    })
    .await;
    assert!(
        standing(&other).epoch > first,
        "{:?} after {first}",
        standing(&other)
    );
    drop(etcd);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_etcd_stops_leading() {
    let (mut etcd, dir) = etcd("lost");
    let a = Fleet::join(config(&etcd), member("a"));
    let limit = Duration::from_secs(20);
    wait_until("a leader", limit, || standing(&a).leader).await;
    assert!(a.confirm_leading().await, "etcd confirms the leader");
    etcd.kill();
    // Asked before a decision: etcd cannot confirm it, whatever the member believes yet.
    assert!(!a.confirm_leading().await);
    // Within the lease's TTL (2 s), with room for a loaded machine.
    wait_until("the leader to stop leading", limit, || !standing(&a).leader).await;
    let _ = std::fs::remove_dir_all(dir);
}
