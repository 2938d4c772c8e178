//! A fleet of holdfast processes in front of one database cluster (`[cluster]`),
//! coordinated through etcd, as Patroni coordinates PostgreSQL nodes: each member keeps a
//! lease (`lease_ttl_secs`), registers itself under it, and campaigns in an etcd election;
//! the one elected is the leader, the only member that makes cluster decisions (HA). The
//! election key's creation revision is the leader's epoch.
//!
//! A leader that cannot renew its lease stops leading before the lease can expire at etcd
//! (after two thirds of the TTL without a renewal), so two members never both lead; it
//! then starts over with a new lease and campaigns again. A member that cannot reach etcd
//! keeps serving its sessions and makes no cluster decision.
//!
//! A switchover is the fleet's: the leader says so (`switching`, under its lease), every
//! member holds its sessions at their next safe point and says when they all are
//! (`parked/<member>`, under its lease), the leader switches once all are (or its drain
//! window passed), then says which node is the primary now; each member lets its
//! sessions go once its own monitor sees that node writable ([`Switching`]).
//!
//! Keys, under `/holdfast/<name>/`: `members/<member>` (JSON: [`MemberInfo`], under the
//! member's lease), the election `leader`, `switching`, `parked/<member>`, `primary`
//! ([`PrimarySaid`]) and `decisions/<time>-<member>` (the last cluster decisions,
//! [`Decision`]). Members follow `switching` and `primary` through an etcd watch.

mod board;

pub use board::{Board, Posted, Poster};

use etcd_client::{Client, ConnectOptions, GetOptions, PutOptions};
use holdfast_config::ClusterConfig;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What a member says of itself in etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Its name in the fleet (`[cluster] member`).
    pub member: String,
    /// Where clients connect (`[proxy] listen`).
    pub listen: String,
    /// Its admin API (`[admin] listen`).
    pub admin: String,
    pub version: String,
    pub pid: u32,
    /// The cluster as this member's config describes it (its nodes and HA mode): every
    /// member of a fleet must say the same ([`check_fits`]).
    #[serde(default)]
    pub shape: String,
    /// Client connections it holds, as it said last (within a few seconds).
    #[serde(default)]
    pub sessions: u64,
}

/// This member's standing in the fleet now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Leadership {
    /// It leads: it makes the cluster decisions.
    pub leader: bool,
    /// The leader's election revision (when this member leads): a later leader's is
    /// higher.
    pub epoch: i64,
}

/// The fleet as etcd said last: its registered members, the leader's name, the last
/// cluster decisions (oldest first).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub members: Vec<MemberInfo>,
    pub leader: Option<String>,
    #[serde(default)]
    pub decisions: Vec<Decision>,
}

/// A cluster decision a leader made (an HA operation, done or failed), as the fleet
/// keeps it: who, under which epoch, when, what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub at_unix_ms: u64,
    pub by: String,
    pub epoch: i64,
    pub what: String,
    pub ok: bool,
}

/// The decisions the fleet keeps (older ones are deleted as new ones come).
const DECISIONS_KEPT: usize = 20;

/// A switchover the leader runs, as every member sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Switching {
    /// The leader that runs it, and its epoch.
    pub by: String,
    pub epoch: i64,
    /// Over: members let their sessions go once their monitor sees `new_primary` (none:
    /// the switchover failed, nothing changed).
    pub done: bool,
    pub new_primary: Option<String>,
}

/// The primary as the leader said after its last promotion (failover or switchover):
/// members probe their nodes again when it changes, and so see the new primary at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrimarySaid {
    pub node: String,
    pub by: String,
    pub epoch: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("the lease was not renewed within {0:?}")]
    LeaseLost(Duration),
    #[error("etcd elected no leader")]
    NoLeader,
    #[error(
        "fleet {fleet:?}: member {member:?} is configured for another cluster ({theirs}) than this \
         config ({ours}); one fleet is one cluster: give this one the same nodes and HA mode, \
         or another [cluster] name"
    )]
    Misfit {
        fleet: String,
        member: String,
        theirs: String,
        ours: String,
    },
}

/// Whether `me` may join the fleet `cfg` names: every other member registered now is
/// configured for the same cluster ([`MemberInfo::shape`]). `Err(FleetError::Misfit)` when
/// one is not; another error when etcd does not answer within the lease's TTL.
pub async fn check_fits(cfg: &ClusterConfig, me: &MemberInfo) -> Result<(), FleetError> {
    let ttl = cfg.lease_ttl();
    let asked = async {
        let options = ConnectOptions::new()
            .with_connect_timeout(ttl)
            .with_timeout(ttl);
        let mut client = Client::connect(&cfg.etcd, Some(options)).await?;
        fits(&mut client, &cfg.name, me).await
    };
    match tokio::time::timeout(ttl, asked).await {
        Ok(result) => result,
        Err(_) => Err(FleetError::LeaseLost(ttl)),
    }
}

async fn fits(client: &mut Client, fleet: &str, me: &MemberInfo) -> Result<(), FleetError> {
    let members = client
        .get(
            format!("{}members/", prefix(fleet)),
            Some(GetOptions::new().with_prefix()),
        )
        .await?;
    let misfit = members
        .kvs()
        .iter()
        .filter_map(|kv| serde_json::from_slice::<MemberInfo>(kv.value()).ok())
        .find(|m| m.member != me.member && !m.shape.is_empty() && m.shape != me.shape);
    match misfit {
        Some(m) => Err(FleetError::Misfit {
            fleet: fleet.to_string(),
            member: m.member,
            theirs: m.shape,
            ours: me.shape.clone(),
        }),
        None => Ok(()),
    }
}

/// This member of the fleet: its standing, kept up to date by a task of its own.
pub struct Fleet {
    name: String,
    member: String,
    /// This member's standing, set by its task (and by [`Fleet::leave`]).
    standing: Arc<watch::Sender<Leadership>>,
    /// While this member leads: its election key, to ask etcd again.
    proof: Arc<Mutex<Option<Proof>>>,
    /// The connection to etcd and this member's lease, while there are.
    client: Arc<Mutex<Option<(Client, i64)>>>,
    switching: watch::Receiver<Option<Switching>>,
    primary: watch::Receiver<Option<PrimarySaid>>,
    /// The board's keys as etcd said last ([`board`]).
    board: watch::Receiver<Board>,
    /// The members and the leader as etcd said last (read every second).
    seen: Arc<Mutex<Seen>>,
    watcher: tokio::task::JoinHandle<()>,
    ttl: Duration,
    /// When etcd last renewed this member's lease, and how many times it was elected.
    life: Arc<Life>,
    /// The member's life in etcd (none after [`Fleet::leave`]), and what starts it again
    /// ([`Fleet::rejoin`]).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    cfg: ClusterConfig,
    me: MemberInfo,
}

/// What the member's task tells of its life in etcd.
#[derive(Default)]
struct Life {
    renewed: Mutex<Option<Instant>>,
    elected: std::sync::atomic::AtomicU64,
    /// The member's client connections now ([`Fleet::set_sessions`]).
    sessions: std::sync::atomic::AtomicU64,
    /// Times it joined (a lease, its registration, a campaign): once, unless etcd was
    /// out of reach for a while.
    joined: std::sync::atomic::AtomicU64,
}

/// What a leader shows etcd to confirm it still leads: its election key and revision.
#[derive(Clone)]
struct Proof {
    client: Client,
    key: Vec<u8>,
    epoch: i64,
    /// To resign with ([`Fleet::leave`]).
    leader_key: etcd_client::LeaderKey,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().ok().and_then(|mut t| t.take()) {
            task.abort();
        }
        self.watcher.abort();
    }
}

impl Fleet {
    /// Joins the fleet `cfg` names as `me`: from now on, in the background, it keeps a
    /// lease, registers and campaigns (retrying while etcd cannot be reached). Not the
    /// leader until etcd elects it.
    pub fn join(cfg: ClusterConfig, me: MemberInfo) -> Fleet {
        let standing = Arc::new(watch::Sender::new(Leadership::default()));
        let name = cfg.name.clone();
        let member = me.member.clone();
        let proof = Arc::new(Mutex::new(None));
        let client = Arc::new(Mutex::new(None));
        let ttl = cfg.lease_ttl();
        let (switching_tx, switching) = watch::channel(None);
        let (primary_tx, primary) = watch::channel(None);
        let (board_tx, board) = watch::channel(Board::default());
        let seen = Arc::new(Mutex::new(Seen::default()));
        let watcher = tokio::spawn(watch_switching(
            name.clone(),
            client.clone(),
            Mirrors {
                switching: switching_tx,
                primary: primary_tx,
                board: board_tx,
                seen: seen.clone(),
            },
        ));
        let life = Arc::new(Life::default());
        let fleet = Fleet {
            name,
            member,
            standing,
            proof,
            client,
            switching,
            primary,
            board,
            seen,
            watcher,
            ttl,
            life,
            task: Mutex::new(None),
            cfg,
            me,
        };
        fleet.rejoin();
        fleet
    }

    /// Starts this member's life in etcd (a lease, its registration, a campaign), unless
    /// it runs: after [`Fleet::leave`], when the process serves again (the successor an
    /// upgrade handed over to exited).
    pub fn rejoin(&self) {
        let Ok(mut task) = self.task.lock() else {
            return;
        };
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        *task = Some(tokio::spawn(run(
            self.cfg.clone(),
            self.me.clone(),
            self.standing.clone(),
            self.proof.clone(),
            self.client.clone(),
            self.life.clone(),
        )));
    }

    /// Leaves the fleet (this process stops, or hands over to its successor in an
    /// upgrade; [`Fleet::rejoin`] if that one goes): it stops leading at once, resigns (another member, or the successor,
    /// is elected without waiting for the lease to run out) and gives its lease back (its
    /// keys go; a key a successor of the same name has put since is the successor's).
    pub async fn leave(&self) {
        if let Some(task) = self.task.lock().ok().and_then(|mut t| t.take()) {
            task.abort();
        }
        let proof = self.proof.lock().ok().and_then(|mut p| p.take());
        let connection = self.client.lock().ok().and_then(|mut c| c.take());
        self.standing.send_replace(Leadership::default());
        let wait = self.ttl / 2;
        if let Some(mut p) = proof {
            let resign = p.client.resign(Some(
                etcd_client::ResignOptions::new().with_leader(p.leader_key.clone()),
            ));
            if !matches!(tokio::time::timeout(wait, resign).await, Ok(Ok(_))) {
                tracing::warn!(fleet = %self.name, member = %self.member, "fleet: resigning did not answer; the lead moves when the lease runs out");
            }
        }
        if let Some((mut client, lease)) = connection {
            let _ = tokio::time::timeout(wait, client.lease_revoke(lease)).await;
        }
        tracing::info!(fleet = %self.name, member = %self.member, "fleet: left");
    }

    /// How long ago etcd last renewed this member's lease (`None`: it holds none now).
    pub fn lease_renewed_ago(&self) -> Option<Duration> {
        let renewed = *self.life.renewed.lock().ok()?;
        renewed.map(|at| at.elapsed())
    }

    /// This member holds `n` client connections now: said in its registration at the
    /// next lease renewal (a third of the TTL) when it changed.
    pub fn set_sessions(&self, n: u64) {
        self.life
            .sessions
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many times this member joined the fleet since it started (again after each
    /// time it lost touch with etcd).
    pub fn times_joined(&self) -> u64 {
        self.life.joined.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times etcd elected this member since it started.
    pub fn times_elected(&self) -> u64 {
        self.life.elected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keeps `decision` in the fleet's log (the last [`DECISIONS_KEPT`]), where every
    /// member reads it. False when etcd did not take it.
    pub async fn record_decision(&self, decision: &Decision) -> bool {
        let Some((mut client, _)) = self.connection() else {
            return false;
        };
        let Ok(value) = serde_json::to_vec(decision) else {
            return false;
        };
        let dir = format!("{}decisions/", prefix(&self.name));
        let key = format!("{dir}{:020}-{}", decision.at_unix_ms, decision.by);
        let kept = async {
            client.put(key, value, None).await.ok()?;
            let all = client
                .get(
                    dir.as_str(),
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
                .ok()?;
            let mut keys: Vec<Vec<u8>> = all.kvs().iter().map(|kv| kv.key().to_vec()).collect();
            keys.sort();
            let extra = keys.len().saturating_sub(DECISIONS_KEPT);
            for old in keys.into_iter().take(extra) {
                client.delete(old, None).await.ok()?;
            }
            Some(())
        };
        matches!(tokio::time::timeout(self.ttl, kept).await, Ok(Some(())))
    }

    /// The members and the leader as etcd said last (within about a second).
    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The leader's switchover, as it is now (`None`: none runs).
    pub fn switching(&self) -> watch::Receiver<Option<Switching>> {
        self.switching.clone()
    }

    /// The primary as the leader said last (see [`PrimarySaid`]).
    pub fn primary_said(&self) -> watch::Receiver<Option<PrimarySaid>> {
        self.primary.clone()
    }

    /// The leader says which node it made the primary. False when this member does not
    /// lead or etcd did not take it.
    pub async fn say_primary(&self, node: &str) -> bool {
        let Some(proof) = self.proof.lock().ok().and_then(|p| p.clone()) else {
            return false;
        };
        let Some((mut client, _)) = self.connection() else {
            return false;
        };
        let said = PrimarySaid {
            node: node.to_string(),
            by: self.member.clone(),
            epoch: proof.epoch,
        };
        let Ok(value) = serde_json::to_vec(&said) else {
            return false;
        };
        let key = format!("{}primary", prefix(&self.name));
        matches!(
            tokio::time::timeout(self.ttl, client.put(key, value, None)).await,
            Ok(Ok(_))
        )
    }

    fn connection(&self) -> Option<(Client, i64)> {
        self.client.lock().ok()?.clone()
    }

    /// The leader tells the members that a switchover starts: they hold their sessions
    /// at safe points. False when this member does not lead (it is not said).
    pub async fn begin_switching(&self) -> bool {
        let Some(proof) = self.proof.lock().ok().and_then(|p| p.clone()) else {
            return false;
        };
        let switching = Switching {
            by: self.member.clone(),
            epoch: proof.epoch,
            done: false,
            new_primary: None,
        };
        self.put_switching(&switching).await
    }

    /// The leader tells the members that the switchover is over (`new_primary`: the node
    /// that is the primary now; none: it failed).
    pub async fn end_switching(&self, new_primary: Option<String>) -> bool {
        let Some(proof) = self.proof.lock().ok().and_then(|p| p.clone()) else {
            return false;
        };
        let switching = Switching {
            by: self.member.clone(),
            epoch: proof.epoch,
            done: true,
            new_primary,
        };
        self.put_switching(&switching).await
    }

    async fn put_switching(&self, switching: &Switching) -> bool {
        let Some((mut client, lease)) = self.connection() else {
            return false;
        };
        let Ok(value) = serde_json::to_vec(switching) else {
            return false;
        };
        let key = format!("{}switching", prefix(&self.name));
        let put = client.put(key, value, Some(PutOptions::new().with_lease(lease)));
        matches!(tokio::time::timeout(self.ttl, put).await, Ok(Ok(_)))
    }

    /// Whether every other member said its sessions are held for the switchover of
    /// `epoch`.
    pub async fn all_parked(&self, epoch: i64) -> bool {
        let Some((mut client, _)) = self.connection() else {
            return false;
        };
        let prefix = prefix(&self.name);
        let names = |r: &etcd_client::GetResponse, under: &str| -> Vec<(String, Vec<u8>)> {
            r.kvs()
                .iter()
                .filter_map(|kv| {
                    let key = kv.key_str().ok()?;
                    let name = key.strip_prefix(&format!("{prefix}{under}"))?;
                    Some((name.to_string(), kv.value().to_vec()))
                })
                .collect()
        };
        let asked = async {
            let members = keys_under(&mut client, &format!("{prefix}members/")).await?;
            let parked = keys_under(&mut client, &format!("{prefix}parked/")).await?;
            Some((names(&members, "members/"), names(&parked, "parked/")))
        };
        let Ok(Some((members, parked))) = tokio::time::timeout(self.ttl, asked).await else {
            return false;
        };
        let mark = epoch.to_string().into_bytes();
        members
            .iter()
            .filter(|(m, _)| *m != self.member)
            .all(|(m, _)| parked.iter().any(|(p, v)| p == m && *v == mark))
    }

    /// This member's sessions are held for the switchover of `epoch` (`true`), or let go
    /// (`false`).
    pub async fn say_parked(&self, epoch: i64, parked: bool) {
        let Some((mut client, lease)) = self.connection() else {
            return;
        };
        let key = format!("{}parked/{}", prefix(&self.name), self.member);
        let said = async {
            match parked {
                true => client
                    .put(
                        key,
                        epoch.to_string(),
                        Some(PutOptions::new().with_lease(lease)),
                    )
                    .await
                    .map(|_| ()),
                false => client.delete(key, None).await.map(|_| ()),
            }
        };
        if !matches!(tokio::time::timeout(self.ttl, said).await, Ok(Ok(()))) {
            tracing::warn!(fleet = %self.name, member = %self.member, parked, "fleet: could not say whether this member's sessions are held");
        }
    }

    /// The member that leads the fleet now, as it registered itself; `None` when etcd
    /// does not say within half the lease's TTL, or no member leads.
    pub async fn leader(&self) -> Option<MemberInfo> {
        let (mut client, _) = self.connection()?;
        let prefix = prefix(&self.name);
        let wait = self.ttl / 2;
        let elected = tokio::time::timeout(wait, client.leader(format!("{prefix}leader")))
            .await
            .ok()?
            .ok()?;
        let member = elected.kv()?.value_str().ok()?.to_string();
        let got = tokio::time::timeout(wait, client.get(format!("{prefix}members/{member}"), None))
            .await
            .ok()?
            .ok()?;
        serde_json::from_slice(got.kvs().first()?.value()).ok()
    }

    /// Whether this member still leads, as etcd says now (its election key is there, of
    /// its revision): asked before a cluster decision, so that a leader that lost its
    /// lease without noticing yet (paused, cut off) makes none. False when etcd does not
    /// answer within a third of the lease's TTL.
    pub async fn confirm_leading(&self) -> bool {
        if !self.standing.borrow().leader {
            return false;
        }
        let Some(proof) = self.proof.lock().ok().and_then(|p| p.clone()) else {
            return false;
        };
        let mut client = proof.client.clone();
        let asked = tokio::time::timeout(self.ttl / 3, client.get(proof.key.clone(), None)).await;
        match asked {
            Ok(Ok(r)) => r
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == proof.epoch),
            _ => false,
        }
    }

    /// The fleet's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This member's name.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// This member's standing, as it changes.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.standing.subscribe()
    }
}

/// The key prefix of the fleet `name`.
fn prefix(name: &str) -> String {
    format!("/holdfast/{name}/")
}

/// Keeps the member in the fleet for as long as the process runs.
async fn run(
    cfg: ClusterConfig,
    me: MemberInfo,
    tx: Arc<watch::Sender<Leadership>>,
    proof: Arc<Mutex<Option<Proof>>>,
    client: Arc<Mutex<Option<(Client, i64)>>>,
    life: Arc<Life>,
) {
    let mut backoff = Duration::from_millis(250);
    loop {
        let started = Instant::now();
        let ended = serve(&cfg, &me, &tx, &proof, &client, &life).await;
        if let Ok(mut r) = life.renewed.lock() {
            *r = None;
        }
        if let Ok(mut p) = proof.lock() {
            *p = None;
        }
        if let Ok(mut c) = client.lock() {
            *c = None;
        }
        if tx.borrow().leader {
            tracing::warn!(fleet = %cfg.name, member = %me.member, "fleet: no longer the leader");
        }
        tx.send_replace(Leadership::default());
        match ended {
            Ok(()) => {}
            Err(e @ FleetError::Misfit { .. }) => {
                tracing::error!(fleet = %cfg.name, member = %me.member, error = %e, "fleet: not joining; trying again")
            }
            Err(e) => {
                tracing::warn!(fleet = %cfg.name, member = %me.member, error = %e, "fleet: out of touch with etcd; trying again")
            }
        }
        if started.elapsed() > cfg.lease_ttl() {
            backoff = Duration::from_millis(250);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(cfg.lease_ttl());
    }
}

/// One life of the member in etcd: a lease, the member key, the campaign, the lease kept
/// until it cannot be.
async fn serve(
    cfg: &ClusterConfig,
    me: &MemberInfo,
    tx: &watch::Sender<Leadership>,
    proof: &Mutex<Option<Proof>>,
    shared_client: &Mutex<Option<(Client, i64)>>,
    life: &Life,
) -> Result<(), FleetError> {
    let ttl = cfg.lease_ttl();
    // No timeout on every request: the campaign waits as long as another member leads
    // (a per-request timeout cancelled it after a TTL, and the member joined again and
    // again). Each request that must answer soon has its own; HTTP/2 pings find a dead
    // connection.
    let options = ConnectOptions::new()
        .with_connect_timeout(ttl)
        .with_keep_alive(ttl / 3, ttl / 3);
    let mut client = Client::connect(&cfg.etcd, Some(options)).await?;
    // Not registered while another member is configured for another cluster.
    soon(ttl, fits(&mut client, &cfg.name, me)).await??;
    let lease = soon(ttl, client.lease_grant(ttl.as_secs() as i64, None))
        .await??
        .id();
    let mut renewed = Instant::now();
    let note_renewed = |at: Instant| {
        if let Ok(mut r) = life.renewed.lock() {
            *r = Some(at);
        }
    };
    note_renewed(renewed);
    if let Ok(mut c) = shared_client.lock() {
        *c = Some((client.clone(), lease));
    }
    let (mut keeper, mut renewals) = soon(ttl, client.lease_keep_alive(lease)).await??;
    let prefix = prefix(&cfg.name);
    let member_key = format!("{prefix}members/{}", me.member);
    let mut said = me.clone();
    said.sessions = life.sessions.load(std::sync::atomic::Ordering::Relaxed);
    let info = serde_json::to_vec(&said).unwrap_or_default();
    soon(
        ttl,
        client.put(
            member_key.as_str(),
            info,
            Some(PutOptions::new().with_lease(lease)),
        ),
    )
    .await??;
    life.joined
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(fleet = %cfg.name, member = %me.member, lease, "fleet: joined; campaigning");
    let mut election = client.clone();
    let campaign = election.campaign(format!("{prefix}leader"), me.member.as_bytes(), lease);
    tokio::pin!(campaign);
    let mut campaigning = true;
    // Renewed three times per TTL; a leader stops leading after two thirds of it without
    // a renewal (the lease still holds at etcd then: no other member can lead yet).
    let every = ttl / 3;
    let demote_after = ttl * 2 / 3;
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            won = &mut campaign, if campaigning => {
                campaigning = false;
                let won = won?;
                let key = won.leader().ok_or(FleetError::NoLeader)?;
                if renewed.elapsed() >= demote_after {
                    return Err(FleetError::LeaseLost(demote_after));
                }
                tracing::info!(fleet = %cfg.name, member = %me.member, epoch = key.rev(), "fleet: elected leader");
                if let Ok(mut p) = proof.lock() {
                    *p = Some(Proof {
                        client: client.clone(),
                        key: key.key().to_vec(),
                        epoch: key.rev(),
                        leader_key: key.clone(),
                    });
                }
                life.elected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tx.send_replace(Leadership { leader: true, epoch: key.rev() });
            }
            _ = tick.tick() => {
                if renewed.elapsed() >= demote_after {
                    return Err(FleetError::LeaseLost(demote_after));
                }
                // A renewal answered within the tick counts; a lease etcd says is gone
                // (TTL 0) ends this life.
                let answer = async {
                    keeper.keep_alive().await?;
                    renewals.message().await
                };
                match tokio::time::timeout(every, answer).await {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => {
                        renewed = Instant::now();
                        note_renewed(renewed);
                    }
                    Ok(Ok(_)) => return Err(FleetError::LeaseLost(ttl)),
                    Ok(Err(e)) => return Err(e.into()),
                    Err(_) => {}
                }
                let sessions = life.sessions.load(std::sync::atomic::Ordering::Relaxed);
                if sessions != said.sessions {
                    said.sessions = sessions;
                    let info = serde_json::to_vec(&said).unwrap_or_default();
                    let put = client.put(
                        member_key.as_str(),
                        info,
                        Some(PutOptions::new().with_lease(lease)),
                    );
                    // (Tried again at the next tick when it does not answer in time.)
                    if !matches!(tokio::time::timeout(every, put).await, Ok(Ok(_))) {
                        said.sessions = u64::MAX;
                    }
                }
            }
        }
    }
}

/// `what`, if it answers within `ttl` (else: as if the lease were lost).
async fn soon<T>(
    ttl: Duration,
    what: impl std::future::Future<Output = T>,
) -> Result<T, FleetError> {
    tokio::time::timeout(ttl, what)
        .await
        .map_err(|_| FleetError::LeaseLost(ttl))
}

/// How often a member reads the fleet's members, leader and decisions.
const SEEN_EVERY: Duration = Duration::from_secs(1);

/// What a member mirrors of etcd: `switching`, `primary` and the board through an etcd
/// watch, `seen` by a read every [`SEEN_EVERY`].
struct Mirrors {
    switching: watch::Sender<Option<Switching>>,
    primary: watch::Sender<Option<PrimarySaid>>,
    board: watch::Sender<Board>,
    seen: Arc<Mutex<Seen>>,
}

/// Keeps the [`Mirrors`] as etcd says: a fresh read of the fleet's prefix, then a watch
/// from the revision after it, again whenever the watch breaks. What cannot be read
/// leaves them as they were.
async fn watch_switching(name: String, client: Arc<Mutex<Option<(Client, i64)>>>, m: Mirrors) {
    let prefix = prefix(&name);
    let board_dir = board::board_dir(&name);
    let switching_key = format!("{prefix}switching");
    let primary_key = format!("{prefix}primary");
    let mut refresh = tokio::time::interval(SEEN_EVERY);
    loop {
        let Some((mut c, _)) = client.lock().ok().and_then(|c| c.clone()) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // Where things stand, then every change after it.
        let read = async {
            let got = c
                .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
                .await
                .ok()?;
            let revision = got.header()?.revision();
            Some((revision, got))
        };
        let Ok(Some((revision, got))) = tokio::time::timeout(Duration::from_secs(1), read).await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        fn value<T: serde::de::DeserializeOwned>(
            got: &etcd_client::GetResponse,
            key: &str,
        ) -> Option<T> {
            got.kvs()
                .iter()
                .find(|kv| kv.key() == key.as_bytes())
                .and_then(|kv| serde_json::from_slice(kv.value()).ok())
        }
        set(&m.switching, value(&got, &switching_key));
        set(&m.primary, value(&got, &primary_key));
        board::mirror_all(&m.board, &board_dir, got.kvs());
        let options = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let Ok(Ok(mut stream)) = tokio::time::timeout(
            Duration::from_secs(1),
            c.watch(prefix.as_str(), Some(options)),
        )
        .await
        else {
            continue;
        };
        loop {
            tokio::select! {
                message = stream.message() => {
                    let Ok(Some(response)) = message else {
                        break;
                    };
                    if response.canceled() {
                        break;
                    }
                    for event in response.events() {
                        let Some(kv) = event.kv() else {
                            continue;
                        };
                        let put = event.event_type() == etcd_client::EventType::Put;
                        if kv.key() == switching_key.as_bytes() {
                            set(&m.switching, put.then(|| serde_json::from_slice(kv.value()).ok()).flatten());
                        } else if kv.key() == primary_key.as_bytes() {
                            set(&m.primary, put.then(|| serde_json::from_slice(kv.value()).ok()).flatten());
                        } else {
                            board::mirror_event(&m.board, &board_dir, event);
                        }
                    }
                }
                _ = refresh.tick() => {
                    if let Some(now) = read_seen(&mut c, &prefix).await {
                        if let Ok(mut s) = m.seen.lock() {
                            *s = now;
                        }
                    }
                    // The connection was replaced (a new life): watch through the new one.
                    let current = client.lock().ok().and_then(|c| c.clone()).map(|(_, lease)| lease);
                    if current.is_none() {
                        break;
                    }
                }
            }
        }
    }
}

/// Sets `tx` to `now` when it differs.
fn set<T: PartialEq>(tx: &watch::Sender<Option<T>>, now: Option<T>) {
    tx.send_if_modified(|was| {
        let changed = *was != now;
        if changed {
            *was = now;
        }
        changed
    });
}

/// The members registered and the leader's name, as etcd says now.
async fn read_seen(client: &mut Client, prefix: &str) -> Option<Seen> {
    let read = async {
        let members = keys_under(client, &format!("{prefix}members/")).await?;
        let leader = client
            .leader(format!("{prefix}leader"))
            .await
            .ok()
            .and_then(|r| r.kv().and_then(|kv| kv.value_str().ok()).map(String::from));
        let mut members: Vec<MemberInfo> = members
            .kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect();
        members.sort_by(|a: &MemberInfo, b| a.member.cmp(&b.member));
        // (Keys sort by time: a zero-padded timestamp first.)
        let mut decisions: Vec<(Vec<u8>, Decision)> =
            keys_under(client, &format!("{prefix}decisions/"))
                .await
                .map(|r| {
                    r.kvs()
                        .iter()
                        .filter_map(|kv| {
                            Some((kv.key().to_vec(), serde_json::from_slice(kv.value()).ok()?))
                        })
                        .collect()
                })
                .unwrap_or_default();
        decisions.sort_by(|a, b| a.0.cmp(&b.0));
        let decisions = decisions.into_iter().map(|(_, d)| d).collect();
        Some(Seen {
            members,
            leader,
            decisions,
        })
    };
    tokio::time::timeout(Duration::from_secs(1), read)
        .await
        .ok()
        .flatten()
}

/// Every key under `dir` (a prefix ending in `/`).
async fn keys_under(client: &mut Client, dir: &str) -> Option<etcd_client::GetResponse> {
    client
        .get(dir, Some(GetOptions::new().with_prefix()))
        .await
        .ok()
}
