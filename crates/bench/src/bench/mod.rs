//! `holdfast-bench bench`: sysbench against the primary directly, through HAProxy (TCP
//! mode) and through holdfast (session and pass-through listeners), interleaved over
//! several rounds, plus idle-session memory.

mod cpu;
mod flamegraph;
mod idle;
mod trace;

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use holdfast_config::{ListenerConfig, ListenerMode};
use holdfast_lab::{self as lab, procs, LabOptions, LabStatus, NodeStatus};

use crate::report::{fmt_opt, median, ratio, shell_words, Doc, Provenance, Table};
use crate::serve::{config_variant, start_holdfast, Helper, LabGuard, LISTEN_TIMEOUT};
use crate::sysbench::{self, prepare_tables, Metrics, Sysbench, METRIC_HEADERS};

/// Which way the benchmark clients reach the primary.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Straight to the primary's port.
    Direct,
    /// Through HAProxy in TCP mode (a plain byte pump: the floor for any proxy).
    Haproxy,
    /// Through a bare tokio relay (`holdfast-bench bare-relay`: accept, connect,
    /// copy_bidirectional) with holdfast's worker threads: the user-space limit.
    #[value(name = "bare_relay", alias = "bare-relay")]
    BareRelay,
    /// Through the bare relay on io_uring (`holdfast-bench bare-relay --engine uring`: one
    /// thread, each turn submits and reaps the system calls of all connections at once):
    /// what batching takes off a relay's cost.
    #[value(name = "bare_uring_relay", alias = "bare-uring-relay")]
    BareUringRelay,
    /// Through `holdfast serve` (its `[proxy] listen`, session mode).
    Holdfast,
    /// Through a `[[listener]]` of the same holdfast with `mode = "passthrough"`: login is
    /// handled by holdfast, then bytes are relayed unparsed.
    #[value(name = "holdfast_passthrough", alias = "holdfast-passthrough")]
    HoldfastPassthrough,
    /// The same pass-through listener, relayed in user space: a second process of the same
    /// binary with `[proxy] kernel_relay = "off"`, on its own ports (the kernel relay's
    /// A/B in one run).
    #[value(
        name = "holdfast_passthrough_user",
        alias = "holdfast-passthrough-user"
    )]
    HoldfastPassthroughUser,
    /// Through a second holdfast process run from `--baseline PATH` (e.g. the previous
    /// release), session mode, with the same configuration on other ports: an A/B
    /// comparison in one interleaved run.
    #[value(name = "holdfast_baseline", alias = "holdfast-baseline")]
    HoldfastBaseline,
    /// Through the same holdfast's split listener (the lab's `[[listener]]` with
    /// `routing = "split"`): reads to the replicas (needs --replicas).
    #[value(name = "holdfast_split", alias = "holdfast-split")]
    HoldfastSplit,
}

impl Target {
    /// Short name for file names and `--targets`.
    fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Haproxy => "haproxy",
            Target::BareRelay => "bare_relay",
            Target::BareUringRelay => "bare_uring_relay",
            Target::Holdfast => "holdfast",
            Target::HoldfastPassthrough => "holdfast_passthrough",
            Target::HoldfastPassthroughUser => "holdfast_passthrough_user",
            Target::HoldfastBaseline => "holdfast_baseline",
            Target::HoldfastSplit => "holdfast_split",
        }
    }

    /// Name shown in reports.
    fn label(self) -> &'static str {
        match self {
            Target::BareRelay => "bare tokio relay",
            Target::BareUringRelay => "bare io_uring relay",
            Target::HoldfastPassthrough => "holdfast (pass-through)",
            Target::HoldfastPassthroughUser => "holdfast (pass-through, user space)",
            Target::HoldfastBaseline => "holdfast (baseline)",
            Target::HoldfastSplit => "holdfast (split)",
            other => other.name(),
        }
    }

    /// Whether this target is a holdfast listener.
    fn is_holdfast(self) -> bool {
        matches!(
            self,
            Target::Holdfast
                | Target::HoldfastPassthrough
                | Target::HoldfastPassthroughUser
                | Target::HoldfastBaseline
                | Target::HoldfastSplit
        )
    }
}

/// Options of `holdfast-bench bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Lab directory. A lab is brought up there if none runs (and stopped again at the
    /// end); a running lab is used as it is.
    #[arg(long, default_value = "holdfast-bench")]
    pub dir: PathBuf,
    /// Replicas of a lab the benchmark starts itself (the benchmark only uses the primary).
    #[arg(long, default_value_t = 0)]
    pub replicas: usize,
    /// Base port of a lab the benchmark starts itself [default: free ports].
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Rounds; each round runs every workload against every target, in a rotated order.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds per sysbench run.
    #[arg(long, default_value_t = 20)]
    pub time: u32,
    /// sysbench client threads (= connections).
    #[arg(long, default_value_t = 20)]
    pub threads: u32,
    /// sysbench tables (prepared once, directly on the primary).
    #[arg(long, default_value_t = 20)]
    pub tables: u32,
    /// Rows per sysbench table.
    #[arg(long, default_value_t = 10000)]
    pub table_size: u32,
    /// sysbench workloads, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "oltp_point_select,oltp_read_write"
    )]
    pub workloads: Vec<String>,
    /// Targets to compare, comma-separated: direct, haproxy, bare_relay (a bare tokio
    /// copy_bidirectional relay), holdfast, holdfast_passthrough (a pass-through
    /// `[[listener]]` of the same holdfast process), holdfast_passthrough_user (the same,
    /// relayed in user space by a second process), holdfast_baseline (the binary given with
    /// --baseline), holdfast_split.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct,haproxy,holdfast"
    )]
    pub targets: Vec<Target>,

    /// Another holdfast binary for the `holdfast_baseline` target (e.g. one built from the
    /// previous commit), to compare two builds side by side.
    #[arg(long, value_name = "PATH")]
    pub baseline: Option<PathBuf>,
    /// TLS end to end, with the lab's certificates: sysbench asks for TLS; holdfast
    /// terminates it and verifies the node over its own TLS connection (verify-full);
    /// HAProxy, in TCP mode, passes the client's TLS through to the server. The idle
    /// clients (`--idle-clients`) log in over TLS too. Without it every target is clear
    /// text (holdfast too).
    #[arg(long)]
    pub tls: bool,
    /// Also write the report as Markdown to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// sysbench --mysql-ignore-errors: `none` makes any SQL error fail the run (reported
    /// as FAILED); `1213,1020,1205` (sysbench's own default) retries deadlocks and lock
    /// timeouts, which small tables provoke under oltp_read_write, and counts them as errors.
    #[arg(long, default_value = "none")]
    pub ignore_errors: String,
    /// Idle logged-in client connections for the per-session memory measurement (0 = skip).
    /// The file-descriptor soft limit is raised to the hard limit as needed (children,
    /// holdfast included, inherit it).
    #[arg(long, default_value_t = 1000)]
    pub idle_clients: usize,
    /// Also count syscalls per query: one extra oltp_point_select run per proxy target with
    /// `strace -c -f` attached. strace slows the proxy down a lot; these runs are reported
    /// apart and never enter the medians.
    #[arg(long)]
    pub syscalls: bool,
    /// Also profile holdfast: `perf record -F 999 --call-graph MODE` during one extra
    /// oltp_point_select run per holdfast target; writes the `perf script` output, folded
    /// stacks (for any flamegraph tool) and the top functions by self and inclusive samples
    /// to DIR.
    #[arg(long, value_name = "DIR")]
    pub profile: Option<PathBuf>,
    /// perf's --call-graph for --profile: `dwarf` unwinds through code built without frame
    /// pointers (libc, a release holdfast); `fp` is cheaper but stops at such frames.
    #[arg(long, default_value = "dwarf", value_name = "MODE")]
    pub call_graph: String,
    /// Seconds of each extra run of --syscalls and --profile.
    #[arg(long, default_value_t = 5)]
    pub trace_time: u32,
    /// Cap each mariadbd of the lab at this many CPUs (a cgroup of its own, after the
    /// tables are prepared), so that nodes sharing this machine stand for hosts of their
    /// own; e.g. 0.5 to show read scale-out with --targets holdfast,holdfast_split.
    #[arg(long, value_name = "CPUS")]
    pub node_cpus: Option<f64>,
    /// One more sysbench option for every run (repeatable), e.g. --sysbench-arg=--skip_trx=on
    /// (reads outside transactions, which a split listener can send to the replicas).
    #[arg(
        long = "sysbench-arg",
        allow_hyphen_values = true,
        value_name = "OPTION"
    )]
    pub sysbench_args: Vec<String>,
    /// `[split] primary_read_weight` of the holdfast under test: the primary's share of
    /// split reads against a replica's 1 (the configuration's default is 0; 1 makes the
    /// three lab nodes equal for a read-only workload).
    #[arg(long, default_value_t = 1.0)]
    pub primary_read_weight: f64,
}

/// The workload of the --syscalls and --profile runs.
const TRACED_WORKLOAD: &str = "oltp_point_select";

/// One sysbench run's outcome.
#[derive(Clone, Debug)]
struct Run {
    round: usize,
    workload: String,
    target: Target,
    result: std::result::Result<Metrics, String>,
    /// The proxy's CPU and context switches over the run (none for direct).
    proxy: Option<cpu::Usage>,
    /// mariadbd's (the primary's) CPU and context switches over the run.
    server: Option<cpu::Usage>,
    /// The whole machine's (user, kernel) CPU seconds over the run.
    machine: Option<(f64, f64)>,
}

impl Run {
    /// CPU µs per query of the proxy and of mariadbd, context switches per query of the
    /// proxy.
    fn per_query(&self) -> PerQuery {
        let Ok(m) = &self.result else {
            return PerQuery::default();
        };
        let switches = self.proxy.and_then(|u| u.switches_per(m.queries));
        PerQuery {
            proxy_us: self.proxy.and_then(|u| u.cpu_us_per(m.queries)),
            voluntary: switches.map(|s| s.0),
            involuntary: switches.map(|s| s.1),
            server_us: self.server.and_then(|u| u.cpu_us_per(m.queries)),
            machine_user_us: self
                .machine
                .filter(|_| m.queries > 0)
                .map(|(u, _)| u * 1e6 / m.queries as f64),
            machine_kernel_us: self
                .machine
                .filter(|_| m.queries > 0)
                .map(|(_, k)| k * 1e6 / m.queries as f64),
        }
    }
}

/// A --syscalls run: the proxy's syscalls counted by strace or perf stat.
struct SyscallRun {
    target: Target,
    /// `strace -c` or `perf stat`.
    tool: &'static str,
    result: std::result::Result<(Metrics, trace::SyscallCounts), String>,
}

/// A --profile run of holdfast.
struct ProfileRun {
    target: Target,
    result: std::result::Result<Profile, String>,
}

struct Profile {
    metrics: Metrics,
    samples: u64,
    /// Share of samples in kernel code (leaf frame).
    kernel_share: Option<f64>,
    files: trace::ProfileFiles,
    top_self: Vec<(String, u64)>,
    top_inclusive: Vec<(String, u64)>,
}

/// Runs the benchmark described by `args`; `holdfast_exe` is the binary started as
/// `holdfast_exe serve --config DIR/holdfast.toml`. Blocking; prints progress to stderr
/// and the report to stdout. If holdfast (or HAProxy) cannot be started, that target is
/// reported as unavailable and the others still run.
pub fn run_bench(args: &BenchArgs, holdfast_exe: &Path) -> Result<()> {
    if args.rounds == 0
        || args.time == 0
        || args.threads == 0
        || args.tables == 0
        || args.trace_time == 0
    {
        bail!("--rounds, --time, --threads, --tables and --trace-time must be at least 1");
    }
    if args.workloads.is_empty() || args.targets.is_empty() {
        bail!("--workloads and --targets must not be empty");
    }
    let started_at = SystemTime::now();
    let sysbench_exe = procs::require_program(&["sysbench"], "sysbench")?;
    let haproxy_exe = if args.targets.contains(&Target::Haproxy) {
        procs::find_program(&["haproxy"])
    } else {
        None
    };
    // Idle clients, sysbench threads and the proxies' two sockets per client; children
    // (holdfast, HAProxy) inherit the raised limit.
    let want_fds = (args.idle_clients as u64 + u64::from(args.threads)) * 2 + 1024;
    let nofile = procs::raise_nofile(want_fds)?;
    if nofile < want_fds {
        eprintln!(
            "bench: warning: RLIMIT_NOFILE is {nofile} (hard limit), below the {want_fds} \
             wanted for {} idle clients",
            args.idle_clients
        );
    }

    // The lab.
    let mut lab_guard = LabGuard(None);
    let dir = std::path::absolute(&args.dir)
        .with_context(|| format!("resolving {}", args.dir.display()))?;
    let st = match lab::status(&dir) {
        Ok(st) if st.nodes.first().is_some_and(|n| n.alive) => {
            eprintln!("bench: using the running lab in {}", dir.display());
            st
        }
        _ => {
            eprintln!("bench: starting a lab in {}", dir.display());
            let st = lab::up(&LabOptions {
                base_port: args.base_port,
                ..LabOptions::new(&dir, args.replicas)
            })?;
            lab_guard.0 = Some(dir.clone());
            st
        }
    };
    let primary = st.primary()?.clone();
    let logs = dir.join("bench-logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    let mut sb = Sysbench::for_lab(
        sysbench_exe.clone(),
        &st,
        args.tables,
        args.table_size,
        &args.ignore_errors,
    );
    prepare_tables(&sb, &st, &logs)?;
    sb.extra = args.sysbench_args.clone();
    if let Some(cpus) = args.node_cpus {
        limit_node_cpus(&st, cpus)?;
    }
    if args.tls {
        sb.tls_dir = Some(sysbench_tls_dir(&st)?);
    }

    // Targets.
    let mut ports: Vec<(Target, u16)> = Vec::new();
    let mut unavailable: Vec<(Target, String)> = Vec::new();
    let mut helpers: Vec<Helper> = Vec::new();
    let mut pids: Vec<(Target, u32)> = Vec::new();
    if let Some(pid) = primary.pid {
        pids.push((Target::Direct, pid));
    }
    // One holdfast process serves both holdfast targets.
    let baseline = if args.targets.contains(&Target::HoldfastBaseline) {
        start_baseline(args, &st).map_err(|e| {
            eprintln!("bench: baseline holdfast unavailable: {e:#}");
            format!("{e:#}")
        })
    } else {
        Err("not started".to_string())
    };
    if let Ok((helper, _)) = &baseline {
        pids.push((Target::HoldfastBaseline, helper.pid));
    }
    let user_space = if args.targets.contains(&Target::HoldfastPassthroughUser) {
        start_user_space_relay(holdfast_exe, args, &st).map_err(|e| {
            eprintln!("bench: the user-space pass-through holdfast unavailable: {e:#}");
            format!("{e:#}")
        })
    } else {
        Err("not started".to_string())
    };
    if let Ok((helper, _)) = &user_space {
        pids.push((Target::HoldfastPassthroughUser, helper.pid));
    }
    let holdfast = if args.targets.iter().any(|t| {
        matches!(
            t,
            Target::Holdfast | Target::HoldfastPassthrough | Target::HoldfastSplit
        )
    }) {
        let started = if args.targets.contains(&Target::HoldfastPassthrough) {
            procs::free_ports(1).and_then(|p| {
                let config = passthrough_config(&st, p[0], args)?;
                start_holdfast(
                    holdfast_exe,
                    &st,
                    &config,
                    &st.dir.join("holdfast.log"),
                    &[p[0]],
                )
                .map(|(helper, port)| (helper, port, Some(p[0])))
            })
        } else {
            config_variant(&st, "bench-holdfast.toml", transport_note(args.tls), |c| {
                set_transport(c, args.tls);
                c.split.primary_read_weight = args.primary_read_weight;
                Ok(())
            })
            .and_then(|config| {
                start_holdfast(
                    holdfast_exe,
                    &st,
                    &config,
                    &st.dir.join("holdfast.log"),
                    &[],
                )
            })
            .map(|(helper, port)| (helper, port, None))
        };
        match started {
            Ok((helper, port, passthrough)) => {
                let pid = helper.pid;
                helpers.push(helper);
                Ok((pid, port, passthrough))
            }
            Err(e) => {
                eprintln!("bench: holdfast unavailable: {e:#}");
                Err(format!("{e:#}"))
            }
        }
    } else {
        Err("not started".to_string())
    };
    for &target in &args.targets {
        match target {
            Target::Direct => ports.push((Target::Direct, primary.port)),
            Target::Haproxy => {
                let started = match haproxy_exe.as_deref() {
                    Some(exe) => start_haproxy(exe, &dir, primary.port),
                    None => Err(anyhow::anyhow!(
                        "haproxy not found on PATH; install haproxy"
                    )),
                };
                match started {
                    Ok((helper, port)) => {
                        pids.push((Target::Haproxy, helper.pid));
                        ports.push((Target::Haproxy, port));
                        helpers.push(helper);
                    }
                    Err(e) => {
                        eprintln!("bench: HAProxy unavailable: {e:#}");
                        unavailable.push((target, format!("{e:#}")));
                    }
                }
            }
            Target::Holdfast | Target::HoldfastPassthrough => match &holdfast {
                Ok((pid, session_port, passthrough_port)) => {
                    let port = if target == Target::Holdfast {
                        Some(*session_port)
                    } else {
                        *passthrough_port
                    };
                    if let Some(port) = port {
                        pids.push((target, *pid));
                        ports.push((target, port));
                    }
                }
                Err(e) => unavailable.push((target, e.clone())),
            },
            Target::HoldfastBaseline => match &baseline {
                Ok((_, port)) => ports.push((target, *port)),
                Err(e) => unavailable.push((target, e.clone())),
            },
            Target::HoldfastPassthroughUser => match &user_space {
                Ok((_, port)) => ports.push((target, *port)),
                Err(e) => unavailable.push((target, e.clone())),
            },
            Target::BareRelay | Target::BareUringRelay => {
                match start_bare_relay(&dir, primary.port, target == Target::BareUringRelay) {
                    Ok((helper, port)) => {
                        pids.push((target, helper.pid));
                        ports.push((target, port));
                        helpers.push(helper);
                    }
                    Err(e) => {
                        eprintln!("bench: the bare relay unavailable: {e:#}");
                        unavailable.push((target, format!("{e:#}")));
                    }
                }
            }
            Target::HoldfastSplit => {
                let split = crate::serve::split_port(&st).ok();
                match (&holdfast, split) {
                    (Ok((pid, _, _)), Some(port)) if st.replicas().next().is_some() => {
                        pids.push((target, *pid));
                        ports.push((target, port));
                    }
                    (Ok(_), _) => unavailable.push((
                        target,
                        "the lab has no split listener or no replica (--replicas 2)".into(),
                    )),
                    (Err(e), _) => unavailable.push((target, e.clone())),
                }
            }
        }
    }
    if let Ok((helper, _)) = baseline {
        helpers.push(helper);
    }
    if let Ok((helper, _)) = user_space {
        helpers.push(helper);
    }

    // Rounds.
    let rounds_started = Instant::now();
    let mut runs = Vec::new();
    let total = args.rounds * args.workloads.len() * ports.len();
    let mut n = 0;
    for round in 0..args.rounds {
        for workload in &args.workloads {
            for i in 0..ports.len() {
                let (target, port) = ports[(i + round) % ports.len()];
                n += 1;
                let log = logs.join(format!("r{}-{workload}-{}.log", round + 1, target.name()));
                // What is left, at the pace of the runs so far (the first: its length).
                let per_run = match n {
                    1 => Duration::from_secs(u64::from(args.time) + 3),
                    _ => rounds_started.elapsed() / (n as u32 - 1),
                };
                let left = per_run * (total - n + 1) as u32;
                eprint!(
                    "bench: [{n}/{total}, {}m{:02}s left] round {} {workload} {:<23} … ",
                    left.as_secs() / 60,
                    left.as_secs() % 60,
                    round + 1,
                    target.label()
                );
                let proxy_pid = pid_of(&pids, target).filter(|_| target != Target::Direct);
                let proxy_watch = cpu::Watch::start(proxy_pid);
                let server_watch = cpu::Watch::start(primary.pid);
                let machine_watch = cpu::MachineWatch::start();
                let result = sb.run(workload, port, args.threads, args.time, &log)?;
                let (proxy, server) = (proxy_watch.finish(), server_watch.finish());
                let machine = machine_watch.finish();
                match &result {
                    Ok(m) => eprintln!(
                        "{:.0} tps, {:.0} qps, avg {:.2} ms, p95 {:.2} ms, p99 {} ms",
                        m.tps,
                        m.qps,
                        m.lat_avg_ms,
                        m.lat_p95_ms,
                        m.lat_p99_ms
                            .map_or_else(|| "-".into(), |v| format!("{v:.2}"))
                    ),
                    Err(e) => eprintln!("FAILED: {e}"),
                }
                runs.push(Run {
                    round: round + 1,
                    workload: workload.clone(),
                    target,
                    result,
                    proxy,
                    server,
                    machine,
                });
            }
        }
    }

    // Extra runs with a tool attached, outside the rounds.
    let extra = ExtraRuns {
        sb: &sb,
        args,
        ports: &ports,
        pids: &pids,
        logs: &logs,
    };
    let syscall_runs = if args.syscalls {
        extra.syscalls()
    } else {
        Vec::new()
    };
    let profiles = match &args.profile {
        Some(dir) => extra.profiles(dir)?,
        None => Vec::new(),
    };

    // Idle sessions (over TLS with `--tls`, as sysbench's).
    let mut idle = Vec::new();
    let idle_tls = match (args.tls, st.tls()) {
        (true, Some(t)) => Some(
            holdfast_client::tls::TlsClient::new(&t.ca, holdfast_client::tls::Verify::Ca, None)
                .context("the idle clients' TLS (the lab's CA)")?,
        ),
        _ => None,
    };
    if args.idle_clients > 0 {
        for target in [
            Target::Holdfast,
            Target::HoldfastBaseline,
            Target::HoldfastSplit,
            Target::HoldfastPassthrough,
            Target::HoldfastPassthroughUser,
            Target::Haproxy,
            Target::Direct,
        ] {
            let (Some(&(_, port)), Some(&(_, pid))) = (
                ports.iter().find(|(t, _)| *t == target),
                pids.iter().find(|(t, _)| *t == target),
            ) else {
                continue;
            };
            eprint!(
                "bench: idle sessions: {} clients to {} … ",
                args.idle_clients,
                target.label()
            );
            // The holdfast under test serves the lab's admin API (it reports its heap).
            let lab_admin = crate::admin::client(&st);
            let heap_from = matches!(
                target,
                Target::Holdfast | Target::HoldfastSplit | Target::HoldfastPassthrough
            )
            .then_some(&lab_admin);
            let r = idle::IdleClients {
                addr: &format!("127.0.0.1:{port}"),
                pid,
                clients: args.idle_clients,
                user: &st.app_user,
                password: &st.app_password,
                heap_from,
                tls: idle_tls.as_ref(),
            }
            .measure();
            match &r {
                Ok(r) => eprintln!(
                    "{:.1} KiB per session, {:.1} per added session, heap {} bytes per added session \
                     (RSS KiB {} / {} / {}, heap bytes {})",
                    r.per_session_kib(),
                    r.per_added_session_kib(),
                    r.heap_per_added_session()
                        .map_or("-".to_string(), |b| format!("{b:.0}")),
                    r.rss_before_kib,
                    r.rss_half_kib,
                    r.rss_after_kib,
                    r.heap_bytes
                        .map_or("-".to_string(), |[a, b, c]| format!("{a} / {b} / {c}")),
                ),
                Err(e) => eprintln!("FAILED: {e:#}"),
            }
            idle.push((target, r.map_err(|e| format!("{e:#}"))));
            wait_sessions_closed(&primary);
        }
    }

    let versions = Versions {
        mariadbd: lab::resolve_mariadbd(None)
            .and_then(|p| procs::run_capture(&p, ["--version"]))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unknown ({e:#})")),
        sysbench: sysbench::version(&sysbench_exe),
        haproxy: haproxy_exe
            .as_deref()
            .map(|h| {
                procs::run_capture(h, ["-v"])
                    .map(|s| s.lines().next().unwrap_or("").trim().to_string())
                    .unwrap_or_else(|e| format!("unknown ({e:#})"))
            })
            .unwrap_or_else(|| "not used".into()),
    };
    drop(helpers);
    drop(lab_guard);

    let report = Report {
        args,
        provenance: Provenance::of_this_run(started_at),
        versions,
        targets: ports.clone(),
        unavailable,
        runs,
        syscall_runs,
        profiles,
        idle,
        sysbench_example: shell_words(
            sb.run_args("WORKLOAD", 0, args.threads, args.time)
                .into_iter()
                .map(|a| {
                    if a == "--mysql-port=0" {
                        "--mysql-port=PORT".to_string()
                    } else {
                        a
                    }
                }),
        ),
    };
    crate::report::publish(|md| report.render(md), args.out.as_deref(), "bench")?;
    if let Some(out) = &args.out {
        let html = out.with_extension("html");
        fs::write(&html, report.render_html())
            .with_context(|| format!("writing {}", html.display()))?;
        eprintln!("bench: report with charts written to {}", html.display());
    }
    Ok(())
}

fn pid_of(pids: &[(Target, u32)], target: Target) -> Option<u32> {
    pids.iter().find(|(t, _)| *t == target).map(|&(_, p)| p)
}

/// Functions listed per profile in the report and the summary file.
const TOP_FUNCTIONS: usize = 15;

/// The extra runs of --syscalls and --profile, outside the rounds.
struct ExtraRuns<'a> {
    sb: &'a Sysbench,
    args: &'a BenchArgs,
    ports: &'a [(Target, u16)],
    pids: &'a [(Target, u32)],
    logs: &'a Path,
}

impl ExtraRuns<'_> {
    /// One oltp_point_select run of `--trace-time` seconds against `port` while `tool args…`
    /// is attached (started before, stopped with SIGINT after); logs go to `LOGS/NAME.*.log`.
    fn attached_run(
        &self,
        port: u16,
        tool: &Path,
        tool_args: &[String],
        name: &str,
    ) -> Result<Metrics> {
        let (args, logs) = (self.args, self.logs);
        let attached =
            trace::Attached::start(tool, tool_args, &logs.join(format!("{name}.tool.log")))?;
        let log = logs.join(format!("{name}.sysbench.log"));
        let result = self
            .sb
            .run(TRACED_WORKLOAD, port, args.threads, args.trace_time, &log);
        let stopped = attached.stop();
        let metrics = result?.map_err(|e| anyhow::anyhow!(e))?;
        stopped?;
        Ok(metrics)
    }

    /// --syscalls: per proxy target, one run under `strace -c -f` (every syscall by name,
    /// the proxy slowed down), then one under `perf stat` (all syscalls and the five most
    /// frequent of the strace run, at little cost to the proxy).
    fn syscalls(&self) -> Vec<SyscallRun> {
        let logs = self.logs;
        let strace = procs::find_program(&["strace"]);
        let perf = procs::find_program(&["perf"]);
        let mut out = Vec::new();
        for &(target, port) in self.ports.iter().filter(|(t, _)| *t != Target::Direct) {
            let pid = pid_of(self.pids, target);
            let traced = self.counted_run(target, "strace -c", || {
                let exe = strace.as_deref().context("strace not found on PATH")?;
                let pid = pid.context("no pid for this target")?;
                let summary = logs.join(format!("strace-{}.txt", target.name()));
                let name = format!("strace-{}", target.name());
                let m = self.attached_run(port, exe, &trace::strace_args(pid, &summary), &name)?;
                let text = fs::read_to_string(&summary)
                    .with_context(|| format!("reading {}", summary.display()))?;
                Ok((m, trace::parse_strace_summary(&text)?))
            });
            let top: Vec<String> = match &traced.result {
                Ok((_, c)) => c.calls.iter().take(5).map(|(n, _)| n.clone()).collect(),
                Err(_) => Vec::new(),
            };
            out.push(traced);
            out.push(self.counted_run(target, "perf stat", || {
                let exe = perf.as_deref().context("perf not found on PATH")?;
                let pid = pid.context("no pid for this target")?;
                let counts = logs.join(format!("perf-stat-{}.csv", target.name()));
                let name = format!("perf-stat-{}", target.name());
                let events = trace::perf_stat_events(&top);
                let m = self.attached_run(
                    port,
                    exe,
                    &trace::perf_stat_args(pid, &events, &counts),
                    &name,
                )?;
                let text = fs::read_to_string(&counts)
                    .with_context(|| format!("reading {}", counts.display()))?;
                Ok((m, trace::parse_perf_stat(&text)?))
            }));
        }
        out
    }

    /// Runs `run` (one traced run), with progress on stderr.
    fn counted_run(
        &self,
        target: Target,
        tool: &'static str,
        run: impl FnOnce() -> Result<(Metrics, trace::SyscallCounts)>,
    ) -> SyscallRun {
        eprint!(
            "bench: syscalls: {TRACED_WORKLOAD} {} s through {} under {tool} … ",
            self.args.trace_time,
            target.label()
        );
        let result = run();
        match &result {
            Ok((m, c)) => eprintln!(
                "{} queries, {:.1} syscalls per query",
                m.queries,
                c.total as f64 / m.queries.max(1) as f64
            ),
            Err(e) => eprintln!("FAILED: {e:#}"),
        }
        SyscallRun {
            target,
            tool,
            result: result.map_err(|e| format!("{e:#}")),
        }
    }

    /// --profile DIR: one run per holdfast target under `perf record -g`, then `perf script`,
    /// folded stacks and the top functions, all in DIR.
    fn profiles(&self, dir: &Path) -> Result<Vec<ProfileRun>> {
        let args = self.args;
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir =
            std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
        let perf = procs::find_program(&["perf"]);
        let mut out = Vec::new();
        for &(target, port) in self.ports.iter().filter(|(t, _)| t.is_holdfast()) {
            eprint!(
                "bench: profile: {TRACED_WORKLOAD} {} s through {} under perf record … ",
                args.trace_time,
                target.label()
            );
            let result = (|| -> Result<Profile> {
                let exe = perf.as_deref().context("perf not found on PATH")?;
                let pid = pid_of(self.pids, target).context("no pid for this target")?;
                let files = trace::ProfileFiles::in_dir(&dir, target.name());
                let name = format!("perf-{}", target.name());
                let metrics = self.attached_run(
                    port,
                    exe,
                    &trace::perf_record_args(pid, &args.call_graph, &files.data),
                    &name,
                )?;
                let script = Command::new(exe)
                    .arg("script")
                    .arg("-i")
                    .arg(&files.data)
                    .output()
                    .context("running perf script")?;
                if !script.status.success() {
                    bail!(
                        "perf script failed ({}): {}",
                        script.status,
                        String::from_utf8_lossy(&script.stderr).trim()
                    );
                }
                fs::write(&files.script, &script.stdout)
                    .with_context(|| format!("writing {}", files.script.display()))?;
                let folded = trace::fold_perf_script(&String::from_utf8_lossy(&script.stdout));
                let mut text = String::new();
                for (stack, n) in &folded {
                    let _ = writeln!(text, "{stack} {n}");
                }
                fs::write(&files.folded, text)
                    .with_context(|| format!("writing {}", files.folded.display()))?;
                let title = format!("{} on {TRACED_WORKLOAD}", target.label());
                fs::write(&files.flamegraph, flamegraph::render(&title, &folded))
                    .with_context(|| format!("writing {}", files.flamegraph.display()))?;
                let samples = folded.iter().map(|(_, n)| n).sum();
                let kernel_share = trace::kernel_share(&folded);
                let (top_self, top_inclusive) = trace::top_functions(&folded, TOP_FUNCTIONS);
                let p = Profile {
                    metrics,
                    samples,
                    kernel_share,
                    files,
                    top_self,
                    top_inclusive,
                };
                let mut doc = Doc::new(false);
                p.render_tops(&mut doc);
                fs::write(&p.files.summary, doc.finish())
                    .with_context(|| format!("writing {}", p.files.summary.display()))?;
                Ok(p)
            })();
            match &result {
                Ok(p) => eprintln!("{} samples, see {}", p.samples, p.files.summary.display()),
                Err(e) => eprintln!("FAILED: {e:#}"),
            }
            out.push(ProfileRun {
                target,
                result: result.map_err(|e| format!("{e:#}")),
            });
        }
        Ok(out)
    }
}

impl Profile {
    /// The top functions by self and by inclusive samples, as two tables.
    fn render_tops(&self, out: &mut Doc) {
        let total = self.samples.max(1) as f64;
        let _ = writeln!(
            out,
            "{}{} samples, {} % of them in the kernel (`_[k]` frames).",
            if out.md { "\n" } else { "" },
            self.samples,
            fmt_opt(self.kernel_share.map(|k| k * 100.0), 1)
        );
        if out.md {
            out.paragraph("");
        }
        for (title, list) in [("self", &self.top_self), ("inclusive", &self.top_inclusive)] {
            let mut t = Table::new(&["samples", "%", &format!("function ({title})")]);
            for (f, n) in list {
                t.row(vec![
                    n.to_string(),
                    format!("{:.1}", *n as f64 * 100.0 / total),
                    // Rust names hold `<…>`, which Markdown would take for HTML.
                    if out.md { format!("`{f}`") } else { f.clone() },
                ]);
            }
            out.table(&t);
            out.paragraph("");
        }
    }
}

fn start_haproxy(exe: &Path, dir: &Path, backend_port: u16) -> Result<(Helper, u16)> {
    let port = procs::free_ports(1)?[0];
    let cfg = dir.join("haproxy.cfg");
    let text = format!(
        "# Written by `holdfast-bench bench`: a TCP pass-through to the primary, for comparison.\n\
         global\n    maxconn 8192\n    nbthread 2\n\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1h\n    \
         timeout server 1h\n    maxconn 8192\n\n\
         frontend mysql\n    bind 127.0.0.1:{port}\n    default_backend primary\n\n\
         backend primary\n    server primary 127.0.0.1:{backend_port} maxconn 8192\n"
    );
    fs::write(&cfg, text).with_context(|| format!("writing {}", cfg.display()))?;
    procs::run_capture(exe, [OsStr::new("-c"), OsStr::new("-f"), cfg.as_os_str()])
        .with_context(|| format!("haproxy rejects {}", cfg.display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("-db").arg("-f").arg(&cfg);
    let pid = procs::spawn_detached(&mut cmd, Some(&dir.join("haproxy.log")))?;
    let helper = Helper::register(dir, "haproxy", pid)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    procs::wait_tcp(&addr, LISTEN_TIMEOUT, || procs::is_alive(helper.pid)).with_context(|| {
        format!(
            "HAProxy did not listen on {addr}; see {}",
            dir.join("haproxy.log").display()
        )
    })?;
    Ok((helper, port))
}

/// Starts `holdfast-bench bare-relay` (this executable) to the primary on a free port, with
/// the worker threads holdfast runs by default.
fn start_bare_relay(dir: &Path, backend_port: u16, uring: bool) -> Result<(Helper, u16)> {
    let port = procs::free_ports(1)?[0];
    let me = std::env::current_exe().context("this executable's path")?;
    let threads = holdfast_config::ProxyConfig::default().effective_worker_threads();
    let mut cmd = Command::new(me);
    cmd.arg("bare-relay")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--to")
        .arg(format!("127.0.0.1:{backend_port}"))
        .arg("--threads")
        .arg(threads.to_string());
    let name = if uring {
        cmd.args(["--engine", "uring"]);
        "bare-uring-relay"
    } else {
        "bare-relay"
    };
    let log = dir.join(format!("{name}.log"));
    let pid = procs::spawn_detached(&mut cmd, Some(&log))?;
    let helper = Helper::register(dir, name, pid)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    procs::wait_tcp(&addr, LISTEN_TIMEOUT, || procs::is_alive(helper.pid)).with_context(|| {
        format!(
            "the bare relay did not listen on {addr}; see {}",
            log.display()
        )
    })?;
    Ok((helper, port))
}

/// Starts the `--baseline` binary with the lab's configuration on two free ports (proxy and
/// admin).
fn start_baseline(args: &BenchArgs, st: &LabStatus) -> Result<(Helper, u16)> {
    let exe = args
        .baseline
        .as_deref()
        .context("the holdfast_baseline target needs --baseline PATH")?;
    let p = procs::free_ports(2)?;
    let config = config_variant(
        st,
        "bench-holdfast-baseline.toml",
        "the baseline build, on its own ports",
        |c| {
            c.proxy.listen = format!("127.0.0.1:{}", p[0]);
            c.admin.listen = format!("127.0.0.1:{}", p[1]);
            // Its main listener only: the others' ports are the holdfast under test's.
            c.listeners.clear();
            set_transport(c, args.tls);
            c.split.primary_read_weight = args.primary_read_weight;
            Ok(())
        },
    )?;
    start_holdfast(exe, st, &config, &st.dir.join("holdfast-baseline.log"), &[])
}

/// A second process of the holdfast under test with a pass-through listener relayed in
/// user space (`kernel_relay = "off"`), on ports of its own; its pass-through port.
fn start_user_space_relay(exe: &Path, args: &BenchArgs, st: &LabStatus) -> Result<(Helper, u16)> {
    let p = procs::free_ports(3)?;
    let config = config_variant(
        st,
        "bench-holdfast-user-space.toml",
        "a pass-through listener relayed in user space, on its own ports",
        |c| {
            c.proxy.listen = format!("127.0.0.1:{}", p[0]);
            c.admin.listen = format!("127.0.0.1:{}", p[1]);
            c.proxy.kernel_relay = holdfast_config::KernelRelayMode::Off;
            c.listeners = vec![ListenerConfig {
                listen: format!("127.0.0.1:{}", p[2]),
                mode: ListenerMode::Passthrough,
                routing: Default::default(),
                trusted_proxies: None,
            }];
            set_transport(c, args.tls);
            Ok(())
        },
    )?;
    let (helper, _) = start_holdfast(
        exe,
        st,
        &config,
        &st.dir.join("holdfast-user-space.log"),
        &[p[2]],
    )?;
    Ok((helper, p[2]))
}

/// Caps every node of the lab at `cpus` CPUs (see `--node-cpus`).
fn limit_node_cpus(st: &LabStatus, cpus: f64) -> Result<()> {
    for node in &st.nodes {
        let Some(pid) = node.pid else {
            bail!("--node-cpus: {} does not run", node.name);
        };
        let key = st.dir.join(format!("{}.cpu", node.name));
        let group = holdfast_serverless::driver::process::limit_process_cpu(pid, &key, cpus)
            .map_err(|e| anyhow::anyhow!("--node-cpus: {}: {e}", node.name))?;
        eprintln!("bench: {} capped at {cpus} CPU ({group})", node.name);
    }
    Ok(())
}

fn passthrough_config(st: &LabStatus, port: u16, args: &BenchArgs) -> Result<PathBuf> {
    config_variant(
        st,
        "bench-holdfast.toml",
        "plus a pass-through listener",
        |c| {
            c.listeners.push(ListenerConfig {
                listen: format!("127.0.0.1:{port}"),
                mode: ListenerMode::Passthrough,
                routing: Default::default(),
                trusted_proxies: None,
            });
            set_transport(c, args.tls);
            c.split.primary_read_weight = args.primary_read_weight;
            Ok(())
        },
    )
}

/// holdfast's TLS for a run: the lab's (to clients, and verify-full to the nodes) with
/// `--tls`, none without, as for the other targets.
fn set_transport(c: &mut holdfast_config::Config, tls: bool) {
    if !tls {
        c.tls = Default::default();
        c.backend_tls = Default::default();
    }
}

fn transport_note(tls: bool) -> &'static str {
    if tls {
        "TLS to clients and to the nodes"
    } else {
        "clear text, like the other targets"
    }
}

/// A directory with what sysbench 1.0's `--mysql-ssl=on` reads from its working
/// directory: the lab's CA, and a client certificate (the nodes' own pair, which is
/// signed for client use too).
fn sysbench_tls_dir(st: &LabStatus) -> Result<PathBuf> {
    let tls = st
        .tls()
        .context("--tls: this lab has no TLS files (made before TLS); start a new lab")?;
    let dir = st.dir.join("bench-tls");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (from, to) in [
        (&tls.ca, "cacert.pem"),
        (&tls.node_cert, "client-cert.pem"),
        (&tls.node_key, "client-key.pem"),
    ] {
        fs::copy(from, dir.join(to))
            .with_context(|| format!("copying {} to {}", from.display(), dir.display()))?;
    }
    Ok(dir)
}

/// After closing idle clients, waits (up to 20 s) until the primary is back to a handful
/// of sessions, so the next measurement does not run into max_connections.
fn wait_sessions_closed(primary: &NodeStatus) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let connected = lab::node_sql(primary, "SHOW GLOBAL STATUS LIKE 'Threads_connected'")
            .ok()
            .and_then(|rows| rows.into_iter().next())
            .and_then(|row| row.get(1).and_then(|v| v.parse::<u64>().ok()));
        if connected.is_some_and(|c| c < 100) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

struct Versions {
    mariadbd: String,
    sysbench: String,
    haproxy: String,
}

struct Report<'a> {
    args: &'a BenchArgs,
    provenance: Provenance,
    versions: Versions,
    targets: Vec<(Target, u16)>,
    unavailable: Vec<(Target, String)>,
    runs: Vec<Run>,
    syscall_runs: Vec<SyscallRun>,
    profiles: Vec<ProfileRun>,
    idle: Vec<(Target, std::result::Result<idle::IdleResult, String>)>,
    sysbench_example: String,
}

#[derive(Clone, Copy, Default)]
struct Summary {
    tps: Option<f64>,
    /// The lowest and highest tps of the runs.
    tps_range: Option<(f64, f64)>,
    qps: Option<f64>,
    avg: Option<f64>,
    p50: Option<f64>,
    p95: Option<f64>,
    p99: Option<f64>,
    errors: u64,
    reconnects: u64,
    ok: usize,
    runs: usize,
    per_query: PerQuery,
}

/// Costs per query of one run, or their medians.
#[derive(Clone, Copy, Default)]
struct PerQuery {
    /// The proxy's CPU µs per query.
    proxy_us: Option<f64>,
    /// The proxy's voluntary and involuntary context switches per query.
    voluntary: Option<f64>,
    involuntary: Option<f64>,
    /// mariadbd's CPU µs per query.
    server_us: Option<f64>,
    /// The whole machine's user and kernel CPU µs per query (sysbench, the proxy,
    /// mariadbd and the kernel's own threads together).
    machine_user_us: Option<f64>,
    machine_kernel_us: Option<f64>,
}

/// Header cells of [`PerQuery::cells`].
const PER_QUERY_HEADERS: [&str; 6] = [
    "proxy CPU µs/q",
    "vol cs/q",
    "invol cs/q",
    "mariadbd CPU µs/q",
    "machine user µs/q",
    "machine kernel µs/q",
];

impl PerQuery {
    /// Report cells (see [`PER_QUERY_HEADERS`]).
    fn cells(&self) -> [String; 6] {
        [
            fmt_opt(self.proxy_us, 1),
            fmt_opt(self.voluntary, 2),
            fmt_opt(self.involuntary, 3),
            fmt_opt(self.server_us, 1),
            fmt_opt(self.machine_user_us, 1),
            fmt_opt(self.machine_kernel_us, 1),
        ]
    }

    /// Medians over runs.
    fn medians(all: &[PerQuery]) -> PerQuery {
        let pick = |f: fn(&PerQuery) -> Option<f64>| median(all.iter().filter_map(f).collect());
        PerQuery {
            proxy_us: pick(|q| q.proxy_us),
            voluntary: pick(|q| q.voluntary),
            involuntary: pick(|q| q.involuntary),
            server_us: pick(|q| q.server_us),
            machine_user_us: pick(|q| q.machine_user_us),
            machine_kernel_us: pick(|q| q.machine_kernel_us),
        }
    }
}

impl Report<'_> {
    fn summary(&self, workload: &str, target: Target) -> Summary {
        let runs: Vec<&Run> = self
            .runs
            .iter()
            .filter(|r| r.workload == workload && r.target == target)
            .collect();
        let ok: Vec<&Metrics> = runs.iter().filter_map(|r| r.result.as_ref().ok()).collect();
        let pick = |f: fn(&Metrics) -> f64| median(ok.iter().map(|m| f(m)).collect());
        let pick_opt =
            |f: fn(&Metrics) -> Option<f64>| median(ok.iter().filter_map(|m| f(m)).collect());
        let tps: Vec<f64> = ok.iter().map(|m| m.tps).collect();
        Summary {
            tps: pick(|m| m.tps),
            tps_range: tps
                .iter()
                .copied()
                .reduce(f64::min)
                .zip(tps.iter().copied().reduce(f64::max)),
            qps: pick(|m| m.qps),
            avg: pick(|m| m.lat_avg_ms),
            p50: pick_opt(|m| m.lat_p50_ms),
            p95: pick(|m| m.lat_p95_ms),
            p99: pick_opt(|m| m.lat_p99_ms),
            errors: ok.iter().map(|m| m.errors).sum(),
            reconnects: ok.iter().map(|m| m.reconnects).sum(),
            ok: ok.len(),
            runs: runs.len(),
            per_query: PerQuery::medians(&runs.iter().map(|r| r.per_query()).collect::<Vec<_>>()),
        }
    }

    /// The medians as pictures: per workload, bars of tps (with the ratio to HAProxy), of
    /// p99 latency and of the whole machine's CPU per query, one bar per target.
    fn render_html(&self) -> String {
        use crate::chart;
        let a = self.args;
        let mut sections = Vec::new();
        for w in &a.workloads {
            let hp = self.summary(w, Target::Haproxy);
            let machine =
                |s: &Summary| Some(s.per_query.machine_user_us? + s.per_query.machine_kernel_us?);
            let mut tps = Vec::new();
            let mut p99 = Vec::new();
            let mut cpu = Vec::new();
            for &(target, _) in &self.targets {
                let s = self.summary(w, target);
                let vs = |v: Option<f64>, base: Option<f64>| match (v, base) {
                    (Some(v), Some(b)) if b > 0.0 && target != Target::Haproxy => {
                        format!("{:.2}x HAProxy", v / b)
                    }
                    _ => String::new(),
                };
                if let Some(v) = s.tps {
                    let spread = s
                        .tps_range
                        .map_or(String::new(), |(lo, hi)| format!(" ({lo:.0}-{hi:.0})"));
                    tps.push((
                        target.label().to_string(),
                        v,
                        format!("{}{spread}", vs(s.tps, hp.tps)),
                    ));
                }
                if let Some(v) = s.p99 {
                    p99.push((target.label().to_string(), v, vs(s.p99, hp.p99)));
                }
                if let Some(v) = machine(&s) {
                    cpu.push((target.label().to_string(), v, vs(Some(v), machine(&hp))));
                }
            }
            sections.push((
                w.clone(),
                [
                    chart::bar_chart("transactions per second, median", "tps", &tps),
                    chart::bar_chart("99th percentile latency, median", "ms", &p99),
                    chart::bar_chart("the whole machine's CPU per query, median", "µs", &cpu),
                ]
                .join("\n"),
            ));
        }
        let context = vec![
            format!(
                "{} round(s) x {} s, {} threads, {} tables x {} rows, nproc {}, targets interleaved",
                a.rounds, a.time, a.threads, a.tables, a.table_size, self.provenance.nproc
            ),
            format!("mariadbd {}; {}; {}", self.versions.mariadbd, self.versions.sysbench, self.versions.haproxy),
            "in parentheses: the lowest and highest tps of the rounds".into(),
        ];
        chart::page("holdfast benchmark", &context, &sections)
    }

    fn render(&self, md: bool) -> String {
        let a = self.args;
        let mut out = Doc::new(md);
        self.provenance.header(&mut out, "holdfast benchmark");
        out.item(format_args!("mariadbd: {}", self.versions.mariadbd));
        out.item(format_args!("sysbench: {}", self.versions.sysbench));
        out.item(format_args!("haproxy: {}", self.versions.haproxy));
        out.item(format_args!(
            "transport: {}",
            if a.tls {
                "TLS end to end (sysbench --mysql-ssl=on; holdfast terminates TLS and \
                 opens its own verified TLS to the node; HAProxy passes TLS through)"
            } else {
                "clear text"
            }
        ));
        out.item(format_args!(
            "setup: {} round(s) × {} s, {} threads, {} tables × {} rows; order rotated each round",
            a.rounds, a.time, a.threads, a.tables, a.table_size
        ));
        out.item(format_args!(
            "sysbench: `sysbench {}`",
            self.sysbench_example
        ));
        let ports: Vec<String> = self
            .targets
            .iter()
            .map(|(t, p)| format!("{} 127.0.0.1:{p}", t.label()))
            .collect();
        out.item(format_args!("targets: {}", ports.join(", ")));
        if !md {
            let _ = writeln!(
                out,
                "holdfast benchmark — {} round(s) × {} s, {} threads, {} tables × {} rows, nproc {}",
                a.rounds, a.time, a.threads, a.tables, a.table_size, self.provenance.nproc
            );
        }
        for (t, why) in &self.unavailable {
            let _ = writeln!(
                out,
                "{}{} NOT MEASURED: {}",
                if md { "\n> **" } else { "" },
                t.label(),
                why.replace('\n', " / ")
            );
        }

        out.heading("Medians");
        let mut t = Table::new(
            &[
                &[
                    "workload",
                    "target",
                    "tps",
                    "tps min-max",
                    "qps",
                    "avg ms",
                    "p50 ms",
                    "p95 ms",
                    "p99 ms",
                    "errors",
                    "reconnects",
                    "ok/runs",
                ][..],
                &PER_QUERY_HEADERS,
            ]
            .concat(),
        );
        for w in &a.workloads {
            for &(target, _) in &self.targets {
                let s = self.summary(w, target);
                let mut row = vec![
                    w.clone(),
                    target.label().into(),
                    fmt_opt(s.tps, 0),
                    s.tps_range
                        .map_or_else(|| "-".into(), |(lo, hi)| format!("{lo:.0}-{hi:.0}")),
                    fmt_opt(s.qps, 0),
                    fmt_opt(s.avg, 2),
                    fmt_opt(s.p50, 2),
                    fmt_opt(s.p95, 2),
                    fmt_opt(s.p99, 2),
                    s.errors.to_string(),
                    s.reconnects.to_string(),
                    format!("{}/{}", s.ok, s.runs),
                ];
                row.extend(s.per_query.cells());
                t.row(row);
            }
        }
        out.table(&t);
        out.paragraph(
            "CPU µs/q: utime+stime from /proc/PID/stat over the run divided by the queries \
             sysbench reports (clock-tick resolution); the proxy's (HAProxy's or holdfast's) \
             process, and mariadbd's as context. cs/q: the proxy's voluntary/involuntary \
             context switches (summed over its threads) per query. machine µs/q: the whole \
             machine's CPU from /proc/stat (user: user+nice; kernel: system+irq+softirq, \
             the kernel's own threads included, such as the sockmap's workers that no \
             process's figure shows) per query: sysbench, the proxy and mariadbd together.",
        );

        let proxied: Vec<Target> = self
            .targets
            .iter()
            .map(|(t, _)| *t)
            .filter(|t| t.is_holdfast() || matches!(t, Target::BareRelay | Target::BareUringRelay))
            .collect();
        if !proxied.is_empty() {
            out.heading("Ratios (medians)");
            let mut t = Table::new(&[
                "workload",
                "target",
                "tps /direct",
                "tps /haproxy",
                "tps /bare relay",
                "p95 /direct",
                "p95 /haproxy",
                "p99 /haproxy",
                "CPU/q /haproxy",
                "machine CPU/q /haproxy",
            ]);
            let machine =
                |s: &Summary| Some(s.per_query.machine_user_us? + s.per_query.machine_kernel_us?);
            for w in &a.workloads {
                let d = self.summary(w, Target::Direct);
                let hp = self.summary(w, Target::Haproxy);
                let bare = self.summary(w, Target::BareRelay);
                for &target in &proxied {
                    let hf = self.summary(w, target);
                    t.row(vec![
                        w.clone(),
                        target.label().into(),
                        ratio(hf.tps, d.tps),
                        ratio(hf.tps, hp.tps),
                        ratio(hf.tps, bare.tps),
                        ratio(hf.p95, d.p95),
                        ratio(hf.p95, hp.p95),
                        ratio(hf.p99, hp.p99),
                        ratio(hf.per_query.proxy_us, hp.per_query.proxy_us),
                        ratio(machine(&hf), machine(&hp)),
                    ]);
                }
            }
            out.table(&t);
        }

        out.heading("Per run");
        let mut t = Table::new(
            &[
                &["round", "workload", "target"][..],
                &METRIC_HEADERS,
                &["reconnects"],
                &PER_QUERY_HEADERS,
            ]
            .concat(),
        );
        for r in &self.runs {
            let mut row = vec![
                r.round.to_string(),
                r.workload.clone(),
                r.target.label().into(),
            ];
            match &r.result {
                Ok(m) => {
                    row.extend(m.cells());
                    row.push(m.reconnects.to_string());
                    row.extend(r.per_query().cells());
                }
                Err(e) => {
                    row.push(format!("FAILED: {e}"));
                    row.extend(std::iter::repeat_n(
                        String::new(),
                        METRIC_HEADERS.len() + PER_QUERY_HEADERS.len(),
                    ));
                }
            }
            t.row(row);
        }
        out.table(&t);

        self.render_syscalls(&mut out);
        self.render_profiles(&mut out);

        if !self.idle.is_empty() {
            out.heading("Idle session memory (RSS)");
            let mut t = Table::new(&[
                "process",
                "clients",
                "RSS before KiB",
                "RSS half-way KiB",
                "RSS after KiB",
                "KiB per session",
                "KiB per added session",
                "heap bytes per added session",
                "note",
            ]);
            for (target, r) in &self.idle {
                let process = match target {
                    Target::Direct => "mariadbd (direct)",
                    other => other.label(),
                };
                match r {
                    Ok(r) => t.row(vec![
                        process.into(),
                        r.clients.to_string(),
                        r.rss_before_kib.to_string(),
                        r.rss_half_kib.to_string(),
                        r.rss_after_kib.to_string(),
                        format!("{:.1}", r.per_session_kib()),
                        format!("{:.1}", r.per_added_session_kib()),
                        r.heap_per_added_session()
                            .map_or("-".to_string(), |b| format!("{b:.0}")),
                        if r.stable {
                            ""
                        } else {
                            "RSS still moving after 15 s"
                        }
                        .into(),
                    ]),
                    Err(e) => t.row(vec![
                        process.into(),
                        self.args.idle_clients.to_string(),
                        String::new(),
                        String::new(),
                        String::new(),
                        "FAILED".into(),
                        String::new(),
                        String::new(),
                        e.replace('\n', " / "),
                    ]),
                }
            }
            out.table(&t);
            out.paragraph(
                "Each client logs in (app, mysql_native_password; over TLS with --tls; with the connection attributes a libmariadb client sends), runs SELECT 1 and stays idle; \
                 the clients come in two halves, RSS read after each has idled for 2 s and RSS \
                 has settled. Per session: the whole rise \
                 over all clients (what the process takes once, such as the logins' working set \
                 left as free chunks, is spread over them); per added session: the second half's \
                 rise over its clients; heap: the same rise of the allocator's bytes in use \
                 (holdfast's holdfast_heap_in_use_bytes), without the free chunks RSS counts. For haproxy and holdfast the server-side sessions live in \
                 mariadbd, not in the proxy.",
            );
        }
        if !md {
            let _ = writeln!(
                out,
                "\n{} / {} / {}",
                self.versions.mariadbd, self.versions.sysbench, self.versions.haproxy
            );
        }
        out.finish()
    }
}

impl Report<'_> {
    /// The --syscalls runs: syscalls per query under strace, beside the untraced context
    /// switches per query (medians of the point_select rounds).
    fn render_syscalls(&self, out: &mut Doc) {
        if self.syscall_runs.is_empty() {
            return;
        }
        out.heading("Syscalls per query (separate runs)");
        let mut t = Table::new(&[
            "target",
            "counted by",
            "queries",
            "qps (counted run)",
            "syscalls/q",
            "top 5 syscalls per query",
            "vol cs/q",
            "invol cs/q",
        ]);
        for r in &self.syscall_runs {
            let s = self.summary(TRACED_WORKLOAD, r.target);
            let switches = [
                fmt_opt(s.per_query.voluntary, 2),
                fmt_opt(s.per_query.involuntary, 3),
            ];
            match &r.result {
                Ok((m, c)) => {
                    let q = m.queries.max(1) as f64;
                    let top: Vec<String> = c
                        .calls
                        .iter()
                        .take(5)
                        .map(|(name, n)| format!("{name} {:.2}", *n as f64 / q))
                        .collect();
                    let mut row = vec![
                        r.target.label().into(),
                        r.tool.into(),
                        m.queries.to_string(),
                        format!("{:.0}", m.qps),
                        format!("{:.2}", c.total as f64 / q),
                        top.join(", "),
                    ];
                    row.extend(switches);
                    t.row(row);
                }
                Err(e) => t.row(vec![
                    r.target.label().into(),
                    r.tool.into(),
                    format!("FAILED: {}", e.replace('\n', " / ")),
                ]),
            }
        }
        out.table(&t);
        out.paragraph(format_args!(
            "Two extra {TRACED_WORKLOAD} runs of {} s per proxy, not part of the medians \
             (outputs in bench-logs/strace-TARGET.txt and perf-stat-TARGET.csv): one with \
             `strace -c -f -p PID` attached, which names every syscall but stops the proxy at \
             each, so the run is several times slower and a slowed proxy may batch more per \
             epoll_wait; then one with `perf stat -p PID` counting raw_syscalls:sys_enter and \
             the five most frequent syscalls of the strace run, at little cost to the proxy. \
             The context switches per query are the medians of the untraced {TRACED_WORKLOAD} \
             rounds.",
            self.args.trace_time
        ));
    }

    /// The --profile runs: where the files are, and the top functions.
    fn render_profiles(&self, out: &mut Doc) {
        for r in &self.profiles {
            out.heading(&format!(
                "Profile of {} (perf record, separate run)",
                r.target.label()
            ));
            match &r.result {
                Ok(p) => {
                    out.paragraph(format_args!(
                        "perf record -F 999 --call-graph {} over a {} s {TRACED_WORKLOAD} run \
                         ({} queries, {:.0} qps). Files: {} (perf script), {} (folded stacks), {} \
                         (flame graph), {} (these tables).",
                        self.args.call_graph,
                        self.args.trace_time,
                        p.metrics.queries,
                        p.metrics.qps,
                        p.files.script.display(),
                        p.files.folded.display(),
                        p.files.flamegraph.display(),
                        p.files.summary.display(),
                    ));
                    p.render_tops(out);
                }
                Err(e) => out.paragraph(format_args!("FAILED: {}", e.replace('\n', " / "))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_args_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let cli = Cli::try_parse_from([
            "bench",
            "--dir",
            "/tmp/x",
            "--workloads",
            "oltp_point_select",
            "--targets",
            "direct,haproxy",
        ])
        .unwrap();
        assert_eq!(cli.bench.rounds, 3);
        assert_eq!(cli.bench.idle_clients, 1000);
        assert_eq!(cli.bench.workloads, vec!["oltp_point_select"]);
        assert_eq!(cli.bench.targets, vec![Target::Direct, Target::Haproxy]);
        for list in [
            "direct,haproxy,holdfast,holdfast_passthrough",
            "direct,haproxy,holdfast,holdfast-passthrough",
        ] {
            let cli = Cli::try_parse_from(["bench", "--targets", list]).unwrap();
            assert_eq!(
                cli.bench.targets,
                vec![
                    Target::Direct,
                    Target::Haproxy,
                    Target::Holdfast,
                    Target::HoldfastPassthrough
                ]
            );
        }
        assert_eq!(
            Target::HoldfastPassthrough.label(),
            "holdfast (pass-through)"
        );
    }
}
