//! The admin API is safe to expose: every request but `GET /health` needs the bearer token,
//! requests a web page could send (another Origin, another Host, a non-JSON body) are
//! refused, and `/restart` / `/resize` run only the binaries and set only the options the
//! config allows.

use holdfast_it::{Harness, Options};

fn primary(h: &Harness) -> String {
    h.status().topology.primary.unwrap_or_default()
}

/// The status code expected, the headers and the body of a request that must be refused.
type Refused<'a> = (u16, Vec<(&'a str, &'a str)>, Option<&'a str>);

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// No token or a wrong one: 401 with a JSON error, and the operation does not run.
#[test]
fn requests_without_the_token_are_refused_and_change_nothing() {
    let h = Harness::start_with(Options::default().replicas(1));
    assert_eq!(primary(&h), "node1");
    let wrong = bearer(&"0".repeat(h.admin_token().len()));
    let almost = bearer(&h.admin_token()[..h.admin_token().len() - 1]);
    let cases: [&[(&str, &str)]; 5] = [
        &[],
        &[("Authorization", &wrong)],
        &[("Authorization", &almost)],
        &[("Authorization", h.admin_token())],
        &[("Authorization", "Basic YWRtaW46YWRtaW4=")],
    ];
    for headers in cases {
        let a = h.admin_raw("POST", "/switchover?to=node2", headers, None);
        assert_eq!(a.code, 401, "{headers:?}: {a:?}");
        assert!(a.error().contains("token"), "{a:?}");
        assert!(
            a.header("www-authenticate")
                .is_some_and(|v| v.starts_with("Bearer")),
            "{a:?}"
        );
        assert_eq!(
            primary(&h),
            "node1",
            "a refused switchover ran: {headers:?}"
        );
    }
    // Reads need it too; /health does not, and tells nothing.
    for path in ["/status", "/metrics", "/usage", "/nothing-here"] {
        let a = h.admin_raw("GET", path, &[], None);
        assert_eq!(a.code, 401, "GET {path}: {a:?}");
        assert!(!a.body.contains("node1"), "{a:?}");
    }
    // So do the node operations: nothing is removed, reloaded or upgraded without it.
    for path in [
        "/nodes/remove?name=node2&drain_ms=0",
        "/nodes/add?name=x&address=127.0.0.1:1",
        "/reload",
        "/upgrade",
        "/sessions/kill?id=1073741825",
    ] {
        let a = h.admin_raw("POST", path, &[], None);
        assert_eq!(a.code, 401, "POST {path}: {a:?}");
    }
    assert_eq!(
        h.shared.membership.members.borrow().len(),
        2,
        "a refused removal ran"
    );
    let a = h.admin_raw("GET", "/health", &[], None);
    assert_eq!(a.code, 200, "{a:?}");
    assert_eq!(a.body, r#"{"status":"ok"}"#);
    // With the token (the scheme is case-insensitive) the switchover runs.
    let auth = format!("bearer {}", h.admin_token());
    let a = h.admin_raw("GET", "/status", &[("Authorization", &auth)], None);
    assert_eq!(a.code, 200, "{a:?}");
    let a = h.admin_raw(
        "POST",
        "/switchover?to=node2",
        &[("Authorization", &bearer(h.admin_token()))],
        None,
    );
    assert_eq!(a.code, 200, "{a:?}");
    assert_eq!(primary(&h), "node2");
}

/// What a web page on the operator's machine could send: another Origin, a Host that is not
/// the admin API (DNS rebinding), a form or text/plain body (no CORS preflight for those).
/// None of them runs, even with the token; and nothing answers with CORS headers.
#[test]
fn cross_site_requests_are_refused() {
    let h = Harness::start_with(Options::default().replicas(1));
    let auth = bearer(h.admin_token());
    let evil_host = format!("evil.example:{}", h.admin.port());
    let own_origin = format!("http://{}", h.admin);
    let refused: Vec<Refused> = vec![
        (
            403,
            vec![("Authorization", &auth), ("Origin", "http://evil.example")],
            None,
        ),
        (
            403,
            vec![("Authorization", &auth), ("Origin", "null")],
            None,
        ),
        (
            403,
            vec![
                ("Authorization", &auth),
                ("Origin", "http://evil.example"),
                ("Content-Type", "application/json"),
            ],
            Some(r#"{"to":"node2"}"#),
        ),
        (
            403,
            vec![("Authorization", &auth), ("Host", &evil_host)],
            None,
        ),
        (
            403,
            vec![("Authorization", &auth), ("Host", "evil.example")],
            None,
        ),
        (
            415,
            vec![("Authorization", &auth), ("Content-Type", "text/plain")],
            Some(r#"{"to":"node2"}"#),
        ),
        (
            415,
            vec![
                ("Authorization", &auth),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            Some("to=node2"),
        ),
        // A body without a Content-Type is not taken for JSON either.
        (
            415,
            vec![("Authorization", &auth)],
            Some(r#"{"to":"node2"}"#),
        ),
    ];
    for (code, headers, body) in &refused {
        let a = h.admin_raw("POST", "/switchover", headers, *body);
        assert_eq!(a.code, *code, "{headers:?} {body:?}: {a:?}");
        assert!(!a.error().is_empty());
        assert_eq!(
            primary(&h),
            "node1",
            "a refused switchover ran: {headers:?}"
        );
    }
    // A preflight gets no CORS answer.
    let a = h.admin_raw(
        "OPTIONS",
        "/switchover",
        &[
            ("Origin", "http://evil.example"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization"),
        ],
        None,
    );
    assert!(a.code >= 400, "{a:?}");
    // The API's own origin, localhost and IP literals as Host are fine.
    for headers in [
        vec![
            ("Authorization", auth.as_str()),
            ("Origin", own_origin.as_str()),
        ],
        vec![
            ("Authorization", auth.as_str()),
            ("Host", &*format!("localhost:{}", h.admin.port())),
        ],
    ] {
        let a = h.admin_raw("GET", "/status", &headers, None);
        assert_eq!(a.code, 200, "{headers:?}: {a:?}");
        assert!(
            a.headers
                .iter()
                .all(|(k, _)| !k.starts_with("access-control-")),
            "{a:?}"
        );
    }
    // A JSON body with the token: the switchover runs.
    let a = h.admin_raw(
        "POST",
        "/switchover",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json; charset=utf-8"),
            ("Origin", &own_origin),
        ],
        Some(r#"{"to":"node2"}"#),
    );
    assert_eq!(a.code, 200, "{a:?}");
    assert_eq!(primary(&h), "node2");
}

/// Bodies are bounded, and `/restart` / `/resize` refuse binaries and options the config
/// does not list (before anything is switched over or restarted).
#[test]
fn restart_and_resize_run_only_what_the_config_allows() {
    let h = Harness::start();
    let auth = bearer(h.admin_token());
    for (path, names) in [
        ("/restart?node=node1&binary=/bin/sh", "binaries"),
        (
            "/restart?node=node1&binary=/usr/sbin/../sbin/../../bin/sh",
            "binaries",
        ),
        (
            "/resize?node=node1&set=general_log_file=/tmp/holdfast-pwned",
            "allowed_options",
        ),
        (
            "/resize?node=node1&set=max_connections=500,plugin_dir=/tmp",
            "allowed_options",
        ),
        ("/resize?node=node1&set=--general-log=ON", "allowed_options"),
    ] {
        let (code, body) = h.admin_post(path, None);
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains(names), "{path}: {body}");
    }
    assert!(
        h.lab
            .primary()
            .pid
            .is_some_and(|p| { std::fs::read_to_string(format!("/proc/{p}/cmdline")).is_ok() }),
        "node1 still runs"
    );
    assert!(!std::path::Path::new("/tmp/holdfast-pwned").exists());

    // A body larger than the limit is refused from its declared length, unread.
    let a = h.admin_raw(
        "POST",
        "/switchover",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("Content-Length", "1048576"),
        ],
        None,
    );
    assert_eq!(a.code, 413, "{a:?}");
}
