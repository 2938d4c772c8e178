//! Idle-session memory: how much resident memory a process gains per logged-in, idle
//! client connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use holdfast_lab::mysql_client::Conn;
use holdfast_lab::procs;

/// Outcome of one idle-session measurement.
#[derive(Clone, Debug)]
pub struct IdleResult {
    pub clients: usize,
    pub rss_before_kib: u64,
    /// After the first half of the clients logged in.
    pub rss_half_kib: u64,
    pub rss_after_kib: u64,
    /// Whether RSS settled (else the last reading was used).
    pub stable: bool,
    /// The allocator's bytes in use at the same three moments, from holdfast's
    /// `holdfast_heap_in_use_bytes` (holdfast processes that report it).
    pub heap_bytes: Option<[u64; 3]>,
}

impl IdleResult {
    /// (after − before) / clients, in KiB: with what the process takes once (the logins'
    /// working set left as free chunks, tables grown) spread over the clients.
    pub fn per_session_kib(&self) -> f64 {
        (self.rss_after_kib as f64 - self.rss_before_kib as f64) / self.clients.max(1) as f64
    }

    /// (after − half) / the second half's clients, in KiB: what one more idle session
    /// costs once the process holds many.
    pub fn per_added_session_kib(&self) -> f64 {
        (self.rss_after_kib as f64 - self.rss_half_kib as f64) / self.added() as f64
    }

    /// The heap in use's rise over the second half, per session, in bytes: what an idle
    /// session holds, without the allocator's free chunks that RSS counts.
    pub fn heap_per_added_session(&self) -> Option<f64> {
        let [_, half, after] = self.heap_bytes?;
        Some((after as f64 - half as f64) / self.added() as f64)
    }

    fn added(&self) -> usize {
        (self.clients - self.clients / 2).max(1)
    }
}

/// How long the clients stay idle before each reading: a session counts as idle once it
/// has settled (holdfast parks an idle session's sockets after a second of silence).
const IDLE_FOR: Duration = Duration::from_secs(2);

/// Logins that may be in flight at once (keeps accept queues and CPU sane).
const LOGIN_CONCURRENCY: usize = 32;
const LOGIN_TIMEOUT: Duration = Duration::from_secs(20);

/// The connection attributes a libmariadb client (Connector/C 3.3, the `mariadb` CLI)
/// sends, which a proxy that repeats them on its backend connections keeps per session;
/// the idle clients send them too (about 135 bytes encoded).
fn driver_attributes() -> Vec<u8> {
    let pid = std::process::id().to_string();
    let mut block = Vec::new();
    for (key, value) in [
        ("_client_name", "libmariadb"),
        ("_client_version", "3.3.8"),
        ("_os", "Linux"),
        ("_pid", pid.as_str()),
        ("_platform", "x86_64"),
        ("_server_host", "127.0.0.1"),
        ("program_name", "holdfast-bench"),
    ] {
        holdfast_wire::codec::put_lenenc_bytes(&mut block, key.as_bytes());
        holdfast_wire::codec::put_lenenc_bytes(&mut block, value.as_bytes());
    }
    block
}

/// Idle logged-in client connections to open against a process.
pub struct IdleClients<'a> {
    /// Where the clients connect.
    pub addr: &'a str,
    /// The process whose memory is measured.
    pub pid: u32,
    pub clients: usize,
    pub user: &'a str,
    pub password: &'a str,
    /// The process's admin API, when it reports its heap (`/metrics`).
    pub heap_from: Option<&'a holdfast_admin::AdminClient>,
    /// The clients log in over TLS (`--tls`), trusting this.
    pub tls: Option<&'a holdfast_client::tls::TlsClient>,
}

impl IdleClients<'_> {
    /// Measures `pid`'s RSS, opens half of `clients` connections to `addr` that log in and
    /// run `SELECT 1`, lets them idle for [`IDLE_FOR`], waits for RSS to settle and
    /// measures, opens the other half, measures again the same way, then closes them.
    ///
    /// Runs its own Tokio runtime on a dedicated thread, so it may be called from anywhere
    /// (including from inside another runtime).
    pub fn measure(&self) -> Result<IdleResult> {
        std::thread::scope(|s| {
            s.spawn(|| -> Result<IdleResult> {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .context("building the Tokio runtime for idle clients")?;
                rt.block_on(self.measure_async())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("idle-client thread panicked"))?
        })
    }

    async fn measure_async(&self) -> Result<IdleResult> {
        let (pid, clients) = (self.pid, self.clients);
        let (rss_before_kib, _) = stable_rss(pid).await?;
        let heap_before = self.heap().await;
        let half = clients / 2;
        let mut conns = self.open(0..half).await?;
        tokio::time::sleep(IDLE_FOR).await;
        let (rss_half_kib, half_stable) = stable_rss(pid).await?;
        let heap_half = self.heap().await;
        conns.append(&mut self.open(half..clients).await?);
        tokio::time::sleep(IDLE_FOR).await;
        let (rss_after_kib, stable) = stable_rss(pid).await?;
        let heap_after = self.heap().await;
        // Close politely so servers free the sessions promptly.
        for c in conns {
            let _ = c.quit().await;
        }
        Ok(IdleResult {
            clients,
            rss_before_kib,
            rss_half_kib,
            rss_after_kib,
            stable: stable && half_stable,
            heap_bytes: match (heap_before, heap_half, heap_after) {
                (Some(a), Some(b), Some(c)) => Some([a, b, c]),
                _ => None,
            },
        })
    }

    /// `holdfast_heap_in_use_bytes` from the admin API, if the process has it.
    async fn heap(&self) -> Option<u64> {
        let admin = self.heap_from?.clone();
        let text = tokio::task::spawn_blocking(move || crate::admin::get(&admin, "/metrics"))
            .await
            .ok()?
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("holdfast_heap_in_use_bytes "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    }

    /// Opens the clients numbered `which` (logged in, `SELECT 1` run), at most
    /// [`LOGIN_CONCURRENCY`] logins at once.
    async fn open(&self, which: std::ops::Range<usize>) -> Result<Vec<Conn>> {
        let IdleClients {
            addr,
            user,
            password,
            clients,
            tls,
            ..
        } = *self;
        let sem = Arc::new(Semaphore::new(LOGIN_CONCURRENCY));
        let mut set = JoinSet::new();
        for i in which.clone() {
            let sem = sem.clone();
            let (addr, user, password) = (addr.to_string(), user.to_string(), password.to_string());
            let tls = tls.cloned();
            set.spawn(async move {
                let _permit = sem.acquire_owned().await.context("semaphore closed")?;
                let conn = Conn::connect_with_attributes(
                    &addr,
                    &user,
                    &password,
                    tls.as_ref(),
                    &driver_attributes(),
                    LOGIN_TIMEOUT,
                )
                .await;
                let mut conn = conn.with_context(|| format!("idle client #{}", i + 1))?;
                conn.query("SELECT 1")
                    .await
                    .with_context(|| format!("idle client #{}: SELECT 1", i + 1))?;
                anyhow::Ok(conn)
            });
        }
        let mut conns = Vec::with_capacity(which.len());
        let mut first_error = None;
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(Ok(conn)) => conns.push(conn),
                Ok(Err(e)) => {
                    if first_error.is_none() {
                        first_error = Some(e);
                        set.abort_all();
                    }
                }
                Err(e) if e.is_cancelled() => {}
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(anyhow::anyhow!("idle client task failed: {e}"));
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e.context(format!(
                "{} of clients {}..{} of {clients} had logged in to {addr} when one failed",
                conns.len(),
                which.start + 1,
                which.end
            ))),
            None => Ok(conns),
        }
    }
}

/// Samples RSS every 250 ms until four consecutive samples lie within
/// max(64 KiB, 0.5 %) of each other, or 15 s pass. Returns (last sample, settled?).
async fn stable_rss(pid: u32) -> Result<(u64, bool)> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut window: Vec<u64> = Vec::new();
    loop {
        let rss = procs::rss_kib(pid)?;
        window.push(rss);
        if window.len() > 4 {
            window.remove(0);
        }
        if window.len() == 4 {
            let (lo, hi) = window
                .iter()
                .fold((u64::MAX, 0), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            if hi - lo <= (hi / 200).max(64) {
                return Ok((rss, true));
            }
        }
        if Instant::now() >= deadline {
            return Ok((rss, false));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_added_session_is_measured_from_the_half_way_reading() {
        let r = IdleResult {
            clients: 1000,
            rss_before_kib: 10_000,
            rss_half_kib: 12_500,
            rss_after_kib: 14_000,
            stable: true,
            heap_bytes: Some([1_000_000, 2_000_000, 3_500_000]),
        };
        assert_eq!(r.per_session_kib(), 4.0);
        assert_eq!(r.per_added_session_kib(), 3.0);
        assert_eq!(r.heap_per_added_session(), Some(3000.0));
    }
}
