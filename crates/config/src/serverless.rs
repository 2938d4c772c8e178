//! The `[serverless]` section: when the instance pauses, how it scales
//! (`[serverless.scale]`) and which driver controls it (`[serverless.driver]`).

use crate::ConfigError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// `[serverless]`: present means the (single) backend is a serverless instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerlessConfig {
    /// The instance's name in logs, errors, metrics and usage lines.
    #[serde(default = "default_instance")]
    pub instance: String,
    /// Pause after this many seconds without a statement or login; 0 never pauses on its own.
    #[serde(default = "default_idle_pause_secs")]
    pub idle_pause_secs: u64,
    /// The tier a pause starts with: "freeze" (suspend the process: resume in milliseconds,
    /// memory kept) or "stop" (shut the server down: memory freed, resume is a cold start).
    #[serde(default)]
    pub pause_tier: PauseTier,
    /// A frozen instance is stopped after this many seconds; 0 keeps it frozen.
    #[serde(default = "default_stop_after_secs")]
    pub stop_after_secs: u64,
    /// How long a client waits for a paused instance to resume before it gets an error.
    #[serde(default = "default_resume_deadline_ms")]
    pub resume_deadline_ms: u64,
    /// First pause between failed resume attempts; doubles up to 5 s.
    #[serde(default = "default_retry_backoff_ms")]
    pub retry_backoff_ms: u64,
    /// After this many resume attempts in a row have failed and no client waits any more,
    /// further clients get the error at once (no new attempt) for `breaker_open_secs`;
    /// then one client tries again. 0 turns the breaker off.
    #[serde(default = "default_breaker_after_failures")]
    pub breaker_after_failures: u32,
    #[serde(default = "default_breaker_open_secs")]
    pub breaker_open_secs: u64,
    /// Whether the autoscaler changes the size with the load.
    #[serde(default = "default_true")]
    pub autoscale: bool,
    /// The size the instance starts with (default: the policy's minimum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ccu: Option<f64>,
    /// InnoDB buffer pool per capacity unit, resized online with the size; 0 leaves it alone.
    #[serde(default = "default_buffer_pool_mib_per_ccu")]
    pub buffer_pool_mib_per_ccu: u64,
    /// The server's max_connections per CCU, set with the size; 0 leaves it alone.
    #[serde(default)]
    pub max_connections_per_ccu: u64,
    #[serde(default)]
    pub scale: ScalePolicy,
    /// The usage ledger (SQLite); relative paths are relative to the working directory.
    #[serde(default = "default_ledger")]
    pub ledger: PathBuf,
    /// Length of a billing period (one usage line each); tests shorten it.
    #[serde(default = "default_period_secs")]
    pub period_secs: u32,
    /// The open period is written to the ledger every this many seconds (what a crash of
    /// holdfast can lose at most; settled periods are written at once).
    #[serde(default = "default_flush_secs")]
    pub flush_secs: u32,
    pub driver: InstanceDriverConfig,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseTier {
    #[default]
    Freeze,
    Stop,
}

impl PauseTier {
    pub fn name(self) -> &'static str {
        match self {
            PauseTier::Freeze => "freeze",
            PauseTier::Stop => "stop",
        }
    }
}

fn default_instance() -> String {
    "default".into()
}
fn default_idle_pause_secs() -> u64 {
    300
}
fn default_stop_after_secs() -> u64 {
    900
}
fn default_resume_deadline_ms() -> u64 {
    10_000
}
fn default_retry_backoff_ms() -> u64 {
    200
}
fn default_breaker_after_failures() -> u32 {
    3
}
fn default_breaker_open_secs() -> u64 {
    30
}
fn default_true() -> bool {
    true
}
fn default_buffer_pool_mib_per_ccu() -> u64 {
    1024
}
fn default_ledger() -> PathBuf {
    PathBuf::from("holdfast-usage.db")
}
fn default_period_secs() -> u32 {
    3600
}
fn default_flush_secs() -> u32 {
    10
}

impl ServerlessConfig {
    /// A section with every default (what a config that only names its driver gets).
    pub fn new(driver: InstanceDriverConfig) -> Self {
        ServerlessConfig {
            instance: default_instance(),
            idle_pause_secs: default_idle_pause_secs(),
            pause_tier: PauseTier::default(),
            stop_after_secs: default_stop_after_secs(),
            resume_deadline_ms: default_resume_deadline_ms(),
            retry_backoff_ms: default_retry_backoff_ms(),
            breaker_after_failures: default_breaker_after_failures(),
            breaker_open_secs: default_breaker_open_secs(),
            autoscale: default_true(),
            start_ccu: None,
            buffer_pool_mib_per_ccu: default_buffer_pool_mib_per_ccu(),
            max_connections_per_ccu: 0,
            scale: ScalePolicy::default(),
            ledger: default_ledger(),
            period_secs: default_period_secs(),
            flush_secs: default_flush_secs(),
            driver,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.scale.validate()?;
        if let Some(c) = self.start_ccu {
            if !(self.scale.min_ccu..=self.scale.max_ccu).contains(&c) {
                return Err(crate::invalid_key(
                    "serverless.start_ccu",
                    format!(
                        "{c} is outside [{}, {}]",
                        self.scale.min_ccu, self.scale.max_ccu
                    ),
                ));
            }
        }
        if self.period_secs == 0 {
            return Err(crate::invalid_key(
                "serverless.period_secs",
                "must be at least 1",
            ));
        }
        if self.flush_secs == 0 {
            return Err(crate::invalid_key(
                "serverless.flush_secs",
                "must be at least 1",
            ));
        }
        if self.resume_deadline_ms == 0 {
            return Err(crate::invalid_key(
                "serverless.resume_deadline_ms",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    pub fn resume_deadline(&self) -> Duration {
        Duration::from_millis(self.resume_deadline_ms)
    }
}

/// The autoscaling knobs. Every field has a default, so a config may set only some of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScalePolicy {
    /// Smallest size, in CCU.
    pub min_ccu: f64,
    /// Largest size, in CCU.
    pub max_ccu: f64,
    /// Granularity of sizes, in CCU; fractional steps are allowed.
    pub step_ccu: f64,
    /// Utilization (CPU used / current size) at or above which a sample counts as busy.
    pub up_utilization: f64,
    /// Consecutive busy samples needed to scale up, so a one-second spike does not.
    pub up_samples: u32,
    /// Utilization a scale-up aims for: the new size is the smallest one with
    /// `used / size <= target` (at least one step up, at most `max_ccu`).
    pub target_utilization: f64,
    /// Utilization below which a sample counts as quiet.
    pub down_utilization: f64,
    /// How long load must stay quiet, without interruption, before stepping down once.
    pub down_after_secs: u64,
}

impl Default for ScalePolicy {
    fn default() -> Self {
        ScalePolicy {
            min_ccu: 0.5,
            max_ccu: 4.0,
            step_ccu: 0.5,
            up_utilization: 0.8,
            up_samples: 2,
            target_utilization: 0.6,
            down_utilization: 0.3,
            down_after_secs: 60,
        }
    }
}

impl ScalePolicy {
    /// Checks the knobs are consistent. The autoscaler never panics on an invalid policy,
    /// but its decisions are only meaningful for a valid one, so configs are checked here.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check()
            .map_err(|e| crate::invalid_key("serverless.scale", e))
    }

    fn check(&self) -> Result<(), String> {
        let finite = [
            ("min_ccu", self.min_ccu),
            ("max_ccu", self.max_ccu),
            ("step_ccu", self.step_ccu),
            ("up_utilization", self.up_utilization),
            ("target_utilization", self.target_utilization),
            ("down_utilization", self.down_utilization),
        ];
        for (name, value) in finite {
            if !value.is_finite() {
                return Err(format!("{name} must be a finite number, not {value}"));
            }
        }
        if self.min_ccu <= 0.0 {
            return Err(format!("min_ccu must be above 0, not {}", self.min_ccu));
        }
        if self.min_ccu > self.max_ccu {
            return Err(format!(
                "min_ccu ({}) must not exceed max_ccu ({})",
                self.min_ccu, self.max_ccu
            ));
        }
        if self.step_ccu <= 0.0 {
            return Err(format!("step_ccu must be above 0, not {}", self.step_ccu));
        }
        for (name, value) in [
            ("up_utilization", self.up_utilization),
            ("target_utilization", self.target_utilization),
            ("down_utilization", self.down_utilization),
        ] {
            if value <= 0.0 || value > 1.0 {
                return Err(format!("{name} must be in (0, 1], not {value}"));
            }
        }
        if self.down_utilization >= self.up_utilization {
            return Err(format!(
                "down_utilization ({}) must be below up_utilization ({})",
                self.down_utilization, self.up_utilization
            ));
        }
        if self.target_utilization > self.up_utilization {
            return Err(format!(
                "target_utilization ({}) must not exceed up_utilization ({}), \
                 or a scale-up could land on a size that is already busy",
                self.target_utilization, self.up_utilization
            ));
        }
        if self.up_samples == 0 {
            return Err("up_samples must be at least 1".to_string());
        }
        Ok(())
    }
}

/// Which driver controls a serverless instance (`[serverless.driver]`), chosen by `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum InstanceDriverConfig {
    /// `kind = "process"`: holdfast runs the server itself.
    Process(ProcessDriverConfig),
    /// `kind = "exec"`: operator commands control the server.
    Exec(ExecDriverConfig),
}

fn default_start_timeout_ms() -> u64 {
    30_000
}

fn default_stop_timeout_ms() -> u64 {
    60_000
}

/// `[serverless.driver]` with `kind = "process"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessDriverConfig {
    /// argv of the server, e.g. `["/usr/sbin/mariadbd", "--defaults-file=/x/my.cnf"]`. The
    /// program must be the server itself (not a wrapper such as `mysqld_safe`): its pid is
    /// the one that gets signalled and that the pid file must name.
    pub command: Vec<String>,
    /// Where the server writes its pid (its pid-file option): lets holdfast adopt a server it
    /// did not start (e.g. after holdfast restarts).
    pub pid_file: PathBuf,
    /// Data directory, summed up for `storage_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datadir: Option<PathBuf>,
    /// The server's stdout/stderr are appended here; quoted when start-up fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
    #[serde(default = "default_start_timeout_ms")]
    pub start_timeout_ms: u64,
    /// Grace period after SIGTERM (a clean InnoDB shutdown can take a while) before SIGKILL.
    #[serde(default = "default_stop_timeout_ms")]
    pub stop_timeout_ms: u64,
    /// CPU limits: a cgroup directory to put the server in. `"auto"` or unset = pick one if
    /// the machine allows (cgroup v2 at /sys/fs/cgroup if its cgroup.controllers offers cpu,
    /// else cgroup v1 at /sys/fs/cgroup/cpu; the group is named after the pid file and removed
    /// when the driver is dropped while the server is down); `"none"` = no limits. Failing
    /// to use the group is logged, never fatal: the server then runs without limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
}

impl ProcessDriverConfig {
    /// What on this machine stops the server from starting, found before it is needed
    /// (each with what to do): the program, the data directory, the directories of the
    /// pid file and the log. Empty when all is there.
    pub fn missing_paths(&self) -> Vec<String> {
        let mut problems = Vec::new();
        match self.command.first() {
            None => problems.push("[serverless.driver] command is empty".to_string()),
            Some(program) => {
                let path = std::path::Path::new(program);
                let found = if path.components().count() > 1 {
                    path.is_file()
                } else {
                    std::env::var_os("PATH").is_some_and(|dirs| {
                        std::env::split_paths(&dirs).any(|d| d.join(path).is_file())
                    })
                };
                if !found {
                    problems.push(format!(
                        "[serverless.driver] command: the program {program} does not exist \
                         (install mariadb-server, or give the server binary's path)"
                    ));
                }
            }
        }
        if let Some(dir) = &self.datadir {
            if !dir.is_dir() {
                problems.push(format!(
                    "[serverless.driver] datadir {} does not exist: create it with \
                     `mariadb-install-db --datadir={}` (or point datadir and the command's \
                     --datadir at the server's data)",
                    dir.display(),
                    dir.display()
                ));
            }
        }
        for (what, file) in [
            ("pid_file", Some(&self.pid_file)),
            ("log", self.log.as_ref()),
        ] {
            let parent = file
                .and_then(|f| f.parent())
                .filter(|p| !p.as_os_str().is_empty());
            if let Some(parent) = parent {
                if !parent.is_dir() {
                    problems.push(format!(
                        "[serverless.driver] {what}: the directory {} does not exist",
                        parent.display()
                    ));
                }
            }
        }
        problems
    }

    /// A process driver running `command` with every default.
    pub fn new(command: Vec<String>, pid_file: PathBuf) -> Self {
        ProcessDriverConfig {
            command,
            pid_file,
            datadir: None,
            log: None,
            start_timeout_ms: default_start_timeout_ms(),
            stop_timeout_ms: default_stop_timeout_ms(),
            cgroup: None,
        }
    }
}

fn default_timeout_ms() -> u64 {
    60_000
}

/// `[serverless.driver]` with `kind = "exec"`: shell commands that control the server.
///
/// Each command runs with `sh -c` and gets `HOLDFAST_ADDRESS` (the server's `host:port`) in
/// its environment. A command succeeds when it exits with status 0 within `timeout_ms`;
/// otherwise it is killed (with its process group) and the action fails, quoting its stderr.
/// `start` and `thaw` only have to set things in motion: the driver then waits until the
/// server answers on its address. `stop` must return once the server is down. A command that
/// leaves a server running in the background must redirect that server's output (`>>log
/// 2>&1`); the driver does not wait for pipes held by background processes.
///
/// A MariaDB managed by systemd, with CPU and memory limits through the unit's cgroup:
///
/// ```toml
/// [serverless.driver]
/// kind = "exec"
/// start = "systemctl start mariadb"
/// stop = "systemctl stop mariadb"
/// freeze = "systemctl kill --signal=SIGSTOP --kill-whom=main mariadb"
/// thaw = "systemctl kill --signal=SIGCONT --kill-whom=main mariadb"
/// status = "systemctl is-active -q mariadb && echo running || echo stopped"
/// scale = "systemctl set-property --runtime mariadb CPUQuota=$((HOLDFAST_CPU_MILLIS / 10))% MemoryMax=${HOLDFAST_MEMORY_MIB}M"
/// ```
///
/// A server in Kubernetes: `start = "kubectl scale statefulset/db --replicas=1 && kubectl
/// rollout status statefulset/db"`, `stop = "kubectl scale statefulset/db --replicas=0 &&
/// kubectl wait --for=delete pod/db-0 --timeout=120s"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecDriverConfig {
    pub start: String,
    pub stop: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thaw: Option<String>,
    /// Prints running / frozen / stopped (first word of stdout); non-zero exit =>
    /// `PowerState::Unknown(stderr)`. Without it the server is running if it answers on its
    /// address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Gets `HOLDFAST_CCU` (e.g. "1.5"), `HOLDFAST_CPU_MILLIS` (1500) and
    /// `HOLDFAST_MEMORY_MIB` (2048 MiB per CCU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<String>,
    /// Prints the server's cumulative CPU seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<String>,
    /// Prints the bytes the instance stores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_bytes: Option<String>,
    /// Per command; also how long start and thaw wait for the server to answer.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

impl ExecDriverConfig {
    /// Start and stop commands only: no freeze tier, no status command (the address is
    /// probed), no scaling or metering commands.
    pub fn new(start: impl Into<String>, stop: impl Into<String>) -> Self {
        ExecDriverConfig {
            start: start.into(),
            stop: stop.into(),
            freeze: None,
            thaw: None,
            status: None,
            scale: None,
            cpu_seconds: None,
            storage_bytes: None,
            timeout_ms: default_timeout_ms(),
        }
    }
}
