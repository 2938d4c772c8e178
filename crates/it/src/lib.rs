//! Harness for holdfast's integration tests: a [`TestLab`] of real `mariadbd` processes
//! with holdfast's proxy and admin API running in-process in front of it, plus helpers to
//! drive real clients (the `mariadb` CLI, Python drivers, sysbench) and a small raw
//! protocol client ([`raw`]) for byte-level tests.
//!
//! Every wait here has a deadline; nothing sleeps and hopes.

pub mod differential;
pub mod fuzz;
pub mod raw;
pub mod rogue;

use anyhow::{bail, Context, Result};
use holdfast_config::{
    AdminConfig, AuthConfig, BackendConfig, Config, DriverConfig, HaConfig, HaMode, ProxyConfig,
    ServerlessConfig,
};
use holdfast_lab::TestLab;
use holdfast_proxy::{Proxy, Seams, Shared};
use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the harness waits for the monitor and the verifier cache after start.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A change to the proxy configuration, applied before it starts.
pub type ConfigTweak = Box<dyn FnOnce(&mut Config)>;

/// Options for [`Harness::start_with`].
#[derive(Default)]
pub struct Options {
    /// Extra `mariadbd` options (e.g. `--max-allowed-packet=256M`).
    pub server_args: Vec<String>,
    /// Changes to the proxy configuration before it starts.
    pub tweak: Option<ConfigTweak>,
    /// Replicas of node1 in the lab (see [`Options::replicas`]).
    pub replicas: usize,
    /// Make node1 a serverless instance (see [`Options::serverless`]).
    pub serverless: Option<ServerlessTweak>,
}

/// A change to the serverless section the lab writes, applied before the proxy starts.
pub type ServerlessTweak = Box<dyn FnOnce(&mut ServerlessConfig)>;

impl Options {
    pub fn server_args(mut self, args: &[&str]) -> Self {
        self.server_args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// A lab with `n` replicas of node1. Every node becomes a backend and `[ha]` is set to
    /// managed mode with the lab's replication account (tweaks apply afterwards).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// node1 becomes a serverless instance run by the process driver, with the section
    /// `holdfast lab up --serverless` writes (idle pause and the rest changed by `f`).
    pub fn serverless(mut self, f: impl FnOnce(&mut ServerlessConfig) + 'static) -> Self {
        self.serverless = Some(Box::new(f));
        self
    }

    pub fn config(mut self, f: impl FnOnce(&mut Config) + 'static) -> Self {
        self.tweak = Some(Box::new(f));
        self
    }
}

/// A lab with holdfast in front of its primary. Dropping it stops the proxy (the runtime
/// is shut down) and then the lab.
pub struct Harness {
    /// holdfast's MySQL listener.
    pub proxy: SocketAddr,
    /// holdfast's admin HTTP listener.
    pub admin: SocketAddr,
    /// The `[[listener]]`s the test configured, in order.
    pub listeners: Vec<SocketAddr>,
    /// The proxy's shared state (metrics, registry, topology).
    pub shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    /// Declared last: dropped after the runtime, so the proxy is gone before the servers.
    pub lab: TestLab,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            // Allowed from any context, unlike dropping the runtime.
            rt.shutdown_background();
        }
    }
}

impl Harness {
    /// A lab with one primary and holdfast with the default configuration.
    pub fn start() -> Harness {
        Self::start_with(Options::default())
    }

    pub fn start_with(opts: Options) -> Harness {
        Self::try_start(opts).unwrap_or_else(|e| panic!("starting the test harness: {e:#}"))
    }

    fn try_start(opts: Options) -> Result<Harness> {
        // `HOLDFAST_IT_LOG=holdfast_proxy=debug cargo nextest run ... --no-capture`: the
        // proxy's log on stderr while a test runs.
        if let Ok(filter) = std::env::var("HOLDFAST_IT_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init();
        }
        let lab =
            TestLab::start_with(opts.replicas, opts.server_args).context("starting the lab")?;
        let st = &lab.status;
        let mut cfg = lab_config(&lab);
        if opts.serverless.is_some() {
            // As the README says: resizing the buffer pool takes SUPER.
            let monitor = &st.monitor_user;
            holdfast_lab::node_sql(
                lab.primary(),
                &format!(
                    "GRANT SUPER ON *.* TO '{monitor}'@'%'; \
                     GRANT SUPER ON *.* TO '{monitor}'@'localhost'"
                ),
            )
            .context("granting the monitor SUPER for the serverless scaler")?;
        }
        if let Some(f) = opts.serverless {
            let mut section = holdfast_lab::serverless_section(&st.dir, lab.primary())
                .context("the lab's serverless section")?;
            f(&mut section);
            cfg.serverless = Some(section);
        }
        if let Some(f) = opts.tweak {
            f(&mut cfg);
        }
        cfg.validate().context("test configuration")?;
        let runtime = runtime().context("building the proxy runtime")?;
        let token = st
            .admin_token
            .clone()
            .context("the lab wrote no admin token")?;
        let (proxy, admin, listeners, shared) = runtime.block_on(async {
            let seams = Seams {
                node_driver: Some(Arc::new(holdfast_lab::LabNodeDriver {
                    dir: st.dir.clone(),
                })),
                ..Seams::default()
            };
            let proxy = Proxy::start_with(cfg, seams)
                .await
                .context("binding the proxy")?;
            let admin = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .context("binding the admin listener")?;
            let proxy_addr = proxy.local_addr()?;
            let listeners: Vec<SocketAddr> =
                proxy.listener_addrs().into_iter().map(|(a, _)| a).collect();
            let admin_addr = admin.local_addr()?;
            let shared = proxy.shared.clone();
            tokio::spawn(proxy.run());
            tokio::spawn(holdfast_admin::serve(admin, shared.clone(), token));
            anyhow::Ok((proxy_addr, admin_addr, listeners, shared))
        })?;
        let h = Harness {
            proxy,
            admin,
            listeners,
            shared,
            runtime: Some(runtime),
            lab,
        };
        let shared = h.shared.clone();
        wait_for(
            "the monitor to see the primary and the verifiers to load",
            READY_TIMEOUT,
            || {
                let topo = shared.topology.borrow().clone();
                // With commit markers on, tests start once COMMITs carry them.
                let markers = !shared.config().ha.commit_markers
                    || shared
                        .commit_markers_ready
                        .load(std::sync::atomic::Ordering::Acquire);
                (topo.primary.is_some() && shared.verifiers.is_loaded() && markers).then_some(())
            },
        );
        Ok(h)
    }

    /// Stops holdfast (its runtime and every task in it) and leaves the lab running, as if
    /// the process had died.
    pub fn stop_proxy(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }

    /// Writes `cfg` as holdfast's configuration file in the lab's directory, as an operator
    /// keeps one (TOML, mode 0600, the passwords in files beside it, mode 0600 too), and
    /// returns its path. The first call makes it the file holdfast runs from (as `holdfast
    /// serve --config` does): `/status` shows it and `POST /reload` reads it again.
    pub fn write_config(&self, cfg: &Config) -> std::path::PathBuf {
        let dir = &self.lab.status.dir;
        let mut cfg = cfg.clone();
        let secret_file = |name: &str, secret: &holdfast_config::Secret| {
            let path = dir.join(name);
            holdfast_config::secret::write_password_file(&path, secret.expose())
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            path
        };
        if !cfg.auth.monitor_password.is_empty() {
            cfg.auth.monitor_password_file = Some(secret_file(
                "it-monitor.password",
                &cfg.auth.monitor_password,
            ));
        }
        if !cfg.ha.repl_password.is_empty() {
            cfg.ha.repl_password_file =
                Some(secret_file("it-repl.password", &cfg.ha.repl_password));
        }
        let text = cfg.to_toml().expect("the config as TOML");
        let path = self.config_path();
        self.write_config_text(&text);
        if self.shared.reloader.source().is_none() {
            self.shared.set_config_file(&path, &text);
        }
        path
    }

    /// Writes `text` as holdfast's configuration file (see [`Harness::write_config`]), as
    /// it is: a test of what a reload does with a broken file.
    pub fn write_config_text(&self, text: &str) {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = self.config_path();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        f.write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// Where [`Harness::write_config`] writes holdfast's configuration file.
    pub fn config_path(&self) -> std::path::PathBuf {
        self.lab.status.dir.join("holdfast-it.toml")
    }

    /// `POST /reload`: its status code and JSON answer.
    pub fn reload(&self) -> (u16, serde_json::Value) {
        let (code, body) = self.admin_post("/reload", None);
        let v = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("POST /reload answered {code}, not JSON ({e}): {body}"));
        (code, v)
    }

    /// The lab node named `name`.
    pub fn node(&self, name: &str) -> &holdfast_lab::NodeStatus {
        self.lab
            .status
            .nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no lab node named {name}"))
    }

    /// The primary's address (to compare holdfast with the server itself).
    pub fn direct(&self) -> SocketAddr {
        self.lab.primary().address.parse().expect("primary address")
    }

    pub fn user(&self) -> &str {
        &self.lab.status.app_user
    }

    pub fn password(&self) -> &str {
        &self.lab.status.app_password
    }

    pub fn database(&self) -> &str {
        &self.lab.status.database
    }

    /// Runs SQL as root on the primary through its unix socket (setup and checks that
    /// must not go through holdfast).
    pub fn root_sql(&self, sql: &str) -> Vec<Vec<String>> {
        holdfast_lab::node_sql(self.lab.primary(), sql)
            .unwrap_or_else(|e| panic!("root SQL {sql:?} failed: {e:#}"))
    }

    /// A `mysql://` URL for the Rust `mysql` crate through holdfast. With
    /// `prefer_socket=false`: by default the crate asks the server for `@@socket` and
    /// reconnects there, which would go around holdfast.
    pub fn url(&self) -> String {
        format!(
            "mysql://{}:{}@{}:{}/{}?prefer_socket=false",
            self.user(),
            self.password(),
            self.proxy.ip(),
            self.proxy.port(),
            self.database()
        )
    }

    /// The admin API client with this holdfast's token.
    pub fn admin_client(&self) -> holdfast_admin::AdminClient {
        holdfast_admin::AdminClient::new(
            self.admin.to_string(),
            self.lab.status.admin_token.clone(),
        )
    }

    /// `GET path` on the admin API (with the token); panics unless it answers 200.
    pub fn admin_get(&self, path: &str) -> String {
        let client = self.admin_client();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (code, body) = rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(10), client.get(path)).await
            })
            .unwrap_or_else(|_| panic!("GET {path} timed out"))
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert_eq!(code, 200, "GET {path} answered {code}: {body}");
        body
    }

    /// `POST path` (with an optional JSON body and the token) on the admin API: status code
    /// and body. HA operations can take a while; the deadline is generous.
    pub fn admin_post(&self, path: &str, body: Option<&str>) -> (u16, String) {
        let client = self.admin_client();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(120), client.post(path, body)).await
        })
        .unwrap_or_else(|_| panic!("POST {path} timed out"))
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    /// The admin API token of this holdfast (the lab's `admin.token`).
    pub fn admin_token(&self) -> &str {
        self.lab
            .status
            .admin_token
            .as_ref()
            .expect("the lab has an admin token")
            .expose()
    }

    /// Sends `METHOD path` to the admin API exactly as given: `headers` as written (a `Host`
    /// naming the admin listener unless `headers` has one; no `Authorization` unless given),
    /// then `body` with its `Content-Length`. Returns the status code, the response headers
    /// (lower-cased names) and the body.
    pub fn admin_raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> RawAnswer {
        use std::io::{Read, Write};
        let mut text = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            text.push_str(&format!("Host: {}\r\n", self.admin));
        }
        for (k, v) in headers {
            text.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(b) = body {
            text.push_str(&format!("Content-Length: {}\r\n", b.len()));
        }
        text.push_str("\r\n");
        text.push_str(body.unwrap_or(""));
        let mut s = std::net::TcpStream::connect(self.admin).expect("connecting to the admin API");
        s.set_read_timeout(Some(Duration::from_secs(120))).ok();
        s.write_all(text.as_bytes()).expect("sending the request");
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).expect("reading the answer");
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status code in {answer:?}"));
        let headers = head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        RawAnswer {
            code,
            headers,
            body: body.to_string(),
        }
    }

    /// `/status` as JSON.
    pub fn status_json(&self) -> serde_json::Value {
        let body = self.admin_get("/status");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status is not JSON ({e}): {body}"))
    }

    /// `/status` as the typed struct `holdfast ctl` reads.
    pub fn status(&self) -> holdfast_admin::Status {
        let body = self.admin_get("/status");
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("/status does not parse ({e}): {body}"))
    }

    /// Switches over to `node` through the admin API, waits until the topology shows it as
    /// the primary, and returns its port.
    pub fn switch_over_to(&self, node: &str) -> u16 {
        let (code, body) = self.admin_post(&format!("/switchover?to={node}"), None);
        assert_eq!(code, 200, "{body}");
        wait_for(
            &format!("topology shows {node} as primary"),
            Duration::from_secs(20),
            || (self.status().topology.primary.as_deref() == Some(node)).then_some(()),
        );
        self.lab
            .status
            .node(node)
            .unwrap_or_else(|e| panic!("{node}: {e}"))
            .port
    }

    /// Waits until every session has captured the state only a capture reads (user
    /// variables...): sessions capture once idle, so a crash right after a statement that
    /// set user variables would lose them; tests that crash a node wait for this first.
    pub fn wait_captured(&self) {
        wait_for(
            "the sessions' state captured",
            Duration::from_secs(10),
            || {
                self.status()
                    .sessions
                    .iter()
                    .all(|s| !s.capture_due)
                    .then_some(())
            },
        );
    }

    /// `/metrics` text.
    pub fn metrics(&self) -> String {
        self.admin_get("/metrics")
    }

    /// Waits until `/status` names a primary other than `old` (a failover away from it);
    /// returns it.
    pub fn wait_primary_other_than(&self, old: &str, timeout: Duration) -> String {
        let mut last = serde_json::Value::Null;
        poll(timeout, || {
            last = self.status_json();
            let p = last["topology"]["primary"].as_str()?;
            (p != old).then(|| p.to_string())
        })
        .unwrap_or_else(|| panic!("no primary other than {old} within {timeout:?}: {last:#}"))
    }

    /// Waits until a replica runs a statement whose text starts with `prefix` (as the
    /// replica's processlist says: holdfast's own marks of a read may lag behind), and
    /// returns that replica.
    pub fn wait_replica_running(&self, prefix: &str) -> holdfast_lab::NodeStatus {
        let sql = format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '{}%'",
            prefix.replace('\'', "''")
        );
        wait_for(
            &format!("a replica running {prefix}"),
            Duration::from_secs(20),
            || {
                self.lab.replicas().iter().find_map(|r| {
                    let n = holdfast_lab::node_sql(r, &sql).ok()?;
                    (n.first()?.first()? == "1").then(|| r.clone())
                })
            },
        )
    }

    /// Waits until `/status` shows exactly `n` open sessions.
    pub fn wait_sessions(&self, n: usize, timeout: Duration) {
        let mut last = 0;
        let ok = poll(timeout, || {
            last = self.status().sessions.len();
            (last == n).then_some(())
        });
        assert!(
            ok.is_some(),
            "expected {n} open sessions within {timeout:?}, /status shows {last}"
        );
    }

    /// Runs the `mariadb` CLI against `addr` as the app user with `args` appended.
    pub fn mariadb(&self, addr: SocketAddr, args: &[&str]) -> CliOutput {
        self.mariadb_as(addr, self.user(), self.password(), args)
    }

    pub fn mariadb_as(
        &self,
        addr: SocketAddr,
        user: &str,
        password: &str,
        args: &[&str],
    ) -> CliOutput {
        let cmd = Self::mariadb_command(addr, user, password, args);
        run_with_deadline(cmd, Duration::from_secs(120)).into()
    }

    /// The `mariadb` CLI command line against `addr` as `user`, with `args` appended (for
    /// a test that runs it itself, e.g. to signal it).
    pub fn mariadb_command(addr: SocketAddr, user: &str, password: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("mariadb");
        cmd.args([
            "--no-defaults",
            "--protocol=TCP",
            "-h",
            &addr.ip().to_string(),
            "-P",
            &addr.port().to_string(),
            "-u",
            user,
            &format!("-p{password}"),
            "--connect-timeout=10",
        ])
        .args(args);
        cmd
    }
}

/// An admin API answer as [`Harness::admin_raw`] reads it.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    pub code: u16,
    /// Header names in lower case, in the order sent.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawAnswer {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `error` of a JSON error body.
    pub fn error(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(String::from))
            .unwrap_or_else(|| panic!("HTTP {}: not a JSON error: {:?}", self.code, self.body))
    }
}

/// A lab without holdfast in front, for tests that drive holdfast's building blocks
/// (`holdfast_cluster::ha`...) directly: node1 and `replicas` replicas of it.
pub fn lab(replicas: usize) -> TestLab {
    TestLab::start(replicas).unwrap_or_else(|e| panic!("starting the lab: {e:#}"))
}

/// The configuration the harness runs holdfast with in front of `lab`: listeners on free
/// ports, the lab's monitor account, every node a backend, TLS as the lab sets it up (its
/// certificate offered to clients, verify-full to the nodes), and, with replicas, `[ha]`
/// in managed mode with the lab's replication account.
pub fn lab_config(lab: &TestLab) -> Config {
    let st = &lab.status;
    // Commit markers on, as the lab runs them (tests of the behaviour without them turn them
    // off).
    let ha = if lab.replicas().is_empty() {
        HaConfig {
            commit_markers: true,
            ..HaConfig::default()
        }
    } else {
        HaConfig {
            mode: HaMode::Managed,
            repl_user: holdfast_lab::REPL_USER.into(),
            repl_password: holdfast_lab::REPL_PASSWORD.into(),
            commit_markers: true,
            ..HaConfig::default()
        }
    };
    let (tls, backend_tls) = st.tls_sections();
    Config {
        proxy: ProxyConfig {
            listen: "127.0.0.1:0".into(),
            // As the lab runs it (tests of the behaviour without it turn it off).
            transaction_replay: true,
            ..ProxyConfig::default()
        },
        admin: AdminConfig {
            listen: "127.0.0.1:0".into(),
            token_file: Some(st.admin_token_file.clone()),
            ..AdminConfig::default()
        },
        auth: AuthConfig {
            monitor_user: st.monitor_user.clone(),
            monitor_password: st.monitor_password.as_str().into(),
            ..AuthConfig::default()
        },
        backends: st
            .nodes
            .iter()
            .map(|n| BackendConfig {
                name: n.name.clone(),
                address: n.address.clone(),
                proxy_protocol: true,
            })
            .collect(),
        ha,
        // Like the lab's own config: its server binary may be restarted into.
        driver: DriverConfig {
            binaries: vec![st.mariadbd.clone()],
            ..DriverConfig::default()
        },
        listeners: Vec::new(),
        serverless: None,
        cluster: None,
        tls,
        backend_tls,
        split: Default::default(),
        log: Default::default(),
    }
}

/// The runtime holdfast runs on in tests: two workers, like a small deployment.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("holdfast-it")
        .enable_all()
        .build()
}

/// Output of a CLI run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliOutput {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for CliOutput {
    fn from(o: Output) -> Self {
        CliOutput {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// Runs `cmd` to completion, killing it if it outlives `timeout`.
pub fn run_with_deadline(mut cmd: Command, timeout: Duration) -> Output {
    use std::io::Read;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    // Drain the pipes on threads so a chatty child never blocks on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for child") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}

pub use holdfast_lab::poll;

/// [`holdfast_lab::wait_for`] for tests: panics naming `what` on timeout.
pub fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    holdfast_lab::wait_for(what, timeout, f).unwrap_or_else(|e| panic!("{e}"))
}

/// The value of a Prometheus sample line `name{labels} value` (labels as written, or
/// empty for none); `None` when absent.
pub fn metric(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        (key == name_and_labels)
            .then(|| value.parse().ok())
            .flatten()
    })
}

/// Whether a command is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Fails unless `program` is installed (CI installs everything the suite needs).
pub fn require(program: &str) -> Result<()> {
    if !have(program) {
        bail!("{program} is not installed");
    }
    Ok(())
}
