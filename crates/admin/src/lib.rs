//! The HTTP admin API: `GET /health` (`{"status":"ok"}`, open), `GET /status` (JSON),
//! `GET /metrics` (Prometheus text), the HA operations `POST /switchover`, `POST /failover`,
//! `POST /rejoin` (JSON reports), planned restarts (`POST /restart`, `POST /resize`), nodes
//! (`POST /nodes/add`, `/nodes/remove`), the configuration file read again (`POST /reload`:
//! 200 with what applied and what waits for a restart, 400 with the file's error), the
//! serverless operations ([`serverless`]), and ([`client`]) the small HTTP client of
//! `holdfast ctl`, `holdfast-bench` and the tests.
//!
//! Every request but `GET /health` needs `Authorization: Bearer <token>` (401 otherwise);
//! requests a web page could send are refused (403: another `Origin` or `Host`; 415: a body
//! that is not JSON); see the guard module for these checks and the server's limits.
//!
//! HA answers: 200 with the operation's report; 409 when another operation is running;
//! 400 when the request cannot apply (unknown node, external mode, the primary is alive…);
//! 500 when the operation failed on the servers. Errors are `{"error": "..."}`.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use holdfast_cluster::ha::controller::HaState;
use holdfast_cluster::ha::HaError;
use holdfast_cluster::topology::Topology;
use holdfast_config::AdminToken;
use holdfast_proxy::registry::SessionView;
use holdfast_proxy::Shared;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::net::TcpListener;

pub mod client;
pub mod dashboard;
mod fleet;
mod guard;
pub mod serverless;

pub use client::AdminClient;
pub use guard::{BODY_TIMEOUT, HEADER_TIMEOUT, MAX_BODY, MAX_CONNECTIONS};
pub use serverless::{parse_since, render_instance};

#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub uptime_secs: u64,
    /// This process, and its generation: 1 when started by hand, one more at each upgrade
    /// (`holdfast ctl upgrade`).
    #[serde(default)]
    pub pid: u32,
    #[serde(default)]
    pub generation: u64,
    /// The process that took over from this one (an upgrade), while this one drains its
    /// sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handed_over_to: Option<u32>,
    pub listen: String,
    pub topology: TopologyView,
    pub verifiers_loaded: bool,
    pub verifier_accounts: usize,
    /// `[ha] commit_markers`: `off`, `waiting` (the marker table is not there yet) or
    /// `ready`.
    #[serde(default)]
    pub commit_markers: String,
    pub counters: Counters,
    /// HA mode, the running operation, the last result and counters.
    pub ha: HaState,
    pub sessions: Vec<SessionViewOwned>,
    /// The serverless instance (`[serverless]`), if any.
    #[serde(default)]
    pub serverless: Option<serde_json::Value>,
    /// What the start-up check (`holdfast check`) found; none until it has run.
    #[serde(default)]
    pub preflight: Option<holdfast_cluster::preflight::Report>,
    /// The configuration file in force (`POST /reload` reads it again).
    #[serde(default)]
    pub config: ConfigView,
    /// This process as a member of a fleet (`[cluster]`), if it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetView>,
    /// Pass-through listeners' relay in the kernel (`[proxy] kernel_relay`), when the
    /// configuration has a pass-through listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_relay: Option<KernelRelayView>,
    /// The last HA and serverless events, oldest first.
    #[serde(default)]
    pub events: Vec<holdfast_proxy::events::Event>,
}

/// Whether pass-through sessions are relayed in the kernel, and how many are now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelRelayView {
    pub on: bool,
    /// Why not, when it is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    pub sessions: u64,
}

/// A member's standing in its fleet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetView {
    /// The fleet's name (`[cluster] name`).
    pub name: String,
    /// This member's name.
    pub member: String,
    /// This member leads the fleet: it runs HA.
    pub leader: bool,
    /// The leader's election revision, while this member leads.
    pub epoch: i64,
    /// The leader's name, as etcd said last.
    #[serde(default)]
    pub leader_member: Option<String>,
    /// Every member registered, as etcd said last: name, client and admin addresses,
    /// version, pid.
    #[serde(default)]
    pub members: Vec<serde_json::Value>,
    /// How long ago etcd last renewed this member's lease, in milliseconds (none: it holds
    /// no lease now: etcd cannot be reached).
    #[serde(default)]
    pub lease_renewed_ms_ago: Option<u64>,
    /// How many times etcd elected this member since it started.
    #[serde(default)]
    pub times_elected: u64,
    /// How many times this member joined the fleet since it started (more than once:
    /// it lost touch with etcd in between).
    #[serde(default)]
    pub times_joined: u64,
    /// The fleet's last cluster decisions, oldest first, as etcd said last: when
    /// (`at_unix_ms`), by which member (`by`) under which `epoch`, `what`, `ok`.
    #[serde(default)]
    pub decisions: Vec<serde_json::Value>,
}

/// The configuration file in force: which, its SHA-256 (what `sha256sum` prints), when it
/// was loaded, what of it waits for a restart; and the log filter in force.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ConfigView {
    /// None when holdfast was started without a file (an embedder, a test).
    pub path: Option<String>,
    pub hash: Option<String>,
    /// RFC 3339, UTC.
    pub loaded_at: Option<String>,
    pub loaded_unix_ms: Option<u64>,
    /// Keys of the file whose new values wait for a restart (the running ones are in
    /// force).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs_restart: Vec<holdfast_config::reload::Change>,
    /// The log filter in force (`[log] level`, or `RUST_LOG` at start).
    pub log_level: Option<String>,
}

fn config_view(shared: &Shared) -> ConfigView {
    let source = shared.reloader.source();
    ConfigView {
        path: source.as_ref().map(|s| s.path.display().to_string()),
        hash: source.as_ref().map(|s| s.hash.clone()),
        loaded_at: source.as_ref().map(|s| s.loaded_at.clone()),
        loaded_unix_ms: source.as_ref().map(|s| s.loaded_unix_ms),
        needs_restart: source
            .as_ref()
            .map(|s| s.needs_restart.clone())
            .unwrap_or_default(),
        log_level: shared.log_level.get().map(|l| l.current()),
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TopologyView {
    pub primary: Option<String>,
    /// No node is writable and the primary was made read-only by an operator: sessions
    /// stay on it and writes get the server's error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only_primary: bool,
    pub nodes: Vec<NodeView>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct NodeView {
    pub name: String,
    pub address: String,
    pub reachable: bool,
    pub read_only: Option<bool>,
    pub version: String,
    pub last_error: Option<String>,
    /// It takes reads of split sessions now.
    #[serde(default)]
    pub serves_reads: bool,
    /// Being removed (`ctl node remove`).
    #[serde(default)]
    pub draining: bool,
    /// A failover moved away from it and it was not rejoined: never the primary, fenced
    /// if it comes back writable.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deposed: bool,
    /// Requests of split sessions running on it now.
    #[serde(default)]
    pub active_requests: u32,
    /// Reads split sessions sent it.
    #[serde(default)]
    pub reads: u64,
    /// Its replication (a replica): threads running, lag, source.
    #[serde(default)]
    pub replication: Option<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Counters {
    pub sessions_open: usize,
    pub connections_accepted: u64,
    pub logins_failed: u64,
    pub commands: u64,
    pub backend_connects: u64,
    pub backend_connect_failures: u64,
    /// Keep-alive: sessions moved to another backend with their state.
    #[serde(default)]
    pub sessions_moved: u64,
    /// Requests that waited for a backend while it was switching.
    #[serde(default)]
    pub requests_held: u64,
    /// In-flight requests re-run on a new backend.
    #[serde(default)]
    pub requests_retried: u64,
    /// In-flight requests answered with an error because their backend was lost.
    #[serde(default)]
    pub requests_failed_on_backend_loss: u64,
    /// Mean time to move a session, in milliseconds (by reason and histogram: /metrics).
    #[serde(default)]
    pub mean_move_ms: f64,
}

/// The sessions as `/status` lists them and `ctl` reads them back.
pub type SessionViewOwned = SessionView;

fn topology_view(t: &Topology) -> TopologyView {
    TopologyView {
        primary: t
            .primary
            .and_then(|i| t.nodes.get(i))
            .map(|n| n.name.to_string()),
        read_only_primary: t.read_only_primary,
        nodes: t
            .nodes
            .iter()
            .map(|n| NodeView {
                name: n.name.to_string(),
                address: n.address.to_string(),
                reachable: n.reachable,
                read_only: n.read_only,
                version: n.version.clone(),
                last_error: n.last_error.clone(),
                serves_reads: n.serves_reads,
                draining: n.draining,
                deposed: n.deposed,
                active_requests: n.load.0.active(),
                reads: n.load.0.reads.load(std::sync::atomic::Ordering::Relaxed),
                replication: n
                    .replication
                    .as_ref()
                    .and_then(|r| serde_json::to_value(r).ok()),
            })
            .collect(),
    }
}

pub fn status(shared: &Shared) -> Status {
    status_of(shared, None, usize::MAX)
}

/// [`status`] with the first `max` sessions (by id) that `find` (lowercase) matches:
/// only those sessions' views are built; `counters.sessions_open` counts them all.
fn status_of(shared: &Shared, find: Option<&str>, max: usize) -> Status {
    let m = &shared.metrics;
    let topo = shared.topology.borrow().clone();
    let (sessions_open, sessions) = shared.sessions.select(find, max);
    let config = shared.config();
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        uptime_secs: shared.started.elapsed().as_secs(),
        pid: std::process::id(),
        generation: shared.upgrader.generation(),
        handed_over_to: *shared.upgrader.handed_over().borrow(),
        fleet: fleet_view(shared),
        kernel_relay: config.has_passthrough_listener().then(|| KernelRelayView {
            on: shared.kernel_relays.own().is_some(),
            why_not: shared.kernel_relays.why_not().map(String::from),
            sessions: m.sessions_kernel_relayed.get().max(0) as u64,
        }),
        listen: config.proxy.listen.clone(),
        topology: topology_view(&topo),
        verifiers_loaded: shared.verifiers.is_loaded(),
        verifier_accounts: shared.verifiers.account_count(),
        commit_markers: match (
            config.ha.commit_markers,
            shared
                .commit_markers_ready
                .load(std::sync::atomic::Ordering::Acquire),
        ) {
            (false, _) => "off",
            (true, false) => "waiting",
            (true, true) => "ready",
        }
        .into(),
        counters: Counters {
            sessions_open,
            connections_accepted: m.connections_accepted.get(),
            logins_failed: m.logins_failed.get(),
            commands: m.requests.latency_count(),
            backend_connects: m.backend_connects.get(),
            backend_connect_failures: m.backend_connect_failures.get(),
            sessions_moved: m.sessions_moved.get(),
            requests_held: m.requests_held.get(),
            requests_retried: m.requests_retried.get(),
            requests_failed_on_backend_loss: m.requests_failed_on_backend_loss.get(),
            mean_move_ms: m.move_latency.mean().as_secs_f64() * 1000.0,
        },
        ha: shared.ha.state(),
        sessions,
        serverless: shared
            .serverless
            .as_ref()
            .and_then(|l| serde_json::to_value(l.view()).ok()),
        preflight: shared.preflight.load_full().map(|r| (*r).clone()),
        config: config_view(shared),
        events: shared.events.recent(),
    }
}

/// `GET /health`: the API answers. Needs no token and tells nothing else.
async fn get_health() -> Response {
    (StatusCode::OK, Json(serde_json::json!({"status": "ok"}))).into_response()
}

/// `GET /status?sessions_max=N&find=TEXT`: the sessions whose id, user, client address,
/// node, blocker or long-running statement holds TEXT (any case), the first N of them by
/// id (the dashboard asks for a page's worth; `counters.sessions_open` still counts them
/// all).
#[derive(Debug, Default, Deserialize)]
struct StatusQuery {
    sessions_max: Option<usize>,
    find: Option<String>,
}

async fn get_status(
    State(shared): State<Arc<Shared>>,
    axum::extract::Query(q): axum::extract::Query<StatusQuery>,
) -> Json<Status> {
    let find = q
        .find
        .map(|f| f.trim().to_lowercase())
        .filter(|f| !f.is_empty());
    Json(status_of(
        &shared,
        find.as_deref(),
        q.sessions_max.unwrap_or(usize::MAX),
    ))
}

async fn get_metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let mut text = shared.metrics.render();
    let mut nodes = node_metrics(&shared.topology.borrow());
    nodes.push_str(&ha_metrics(&shared.ha.state()));
    nodes.push_str(&heap_metrics());
    if let Some(f) = fleet_view(&shared) {
        nodes.push_str(&fleet_metrics(&f));
    }
    match text.rfind("# EOF") {
        Some(at) => text.insert_str(at, &nodes),
        None => text.push_str(&nodes),
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
}

/// The allocator's figures (glibc), which tell memory in use from memory RSS counts but
/// the heap holds free.
fn heap_metrics() -> String {
    let Some(h) = holdfast_proxy::memory::heap_use() else {
        return String::new();
    };
    format!(
        "# HELP holdfast_heap_in_use_bytes Bytes in live allocations (glibc's mallinfo2, all arenas)\n\
         # TYPE holdfast_heap_in_use_bytes gauge\n\
         holdfast_heap_in_use_bytes {}\n\
         # HELP holdfast_heap_free_bytes Bytes the allocator holds in free chunks (part of them resident)\n\
         # TYPE holdfast_heap_free_bytes gauge\n\
         holdfast_heap_free_bytes {}\n",
        h.in_use, h.free
    )
}

/// The HA figures an alert needs (from the controller's state at each scrape).
fn ha_metrics(h: &HaState) -> String {
    let c = &h.counters;
    let semi_sync = h.semi_sync.as_ref().map_or(String::new(), |s| {
        format!(
            "# HELP holdfast_semi_sync_active 1 while the primary waits for a replica's acknowledgement of each commit (semi-sync), 0 after a fallback to asynchronous replication\n\
             # TYPE holdfast_semi_sync_active gauge\n\
             holdfast_semi_sync_active {}\n\
             # HELP holdfast_semi_sync_fallbacks Times holdfast saw the primary fall back to asynchronous replication\n\
             # TYPE holdfast_semi_sync_fallbacks counter\n\
             holdfast_semi_sync_fallbacks_total {}\n",
            u8::from(s.active),
            s.fallbacks
        )
    });
    let operations = format!(
        "# HELP holdfast_ha_operations HA operations that completed, by kind (switchover, failover, rejoin)\n\
         # TYPE holdfast_ha_operations counter\n\
         holdfast_ha_operations_total{{operation=\"switchover\"}} {}\n\
         holdfast_ha_operations_total{{operation=\"failover\"}} {}\n\
         holdfast_ha_operations_total{{operation=\"rejoin\"}} {}\n\
         # HELP holdfast_automatic_failovers Failovers the failure detector started (a subset of the failovers)\n\
         # TYPE holdfast_automatic_failovers counter\n\
         holdfast_automatic_failovers_total {}\n\
         # HELP holdfast_ha_operations_failed HA operations that failed (refusals not counted)\n\
         # TYPE holdfast_ha_operations_failed counter\n\
         holdfast_ha_operations_failed_total {}\n\
         # HELP holdfast_ha_operation_running 1 while an HA operation runs\n\
         # TYPE holdfast_ha_operation_running gauge\n\
         holdfast_ha_operation_running {}\n\
         # HELP holdfast_primary_failed_probes Failed probes in a row of the primary the failure detector watches\n\
         # TYPE holdfast_primary_failed_probes gauge\n\
         holdfast_primary_failed_probes {}\n",
        c.switchovers,
        c.failovers,
        c.rejoins,
        c.automatic_failovers,
        c.failed_operations,
        u8::from(h.in_progress.is_some()),
        h.failed_probes
    );
    operations + &semi_sync + &format!(
        "# HELP holdfast_failovers_withheld Failovers not done because no replica had applied everything the replicas received (acknowledged writes would be lost)\n\
         # TYPE holdfast_failovers_withheld counter\n\
         holdfast_failovers_withheld_total {}\n\
         # HELP holdfast_failover_withheld 1 while a lost primary is not failed over for that reason (an operator must act)\n\
         # TYPE holdfast_failover_withheld gauge\n\
         holdfast_failover_withheld {}\n",
        h.counters.failovers_withheld,
        u8::from(h.failover_withheld.is_some())
    )
}

/// This member's standing in its fleet, as `/status` and `/metrics` show it.
fn fleet_view(shared: &Shared) -> Option<FleetView> {
    let f = shared.fleet.as_ref()?;
    let standing = *f.leadership().borrow();
    let seen = f.seen();
    Some(FleetView {
        name: f.name().to_string(),
        member: f.member().to_string(),
        leader: standing.leader,
        epoch: standing.epoch,
        leader_member: seen.leader,
        members: seen
            .members
            .iter()
            .filter_map(|m| serde_json::to_value(m).ok())
            .collect(),
        lease_renewed_ms_ago: f.lease_renewed_ago().map(|d| d.as_millis() as u64),
        times_elected: f.times_elected(),
        times_joined: f.times_joined(),
        decisions: seen
            .decisions
            .iter()
            .filter_map(|d| serde_json::to_value(d).ok())
            .collect(),
    })
}

/// This member's standing in its fleet (from what `/status` shows, at each scrape).
fn fleet_metrics(f: &FleetView) -> String {
    let renewed = f
        .lease_renewed_ms_ago
        .map_or(String::new(), |ms| {
            format!(
                "# HELP holdfast_fleet_lease_renewed_seconds_ago How long ago etcd last renewed this member's lease (absent: it holds none)\n\
                 # TYPE holdfast_fleet_lease_renewed_seconds_ago gauge\n\
                 holdfast_fleet_lease_renewed_seconds_ago {}\n",
                ms as f64 / 1000.0
            )
        });
    format!(
        "# HELP holdfast_fleet_leader 1 while this member leads its fleet (it runs HA)\n\
         # TYPE holdfast_fleet_leader gauge\n\
         holdfast_fleet_leader {}\n\
         # HELP holdfast_fleet_epoch The election revision of this member's lead (0 when it does not lead)\n\
         # TYPE holdfast_fleet_epoch gauge\n\
         holdfast_fleet_epoch {}\n\
         # HELP holdfast_fleet_members Members registered in the fleet, as etcd said last\n\
         # TYPE holdfast_fleet_members gauge\n\
         holdfast_fleet_members {}\n\
         # HELP holdfast_fleet_elections Times etcd elected this member\n\
         # TYPE holdfast_fleet_elections counter\n\
         holdfast_fleet_elections_total {}\n\
         # HELP holdfast_fleet_joins Times this member joined its fleet (again after each loss of touch with etcd)\n\
         # TYPE holdfast_fleet_joins counter\n\
         holdfast_fleet_joins_total {}\n{renewed}",
        u8::from(f.leader),
        f.epoch,
        f.members.len(),
        f.times_elected,
        f.times_joined
    )
}

/// Per-node figures of the current topology (the node set changes at run time, so they
/// are written from it at each scrape rather than registered).
fn node_metrics(t: &Topology) -> String {
    use std::fmt::Write as _;
    let label = |name: &str| name.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = String::new();
    let _ = write!(
        out,
        "# HELP holdfast_primary_known 1 while holdfast knows a writable primary (0: writes wait or fail)\n\
         # TYPE holdfast_primary_known gauge\n\
         holdfast_primary_known {}\n",
        u8::from(t.primary.is_some())
    );
    let primary = t.primary;
    let mut family =
        |name: &str,
         kind: &str,
         help: &str,
         value: &dyn Fn(&holdfast_cluster::topology::NodeState) -> Option<f64>| {
            let _ = writeln!(out, "# HELP holdfast_{name} {help}");
            let _ = writeln!(out, "# TYPE holdfast_{name} {kind}");
            let suffix = if kind == "counter" { "_total" } else { "" };
            for n in &t.nodes {
                if let Some(v) = value(n) {
                    let _ = writeln!(
                        out,
                        "holdfast_{name}{suffix}{{node=\"{}\"}} {v}",
                        label(&n.name)
                    );
                }
            }
        };
    family(
        "node_primary",
        "gauge",
        "1 for the node holdfast sends writes to",
        &|n| {
            let is = primary.and_then(|i| t.nodes.get(i)).map(|p| &p.name) == Some(&n.name);
            Some(f64::from(u8::from(is)))
        },
    );
    family(
        "node_reachable",
        "gauge",
        "1 while the monitor reaches the node",
        &|n| Some(f64::from(u8::from(n.reachable))),
    );
    family(
        "node_active_requests",
        "gauge",
        "Requests of split sessions running on each node now",
        &|n| Some(f64::from(n.load.0.active())),
    );
    family(
        "node_reads",
        "counter",
        "Reads split sessions sent to each node",
        &|n| Some(n.load.0.reads.load(std::sync::atomic::Ordering::Relaxed) as f64),
    );
    family(
        "node_serves_reads",
        "gauge",
        "1 when the node takes reads of split sessions",
        &|n| Some(f64::from(u8::from(n.serves_reads))),
    );
    family(
        "node_draining",
        "gauge",
        "1 while the node is being removed",
        &|n| Some(f64::from(u8::from(n.draining))),
    );
    family(
        "node_replica_lag_seconds",
        "gauge",
        "Seconds_Behind_Master of each replica, when known",
        &|n| n.replication.as_ref()?.lag_ms.map(|ms| ms as f64 / 1000.0),
    );
    out
}

/// An error answer: `{"error": "..."}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

fn ha_answer<T: Serialize>(result: Result<T, HaError>) -> Response {
    match result {
        Ok(report) => (StatusCode::OK, Json(report)).into_response(),
        Err(e) => {
            let code = match &e {
                HaError::Busy(_) => StatusCode::CONFLICT,
                // Nothing was changed; the operator may force it.
                e if e.is_withheld() => StatusCode::SERVICE_UNAVAILABLE,
                e if e.is_refusal() => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error_answer(code, e)
        }
    }
}

/// `{"error": "..."}` with `status`.
pub(crate) fn error_answer(status: StatusCode, error: impl std::fmt::Display) -> Response {
    let error = error.to_string();
    (status, Json(ErrorBody { error })).into_response()
}

pub(crate) fn bad_request(msg: String) -> Response {
    error_answer(StatusCode::BAD_REQUEST, msg)
}

/// `?to=node2` or `{"to": "node2"}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchoverRequest {
    pub to: Option<String>,
}

/// `?node=node1` or `{"node": "node1"}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejoinRequest {
    pub node: Option<String>,
}

/// Parses an optional JSON body (empty means "no parameters").
fn json_body<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))
}

async fn post_switchover(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<SwitchoverRequest>,
    body: Bytes,
) -> Response {
    let body: SwitchoverRequest = match json_body(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(e),
    };
    let to = query.to.or(body.to).filter(|t| !t.is_empty());
    ha_answer(shared.switchover(to).await)
}

/// `?force=true` (or `{"force": true}`): promote even when that loses transactions a
/// replica received; the report names them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FailoverRequest {
    force: Option<bool>,
}

async fn post_failover(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<FailoverRequest>,
    body: Bytes,
) -> Response {
    let body: FailoverRequest = match json_body(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(e),
    };
    let force = query.force.or(body.force).unwrap_or(false);
    ha_answer(shared.ha.failover(force).await)
}

async fn post_rejoin(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<RejoinRequest>,
    body: Bytes,
) -> Response {
    let body: RejoinRequest = match json_body(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(e),
    };
    match query.node.or(body.node).filter(|n| !n.is_empty()) {
        Some(node) => match shared.ha.rejoin(node.clone()).await {
            // The node is down: say what to do, not only what failed.
            Err(e @ HaError::Unreachable { .. }) => error_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{e}; start {node}'s server first (a lab's stopped nodes: `holdfast lab up \
                     --dir DIR`), then rejoin it: rejoin reads its position and points its \
                     replication at the primary"
                ),
            ),
            other => ha_answer(other),
        },
        None => bad_request("which node? POST /rejoin?node=NAME".into()),
    }
}

/// `?name=node4&address=127.0.0.1:3310[&proxy_protocol=true]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeAddRequest {
    name: Option<String>,
    address: Option<String>,
    proxy_protocol: Option<bool>,
}

/// `POST /nodes/add`: a replica of the primary joins; it takes reads once healthy.
async fn post_node_add(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<NodeAddRequest>,
) -> Response {
    let (Some(name), Some(address)) = (q.name, q.address) else {
        return bad_request("which node? POST /nodes/add?name=NAME&address=HOST:PORT".into());
    };
    membership_answer(
        shared
            .membership
            .add_node(&name, &address, q.proxy_protocol)
            .await,
    )
}

/// `?name=node3[&drain_ms=60000]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeRemoveRequest {
    name: Option<String>,
    drain_ms: Option<u64>,
}

/// `POST /nodes/remove`: the node takes no new work, what runs there gets the drain
/// window, then holdfast lets it go.
async fn post_node_remove(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<NodeRemoveRequest>,
) -> Response {
    let Some(name) = q.name else {
        return bad_request("which node? POST /nodes/remove?name=NAME[&drain_ms=N]".into());
    };
    let drain = q
        .drain_ms
        .map(std::time::Duration::from_millis)
        .unwrap_or_else(|| shared.config().split.drain());
    membership_answer(shared.membership.remove_node(&name, drain).await)
}

/// `?id=1073741825[&query=true]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionKillRequest {
    id: Option<u32>,
    query: Option<bool>,
}

/// What `POST /sessions/kill` did.
#[derive(Debug, Serialize, Deserialize)]
pub struct SessionKilled {
    pub session: u32,
    pub node: String,
    pub thread: u32,
    /// Only the statement it ran was stopped.
    pub query: bool,
}

/// `POST /sessions/kill?id=N[&query=true]`: ends a session as the server's `KILL` of its
/// connection would (its backend connection is killed, and the session closes with it
/// instead of moving or logging in again), or with `query=true` stops the statement it
/// runs (its client gets the server's 1317; a split session's read on a replica is stopped
/// there). The `KILL` runs as the monitor account, which needs CONNECTION ADMIN.
async fn post_session_kill(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<SessionKillRequest>,
) -> Response {
    let Some(id) = q.id else {
        return bad_request("which session? POST /sessions/kill?id=N[&query=true]".into());
    };
    let Some(info) = shared.sessions.get(id) else {
        return error_answer(StatusCode::NOT_FOUND, format!("no session {id} is open"));
    };
    let thread = info
        .backend_thread
        .load(std::sync::atomic::Ordering::Acquire);
    let node = info.backend.lock().map(|b| b.clone()).unwrap_or_default();
    if thread == 0 || node.is_empty() {
        return error_answer(
            StatusCode::CONFLICT,
            format!("session {id} has no backend connection now (it is moving or logging in); try again"),
        );
    }
    let query = q.query.unwrap_or(false);
    // A split session's read running on a replica: `query` stops it there; a whole kill
    // ends the backend connection, then stops the read too (the session finds its
    // connection gone at its next request).
    let replica_read = info.replica_read.load_full();
    let (node, thread) = match (&replica_read, query) {
        (Some(read), true) => (read.node.clone(), read.thread),
        _ => (node, thread),
    };
    // Marked first: the session sees its connection go and must know it was on purpose.
    if !query {
        info.kill_requested
            .store(thread, std::sync::atomic::Ordering::Release);
    }
    let killed = shared.membership.kill_thread(&node, thread, query).await;
    if let (Ok(()), false, Some(read)) = (&killed, query, &replica_read) {
        if let Err(why) = shared
            .membership
            .kill_thread(&read.node, read.thread, true)
            .await
        {
            tracing::warn!(session = id, node = %read.node, thread = read.thread, error = %why, "stopping a session's read on a replica failed");
        }
    }
    match killed {
        Ok(()) => {
            tracing::info!(session = id, node = %node, thread, query, "session killed through the admin API");
            let killed = SessionKilled {
                session: id,
                node: node.to_string(),
                thread,
                query,
            };
            (StatusCode::OK, Json(killed)).into_response()
        }
        Err(why) => {
            if !query {
                let _ = info.kill_requested.compare_exchange(
                    thread,
                    0,
                    std::sync::atomic::Ordering::AcqRel,
                    std::sync::atomic::Ordering::Acquire,
                );
            }
            tracing::warn!(session = id, node = %node, thread, error = %why, "a kill through the admin API failed");
            error_answer(StatusCode::CONFLICT, why)
        }
    }
}

/// `POST /reload`: the configuration file read again and put in force (see
/// `holdfast_proxy::reload`): 200 with what was applied, what waits for a restart and what
/// happened to the `[[backend]]` list; 400 with the error (file, line, key) when the file
/// is refused, in which case nothing changed.
async fn post_reload(State(shared): State<Arc<Shared>>) -> Response {
    match shared.reload().await {
        Ok(report) => (StatusCode::OK, Json(report)).into_response(),
        Err(e) => error_answer(StatusCode::BAD_REQUEST, e),
    }
}

/// `POST /upgrade`: the binary at this process's own path started and handed the
/// listeners (see `holdfast_proxy::upgrade`): 200 with the new process's pid, version and
/// generation; 409 when one is running or this process already handed over; 500 when the
/// new process could not take over (this one keeps serving).
async fn post_upgrade(State(shared): State<Arc<Shared>>) -> Response {
    use holdfast_proxy::upgrade::UpgradeError;
    match shared.upgrader.upgrade(&shared).await {
        Ok(report) => (StatusCode::OK, Json(report)).into_response(),
        Err(e @ (UpgradeError::AlreadyRunning | UpgradeError::HandedOver(_))) => {
            error_answer(StatusCode::CONFLICT, e)
        }
        Err(e) => error_answer(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

fn membership_answer<T: Serialize>(
    result: Result<T, holdfast_cluster::membership::MembershipError>,
) -> Response {
    match result {
        Ok(report) => (StatusCode::OK, Json(report)).into_response(),
        Err(e) if e.is_bad_request() => error_answer(StatusCode::BAD_REQUEST, e),
        Err(e) => error_answer(StatusCode::CONFLICT, e),
    }
}

/// `?node=node1&binary=/path/to/mariadbd&set=innodb_buffer_pool_size=256M,max_connections=500`.
#[derive(Debug, Default, Deserialize)]
struct RestartQuery {
    node: Option<String>,
    binary: Option<String>,
    /// Comma-separated `key=value` server options.
    set: Option<String>,
}

#[derive(Debug, Serialize)]
struct RestartReport {
    node: String,
    steps: Vec<String>,
}

/// `POST /restart` (upgrade: `binary=`) and `POST /resize` (`set=`): a planned restart of a
/// node through the control driver, with sessions moved away and back.
async fn post_restart(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<RestartQuery>,
) -> Response {
    let Some(node) = q.node.filter(|n| !n.is_empty()) else {
        return bad_request(
            "which node? POST /restart?node=NAME[&binary=PATH][&set=K=V,...]".into(),
        );
    };
    let spec = holdfast_cluster::driver::RestartSpec {
        binary: q.binary.filter(|b| !b.is_empty()),
        set: q
            .set
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
    };
    match shared.restart_node(&node, &spec).await {
        Ok(steps) => (StatusCode::OK, Json(RestartReport { node, steps })).into_response(),
        Err(error @ holdfast_cluster::planned::RestartError::NotAllowed(_)) => {
            error_answer(StatusCode::FORBIDDEN, error)
        }
        Err(error) => error_answer(StatusCode::INTERNAL_SERVER_ERROR, error),
    }
}

/// The API with its checks: `token` is the bearer token; `Host` may name the host of
/// `[admin] listen`, `[admin] allowed_hosts`, `localhost` or an IP literal.
pub fn router(shared: Arc<Shared>, token: AdminToken) -> Router {
    let logins = Arc::new(dashboard::Logins::default());
    let guard = Arc::new(guard::Guard::new(
        token.clone(),
        &shared.config().admin,
        logins.clone(),
    ));
    let dashboard = Router::new()
        .route("/", get(dashboard::get_page))
        .route("/dashboard.js", get(dashboard::get_script))
        .route("/dashboard.css", get(dashboard::get_style))
        .route("/login", get(dashboard::get_login))
        .route("/dashboard/link", post(dashboard::post_link))
        .with_state(logins);
    // The fleet leader's operations: a member that does not lead forwards them to it.
    let leaders = Router::new()
        .route("/switchover", post(post_switchover))
        .route("/failover", post(post_failover))
        .route("/rejoin", post(post_rejoin))
        .route("/restart", post(post_restart))
        .route("/resize", post(post_restart))
        .route("/pause", post(serverless::post_pause))
        .route("/resume", post(serverless::post_resume))
        .route("/scale", post(serverless::post_scale))
        .route_layer(axum::middleware::from_fn_with_state(
            (shared.clone(), token),
            fleet::to_the_leader,
        ));
    Router::new()
        .route("/health", get(get_health))
        .route("/status", get(get_status))
        .route("/metrics", get(get_metrics))
        .merge(leaders)
        .route("/nodes/add", post(post_node_add))
        .route("/nodes/remove", post(post_node_remove))
        .route("/sessions/kill", post(post_session_kill))
        .route("/reload", post(post_reload))
        .route("/upgrade", post(post_upgrade))
        .route("/usage", get(serverless::get_usage))
        .fallback(guard::not_found)
        .with_state(shared)
        .merge(dashboard)
        .layer(axum::middleware::from_fn_with_state(guard, guard::check))
}

/// Serves the admin API on `listener`, requiring `token`, until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    token: AdminToken,
) -> std::io::Result<()> {
    let open = shared.admin_connections.clone();
    guard::serve(listener, router(shared, token), open).await
}

/// The last events shown by `ctl status`.
const EVENTS_SHOWN: usize = 5;

/// The last few events, newest last, with how long ago each was (`now_ms`: the time now).
fn render_events(events: &[holdfast_proxy::events::Event], now_ms: u64) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    if events.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "events (the last {} of {}; all in /status and the dashboard):",
        events.len().min(EVENTS_SHOWN),
        events.len()
    );
    for e in &events[events.len().saturating_sub(EVENTS_SHOWN)..] {
        let ago = now_ms.saturating_sub(e.unix_ms) / 1000;
        let mark = if e.bad { "!" } else { " " };
        let _ = writeln!(o, " {mark} {ago:>5}s ago  {}", e.text);
    }
    o
}

/// Renders a status for a person.
pub fn render_status(s: &Status) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "holdfast {}  up {}s  listening on {}  (pid {}, generation {})",
        s.version, s.uptime_secs, s.listen, s.pid, s.generation
    );
    if let Some(pid) = s.handed_over_to {
        let _ = writeln!(
            o,
            "upgraded: process {pid} serves; this one drains its {} sessions",
            s.counters.sessions_open
        );
    }
    if let Some(f) = &s.fleet {
        let _ = match f.leader {
            true => writeln!(
                o,
                "fleet {}: member {} leads (epoch {}): it runs HA",
                f.name, f.member, f.epoch
            ),
            false => writeln!(
                o,
                "fleet {}: member {} does not lead: {} runs HA",
                f.name,
                f.member,
                f.leader_member.as_deref().unwrap_or("another member")
            ),
        };
        for m in &f.members {
            let field = |k: &str| m[k].as_str().unwrap_or("?").to_string();
            let _ = writeln!(
                o,
                "  member {}: clients {}, admin {}, holdfast {}, pid {}, {} sessions{}",
                field("member"),
                field("listen"),
                field("admin"),
                field("version"),
                m["pid"].as_u64().unwrap_or(0),
                m["sessions"].as_u64().unwrap_or(0),
                if f.leader_member.as_deref() == m["member"].as_str() {
                    " (leads)"
                } else {
                    ""
                }
            );
        }
        let _ = match f.lease_renewed_ms_ago {
            Some(ms) => writeln!(
                o,
                "  this member's lease renewed {ms} ms ago; joined {} times, elected {} times",
                f.times_joined, f.times_elected
            ),
            None => writeln!(
                o,
                "  this member holds no lease: etcd cannot be reached (it serves its sessions and decides nothing)"
            ),
        };
        let now = unix_ms_now();
        for d in f.decisions.iter().rev().take(5) {
            let ago = now.saturating_sub(d["at_unix_ms"].as_u64().unwrap_or(0)) / 1000;
            let _ = writeln!(
                o,
                "  decision {ago} s ago by member {} (epoch {}): {}{}",
                d["by"].as_str().unwrap_or("?"),
                d["epoch"].as_i64().unwrap_or(0),
                d["what"].as_str().unwrap_or("?"),
                if d["ok"].as_bool() == Some(false) {
                    " (failed)"
                } else {
                    ""
                }
            );
        }
    }
    let _ = writeln!(
        o,
        "primary: {}{}",
        s.topology.primary.as_deref().unwrap_or("(none)"),
        if s.topology.read_only_primary {
            " (READ-ONLY: no node is writable; writes get the server's error)"
        } else {
            ""
        }
    );
    o.push_str(&render_ha(&s.ha, unix_ms_now()));
    if let Some(v) = &s.serverless {
        o.push_str(&render_instance(v));
    }
    let _ = writeln!(
        o,
        "{:<10} {:<22} {:<10} {:<10} {:<14} {:>7} {:>10} version",
        "node", "address", "reachable", "read_only", "reads", "active", "lag ms"
    );
    for n in &s.topology.nodes {
        let ro = n.read_only.map_or("?".to_string(), |r| r.to_string());
        let reads = if n.draining {
            "draining"
        } else if n.serves_reads {
            "taking reads"
        } else {
            "-"
        };
        let lag = n
            .replication
            .as_ref()
            .and_then(|r| r.get("lag_ms"))
            .and_then(|l| l.as_u64())
            .map_or("-".to_string(), |l| l.to_string());
        let _ = writeln!(
            o,
            "{:<10} {:<22} {:<10} {:<10} {:<14} {:>7} {:>10} {}",
            n.name, n.address, n.reachable, ro, reads, n.active_requests, lag, n.version
        );
        if let Some(e) = &n.last_error {
            let _ = writeln!(o, "           last error: {e}");
        }
        let replication_error = n
            .replication
            .as_ref()
            .and_then(|r| r.get("error"))
            .and_then(|e| e.as_str())
            .filter(|e| !e.is_empty());
        if let (Some(e), false) = (replication_error, n.serves_reads) {
            let _ = writeln!(o, "           replication: {e}");
        }
    }
    let c = &s.counters;
    let _ = writeln!(
        o,
        "sessions open: {}  accepted: {}  logins failed: {}  commands: {}  backend connects: {} (failed {})",
        c.sessions_open, c.connections_accepted, c.logins_failed, c.commands, c.backend_connects, c.backend_connect_failures
    );
    let _ = writeln!(
        o,
        "keep-alive: sessions moved: {} (mean {:.0} ms)  requests held: {}  retried: {}  failed on backend loss: {}",
        c.sessions_moved, c.mean_move_ms, c.requests_held, c.requests_retried, c.requests_failed_on_backend_loss
    );
    if let Some(k) = &s.kernel_relay {
        let _ = match (&k.why_not, k.on) {
            (_, true) => writeln!(
                o,
                "pass-through relayed in the kernel (BPF sockmap): {} sessions now",
                k.sessions
            ),
            (Some(why), false) => writeln!(o, "pass-through relayed in user space: {why}"),
            (None, false) => writeln!(o, "pass-through relayed in user space"),
        };
    }
    let _ = writeln!(
        o,
        "password verifiers: {} accounts{}",
        s.verifier_accounts,
        if s.verifiers_loaded {
            ""
        } else {
            " (not loaded: check the monitor account)"
        }
    );
    o.push_str(&render_config(&s.config, unix_ms_now()));
    if let Some(p) = &s.preflight {
        if p.problem_count() > 0 {
            let _ = writeln!(o, "START-UP CHECK: {}", p.render().replace('\n', "\n  "));
        }
    }
    o.push_str(&render_events(&s.events, unix_ms_now()));
    if !s.sessions.is_empty() {
        let _ = writeln!(
            o,
            "{:<6} {:<22} {:<12} {:<8} {:<9} {:<8} movable",
            "id", "client", "user", "backend", "commands", "reauth"
        );
        for x in &s.sessions {
            let movable = match &x.blocked_by {
                None => "yes".to_string(),
                Some(b) => format!("no ({b})"),
            };
            let _ = writeln!(
                o,
                "{:<6} {:<22} {:<12} {:<8} {:<9} {:<8} {}",
                x.id, x.client, x.user, x.backend, x.commands, x.can_reauthenticate, movable
            );
            if let (Some(text), Some(ms)) = (&x.statement, x.statement_ms) {
                let _ = writeln!(
                    o,
                    "       {} for {:.1} s: {text}",
                    x.state,
                    ms as f64 / 1000.0
                );
            }
        }
    }
    o
}

/// What `holdfast ctl reload` prints of a reload's report.
pub fn render_reload(r: &holdfast_proxy::reload::ReloadReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let c = &r.config;
    let _ = writeln!(
        o,
        "reloaded {} (sha256 {}, {})",
        c.path.display(),
        c.hash.get(..12).unwrap_or(&c.hash),
        if r.file_changed {
            "changed"
        } else {
            "unchanged"
        }
    );
    let b = &r.backends;
    let nodes_changed = !(b.added.is_empty() && b.removing.is_empty() && b.refused.is_empty());
    if r.applied.is_empty() && r.needs_restart.is_empty() && !nodes_changed {
        o.push_str("no setting changed\n");
    }
    if !r.applied.is_empty() {
        o.push_str("applied now:\n");
        for change in &r.applied {
            let _ = writeln!(o, "  {change}");
        }
    }
    if !r.needs_restart.is_empty() {
        let _ = writeln!(
            o,
            "not applied, need a restart ({}):",
            r.restart_note
                .as_deref()
                .unwrap_or("the running values stay")
        );
        for change in &r.needs_restart {
            let _ = writeln!(o, "  {change}");
        }
    }
    for (what, list) in [("added", &b.added), ("being removed", &b.removing)] {
        if !list.is_empty() {
            let _ = writeln!(o, "backends {what}: {}", list.join(", "));
        }
    }
    for refused in &b.refused {
        let _ = writeln!(o, "backend refused: {refused}");
    }
    for w in &r.warnings {
        let _ = writeln!(o, "warning: {w}");
    }
    o
}

/// The config lines of `holdfast ctl status`.
pub fn render_config(c: &ConfigView, now_unix_ms: u64) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    match (&c.path, &c.hash) {
        (Some(path), Some(hash)) => {
            let ago = c
                .loaded_unix_ms
                .map(|t| format!(" ({}s ago)", now_unix_ms.saturating_sub(t) / 1000))
                .unwrap_or_default();
            let _ = write!(
                o,
                "config: {path}  sha256 {}  loaded {}{ago}",
                hash.get(..12).unwrap_or(hash),
                c.loaded_at.as_deref().unwrap_or("?"),
            );
        }
        _ => o.push_str("config: (not from a file)"),
    }
    if let Some(level) = &c.log_level {
        let _ = write!(o, "  log level: {level}");
    }
    o.push('\n');
    for change in &c.needs_restart {
        let _ = writeln!(o, "    waits for a restart: {change}");
    }
    o
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} s", v / 1000.0)
    } else {
        format!("{v:.0} ms")
    }
}

/// The HA lines of `holdfast ctl status` (`now_unix_ms` for "… ago").
pub fn render_ha(h: &HaState, now_unix_ms: u64) -> String {
    use holdfast_config::HaMode;
    use std::fmt::Write;
    let mut o = String::new();
    let c = &h.counters;
    let mode = match h.mode {
        HaMode::Managed => "managed",
        HaMode::External => "external (follows read_only; operations refused)",
    };
    let watching = match (&h.watching, h.failed_probes) {
        (Some(w), 0) => format!(", watching {w}"),
        (Some(w), n) => format!(", watching {w} ({n} failed probes in a row)"),
        (None, _) => String::new(),
    };
    let _ = writeln!(
        o,
        "ha: {mode}{watching}  switchovers: {}  failovers: {} ({} automatic)  rejoins: {}  failed: {}",
        c.switchovers, c.failovers, c.automatic_failovers, c.rejoins, c.failed_operations
    );
    if let Some(r) = &h.in_progress {
        let _ = writeln!(
            o,
            "    running: {}{} for {}",
            if r.automatic { "automatic " } else { "" },
            r.operation,
            ms(now_unix_ms.saturating_sub(r.started_unix_ms) as f64)
        );
    }
    if let Some(l) = &h.last {
        let ago = now_unix_ms.saturating_sub(l.finished_unix_ms) / 1000;
        let _ = writeln!(
            o,
            "    last: {}{} {} in {}, {ago}s ago: {}",
            if l.automatic { "automatic " } else { "" },
            l.operation,
            if l.ok { "ok" } else { "FAILED" },
            ms(l.duration_ms),
            l.summary
        );
        for w in &l.warnings {
            let _ = writeln!(o, "    warning: {w}");
        }
    }
    if let Some(w) = &h.failover_withheld {
        let _ = writeln!(
            o,
            "    FAILOVER WITHHELD ({} attempts): {w}",
            c.failovers_withheld
        );
    }
    if !h.needs_rejoin.is_empty() {
        let _ = writeln!(
            o,
            "    needs rejoin: {} (holdfast ctl rejoin NODE once it runs again)",
            h.needs_rejoin.join(", ")
        );
    }
    if let Some(s) = &h.semi_sync {
        let state = match s.active {
            true => "active".to_string(),
            false => "NOT ACTIVE (asynchronous: a failover may lose acknowledged writes)".into(),
        };
        let _ = writeln!(
            o,
            "    semi-sync: {state} on {}, {} acknowledging replicas, fallbacks: {}",
            s.primary.as_deref().unwrap_or("?"),
            s.clients,
            s.fallbacks
        );
    }
    o
}

/// Renders an HA operation report (the JSON the admin API answers) for a person: what
/// changed, each phase with its duration, re-pointed and skipped nodes, warnings.
pub fn render_report(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    let str_of = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("?").to_string();
    let num_of = |k: &str| v.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
    let list_of = |k: &str| -> Vec<String> {
        v.get(k)
            .and_then(|x| x.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut o = String::new();
    if v.get("old_primary").is_some() {
        let _ = writeln!(
            o,
            "switchover {} -> {} done in {} (writes blocked {}; {} client connections killed on {})",
            str_of("old_primary"),
            str_of("new_primary"),
            ms(num_of("total")),
            ms(num_of("writes_blocked")),
            num_of("killed_connections"),
            str_of("old_primary"),
        );
        let _ = writeln!(o, "fenced at GTID {}", str_of("fenced_at"));
    } else if v.get("lost_primary").is_some() {
        let _ = writeln!(
            o,
            "failover away from {} done in {}: {} is the primary (from GTID {})",
            str_of("lost_primary"),
            ms(num_of("total")),
            str_of("new_primary"),
            str_of("promoted_at"),
        );
    } else if v.get("caught_up_to").is_some() {
        let _ = writeln!(
            o,
            "rejoin of {} done in {}: replicating from {} (was at GTID {}, caught up to {})",
            str_of("node"),
            ms(num_of("total")),
            str_of("primary"),
            str_of("node_was_at"),
            str_of("caught_up_to"),
        );
    } else {
        let _ = writeln!(o, "{}", serde_json::to_string_pretty(v).unwrap_or_default());
        return o;
    }
    if let Some(phases) = v.get("phases").and_then(|p| p.as_array()) {
        o.push_str("phases:\n");
        for p in phases {
            let name = p.get("name").and_then(|x| x.as_str()).unwrap_or("?");
            let took = p.get("took").and_then(|x| x.as_f64()).unwrap_or(0.0);
            let _ = writeln!(o, "  {name:<10} {took:>9.1} ms");
        }
    }
    let repointed = list_of("repointed");
    if !repointed.is_empty() {
        let _ = writeln!(o, "re-pointed: {}", repointed.join(", "));
    }
    if let Some(skipped) = v.get("skipped").and_then(|p| p.as_array()) {
        for sk in skipped {
            let node = sk.get("node").and_then(|x| x.as_str()).unwrap_or("?");
            let reason = sk.get("reason").and_then(|x| x.as_str()).unwrap_or("?");
            let _ = writeln!(o, "skipped {node}: {reason}");
        }
    }
    for n in list_of("needs_rejoin") {
        let _ = writeln!(
            o,
            "{n} needs rejoin: once it runs again, `holdfast ctl rejoin {n}`"
        );
    }
    for w in list_of("warnings") {
        let _ = writeln!(o, "warning: {w}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_render_for_people() {
        let v = serde_json::json!({
            "old_primary": "node1", "new_primary": "node2", "fenced_at": "0-1-7",
            "killed_connections": 2, "repointed": ["node1", "node3"], "skipped": [],
            "phases": [{"name": "probe", "took": 3.5}, {"name": "fence", "took": 10.25}],
            "writes_blocked": 40.0, "total": 52.0, "warnings": ["careful"]
        });
        let text = render_report(&v);
        assert!(
            text.contains("switchover node1 -> node2 done in 52 ms"),
            "{text}"
        );
        assert!(text.contains("fence"), "{text}");
        assert!(
            text.contains("10.2 ms") || text.contains("10.3 ms"),
            "{text}"
        );
        assert!(text.contains("re-pointed: node1, node3"), "{text}");
        assert!(text.contains("warning: careful"), "{text}");
        let v = serde_json::json!({
            "lost_primary": "node1", "new_primary": "node3", "promoted_at": "0-1-9",
            "needs_rejoin": ["node1"], "phases": [], "total": 120.0
        });
        let text = render_report(&v);
        assert!(text.contains("node3 is the primary"), "{text}");
        assert!(text.contains("holdfast ctl rejoin node1"), "{text}");
    }

    #[test]
    fn reload_reports_render_for_people() {
        let report: holdfast_proxy::reload::ReloadReport = serde_json::from_value(serde_json::json!({
            "config": {"path": "/etc/h.toml", "hash": "0123456789abcdef0123", "loaded_at": "2026-12-05T10:11:12Z", "loaded_unix_ms": 1},
            "file_changed": true,
            "applied": [{"key": "proxy.max_connections", "from": "10000", "to": "5"},
                        {"key": "auth.monitor_password"}],
            "needs_restart": [{"key": "proxy.listen", "from": "\"a:1\"", "to": "\"a:2\""}],
            "restart_note": "these apply when holdfast restarts",
            "added": [], "removing": ["node3"], "refused": ["node2: its address changed"]
        }))
        .unwrap();
        let text = render_reload(&report);
        assert_eq!(
            text,
            "reloaded /etc/h.toml (sha256 0123456789ab, changed)\n\
             applied now:\n  proxy.max_connections: 10000 -> 5\n  auth.monitor_password: changed\n\
             not applied, need a restart (these apply when holdfast restarts):\n  proxy.listen: \"a:1\" -> \"a:2\"\n\
             backends being removed: node3\n\
             backend refused: node2: its address changed\n"
        );
        let unchanged = holdfast_proxy::reload::ReloadReport {
            file_changed: false,
            applied: vec![],
            needs_restart: vec![],
            restart_note: None,
            backends: Default::default(),
            ..report
        };
        assert!(render_reload(&unchanged).ends_with("unchanged)\nno setting changed\n"));
    }

    /// Every metric the Grafana dashboard and the Prometheus rules in `deploy/` name is one
    /// `/metrics` shows (rendered here by the same code, with every optional family on: a
    /// replica, semi-sync, a fleet), and of the type the name says (`_total` a counter,
    /// `_bucket` a histogram).
    #[test]
    fn deploy_files_name_only_metrics_holdfast_exposes() {
        let cfg = holdfast_config::Config::parse(
            "[proxy]\nlisten = \"127.0.0.1:1\"\n[[backend]]\nname = \"node1\"\naddress = \"127.0.0.1:2\"\n\
             [[backend]]\nname = \"node2\"\naddress = \"127.0.0.1:3\"\n",
            "test",
        )
        .expect("a config");
        let mut topology = Topology::from_config(&cfg);
        topology.primary = Some(0);
        topology.nodes[1].replication = Some(holdfast_cluster::topology::ReplicaHealth {
            io_running: true,
            sql_running: true,
            lag_ms: Some(2000),
            source: "127.0.0.1:2".into(),
            error: String::new(),
        });
        let fleet = FleetView {
            name: "lab".into(),
            member: "a".into(),
            leader: true,
            epoch: 7,
            leader_member: Some("a".into()),
            members: vec![],
            lease_renewed_ms_ago: Some(100),
            times_elected: 1,
            times_joined: 1,
            decisions: vec![],
        };
        let metrics = holdfast_proxy::metrics::Metrics::new();
        let text = metrics.render()
            + &node_metrics(&topology)
            + &ha_metrics(&sample_ha_state())
            + &fleet_metrics(&fleet);
        let type_of = |base: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("# TYPE {base} ")))
                .map(str::to_string)
        };
        for file in [
            include_str!("../../../deploy/grafana-dashboard.json"),
            include_str!("../../../deploy/prometheus-rules.yml"),
        ] {
            let mut named = 0;
            for (at, _) in file.match_indices("holdfast_") {
                let word_start = file[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
                if !word_start {
                    continue;
                }
                let name: String = file[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                named += 1;
                let (base, wants) = [("_total", "counter"), ("_bucket", "histogram")]
                    .into_iter()
                    .find_map(|(suffix, kind)| Some((name.strip_suffix(suffix)?, Some(kind))))
                    .unwrap_or((name.as_str(), None));
                let found = type_of(base).or_else(|| type_of(&name));
                let Some(found) = found else {
                    panic!("{name} is not a metric holdfast exposes");
                };
                if let Some(wants) = wants {
                    assert_eq!(found, wants, "{name}: a {found}");
                } else {
                    assert!(
                        !matches!(found.as_str(), "counter" | "histogram"),
                        "{name} is a {found}: name its _total or _bucket"
                    );
                }
            }
            assert!(named > 10, "the file names holdfast's metrics");
        }
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../../deploy/grafana-dashboard.json"))
                .expect("the dashboard is JSON");
        assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() > 10));
    }

    fn sample_ha_state() -> HaState {
        use holdfast_cluster::ha::controller::{HaCounters, LastOp, OpKind};
        HaState {
            mode: holdfast_config::HaMode::Managed,
            in_progress: None,
            last: Some(LastOp {
                operation: OpKind::Switchover,
                automatic: false,
                started_unix_ms: 1_000,
                finished_unix_ms: 2_000,
                duration_ms: 52.0,
                ok: true,
                summary: "node1 -> node2".into(),
                error: None,
                warnings: vec![],
            }),
            counters: HaCounters {
                switchovers: 1,
                ..Default::default()
            },
            watching: Some("node2".into()),
            failed_probes: 0,
            needs_rejoin: vec![],
            failing_over_from: None,
            failover_withheld: None,
            semi_sync: Some(holdfast_cluster::ha::durability::SemiSyncState {
                active: false,
                primary: Some("node2".into()),
                clients: 0,
                fallbacks: 1,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_last_events_render_newest_last() {
        use holdfast_proxy::events::Event;
        let events: Vec<Event> = (0..7)
            .map(|i| Event {
                unix_ms: 1_000 * i,
                kind: "node".into(),
                text: format!("event {i}"),
                bad: i == 6,
            })
            .collect();
        let text = render_events(&events, 10_000);
        assert!(text.starts_with("events (the last 5 of 7;"), "{text}");
        assert!(!text.contains("event 1\n"), "{text}");
        assert!(text.contains("    8s ago  event 2"), "{text}");
        assert!(text.ends_with(" !     4s ago  event 6\n"), "{text}");
        assert_eq!(render_events(&[], 0), "");
    }

    #[test]
    fn ha_line() {
        let h = sample_ha_state();
        let text = render_ha(&h, 12_000);
        assert!(
            text.contains("semi-sync: NOT ACTIVE (asynchronous"),
            "{text}"
        );
        assert!(
            text.starts_with("ha: managed, watching node2  switchovers: 1"),
            "{text}"
        );
        assert!(
            text.contains("last: switchover ok in 52 ms, 10s ago: node1 -> node2"),
            "{text}"
        );
    }
}
