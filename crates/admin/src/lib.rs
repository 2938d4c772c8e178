//! The HTTP admin API: `GET /status` (JSON) and `GET /metrics` (Prometheus text), and the
//! small HTTP client `holdfast ctl` uses to read them.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use holdfast_proxy::registry::SessionView;
use holdfast_proxy::topology::Topology;
use holdfast_proxy::Shared;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub uptime_secs: u64,
    pub listen: String,
    pub topology: TopologyView,
    pub verifiers_loaded: bool,
    pub verifier_accounts: usize,
    pub counters: Counters,
    pub sessions: Vec<SessionViewOwned>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TopologyView {
    pub primary: Option<String>,
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
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Counters {
    pub sessions_open: usize,
    pub connections_accepted: u64,
    pub logins_failed: u64,
    pub commands: u64,
    pub backend_connects: u64,
    pub backend_connect_failures: u64,
}

/// Mirror of [`SessionView`] that can also be deserialized by `ctl`.
#[derive(Debug, Serialize, Deserialize)]
pub struct SessionViewOwned {
    pub id: u32,
    pub client: String,
    pub user: String,
    pub backend: String,
    pub age_secs: u64,
    pub commands: u64,
    pub can_reauthenticate: bool,
    pub movable: bool,
    pub blocked_by: Option<String>,
}

impl From<SessionView> for SessionViewOwned {
    fn from(s: SessionView) -> Self {
        SessionViewOwned {
            id: s.id,
            client: s.client,
            user: s.user,
            backend: s.backend,
            age_secs: s.age_secs,
            commands: s.commands,
            can_reauthenticate: s.can_reauthenticate,
            movable: s.movable,
            blocked_by: s.blocked_by,
        }
    }
}

fn topology_view(t: &Topology) -> TopologyView {
    TopologyView {
        primary: t
            .primary
            .and_then(|i| t.nodes.get(i))
            .map(|n| n.name.clone()),
        nodes: t
            .nodes
            .iter()
            .map(|n| NodeView {
                name: n.name.clone(),
                address: n.address.clone(),
                reachable: n.reachable,
                read_only: n.read_only,
                version: n.version.clone(),
                last_error: n.last_error.clone(),
            })
            .collect(),
    }
}

pub fn status(shared: &Shared) -> Status {
    let m = &shared.metrics;
    let topo = shared.topology.borrow().clone();
    let sessions: Vec<SessionViewOwned> = shared
        .sessions
        .snapshot()
        .into_iter()
        .map(Into::into)
        .collect();
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        uptime_secs: shared.started.elapsed().as_secs(),
        listen: shared.config.proxy.listen.clone(),
        topology: topology_view(&topo),
        verifiers_loaded: shared.verifiers.is_loaded(),
        verifier_accounts: shared.verifiers.account_count(),
        counters: Counters {
            sessions_open: sessions.len(),
            connections_accepted: m.connections_accepted.get(),
            logins_failed: m.logins_failed.get(),
            commands: m.query_latency.count(),
            backend_connects: m.backend_connects.get(),
            backend_connect_failures: m.backend_connect_failures.get(),
        },
        sessions,
    }
}

async fn get_status(State(shared): State<Arc<Shared>>) -> Json<Status> {
    Json(status(&shared))
}

async fn get_metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.render(),
    )
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/status", get(get_status))
        .route("/metrics", get(get_metrics))
        .with_state(shared)
}

/// Serves the admin API on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    axum::serve(listener, router(shared)).await
}

/// A minimal HTTP/1.1 GET for `holdfast ctl`: returns the status code and body.
pub async fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((code, body))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// Renders a status for a person.
pub fn render_status(s: &Status) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "holdfast {}  up {}s  listening on {}",
        s.version, s.uptime_secs, s.listen
    );
    let _ = writeln!(
        o,
        "primary: {}",
        s.topology.primary.as_deref().unwrap_or("(none)")
    );
    let _ = writeln!(
        o,
        "{:<10} {:<22} {:<10} {:<10} version",
        "node", "address", "reachable", "read_only"
    );
    for n in &s.topology.nodes {
        let ro = n.read_only.map_or("?".to_string(), |r| r.to_string());
        let _ = writeln!(
            o,
            "{:<10} {:<22} {:<10} {:<10} {}",
            n.name, n.address, n.reachable, ro, n.version
        );
        if let Some(e) = &n.last_error {
            let _ = writeln!(o, "           last error: {e}");
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
        "password verifiers: {} accounts{}",
        s.verifier_accounts,
        if s.verifiers_loaded {
            ""
        } else {
            " (not loaded: check the monitor account)"
        }
    );
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
        }
    }
    o
}
