//! Operator-command driver: every action is a shell command the operator configures, so
//! whatever already manages the database (systemd, Kubernetes, a cloud CLI) keeps doing so.

use super::{ready, DriverError, DriverFuture, InstanceDriver, PowerState, ScaleApplied};
use holdfast_config::serverless::ExecDriverConfig;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::task::JoinHandle;

/// Memory that goes with one capacity unit, passed to scale commands.
const MIB_PER_CCU: f64 = 2048.0;
/// Output kept per stream (stdout: the beginning, stderr: the end).
const OUTPUT_CAP: usize = 64 * 1024;
/// Lines of stderr quoted in errors.
const ERROR_LINES: usize = 10;
/// After the command exits, how long to keep collecting output still in the pipes. A
/// background process started by the command may hold the pipes open indefinitely; it is
/// not waited for.
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

/// Runs the operator's commands; see [`ExecDriverConfig`].
pub struct ExecDriver {
    cfg: ExecDriverConfig,
    address: String,
    /// Serializes start/stop/freeze/thaw: the commands are not expected to cope with
    /// running concurrently.
    ops: tokio::sync::Mutex<()>,
}

impl ExecDriver {
    /// `address` is the server's `host:port`, passed to commands and probed after start/thaw.
    pub fn new(cfg: ExecDriverConfig, address: &str) -> Self {
        ExecDriver {
            cfg,
            address: address.to_string(),
            ops: tokio::sync::Mutex::new(()),
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.timeout_ms)
    }

    /// Runs `command` for `action`; its stdout on success.
    async fn run(
        &self,
        action: &'static str,
        command: &str,
        env: &[(&str, String)],
    ) -> Result<String, DriverError> {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(command)
            .env("HOLDFAST_ADDRESS", &self.address)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a timeout kills everything the command started.
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            DriverError::Failed(format!("cannot run the {action} command (sh): {e}"))
        })?;
        let stdout = Collector::start(child.stdout.take(), Keep::Head);
        let stderr = Collector::start(child.stderr.take(), Keep::Tail);

        let waited = tokio::time::timeout(self.timeout(), child.wait()).await;
        let status = match waited {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => {
                return Err(DriverError::Failed(format!(
                    "cannot wait for the {action} command: {e}"
                )))
            }
            Err(_) => {
                if let Some(pgid) = child.id().and_then(|id| libc::pid_t::try_from(id).ok()) {
                    // The group still exists: its leader is unreaped until child.wait below.
                    if let Err(e) = super::process::send_signal(-pgid, libc::SIGKILL) {
                        tracing::debug!("exec driver: killing the {action} command's group: {e}");
                    }
                }
                if let Err(e) = child.kill().await {
                    tracing::debug!("exec driver: killing the {action} command: {e}");
                }
                let stderr = stderr.finish(action).await;
                return Err(DriverError::Failed(format!(
                    "the {action} command `{command}` timed out after {} ms and was killed{}",
                    self.cfg.timeout_ms,
                    quote(&stderr)
                )));
            }
        };
        let out = stdout.finish(action).await;
        let err = stderr.finish(action).await;
        if !status.success() {
            let detail = if err.trim().is_empty() { &out } else { &err };
            return Err(DriverError::Failed(format!(
                "the {action} command `{command}` failed ({}){}",
                describe(status),
                quote(detail)
            )));
        }
        Ok(out)
    }

    async fn run_then_wait_ready(
        &self,
        action: &'static str,
        command: &str,
    ) -> Result<(), DriverError> {
        let _op = self.ops.lock().await;
        self.run(action, command, &[]).await?;
        ready::wait_ready(&self.address, self.timeout()).await
    }

    async fn run_exclusive(&self, action: &'static str, command: &str) -> Result<(), DriverError> {
        let _op = self.ops.lock().await;
        self.run(action, command, &[]).await.map(drop)
    }

    async fn status_of(&self) -> PowerState {
        let Some(command) = &self.cfg.status else {
            return if ready::answers(&self.address, self.timeout().min(Duration::from_secs(1)))
                .await
            {
                PowerState::Running
            } else {
                PowerState::Stopped
            };
        };
        match self.run("status", command, &[]).await {
            Err(e) => PowerState::Unknown(e.to_string()),
            Ok(out) => {
                let word = out
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_ascii_lowercase();
                match word.as_str() {
                    "running" => PowerState::Running,
                    "frozen" => PowerState::Frozen,
                    "stopped" => PowerState::Stopped,
                    _ => PowerState::Unknown(format!(
                        "the status command printed {:?}, not running/frozen/stopped",
                        out.trim()
                    )),
                }
            }
        }
    }

    async fn scale_to(&self, ccu: f64) -> Result<ScaleApplied, DriverError> {
        if !(ccu.is_finite() && ccu > 0.0) {
            return Err(DriverError::Failed(format!(
                "invalid compute size {ccu} CCU"
            )));
        }
        let Some(command) = &self.cfg.scale else {
            return Ok(ScaleApplied {
                cpu_limit: None,
                note: "no scale command configured".to_string(),
            });
        };
        let env = scale_env(ccu);
        let out = self.run("scale", command, &env).await?;
        let first_line = out.lines().next().unwrap_or("").trim();
        Ok(ScaleApplied {
            cpu_limit: Some(ccu),
            note: if first_line.is_empty() {
                "scale command".to_string()
            } else {
                format!("scale command: {first_line}")
            },
        })
    }

    async fn number<T: std::str::FromStr>(
        &self,
        action: &'static str,
        command: Option<&String>,
    ) -> Result<Option<T>, DriverError> {
        let Some(command) = command else {
            return Ok(None);
        };
        let out = self.run(action, command, &[]).await?;
        out.trim().parse().map(Some).map_err(|_| {
            DriverError::Failed(format!(
                "the {action} command printed {:?}, not a number",
                out.trim()
            ))
        })
    }
}

/// The environment of a scale command for `ccu` capacity units.
fn scale_env(ccu: f64) -> [(&'static str, String); 3] {
    let ccu_text = format!("{ccu:.3}");
    let ccu_text = ccu_text.trim_end_matches('0').trim_end_matches('.');
    [
        ("HOLDFAST_CCU", ccu_text.to_string()),
        (
            "HOLDFAST_CPU_MILLIS",
            format!("{}", (ccu * 1000.0).round() as u64),
        ),
        (
            "HOLDFAST_MEMORY_MIB",
            format!("{}", (ccu * MIB_PER_CCU).round() as u64),
        ),
    ]
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// `": <last lines>"`, or nothing when the command printed nothing.
fn quote(output: &str) -> String {
    let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let keep = lines.len().saturating_sub(ERROR_LINES);
    format!(": {}", lines[keep..].join("\n"))
}

#[derive(Clone, Copy)]
enum Keep {
    Head,
    Tail,
}

/// Reads one output pipe of a command in the background, keeping at most [`OUTPUT_CAP`]
/// bytes, so the command's exit (not the pipe's end of file) decides when it is done.
struct Collector {
    buf: Arc<Mutex<Vec<u8>>>,
    task: Option<JoinHandle<()>>,
}

impl Collector {
    fn start(pipe: Option<impl AsyncRead + Unpin + Send + 'static>, keep: Keep) -> Self {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let task = pipe.map(|mut pipe| {
            let buf = Arc::clone(&buf);
            tokio::spawn(async move {
                let mut chunk = [0u8; 4096];
                loop {
                    match pipe.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let mut buf = buf.lock().unwrap_or_else(PoisonError::into_inner);
                            buf.extend_from_slice(&chunk[..n]);
                            if buf.len() > OUTPUT_CAP {
                                match keep {
                                    Keep::Head => buf.truncate(OUTPUT_CAP),
                                    Keep::Tail => {
                                        let excess = buf.len() - OUTPUT_CAP;
                                        buf.drain(..excess);
                                    }
                                }
                            }
                        }
                    }
                }
            })
        });
        Collector { buf, task }
    }

    /// What was collected, after giving the pipe [`OUTPUT_GRACE`] to reach end of file.
    async fn finish(mut self, action: &str) -> String {
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(OUTPUT_GRACE, &mut task).await.is_err() {
                task.abort();
                tracing::warn!(
                    "exec driver: something the {action} command started keeps its output \
                     open; redirect the output of background processes"
                );
            }
        }
        let buf = self.buf.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl Drop for Collector {
    /// A cancelled command must not leave a reader behind on a pipe a background process
    /// keeps open.
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl InstanceDriver for ExecDriver {
    fn kind(&self) -> &'static str {
        "exec"
    }

    fn start(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.run_then_wait_ready("start", &self.cfg.start))
    }

    fn stop(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.run_exclusive("stop", &self.cfg.stop))
    }

    fn supports_freeze(&self) -> bool {
        self.cfg.freeze.is_some() && self.cfg.thaw.is_some()
    }

    fn freeze(&self) -> DriverFuture<'_, ()> {
        Box::pin(async move {
            match (&self.cfg.freeze, &self.cfg.thaw) {
                (Some(freeze), Some(_)) => self.run_exclusive("freeze", freeze).await,
                _ => Err(DriverError::Unsupported {
                    driver: "exec",
                    what: "freeze",
                }),
            }
        })
    }

    fn thaw(&self) -> DriverFuture<'_, ()> {
        Box::pin(async move {
            match (&self.cfg.freeze, &self.cfg.thaw) {
                (Some(_), Some(thaw)) => self.run_then_wait_ready("thaw", thaw).await,
                _ => Err(DriverError::Unsupported {
                    driver: "exec",
                    what: "thaw",
                }),
            }
        })
    }

    fn status(&self) -> DriverFuture<'_, PowerState> {
        Box::pin(async move { Ok(self.status_of().await) })
    }

    fn scale(&self, ccu: f64) -> DriverFuture<'_, ScaleApplied> {
        Box::pin(self.scale_to(ccu))
    }

    fn cpu_seconds(&self) -> DriverFuture<'_, Option<f64>> {
        Box::pin(self.number("cpu_seconds", self.cfg.cpu_seconds.as_ref()))
    }

    fn storage_bytes(&self) -> DriverFuture<'_, Option<u64>> {
        Box::pin(self.number("storage_bytes", self.cfg.storage_bytes.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_environment() {
        let env = scale_env(1.5);
        assert_eq!(env[0], ("HOLDFAST_CCU", "1.5".to_string()));
        assert_eq!(env[1], ("HOLDFAST_CPU_MILLIS", "1500".to_string()));
        assert_eq!(env[2], ("HOLDFAST_MEMORY_MIB", "3072".to_string()));
        assert_eq!(scale_env(2.0)[0].1, "2");
        assert_eq!(scale_env(0.1 + 0.2)[0].1, "0.3");
    }

    #[test]
    fn quote_keeps_the_last_lines() {
        assert_eq!(quote(""), "");
        let many: String = (0..20).map(|i| format!("line {i}\n")).collect();
        assert!(quote(&many).starts_with(": line 10\n"));
    }
}
