//! Running sysbench against a lab and reading its report.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use holdfast_lab::{procs, LabStatus};

/// Connection and sizing parameters shared by every sysbench invocation.
#[derive(Clone, Debug)]
pub struct Sysbench {
    pub exe: PathBuf,
    pub user: String,
    pub password: String,
    pub db: String,
    pub tables: u32,
    pub table_size: u32,
    /// Value of `--mysql-ignore-errors`.
    pub ignore_errors: String,
    /// TLS (`--mysql-ssl=on`): sysbench 1.0 reads `cacert.pem`, `client-cert.pem` and
    /// `client-key.pem` from its working directory, so it runs in this one.
    pub tls_dir: Option<PathBuf>,
    /// More options for every run (e.g. `--skip_trx=on`).
    pub extra: Vec<String>,
}

/// Numbers of one successful run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    pub tps: f64,
    pub qps: f64,
    /// Queries served in the run (the total, not per second).
    pub queries: u64,
    pub lat_avg_ms: f64,
    /// The median and the 99th percentile, from sysbench's latency histogram (absent
    /// from a report printed without `--histogram`).
    pub lat_p50_ms: Option<f64>,
    pub lat_p95_ms: f64,
    pub lat_p99_ms: Option<f64>,
    pub lat_max_ms: f64,
    pub errors: u64,
    pub reconnects: u64,
}

/// Column headers of [`Metrics::cells`].
pub const METRIC_HEADERS: [&str; 8] = [
    "tps", "qps", "avg ms", "p50 ms", "p95 ms", "p99 ms", "max ms", "errors",
];

impl Metrics {
    /// Throughput, latencies and errors as report cells (see [`METRIC_HEADERS`]).
    pub fn cells(&self) -> [String; 8] {
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
        [
            format!("{:.0}", self.tps),
            format!("{:.0}", self.qps),
            format!("{:.2}", self.lat_avg_ms),
            opt(self.lat_p50_ms),
            format!("{:.2}", self.lat_p95_ms),
            opt(self.lat_p99_ms),
            format!("{:.2}", self.lat_max_ms),
            self.errors.to_string(),
        ]
    }
}

impl Sysbench {
    /// sysbench (`exe`) as the lab's application user on its database.
    pub fn for_lab(
        exe: PathBuf,
        st: &LabStatus,
        tables: u32,
        table_size: u32,
        ignore_errors: &str,
    ) -> Sysbench {
        Sysbench {
            exe,
            user: st.app_user.clone(),
            password: st.app_password.clone(),
            db: st.database.clone(),
            tables,
            table_size,
            ignore_errors: ignore_errors.into(),
            tls_dir: None,
            extra: Vec::new(),
        }
    }

    /// `WORKLOAD --mysql-…(port) --tables… OPTIONS… COMMAND`, for callers that run sysbench
    /// themselves (`--mysql-ignore-errors` is left to them).
    pub fn command(&self, workload: &str, port: u16, options: &[String], cmd: &str) -> Vec<String> {
        let mut args = vec![workload.to_string()];
        args.extend(self.common_args(port));
        args.extend(options.iter().cloned());
        args.push(cmd.into());
        args
    }

    fn common_args(&self, port: u16) -> Vec<String> {
        let tls = self.tls_dir.as_ref().map(|_| "--mysql-ssl=on".to_string());
        let mut args = vec![
            "--mysql-host=127.0.0.1".into(),
            format!("--mysql-port={port}"),
            format!("--mysql-user={}", self.user),
            format!("--mysql-password={}", self.password),
            format!("--mysql-db={}", self.db),
            format!("--tables={}", self.tables),
            format!("--table-size={}", self.table_size),
        ];
        args.extend(tls);
        args
    }

    /// `sysbench oltp_read_write prepare` against `port`, logging to `log`.
    pub fn prepare(&self, port: u16, log: &Path) -> Result<()> {
        let threads = format!("--threads={}", self.tables.clamp(1, 4));
        let args = self.command("oltp_read_write", port, &[threads], "prepare");
        // Generous: 20 × 10 000 rows take a few seconds; large sizes take minutes.
        let budget =
            Duration::from_secs(600 + u64::from(self.tables) * u64::from(self.table_size) / 2_000);
        let (ok, out) = self.run_logged(&args, log, budget)?;
        if !ok {
            bail!(
                "sysbench prepare failed (log {}):\n{}",
                log.display(),
                tail(&out, 20)
            );
        }
        Ok(())
    }

    /// The exact command line of a benchmark run (for reports).
    pub fn run_args(&self, workload: &str, port: u16, threads: u32, time: u32) -> Vec<String> {
        let mut options = vec![
            format!("--threads={threads}"),
            format!("--time={time}"),
            "--db-ps-mode=auto".into(),
            "--report-interval=0".into(),
            // The latency histogram, for the median and the 99th percentile.
            "--histogram=on".into(),
            format!("--mysql-ignore-errors={}", self.ignore_errors),
        ];
        if workload == "oltp_point_select" {
            options.push("--rand-type=uniform".into());
        }
        options.extend(self.extra.iter().cloned());
        self.command(workload, port, &options, "run")
    }

    /// One benchmark run; `Err` carries the reason a run failed (exit status, output tail).
    pub fn run(
        &self,
        workload: &str,
        port: u16,
        threads: u32,
        time: u32,
        log: &Path,
    ) -> Result<std::result::Result<Metrics, String>> {
        let args = self.run_args(workload, port, threads, time);
        let budget = Duration::from_secs(u64::from(time) + 120);
        let (ok, out) = self.run_logged(&args, log, budget)?;
        if !ok {
            return Ok(Err(format!(
                "sysbench failed (log {}): {}",
                log.display(),
                tail(&out, 6).replace('\n', " / ")
            )));
        }
        Ok(parse_report(&out).map_err(|e| format!("{e:#} (log {})", log.display())))
    }

    /// Runs sysbench with output to `log`; kills it after `budget`. Returns (success, output).
    fn run_logged(&self, args: &[String], log: &Path, budget: Duration) -> Result<(bool, String)> {
        let file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let file2 = file.try_clone().context("duplicating log handle")?;
        let mut cmd = Command::new(&self.exe);
        if let Some(dir) = &self.tls_dir {
            cmd.current_dir(dir);
        }
        let mut child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(file2)
            .spawn()
            .with_context(|| format!("starting {}", self.exe.display()))?;
        let deadline = Instant::now() + budget;
        let status = loop {
            if let Some(status) = child.try_wait().context("waiting for sysbench")? {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = String::from_utf8_lossy(&fs::read(log).unwrap_or_default()).into_owned();
        match status {
            Some(s) if s.success() => Ok((true, out)),
            Some(s) => Ok((false, format!("{out}\n({s})"))),
            None => Ok((
                false,
                format!("{out}\n(killed: still running after {budget:?})"),
            )),
        }
    }
}

/// Prepares the sysbench tables on the primary unless they already hold the right shape.
pub fn prepare_tables(sb: &Sysbench, st: &LabStatus, logs: &Path) -> Result<()> {
    let primary = st.primary()?;
    let db = &st.database;
    let count = |sql: &str| -> Result<u64> {
        Ok(holdfast_lab::node_sql_value(primary, sql)?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    };
    let tables = count(&format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA='{db}' \
         AND TABLE_NAME REGEXP '^sbtest[0-9]+$'"
    ))?;
    let ready = tables == u64::from(sb.tables)
        && [1, sb.tables].iter().all(|i| {
            count(&format!("SELECT COUNT(*) FROM `{db}`.`sbtest{i}`")).ok()
                == Some(u64::from(sb.table_size))
        });
    if ready {
        eprintln!(
            "sysbench tables already prepared ({} × {} rows)",
            sb.tables, sb.table_size
        );
        return Ok(());
    }
    eprintln!(
        "preparing {} sysbench tables × {} rows on {} …",
        sb.tables, sb.table_size, primary.name
    );
    let t = Instant::now();
    holdfast_lab::node_sql(
        primary,
        &format!("DROP DATABASE IF EXISTS `{db}`; CREATE DATABASE `{db}`"),
    )?;
    let (node, schema, tables) = (primary.clone(), db.clone(), sb.tables);
    let ticker = holdfast_lab::progress::Ticker::start("sysbench prepare", move || {
        let made = holdfast_lab::node_sql_value(
            &node,
            &format!(
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA='{schema}'"
            ),
        )
        .ok()??;
        Some(format!("{made} of {tables} tables made"))
    });
    let prepared = sb.prepare(primary.port, &logs.join("prepare.log"));
    drop(ticker);
    prepared?;
    eprintln!("prepared in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Parses the final report of `sysbench … run` (sysbench 1.0).
pub fn parse_report(out: &str) -> Result<Metrics> {
    let mut m = Metrics::default();
    let mut seen_tps = false;
    let mut seen_lat = false;
    let mut in_latency = false;
    for line in out.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("Latency (ms):") {
            in_latency = true;
            continue;
        }
        let Some((key, rest)) = trimmed.split_once(':') else {
            continue;
        };
        let key = key.trim();
        let rest = rest.trim();
        match key {
            "transactions" => {
                m.tps = per_sec(rest).context("transactions line")?;
                seen_tps = true;
            }
            "queries" => {
                m.qps = per_sec(rest).context("queries line")?;
                m.queries = first_int(rest).context("queries line")?;
            }
            "ignored errors" => m.errors = first_int(rest).context("ignored errors line")?,
            "reconnects" => m.reconnects = first_int(rest).context("reconnects line")?,
            "avg" if in_latency => {
                m.lat_avg_ms = first_float(rest).context("latency avg line")?;
                seen_lat = true;
            }
            "max" if in_latency => m.lat_max_ms = first_float(rest).context("latency max")?,
            "95th percentile" if in_latency => {
                m.lat_p95_ms = first_float(rest).context("latency 95th percentile")?
            }
            _ => {}
        }
    }
    if !seen_tps || !seen_lat {
        bail!("no transactions/latency figures in sysbench output");
    }
    let histogram = parse_histogram(out);
    m.lat_p50_ms = percentile(&histogram, 0.50);
    m.lat_p99_ms = percentile(&histogram, 0.99);
    Ok(m)
}

/// The rows of sysbench's `Latency histogram (values are in milliseconds)`: each
/// bucket's value and count, e.g. `       0.412 |****        1234`.
fn parse_histogram(out: &str) -> Vec<(f64, u64)> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in out.lines() {
        if line.trim_start().starts_with("Latency histogram") {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        let Some((value, rest)) = line.split_once('|') else {
            if line.trim().is_empty() && !rows.is_empty() {
                break;
            }
            continue;
        };
        let value = value.trim().parse::<f64>();
        let count = rest
            .split_whitespace()
            .last()
            .and_then(|c| c.parse::<u64>().ok());
        if let (Ok(value), Some(count)) = (value, count) {
            rows.push((value, count));
        }
    }
    rows
}

/// The bucket value under which a fraction `q` of the events fell.
fn percentile(histogram: &[(f64, u64)], q: f64) -> Option<f64> {
    let total: u64 = histogram.iter().map(|(_, c)| c).sum();
    if total == 0 {
        return None;
    }
    let wanted = (total as f64 * q).ceil() as u64;
    let mut seen = 0;
    for &(value, count) in histogram {
        seen += count;
        if seen >= wanted {
            return Some(value);
        }
    }
    histogram.last().map(|(v, _)| *v)
}

/// `12345  (617.11 per sec.)` → 617.11
fn per_sec(rest: &str) -> Result<f64> {
    let open = rest.find('(').context("no '(' in per-second figure")?;
    first_float(&rest[open + 1..])
}

fn first_float(s: &str) -> Result<f64> {
    let w = s.split_whitespace().next().context("missing number")?;
    w.parse().with_context(|| format!("not a number: {w:?}"))
}

fn first_int(s: &str) -> Result<u64> {
    let w = s.split_whitespace().next().context("missing number")?;
    w.parse().with_context(|| format!("not an integer: {w:?}"))
}

/// `sysbench --version` (e.g. `sysbench 1.0.20`).
pub fn version(exe: &Path) -> String {
    procs::run_capture(exe, ["--version"])
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({e:#})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"sysbench 1.0.20 (using system LuaJIT 2.1.0-beta3)

Running the test with following options:
Number of threads: 20
Initializing random number generator from current time


Initializing worker threads...

Threads started!

SQL statistics:
    queries performed:
        read:                            1008744
        write:                           0
        other:                           0
        total:                           1008744
    transactions:                        1008744 (50425.69 per sec.)
    queries:                             1008744 (50425.69 per sec.)
    ignored errors:                      0      (0.00 per sec.)
    reconnects:                          0      (0.00 per sec.)

General statistics:
    total time:                          20.0028s
    total number of events:              1008744

Latency (ms):
         min:                                    0.05
         avg:                                    0.40
         max:                                   20.11
         95th percentile:                        0.81
         sum:                               399013.80

Threads fairness:
    events (avg/stddev):           50437.2000/449.60
    execution time (avg/stddev):   19.9507/0.00
"#;

    #[test]
    fn parses_sysbench_report() {
        let m = parse_report(SAMPLE).unwrap();
        assert_eq!(m.tps, 50425.69);
        assert_eq!(m.qps, 50425.69);
        assert_eq!(m.queries, 1008744);
        assert_eq!(m.lat_avg_ms, 0.40);
        assert_eq!(m.lat_p95_ms, 0.81);
        assert_eq!(m.lat_max_ms, 20.11);
        assert_eq!(m.errors, 0);
        assert_eq!(m.reconnects, 0);
    }

    #[test]
    fn reads_the_median_and_p99_from_the_histogram() {
        let with = SAMPLE.replace(
            "SQL statistics:",
            "Latency histogram (values are in milliseconds)\n       value  ------------- distribution ------------- count\n          0.300 |*                                        10\n          0.400 |****************************************  80\n          0.800 |***                                       9\n         20.110 |*                                        1\n \nSQL statistics:",
        );
        let m = parse_report(&with).unwrap();
        assert_eq!(m.lat_p50_ms, Some(0.4));
        assert_eq!(m.lat_p99_ms, Some(0.8));
        assert_eq!(m.lat_p95_ms, 0.81);
        let without = parse_report(SAMPLE).unwrap();
        assert_eq!((without.lat_p50_ms, without.lat_p99_ms), (None, None));
    }

    #[test]
    fn rejects_output_without_figures() {
        assert!(parse_report("FATAL: unable to connect to MySQL server").is_err());
    }
}
