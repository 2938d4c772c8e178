//! Members of a fleet against a real etcd (`/usr/bin/etcd`, Debian's `etcd-server`) on
//! loopback ports: one leader at a time; a member that goes leaves the lead to another
//! within the lease's TTL, with a higher epoch; with etcd gone, the leader stops leading.

use holdfast_config::ClusterConfig;
use holdfast_fleet::{check_fits, Fleet, FleetError, Leadership, MemberInfo};
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
        shape: "ha managed; nodes node1=127.0.0.1:3310".into(),
        sessions: 0,
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
    // Never two: watched for three lease TTLs; and neither member joins again meanwhile
    // (a follower's campaign waits as long as the leader leads: it once was cut off by a
    // request timeout every TTL, and the member joined anew each time).
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(6) {
        assert!(!(standing(&a).leader && standing(&b).leader));
        assert_eq!((a.times_joined(), b.times_joined()), (1, 1));
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

/// A member configured for another cluster than the members registered is refused (at
/// start, by `check_fits`; in the background, it does not register nor campaign); the same
/// member name (a process replacing itself) and members without a shape are not judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_configured_for_another_cluster_does_not_join() {
    let (etcd, dir) = etcd("misfit");
    let a = Fleet::join(config(&etcd), member("a"));
    let limit = Duration::from_secs(20);
    wait_until("a leader", limit, || standing(&a).leader).await;
    let mut other = member("b");
    other.shape = "ha managed; nodes node1=127.0.0.1:3399".into();
    match check_fits(&config(&etcd), &other).await {
        Err(FleetError::Misfit { member, theirs, .. }) => {
            assert_eq!(member, "a");
            assert!(theirs.contains("127.0.0.1:3310"), "{theirs}");
        }
        other => panic!("refused as a misfit, not {other:?}"),
    }
    check_fits(&config(&etcd), &member("b"))
        .await
        .expect("the same cluster fits");
    let mut itself = member("a");
    itself.shape = other.shape.clone();
    check_fits(&config(&etcd), &itself)
        .await
        .expect("a member is not judged against its own registration");
    // Joined anyway (etcd was not there at start, say): not registered while `a` is.
    let b = Fleet::join(config(&etcd), other);
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(3) {
        let names: Vec<String> = a.seen().members.into_iter().map(|m| m.member).collect();
        assert!(names.iter().all(|m| m == "a"), "{names:?}");
        assert!(!standing(&b).leader);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(a.seen().members.len(), 1, "a lists itself");
    // Once no member of the old shape is left, the fleet is the one that remains.
    drop(a);
    wait_until("the remaining member to lead", limit, || {
        standing(&b).leader
    })
    .await;
    drop(etcd);
    let _ = std::fs::remove_dir_all(dir);
}
