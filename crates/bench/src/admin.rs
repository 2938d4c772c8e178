//! holdfast's admin API as the tools use it: blocking calls through
//! [`holdfast_admin::client`], with errors that say which request failed.

use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Read timeout of ordinary requests.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Operations (switchover, restart, resize) may take a while to answer.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(300);

/// Sends `METHOD path` to `addr` and returns the status code and body; `timeout` bounds
/// the whole exchange.
pub fn request(addr: &str, method: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    holdfast_admin::client::blocking_request(addr, method, path, timeout)
        .with_context(|| format!("{method} {path} on the admin API at {addr}"))
}

/// `GET path`, requiring 200: the body.
pub fn get(addr: &str, path: &str) -> Result<String> {
    let (code, body) = request(addr, "GET", path, TIMEOUT)?;
    if code != 200 {
        bail!("GET {path}: HTTP {code}: {body}");
    }
    Ok(body)
}

/// `GET path`, requiring 200, as JSON.
pub fn get_json(addr: &str, path: &str) -> Result<serde_json::Value> {
    serde_json::from_str(&get(addr, path)?).with_context(|| format!("GET {path}: body is not JSON"))
}

/// `GET /status` as the typed struct `holdfast ctl` reads.
pub fn status(addr: &str) -> Result<holdfast_admin::Status> {
    serde_json::from_str(&get(addr, "/status")?).context("GET /status: unexpected body")
}

/// `POST path`, requiring 2xx: the body.
pub fn post(addr: &str, path: &str) -> Result<String> {
    let (code, body) = request(addr, "POST", path, OPERATION_TIMEOUT)?;
    if !(200..300).contains(&code) {
        bail!("POST {path} answered HTTP {code}: {body}");
    }
    Ok(body)
}
