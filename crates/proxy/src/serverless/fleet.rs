//! A serverless instance in front of which several holdfast processes run (a fleet,
//! `[cluster]`): the leader alone pauses, resumes, scales and meters it; every member's
//! clients keep it awake, and any member's client can wake it.
//!
//! Through the fleet's board ([`holdfast_fleet::Board`]):
//! - `instance` ([`InstanceSaid`], posted by the leader, fenced): the phase. Members follow
//!   it: their gates close when the leader pauses and open when it says the instance runs.
//! - `use/<member>` ([`MemberUse`], each member's own, under its lease, every second):
//!   how long its sessions have been idle, what of them could not survive a pause, whether
//!   a client of its waits for the instance, and its answer to a pause under way.
//!
//! A pause: the leader, idle itself and with every member idle as they said, closes its
//! gate, drains, and says `pausing` with the pause's number; each member closes its gate,
//! lets the requests in flight finish, and says it drained for that pause (or refuses: a
//! client arrived, a session became unmovable); only when every member drained does the
//! leader, still leading as etcd says, freeze or stop the server. Anything else, and it
//! says `running` again. A wake: a member's client finds the gate closed, the member says
//! it wants the instance, the leader resumes it once (however many members ask) and says
//! `running`.

use super::control::{drain, local_blockers, set_metrics_phase, Activity, PAUSE_DRAIN};
use super::{Lifecycle, PauseTier, Phase};
use crate::Shared;
use holdfast_fleet::{Fleet, Poster};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The board key of the instance's phase.
pub(super) const INSTANCE_KEY: &str = "instance";
/// The board directory of the members' [`MemberUse`].
const USE_DIR: &str = "use/";
/// How often a member says what its sessions do.
const SAY_EVERY: Duration = Duration::from_secs(1);
/// A member that said nothing for this long (its lease still holds) counts as busy.
const STALE: Duration = Duration::from_secs(5);
/// How long the leader waits for the members to drain, beyond its own drain.
const MEMBERS_DRAIN: Duration = Duration::from_secs(1);

/// The instance as the leader says it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceSaid {
    pub phase: Phase,
    pub tier: Option<PauseTier>,
    /// While pausing: the pause's number, which members say they drained for.
    pub pause: u64,
    /// The server's run, bumped when it stopped: backend connections opened before are
    /// gone.
    pub server_epoch: u64,
    /// The instance's size.
    #[serde(default)]
    pub ccu: f64,
    pub by: String,
}

/// A member's share of the instance, as it says it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberUse {
    /// How long its sessions have been idle (no statement, no login).
    pub idle_ms: u64,
    /// Its sessions that could not survive a freeze, and a stop.
    pub blocks_freeze: Vec<String>,
    pub blocks_stop: Vec<String>,
    /// A client of this member waits for the instance.
    pub wants_wake: bool,
    /// The pause this member drained for (its gate closed, nothing in flight).
    pub drained: Option<u64>,
    /// The pause this member refused, and why.
    pub refused: Option<(u64, String)>,
}

/// The leader says the instance's phase as it is now (`pause`: the number of the pause
/// under way, else 0). True without a fleet; false when etcd did not take it or this
/// member no longer leads.
pub(super) async fn say_phase(shared: &Shared, lc: &Lifecycle, pause: u64) -> bool {
    let Some(fleet) = &shared.fleet else {
        return true;
    };
    let (tier, ccu) = {
        let i = lc.lock();
        (i.tier, i.ccu)
    };
    let said = InstanceSaid {
        phase: lc.phase(),
        tier,
        pause,
        server_epoch: lc.epoch(),
        ccu,
        by: fleet.member().to_string(),
    };
    let ok = fleet.post(INSTANCE_KEY, &said, Poster::Leader).await;
    if !ok {
        tracing::warn!(
            phase = said.phase.name(),
            "serverless: could not tell the fleet the instance's phase"
        );
    }
    ok
}

/// What each other member said of its share, and how long ago (`None`: nothing yet).
fn members_use(fleet: &Fleet) -> Vec<(String, Option<(MemberUse, Duration)>)> {
    let board = fleet.board().borrow().clone();
    let mut names: BTreeSet<String> = fleet.seen().members.into_iter().map(|m| m.member).collect();
    names.extend(
        board
            .keys()
            .filter_map(|k| k.strip_prefix(USE_DIR))
            .map(String::from),
    );
    names.remove(fleet.member());
    names
        .into_iter()
        .map(|name| {
            let said = board
                .get(&format!("{USE_DIR}{name}"))
                .and_then(|p| Some((p.read::<MemberUse>()?, p.seen_at.elapsed())));
            (name, said)
        })
        .collect()
}

/// How long the least idle of the other members has been idle (one that said nothing
/// lately counts as busy); `None` without other members.
pub(super) fn members_idle(shared: &Shared) -> Option<Duration> {
    let fleet = shared.fleet.as_ref()?;
    members_use(fleet)
        .into_iter()
        .map(|(_, said)| match said {
            Some((u, age)) if age < STALE => Duration::from_millis(u.idle_ms) + age,
            _ => Duration::ZERO,
        })
        .min()
}

/// What keeps the instance from pausing to `tier` on the other members.
pub(super) fn members_blockers(shared: &Shared, tier: PauseTier) -> Vec<String> {
    let Some(fleet) = &shared.fleet else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, said) in members_use(fleet) {
        match said {
            None => out.push(format!("member {name} has not said what its sessions do")),
            Some((_, age)) if age >= STALE => out.push(format!(
                "member {name} has said nothing for {} s",
                age.as_secs()
            )),
            Some((u, _)) => {
                let blocks = match tier {
                    PauseTier::Freeze => u.blocks_freeze,
                    PauseTier::Stop => u.blocks_stop,
                };
                out.extend(blocks.into_iter().map(|b| format!("member {name}: {b}")));
            }
        }
    }
    out
}

/// Why the members did not let a pause go ahead.
pub(super) enum NotDrained {
    /// A member's session could not survive it (the member's answer).
    Blocked(String),
    /// Anything else: a client arrived, a member did not answer, the lead was lost.
    Abandoned(String),
}

/// The leader's share of a pause beyond its own sessions: it says `pausing` (pause
/// number `pause`) and waits until every other member drained for it; then asks etcd
/// once more whether it still leads. `Err`: why the pause must be abandoned.
pub(super) async fn members_drained(
    shared: &Shared,
    lc: &Lifecycle,
    pause: u64,
) -> Result<(), NotDrained> {
    use NotDrained::Abandoned;
    let Some(fleet) = &shared.fleet else {
        return Ok(());
    };
    if !say_phase(shared, lc, pause).await {
        return Err(Abandoned(
            "the fleet was not told (etcd did not answer, or this member no longer leads)".into(),
        ));
    }
    let deadline = Instant::now() + PAUSE_DRAIN + MEMBERS_DRAIN;
    let mut board = fleet.board();
    loop {
        if lc.wake_requested.load(Ordering::SeqCst) {
            return Err(Abandoned("a client arrived".into()));
        }
        let mut waiting = Vec::new();
        for (name, said) in members_use(fleet) {
            match said {
                Some((u, _)) if u.wants_wake => {
                    return Err(Abandoned(format!("a client of member {name} arrived")));
                }
                Some((u, _)) if u.drained == Some(pause) => {}
                Some((
                    MemberUse {
                        refused: Some((p, why)),
                        ..
                    },
                    _,
                )) if p == pause => {
                    return Err(NotDrained::Blocked(format!("member {name}: {why}")))
                }
                _ => waiting.push(name),
            }
        }
        if waiting.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(Abandoned(format!(
                "members still draining after {} ms: {}",
                (PAUSE_DRAIN + MEMBERS_DRAIN).as_millis(),
                waiting.join(", ")
            )));
        }
        tokio::select! {
            _ = board.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    if !fleet.confirm_leading().await {
        return Err(Abandoned("this member no longer leads the fleet".into()));
    }
    Ok(())
}

/// The leader hears the members' wakes: while one of them wants the instance and it is
/// paused (or pausing), the lifecycle is asked to resume it, once, as for a client of its
/// own. Runs for as long as the process.
pub(super) async fn hear_wakes(lc: std::sync::Arc<Lifecycle>, fleet: std::sync::Arc<Fleet>) {
    let mut board = fleet.board();
    let mut every = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            changed = board.changed() => if changed.is_err() { return },
            _ = every.tick() => {}
        }
        if !lc.is_in_charge() {
            lc.remote_waiters.store(0, Ordering::SeqCst);
            continue;
        }
        let wanting: Vec<String> = members_use(&fleet)
            .into_iter()
            .filter(|(_, said)| said.as_ref().is_some_and(|(u, _)| u.wants_wake))
            .map(|(name, _)| name)
            .collect();
        lc.remote_waiters.store(wanting.len(), Ordering::SeqCst);
        if !wanting.is_empty() && matches!(lc.phase(), Phase::Paused | Phase::Pausing) {
            if !lc.wake_requested.swap(true, Ordering::SeqCst) {
                tracing::info!(instance = %lc.config().instance, members = ?wanting, "wake requested by the fleet's members");
            }
            lc.wake_notify.notify_one();
        }
    }
}

/// A member that does not lead: its gate follows the phase the leader says, it says
/// every second what its sessions do, drains when the leader pauses, and says so when a
/// client of its wants the instance. Returns once this process is in charge.
pub(super) async fn follow(shared: &Shared, lc: &Lifecycle, fleet: &Fleet) {
    tracing::info!(instance = %lc.config().instance, "serverless: the fleet's leader runs the instance; this member follows it");
    let mut board = fleet.board();
    let mut in_charge = lc.in_charge.subscribe();
    let mut tick = tokio::time::interval(SAY_EVERY);
    let mut activity = Activity::default();
    let mut mine = MemberUse::default();
    let mut said_at: Option<(MemberUse, Instant)> = None;
    let mut applied: Option<InstanceSaid> = None;
    let key = format!("{USE_DIR}{}", fleet.member());
    // The sessions are looked at once a second (the board changes several times a
    // second: every member's use, the leader's meter).
    let mut ticked = true;
    loop {
        if lc.is_in_charge() {
            return;
        }
        let said = board
            .borrow_and_update()
            .get(INSTANCE_KEY)
            .and_then(|p| p.read::<InstanceSaid>());
        if let Some(said) = said {
            if applied.as_ref() != Some(&said) {
                follow_phase(shared, lc, &said, applied.as_ref(), &mut mine, fleet, &key).await;
                applied = Some(said);
            }
        }
        if lc.is_running() {
            lc.wake_requested.store(false, Ordering::SeqCst);
            mine.wants_wake = false;
        } else {
            mine.wants_wake = lc.wake_requested.load(Ordering::SeqCst);
        }
        if ticked {
            if activity.changed(shared) {
                lc.touch();
            }
            mine.idle_ms = lc.lock().last_activity.elapsed().as_millis() as u64;
            mine.blocks_freeze = local_blockers(shared, PauseTier::Freeze);
            mine.blocks_stop = local_blockers(shared, PauseTier::Stop);
        }
        // Said when something other than the idle clock changed, else every second.
        let due = said_at.as_ref().is_none_or(|(was, at)| {
            at.elapsed() >= SAY_EVERY
                || MemberUse {
                    idle_ms: mine.idle_ms,
                    ..was.clone()
                } != mine
        });
        if due && fleet.post(&key, &mine, Poster::Member).await {
            said_at = Some((mine.clone(), Instant::now()));
        }
        ticked = tokio::select! {
            _ = board.changed() => false,
            _ = tick.tick() => true,
            _ = lc.wake_notify.notified() => false,
            _ = in_charge.changed() => false,
        };
    }
}

/// Applies the leader's `said` (after `before`) to this member's gate.
async fn follow_phase(
    shared: &Shared,
    lc: &Lifecycle,
    said: &InstanceSaid,
    before: Option<&InstanceSaid>,
    mine: &mut MemberUse,
    fleet: &Fleet,
    key: &str,
) {
    if before.is_some_and(|b| b.server_epoch != said.server_epoch) {
        // The server stopped since: this member's backend connections are gone too.
        lc.epoch.fetch_add(1, Ordering::SeqCst);
    }
    lc.lock().ccu = said.ccu;
    shared.metrics.instance_ccu.set(said.ccu);
    match said.phase {
        Phase::Running => {
            mine.drained = None;
            mine.refused = None;
            lc.lock().pause_blocked_by.clear();
            if !lc.is_running() {
                lc.touch();
                lc.running.store(true, Ordering::SeqCst);
            }
            lc.set_phase(Phase::Running, None);
        }
        Phase::Resuming | Phase::Paused => {
            lc.running.store(false, Ordering::SeqCst);
            lc.set_phase(said.phase, said.tier);
        }
        Phase::Pausing => {
            lc.running.store(false, Ordering::SeqCst);
            lc.set_phase(Phase::Pausing, said.tier);
            let tier = said.tier.unwrap_or(PauseTier::Stop);
            let why_not = match drain(shared, lc).await {
                Some(why) => Some(why.to_string()),
                None => {
                    let blocked = local_blockers(shared, tier);
                    (!blocked.is_empty()).then(|| blocked.join("; "))
                }
            };
            match why_not {
                None => mine.drained = Some(said.pause),
                Some(why) => {
                    tracing::info!(instance = %lc.config().instance, %why, "serverless: this member refuses the leader's pause");
                    mine.refused = Some((said.pause, why));
                }
            }
            mine.wants_wake = lc.wake_requested.load(Ordering::SeqCst);
            // At once: the leader waits for it.
            fleet.post(key, &*mine, Poster::Member).await;
        }
    }
    set_metrics_phase(shared, said.phase);
}
