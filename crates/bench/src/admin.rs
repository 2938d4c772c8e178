//! holdfast's admin API as the tools use it: blocking calls through
//! [`holdfast_admin::client`] with the lab's admin token, with errors that say which request
//! failed.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use holdfast_admin::AdminClient;
use holdfast_lab::LabStatus;

/// Read timeout of ordinary requests.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Operations (switchover, restart, resize) may take a while to answer.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(300);

/// The admin API of the holdfast serving `lab` (its address and token).
pub fn client(lab: &LabStatus) -> AdminClient {
    AdminClient::new(lab.admin.clone(), lab.admin_token.clone())
}

/// Sends `METHOD path` and returns the status code and body; `timeout` bounds the whole
/// exchange.
pub fn request(
    admin: &AdminClient,
    method: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String)> {
    admin
        .blocking_request(method, path, timeout)
        .with_context(|| format!("{method} {path} on the admin API at {}", admin.addr))
}

/// `GET path`, requiring 200: the body.
pub fn get(admin: &AdminClient, path: &str) -> Result<String> {
    let (code, body) = request(admin, "GET", path, TIMEOUT)?;
    if code != 200 {
        bail!("GET {path}: HTTP {code}: {body}");
    }
    Ok(body)
}

/// `GET path`, requiring 200, as JSON.
pub fn get_json(admin: &AdminClient, path: &str) -> Result<serde_json::Value> {
    serde_json::from_str(&get(admin, path)?)
        .with_context(|| format!("GET {path}: body is not JSON"))
}

/// `GET /status` as the typed struct `holdfast ctl` reads.
pub fn status(admin: &AdminClient) -> Result<holdfast_admin::Status> {
    serde_json::from_str(&get(admin, "/status")?).context("GET /status: unexpected body")
}

/// `POST path`, requiring 2xx: the body.
pub fn post(admin: &AdminClient, path: &str) -> Result<String> {
    let (code, body) = request(admin, "POST", path, OPERATION_TIMEOUT)?;
    if !(200..300).contains(&code) {
        bail!("POST {path} answered HTTP {code}: {body}");
    }
    Ok(body)
}
