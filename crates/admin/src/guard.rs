//! What every admin request passes before a handler sees it, and the server around them.
//!
//! * `Host` must name this API: `localhost`, an IP literal, the host of `[admin] listen` or
//!   one of `[admin] allowed_hosts` (a DNS-rebinding page sends its own name) — else 403.
//! * An `Origin` header must be this API's own origin (`http://` + `Host`), and
//!   `Sec-Fetch-Site` must not say `cross-site` or `same-site` — else 403. No CORS headers
//!   are ever sent, so a browser's preflight fails.
//! * Every request except `GET /health` needs `Authorization: Bearer <token>`, compared in
//!   constant time — else 401 with `WWW-Authenticate: Bearer`.
//! * A body must be `application/json` (parameterless POSTs send none) — else 415; at most
//!   [`MAX_BODY`] bytes (413), read within [`BODY_TIMEOUT`] (408).
//!
//! The server ([`serve`]): HTTP/1.1, one request per connection, headers within
//! [`HEADER_TIMEOUT`], at most [`MAX_CONNECTIONS`] connections at once (more are closed
//! at once).

use crate::error_answer;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use holdfast_config::{AdminConfig, AdminToken};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Largest request body (the API's JSON bodies are a few dozen bytes).
pub const MAX_BODY: usize = 64 * 1024;
/// A client must send its request line and headers within this time.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A client must send its body within this time.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Admin connections open at once; one more is closed without an answer.
pub const MAX_CONNECTIONS: usize = 64;
/// Largest request head hyper buffers.
const MAX_HEAD: usize = 16 * 1024;

/// The checks' configuration: the token and the host names `Host` may carry.
pub(crate) struct Guard {
    token: AdminToken,
    /// Browsers logged in to the dashboard (GET requests with their cookie).
    logins: Arc<crate::dashboard::Logins>,
    /// Lower-case host names besides `localhost` and IP literals.
    hosts: Vec<String>,
}

impl Guard {
    pub(crate) fn new(
        token: AdminToken,
        admin: &AdminConfig,
        logins: Arc<crate::dashboard::Logins>,
    ) -> Guard {
        let mut hosts: Vec<String> = admin
            .allowed_hosts
            .iter()
            .map(|h| normalise_host(h))
            .collect();
        hosts.push(normalise_host(admin.listen_host()));
        Guard {
            token,
            logins,
            hosts,
        }
    }

    /// Whether a `Host` header value (`name[:port]`, `[v6][:port]`) names this API.
    fn host_allowed(&self, value: &str) -> bool {
        let Some(host) = host_without_port(value) else {
            return false;
        };
        let host = normalise_host(host);
        host == "localhost"
            || host.parse::<std::net::IpAddr>().is_ok()
            || self.hosts.contains(&host)
    }

    fn token_ok(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return false;
        };
        let value = value.as_bytes();
        let scheme = b"bearer ";
        if value.len() <= scheme.len() || !value[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return false;
        }
        self.token.matches(value[scheme.len()..].trim_ascii())
    }
}

fn normalise_host(h: &str) -> String {
    h.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// The host of a `Host` header value; `None` if it is malformed.
fn host_without_port(value: &str) -> Option<&str> {
    if let Some(rest) = value.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port_ok = after.is_empty()
            || after
                .strip_prefix(':')
                .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
        return port_ok.then_some(host);
    }
    let host = match value.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        Some(_) => return None,
        None => value,
    };
    let valid = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    valid.then_some(host)
}

/// The checks of the module documentation, then the handler with the body read.
pub(crate) async fn check(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_default();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let refuse = |status: StatusCode, why: String| {
        tracing::warn!(%peer, %method, %path, status = status.as_u16(), reason = %why, "admin request refused");
        let mut answer = error_answer(status, why);
        if status == StatusCode::UNAUTHORIZED {
            answer.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"holdfast admin\""),
            );
        }
        answer
    };
    let headers = req.headers();

    // Where the request says it goes: this API, not a name that resolves here.
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let Some(host) = host else {
        return refuse(StatusCode::BAD_REQUEST, "no Host header".into());
    };
    let uri_host_ok = req
        .uri()
        .authority()
        .is_none_or(|a| guard.host_allowed(a.as_str()));
    if !guard.host_allowed(host) || !uri_host_ok {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "Host {host:?} is not this admin API's address (add the name to [admin] \
                 allowed_hosts if it is)"
            ),
        );
    }
    // Where the request comes from: a page of another origin must not use this API.
    if let Some(origin) = headers.get(header::ORIGIN) {
        let own = format!("http://{host}");
        let same = origin.to_str().is_ok_and(|o| o.eq_ignore_ascii_case(&own));
        if !same {
            return refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "cross-origin request refused (Origin {:?})",
                    String::from_utf8_lossy(origin.as_bytes())
                ),
            );
        }
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        if matches!(site.as_bytes(), b"cross-site" | b"same-site") {
            return refuse(
                StatusCode::FORBIDDEN,
                "cross-site request refused (Sec-Fetch-Site)".into(),
            );
        }
    }
    // Who sends it. The dashboard's page and its login link are open (the page shows
    // nothing until it may read `/status`); a logged-in browser may read, never change.
    let open = method == Method::GET
        && matches!(
            path.as_str(),
            "/health" | "/login" | "/" | "/dashboard.js" | "/dashboard.css"
        );
    let browser = method == Method::GET && guard.logins.cookie_ok(headers);
    if !open && !browser && !guard.token_ok(headers) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "missing or wrong admin token: send Authorization: Bearer <token> (holdfast ctl: \
             --token-file, HOLDFAST_ADMIN_TOKEN or --config)"
                .into(),
        );
    }
    // What it carries: JSON or nothing, bounded in size and time.
    let content_type = headers.get(header::CONTENT_TYPE);
    let length = headers
        .get(header::CONTENT_LENGTH)
        .map(|v| v.to_str().ok().and_then(|v| v.parse::<u64>().ok()));
    let chunked = headers.contains_key(header::TRANSFER_ENCODING);
    let has_body =
        chunked || matches!(length, Some(Some(n)) if n > 0) || matches!(length, Some(None));
    match content_type {
        Some(ct) if !is_json(ct) => {
            return refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "Content-Type {:?} refused: send application/json (or no body)",
                    String::from_utf8_lossy(ct.as_bytes())
                ),
            )
        }
        None if has_body => {
            return refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "a body needs Content-Type: application/json".into(),
            )
        }
        _ => {}
    }
    if matches!(length, Some(Some(n)) if n > MAX_BODY as u64) {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body larger than {MAX_BODY} bytes"),
        );
    }
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body larger than {MAX_BODY} bytes (or cut short)"),
            )
        }
        Err(_) => {
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                format!("body not received within {BODY_TIMEOUT:?}"),
            )
        }
    };
    let mut answer = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let h = answer.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    answer
}

/// `application/json`, with parameters (`; charset=utf-8`) or without.
fn is_json(ct: &HeaderValue) -> bool {
    ct.to_str().is_ok_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Any path no route takes (after the checks: unknown paths need the token too).
pub(crate) async fn not_found() -> Response {
    error_answer(StatusCode::NOT_FOUND, "no such admin endpoint").into_response()
}

/// Serves `app` on `listener` with the limits of the module documentation; returns only
/// when the listener fails for good.
/// `open` counts the connections being served (a process that upgraded waits for them
/// before it exits: the answer to `POST /upgrade` is one).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    open: Arc<std::sync::atomic::AtomicUsize>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "admin API: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "admin API: {MAX_CONNECTIONS} connections open; closing a new one");
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(app.clone().layer(Extension(ConnectInfo(peer))));
        let open = OpenConnection::new(open.clone());
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .max_buf_size(MAX_HEAD);
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "admin connection ended with an error");
            }
            drop(slot);
            drop(open);
        });
    }
}

/// One admin connection in [`serve`]'s count while it lives.
struct OpenConnection(Arc<std::sync::atomic::AtomicUsize>);

impl OpenConnection {
    fn new(count: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        OpenConnection(count)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> Guard {
        let admin = AdminConfig {
            listen: "0.0.0.0:6034".into(),
            allowed_hosts: vec!["Admin.Example".into()],
            ..AdminConfig::default()
        };
        Guard::new(
            AdminToken::new("0123456789abcdef0123"),
            &admin,
            Default::default(),
        )
    }

    #[test]
    fn hosts_that_name_this_api() {
        let g = guard();
        for ok in [
            "localhost:6034",
            "LOCALHOST",
            "127.0.0.1:6034",
            "10.0.0.7:6034",
            "[::1]:6034",
            "[::1]",
            "admin.example:6034",
            "admin.example.",
            "0.0.0.0:6034",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for refused in [
            "evil.example:6034",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:6034",
            "",
            ":6034",
            "localhost:80x",
            "[::1]x",
            "a b",
            "admin.example@evil",
        ] {
            assert!(!g.host_allowed(refused), "{refused}");
        }
    }

    #[test]
    fn bearer_tokens() {
        let g = guard();
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            g.token_ok(&h)
        };
        assert!(with("Bearer 0123456789abcdef0123"));
        assert!(with("bearer 0123456789abcdef0123"));
        assert!(with("BEARER  0123456789abcdef0123 "));
        assert!(!with("Bearer 0123456789abcdef012"));
        assert!(!with("Bearer "));
        assert!(!with("Basic 0123456789abcdef0123"));
        assert!(!with("0123456789abcdef0123"));
        assert!(!g.token_ok(&HeaderMap::new()));
    }

    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            " application/json ",
        ] {
            assert!(is_json(&HeaderValue::from_static(ok)), "{ok}");
        }
        for refused in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "",
        ] {
            assert!(!is_json(&HeaderValue::from_static(refused)), "{refused}");
        }
    }
}
