//! The dashboard in a real browser: Debian's headless Chromium, driven over the DevTools
//! protocol, logs in with the link `holdfast ctl dashboard` prints, shows the lab's primary,
//! and after a switchover shows the new primary and the event within seconds. A screenshot
//! is saved as the test's artifact; the page must log no error to the console.

mod common;

use common::{holdfast, lab_up, run, Lab, Serving};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn chromium() -> PathBuf {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("Chromium is needed for the dashboard's test: scripts/deps.sh installs it (apt-get install chromium)")
}

/// A page in headless Chromium, spoken to over the DevTools protocol.
struct Browser {
    ws: tungstenite::WebSocket<TcpStream>,
    session: String,
    next_id: u64,
    /// Exceptions and console errors the page reported.
    errors: Vec<String>,
    _process: Serving,
    _profile: PathBuf,
}

impl Browser {
    fn open(url: &str, profile: PathBuf) -> Browser {
        std::fs::create_dir_all(&profile).expect("a profile directory");
        let mut child = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-port=0",
                "--window-size=1280,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting chromium");
        let stderr = child.stderr.take().expect("chromium's stderr");
        let process = Serving(child);
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("ws://") {
                    let _ = tx.send(line[at..].trim().to_string());
                }
            }
        });
        let endpoint = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium says where its DevTools listen");
        let address = endpoint
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .expect("host:port")
            .to_string();
        let stream = TcpStream::connect(&address).expect("connecting to DevTools");
        // The handshake may take a while on a busy machine (a timeout here would cut it
        // short); reads after it wake every 200 ms to check their deadline.
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("a read timeout");
        let (ws, _) = tungstenite::client(endpoint.as_str(), stream).expect("a DevTools socket");
        ws.get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("a read timeout");
        let mut b = Browser {
            ws,
            session: String::new(),
            next_id: 0,
            errors: Vec::new(),
            _process: process,
            _profile: profile,
        };
        let target = b.call(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let target = target["targetId"].as_str().expect("a target").to_string();
        let attached = b.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
        );
        b.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_string();
        let session = Some(b.session.clone());
        b.call(session.as_deref(), "Runtime.enable", json!({}));
        b.call(session.as_deref(), "Page.enable", json!({}));
        b.call(session.as_deref(), "Page.navigate", json!({ "url": url }));
        b
    }

    /// Sends a command and waits for its answer, noting the page's errors meanwhile.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            message["sessionId"] = json!(s);
        }
        self.ws
            .send(tungstenite::Message::text(message.to_string()))
            .expect("sending to DevTools");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "no answer to {method}");
            let text = match self.ws.read() {
                Ok(tungstenite::Message::Text(t)) => t.to_string(),
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => panic!("DevTools: {e}"),
            };
            let v: Value = serde_json::from_str(&text).expect("DevTools JSON");
            match v["method"].as_str() {
                Some("Runtime.exceptionThrown") => self
                    .errors
                    .push(v["params"]["exceptionDetails"].to_string()),
                Some("Runtime.consoleAPICalled")
                    if matches!(v["params"]["type"].as_str(), Some("error" | "assert")) =>
                {
                    self.errors.push(v["params"]["args"].to_string())
                }
                _ => {}
            }
            if v["id"].as_u64() == Some(id) {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let session = self.session.clone();
        let r = self.call(
            Some(&session),
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
        );
        r["result"]["value"].clone()
    }

    /// Waits up to `within` for `expression` to be true in the page.
    fn wait_until(&mut self, what: &str, expression: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while self.eval(expression) != json!(true) {
            assert!(
                Instant::now() < deadline,
                "the page did not show {what} within {within:?}; its text:\n{}",
                self.eval("document.body.innerText")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&mut self, to: &Path) {
        use base64::Engine;
        let session = self.session.clone();
        let r = self.call(
            Some(&session),
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("base64");
        std::fs::write(to, png).expect("writing the screenshot");
    }
}

/// A plain HTTP/1.1 GET to the admin listener, with `header` (a whole line, or nothing):
/// its status line and headers, then body.
fn http_get(admin: &str, path: &str, header: Option<&str>) -> String {
    let mut s = TcpStream::connect(admin).expect("the admin listener");
    let header = header.map(|h| format!("{h}\r\n")).unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {admin}\r\n{header}Connection: close\r\n\r\n"
    )
    .expect("a request");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
}

fn ctl(config: &Path, args: &[&str]) -> String {
    let out = run(holdfast().arg("ctl").arg("--config").arg(config).args(args));
    assert!(
        out.status.success(),
        "ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_dashboard_shows_a_switchover_live_in_a_browser() {
    let dir = std::env::temp_dir().join(format!("holdfast-dashboard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base = lab_up(&dir, &["--replicas", "1"]);
    let _lab = Lab(dir.clone());
    let config = dir.join("holdfast.toml");
    let text = std::fs::read_to_string(&config).expect("the lab's config");
    let parsed: toml::Value = toml::from_str(&text).expect("TOML");
    let admin = parsed["admin"]["listen"]
        .as_str()
        .expect("[admin] listen")
        .to_string();
    let log = dir.join("serve.log");
    let _served = Serving(
        holdfast()
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("a log"))
            .spawn()
            .expect("holdfast serve"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = run(holdfast()
            .args(["ctl", "--config"])
            .arg(&config)
            .args(["status", "--json"]));
        let primary = serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|s| s["topology"]["primary"].as_str().map(String::from));
        if primary.as_deref() == Some("node1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "holdfast does not serve:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Without a login, the page is there but the status is not.
    assert!(http_get(&admin, "/", None).starts_with("HTTP/1.1 200"));
    assert!(http_get(&admin, "/status", None).starts_with("HTTP/1.1 401"));

    let link = ctl(&config, &["dashboard"]).trim().to_string();
    assert!(
        link.starts_with(&format!("http://{admin}/login?code=")),
        "{link}"
    );
    let token = std::fs::read_to_string(dir.join("admin.token")).expect("the token");
    assert!(!link.contains(token.trim()), "the token is never in a URL");

    // A client to find in the session table, and to see moved.
    let url = format!("mysql://app:app_pass@127.0.0.1:{base}/sbtest?prefer_socket=false");
    let mut client =
        mysql::Conn::new(mysql::Opts::from_url(&url).expect("url")).expect("a session");
    use mysql::prelude::Queryable;
    client.query_drop("SET @who = 'dash'").expect("a statement");

    let mut browser = Browser::open(&link, dir.join("chromium-profile"));
    browser.wait_until(
        "the primary",
        "document.getElementById('primary').textContent === 'node1'",
        Duration::from_secs(20),
    );
    browser.wait_until(
        "both nodes",
        "document.querySelectorAll('#nodes tbody tr').length === 2",
        Duration::from_secs(5),
    );
    browser.wait_until(
        "the client's session",
        "document.querySelectorAll('#sessions tbody tr').length === 1 && \
         document.querySelector('#sessions tbody tr').innerText.includes('app')",
        Duration::from_secs(5),
    );
    // An error the server sends the client shows, by its code (read from /metrics).
    assert!(client
        .query_drop("SELECT * FROM sbtest.no_such_table")
        .is_err());
    browser.wait_until(
        "the error by its code",
        "document.getElementById('errors').innerText.includes('1146: 1')",
        Duration::from_secs(12),
    );
    // The page asks the server for the sessions its finder matches, a page's worth.
    let bearer = format!("Authorization: Bearer {}", token.trim());
    let found = |query: &str| -> Value {
        let answer = http_get(&admin, &format!("/status?{query}"), Some(&bearer));
        let body = answer.split("\r\n\r\n").nth(1).expect("a body");
        serde_json::from_str(body).expect("status JSON")
    };
    let none = found("find=nobody-here");
    assert_eq!(none["sessions"].as_array().map(Vec::len), Some(0));
    assert_eq!(none["counters"]["sessions_open"], 1);
    assert_eq!(
        found("find=APP&sessions_max=5")["sessions"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        found("sessions_max=0")["sessions"].as_array().map(Vec::len),
        Some(0)
    );
    // The cookie is out of the page's reach, and the link worked once.
    assert_eq!(browser.eval("document.cookie"), json!(""));
    let path = link.trim_start_matches(&format!("http://{admin}"));
    assert!(http_get(&admin, path, None).starts_with("HTTP/1.1 401"));

    // A statement that runs for a while shows in its session's row, and the finder finds
    // it by its text. The operator ends that session from the page, with the admin token
    // typed in (two clicks): its client's connection is gone, as after a server's KILL.
    let slow = std::thread::spawn(move || {
        let mut other =
            mysql::Conn::new(mysql::Opts::from_url(&url).expect("url")).expect("a session");
        let slept: mysql::Result<Option<i64>> =
            other.query_first("SELECT SLEEP(30) AS waiting_for_the_dashboard");
        slept.map_err(|e| e.to_string())
    });
    browser.wait_until(
        "the slow statement in its session's row",
        "[...document.querySelectorAll('#sessions tbody tr')].some(r => \
           r.children[9].innerText.startsWith('running') \
           && r.children[9].innerText.includes('SELECT SLEEP(30) AS waiting_for_the_dashboard'))",
        Duration::from_secs(5),
    );
    let running = found("find=WAITING_FOR_THE");
    let rows = running["sessions"].as_array().expect("sessions");
    assert_eq!(rows.len(), 1, "{running}");
    assert_eq!(rows[0]["state"], "running");
    assert!(rows[0]["statement_ms"].as_u64().is_some_and(|ms| ms >= 500));
    let victim = rows[0]["id"].as_u64().expect("an id");
    // Without the token the page only says what it needs.
    let end = format!("document.querySelector('[data-end=\"{victim}\"]').click()");
    browser.eval(&end);
    browser.wait_until(
        "the page asking for the token",
        "document.getElementById('action-result').innerText.includes('type the admin token')",
        Duration::from_secs(2),
    );
    browser.eval(&format!(
        "document.getElementById('token').value = {}",
        json!(token.trim())
    ));
    browser.eval(&end);
    browser.wait_until(
        "the button asking to be sure",
        &format!("document.querySelector('[data-end=\"{victim}\"]').innerText === 'sure?'"),
        Duration::from_secs(2),
    );
    browser.eval(&end);
    browser.wait_until(
        "the session ended",
        &format!(
            "document.getElementById('action-result').innerText \
               .startsWith('session {victim} ended (KILL of thread ')"
        ),
        Duration::from_secs(5),
    );
    let answer = slow.join().expect("the slow client");
    assert!(
        answer.is_err(),
        "the client's statement was cut: {answer:?}"
    );
    let gone = Instant::now() + Duration::from_secs(10);
    while found(&format!("find={victim}"))["sessions"]
        .as_array()
        .map(Vec::len)
        != Some(0)
    {
        assert!(Instant::now() < gone, "the ended session is still open");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The first client's row says it is idle and shows no statement.
    let quiet = found("sessions_max=1");
    assert_eq!(quiet["sessions"][0]["state"], "idle", "{quiet}");
    assert!(quiet["sessions"][0].get("statement").is_none(), "{quiet}");

    let started = Instant::now();
    ctl(&config, &["switchover", "--to", "node2"]);
    browser.wait_until(
        "the new primary and the switchover",
        "document.getElementById('primary').textContent === 'node2' && \
         document.getElementById('events').innerText.includes('switchover done') && \
         document.getElementById('events').innerText.includes('primary node1 → node2')",
        Duration::from_secs(10),
    );
    // The events are holdfast's, not the page's: a page opened later shows them too.
    let status: Value =
        serde_json::from_str(&ctl(&config, &["status", "--json"])).expect("status JSON");
    let told: Vec<&str> = status["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(
        told.iter().any(|t| t.starts_with("switchover done")),
        "{told:?}"
    );
    // Holdfast's own start is no event: the nodes were reachable all along.
    assert!(
        !told.iter().any(|t| t.contains("reachable again")),
        "{told:?}"
    );
    let who: Option<String> = client
        .query_first("SELECT @who")
        .expect("the session goes on");
    assert_eq!(who.as_deref(), Some("dash"));
    // The session's row says it moved once, to node2.
    browser.wait_until(
        "the session moved",
        "(() => { const c = document.querySelector('#sessions tbody tr').children; \
           return c[3].innerText === 'node2' && c[6].innerText === '1' \
             && c[8].innerText.includes('node1 → node2 (primary_changed'); })()",
        Duration::from_secs(5),
    );
    eprintln!(
        "the page showed the switchover {:.1} s after it was asked for",
        started.elapsed().as_secs_f64()
    );
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    browser.screenshot(&shot);
    eprintln!("screenshot: {}", shot.display());
    assert!(std::fs::metadata(&shot).expect("a screenshot").len() > 10_000);
    // On a phone's screen: nothing wider than the screen but the tables, which scroll.
    let session = browser.session.clone();
    browser.call(
        Some(&session),
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true }),
    );
    browser.wait_until(
        "the page within a phone's width",
        "document.documentElement.scrollWidth <= window.innerWidth + 1",
        Duration::from_secs(5),
    );
    let phone = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-phone.png");
    browser.screenshot(&phone);
    eprintln!("screenshot on a phone's screen: {}", phone.display());
    // A last look for errors the page logged.
    browser.eval("1");
    assert!(
        browser.errors.is_empty(),
        "the page logged errors: {:?}",
        browser.errors
    );
}
