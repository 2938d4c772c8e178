//! The serverless part of the admin API: `POST /pause`, `POST /resume`, `POST /scale`,
//! `GET /usage`, and the text `holdfast ctl` prints for them.

use crate::bad_request;
use crate::error_answer;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use holdfast_config::PauseTier;
use holdfast_proxy::serverless::{self, Phase};
use holdfast_proxy::Shared;
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn no_instance() -> Response {
    bad_request("this holdfast has no [serverless] instance".into())
}

/// Polls `done` every 10 ms up to `limit`.
async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct PauseQuery {
    tier: Option<String>,
}

/// `POST /pause[?tier=freeze|stop]`: pauses now. 200 with the instance view once paused;
/// 409 with the reasons when sessions keep it from pausing.
pub(crate) async fn post_pause(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<PauseQuery>,
) -> Response {
    let Some(lc) = shared.serverless.clone() else {
        return no_instance();
    };
    let tier = match q.tier.as_deref() {
        None | Some("") => lc.config().pause_tier,
        Some("freeze") => PauseTier::Freeze,
        Some("stop") => PauseTier::Stop,
        Some(other) => {
            return bad_request(format!(
                "unknown tier {other:?}: use tier=freeze or tier=stop"
            ))
        }
    };
    match lc.pause_now(tier).await {
        Ok(()) => (StatusCode::OK, Json(lc.view())).into_response(),
        Err(error) => error_answer(StatusCode::CONFLICT, error),
    }
}

/// `POST /resume`: wakes the instance; 200 once it runs, 503 after the resume deadline.
pub(crate) async fn post_resume(State(shared): State<Arc<Shared>>) -> Response {
    let Some(lc) = shared.serverless.clone() else {
        return no_instance();
    };
    shared.metrics.wake("admin");
    match lc.wake("admin").await {
        Ok(()) => (StatusCode::OK, Json(lc.view())).into_response(),
        Err(e) => error_answer(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ScaleQuery {
    ccu: Option<f64>,
    /// `auto=true`: the autoscaler decides again (an operator's size no longer holds).
    auto: Option<bool>,
}

/// `POST /scale?ccu=1.5`: sets the size now; it holds (the autoscaler leaves it alone)
/// until `POST /scale?auto=true`.
pub(crate) async fn post_scale(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<ScaleQuery>,
) -> Response {
    let Some(lc) = shared.serverless.clone() else {
        return no_instance();
    };
    if q.auto == Some(true) {
        lc.scale_automatically();
        return (StatusCode::OK, Json(lc.view())).into_response();
    }
    let Some(ccu) = q.ccu.filter(|c| c.is_finite() && *c > 0.0) else {
        return bad_request("how large? POST /scale?ccu=1.5 (or ?auto=true)".into());
    };
    if lc.phase() != Phase::Running {
        return error_answer(
            StatusCode::CONFLICT,
            format!(
                "the instance is {}; resume it first (POST /resume)",
                lc.phase().name()
            ),
        )
        .into_response();
    }
    lc.request_scale(ccu);
    wait_until(Duration::from_secs(10), || !lc.scale_pending()).await;
    (StatusCode::OK, Json(lc.view())).into_response()
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct UsageQuery {
    instance: Option<String>,
    /// Unix seconds, or a time ago: `90s`, `30m`, `6h`, `7d`.
    since: Option<String>,
}

/// Parses `since`: unix seconds or an age (`30m`, `6h`, `7d`) counted back from `now`.
pub fn parse_since(text: &str, now_unix: i64) -> Result<i64, String> {
    let t = text.trim();
    if let Ok(n) = t.parse::<i64>() {
        return Ok(n);
    }
    let (num, unit) = t.split_at(t.len().saturating_sub(1));
    let n: i64 = num
        .parse()
        .map_err(|_| format!("since={text:?}: give unix seconds or an age like 30m, 6h, 7d"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("since={text:?}: the unit must be s, m, h or d")),
    };
    Ok(now_unix - n * secs)
}

/// `GET /usage[?instance=I][&since=T]`: the usage ledger's lines, oldest first.
pub(crate) async fn get_usage(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<UsageQuery>,
) -> Response {
    let Some(ledger) = shared.ledger.clone() else {
        return bad_request(
            "this holdfast keeps no usage ledger (no [serverless] instance)".into(),
        );
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let since = match q.since.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => match parse_since(s, now) {
            Ok(t) => Some(t),
            Err(e) => return bad_request(e),
        },
        None => None,
    };
    let instance = q.instance.filter(|i| !i.is_empty());
    match serverless::usage_lines(&ledger, shared.serverless.as_deref(), instance, since).await {
        Ok(lines) => (StatusCode::OK, Json(lines)).into_response(),
        Err(error) => error_answer(StatusCode::INTERNAL_SERVER_ERROR, error),
    }
}

/// The serverless lines of `holdfast ctl status`, from the JSON `/status` gives.
pub fn render_instance(v: &serde_json::Value) -> String {
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("?").to_string();
    let f = |k: &str| v.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
    let u = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let mut o = format!(
        "serverless instance {} ({} driver): {}{} for {:.0}s, idle {:.0}s (pauses after {}s), {} CCU, cpu {:.2}\n",
        s("instance"),
        s("driver"),
        s("phase"),
        v.get("tier")
            .and_then(|t| t.as_str())
            .map(|t| format!(" ({t})"))
            .unwrap_or_default(),
        f("phase_secs"),
        f("idle_secs"),
        u("idle_pause_secs"),
        f("ccu"),
        f("cpu_used"),
    );
    if let Some(manual) = v.get("manual_ccu").and_then(|x| x.as_f64()) {
        o.push_str(&format!(
            "  size {manual} CCU set by an operator: the autoscaler leaves it until `holdfast ctl scale auto`\n"
        ));
    }
    o.push_str(&format!(
        "  pauses {}  resumes {} (last {})  resume failures {}  storage {}\n",
        u("pauses"),
        u("resumes"),
        v.get("last_resume_ms")
            .and_then(|x| x.as_f64())
            .map_or("-".to_string(), |ms| format!("{ms:.1} ms")),
        u("resume_failures"),
        v.get("storage_bytes")
            .and_then(|x| x.as_u64())
            .map_or("-".to_string(), |b| format!(
                "{:.1} MiB",
                b as f64 / 1048576.0
            )),
    ));
    if let Some(e) = v.get("last_error").and_then(|x| x.as_str()) {
        o.push_str(&format!("  last error: {e}\n"));
    }
    if let Some(list) = v.get("pause_blocked_by").and_then(|x| x.as_array()) {
        for b in list.iter().filter_map(|x| x.as_str()) {
            o.push_str(&format!("  not pausing: {b}\n"));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_accepts_unix_seconds_and_ages() {
        assert_eq!(parse_since("1700000000", 0), Ok(1_700_000_000));
        assert_eq!(parse_since("30m", 10_000), Ok(10_000 - 1800));
        assert_eq!(parse_since("2d", 200_000), Ok(200_000 - 172_800));
        assert!(parse_since("yesterday", 0).is_err());
        assert!(parse_since("5w", 0).is_err());
    }
}
