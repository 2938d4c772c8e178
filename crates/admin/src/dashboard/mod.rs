//! The live dashboard: a page at `/` that reads `/status` once a second and draws what an
//! operator watches during a switchover (topology, sessions, commands/s, moves, held
//! requests, the serverless phase, the event log), served from the binary: no CDN, no
//! build step, no script from anywhere else (`Content-Security-Policy: default-src 'self'`).
//!
//! Logging a browser in: `holdfast ctl dashboard` asks `POST /dashboard/link` (with the
//! bearer token) for a one-time code and prints a link to `/login?code=...`. The code is
//! good once, for [`CODE_LIFETIME`]; redeemed, it becomes a cookie (HttpOnly,
//! SameSite=Strict) that lets the browser make GET requests for [`SESSION_LIFETIME`]. The
//! token itself never goes into a URL, and a cookie never changes anything: every POST still
//! needs the token.
//!
//! Costs: the page reads only what `/status` shows; a hundred open tabs are a hundred
//! polls a second on the admin listener (bounded by its connection limit) and at most
//! [`MAX_SESSIONS`] remembered logins.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use holdfast_config::AdminToken;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a printed link can be used.
pub const CODE_LIFETIME: Duration = Duration::from_secs(120);
/// How long a logged-in browser stays logged in.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Logged-in browsers remembered at once; a login past it forgets the oldest.
pub const MAX_SESSIONS: usize = 32;
/// Unused links at once; a link past it forgets the oldest.
const MAX_CODES: usize = 16;
/// The cookie's name.
pub const COOKIE: &str = "holdfast_dashboard";

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("dashboard.js");
const STYLE: &str = include_str!("dashboard.css");

/// A secret (made and compared as the admin token is: 32 bytes from the OS's CSPRNG as
/// hex, compared in constant time, zeroized when dropped) with its expiry.
struct Secret {
    value: AdminToken,
    expires: Instant,
}

/// The one-time codes and the logged-in browsers.
#[derive(Default)]
pub struct Logins {
    codes: Mutex<Vec<Secret>>,
    sessions: Mutex<Vec<Secret>>,
}

impl Logins {
    /// A new one-time code.
    pub fn issue_code(&self) -> AdminToken {
        let code = AdminToken::generate();
        remember(&mut lock(&self.codes), &code, CODE_LIFETIME, MAX_CODES);
        code
    }

    /// Takes a code; a cookie value for a new logged-in browser if the code was good.
    fn redeem(&self, code: &str) -> Option<AdminToken> {
        let now = Instant::now();
        {
            let mut codes = lock(&self.codes);
            codes.retain(|c| c.expires > now);
            let i = codes
                .iter()
                .position(|c| c.value.matches(code.as_bytes()))?;
            codes.swap_remove(i);
        }
        let cookie = AdminToken::generate();
        remember(
            &mut lock(&self.sessions),
            &cookie,
            SESSION_LIFETIME,
            MAX_SESSIONS,
        );
        Some(cookie)
    }

    /// Whether the request carries the cookie of a logged-in browser.
    pub fn cookie_ok(&self, headers: &HeaderMap) -> bool {
        let Some(value) = cookie_value(headers) else {
            return false;
        };
        let now = Instant::now();
        let mut sessions = lock(&self.sessions);
        sessions.retain(|s| s.expires > now);
        sessions.iter().any(|s| s.value.matches(value.as_bytes()))
    }
}

/// Poisoning would mean a panic while holding a list of secrets; the list is still whole.
fn lock(m: &Mutex<Vec<Secret>>) -> std::sync::MutexGuard<'_, Vec<Secret>> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn remember(list: &mut Vec<Secret>, value: &AdminToken, lifetime: Duration, max: usize) {
    let now = Instant::now();
    list.retain(|s| s.expires > now);
    if list.len() >= max {
        list.remove(0);
    }
    list.push(Secret {
        value: value.clone(),
        expires: now + lifetime,
    });
}

/// The dashboard cookie's value in a request's `Cookie` headers.
fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// What `POST /dashboard/link` answers.
#[derive(Debug, Serialize, Deserialize)]
pub struct Link {
    /// The path (with its one-time code) a browser opens on this admin listener.
    pub path: String,
    pub expires_in_secs: u64,
}

/// `POST /dashboard/link`: a one-time login link.
pub(crate) async fn post_link(State(logins): State<Arc<Logins>>) -> Response {
    let code = logins.issue_code();
    let link = Link {
        path: format!("/login?code={}", code.expose()),
        expires_in_secs: CODE_LIFETIME.as_secs(),
    };
    (StatusCode::OK, axum::Json(link)).into_response()
}

#[derive(Deserialize)]
pub(crate) struct CodeQuery {
    code: Option<String>,
}

/// `GET /login?code=...`: a good code logs the browser in and sends it to the dashboard.
pub(crate) async fn get_login(
    State(logins): State<Arc<Logins>>,
    Query(q): Query<CodeQuery>,
) -> Response {
    let Some(cookie) = q.code.as_deref().and_then(|c| logins.redeem(c)) else {
        tracing::warn!("admin: a dashboard link was refused (unknown, used or expired)");
        return crate::error_answer(
            StatusCode::UNAUTHORIZED,
            "this dashboard link is unknown, used or expired: run `holdfast ctl dashboard` \
             for a new one",
        );
    };
    tracing::info!("admin: a browser logged in to the dashboard");
    let set = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        cookie.expose(),
        SESSION_LIFETIME.as_secs()
    );
    let mut answer = (StatusCode::SEE_OTHER, "logged in").into_response();
    let headers = answer.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_static("/"));
    if let Ok(v) = HeaderValue::from_str(&set) {
        headers.insert(header::SET_COOKIE, v);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    answer
}

/// `GET /`: the page.
pub(crate) async fn get_page() -> Response {
    asset(PAGE, "text/html; charset=utf-8")
}

/// `GET /dashboard.js`.
pub(crate) async fn get_script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

/// `GET /dashboard.css`.
pub(crate) async fn get_style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut answer = (StatusCode::OK, body).into_response();
    let h = answer.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={value}")).unwrap(),
        );
        h
    }

    #[test]
    fn a_code_is_good_once_and_its_cookie_lets_the_browser_in() {
        let logins = Logins::default();
        let code = logins.issue_code();
        let cookie = logins.redeem(code.expose()).expect("a fresh code");
        assert!(
            logins.redeem(code.expose()).is_none(),
            "a code is good once"
        );
        assert!(logins.cookie_ok(&with_cookie(cookie.expose())));
        assert!(
            !logins.cookie_ok(&with_cookie(code.expose())),
            "a code is not a cookie"
        );
        assert!(!logins.cookie_ok(&with_cookie("")));
        assert!(!logins.cookie_ok(&HeaderMap::new()));
        assert!(logins.redeem("").is_none());
    }

    #[test]
    fn logins_past_the_limit_forget_the_oldest() {
        let logins = Logins::default();
        let cookies: Vec<_> = (0..=MAX_SESSIONS)
            .map(|_| {
                let code = logins.issue_code();
                logins.redeem(code.expose()).expect("a fresh code")
            })
            .collect();
        assert!(!logins.cookie_ok(&with_cookie(cookies[0].expose())));
        assert!(logins.cookie_ok(&with_cookie(cookies[MAX_SESSIONS].expose())));
        assert_eq!(lock(&logins.sessions).len(), MAX_SESSIONS);
    }
}
