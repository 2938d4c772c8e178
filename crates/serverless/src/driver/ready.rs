//! Readiness probe: is a MySQL/MariaDB server answering on its address?
//!
//! A server counts as ready once a TCP connection to it receives the first 4-byte packet
//! header. That is the handshake greeting normally, or an ERR packet (too many connections,
//! host blocked...): either way the server process accepts and answers connections, which
//! is all a driver has to establish after a start or thaw. Connecting alone is not enough:
//! the kernel completes TCP handshakes for a listening socket even while the server process
//! is frozen (SIGSTOP), so only bytes from the server prove it runs.

use super::DriverError;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Pause between attempts. A refused connect returns at once, so this bounds how late a
/// start is noticed (cold starts take ~150 ms; a few ms of lag is cheap, polling is too).
const RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// Longest a single attempt waits for the header on an accepted connection before a fresh
/// connection is tried, so one connection stuck in a backlog cannot use up the whole wait.
const ATTEMPT_CAP: Duration = Duration::from_secs(1);

/// Waits until the server at `address` answers (see the module docs), retrying every few
/// milliseconds until `timeout` has passed.
pub async fn wait_ready(address: &str, timeout: Duration) -> Result<(), DriverError> {
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(DriverError::Timeout {
                what: format!("the server at {address} to answer"),
                ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            });
        }
        if answers(address, remaining.min(ATTEMPT_CAP)).await {
            return Ok(());
        }
        let pause = RETRY_INTERVAL.min(deadline.saturating_duration_since(Instant::now()));
        tokio::time::sleep(pause).await;
    }
}

/// One attempt: true if a connection to `address` receives a packet header within
/// `timeout`. The probe connection is closed right away (the server logs it as an aborted
/// handshake at most).
pub async fn answers(address: &str, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, read_header(address)).await,
        Ok(Ok(()))
    )
}

async fn read_header(address: &str) -> std::io::Result<()> {
    let mut stream = TcpStream::connect(address).await?;
    let mut header = [0u8; 4];
    stream.read_exact(&mut header).await?;
    Ok(())
}
