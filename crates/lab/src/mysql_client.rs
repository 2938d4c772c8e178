//! The lab's and the benchmarks' MySQL client: `holdfast_client` (the same client the
//! proxy's backend connections use) behind an `anyhow` API. Logins use
//! `mysql_native_password`; queries are text queries whose results are drained.

use std::time::Duration;

use anyhow::{Context, Result};
use holdfast_client::{Client, ClientError, CONTROL_MAX_PACKET};

pub use holdfast_client::ServerError;

/// One logged-in connection.
pub struct Conn {
    client: Client,
    /// Server version from the greeting.
    pub server_version: String,
    /// Connection id from the greeting.
    pub connection_id: u32,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("server_version", &self.server_version)
            .field("connection_id", &self.connection_id)
            .finish_non_exhaustive()
    }
}

/// A server refusal becomes a [`ServerError`] in the chain (callers downcast to it).
fn into_anyhow(e: ClientError) -> anyhow::Error {
    match e.server_error() {
        Some(server) => server.into(),
        None => e.into(),
    }
}

impl Conn {
    /// Connects to `addr` and logs in as `user`, within `timeout` overall. A server ERR
    /// (wrong password, too many connections, …) is returned as a [`ServerError`] in
    /// the error chain.
    pub async fn connect(
        addr: &str,
        user: &str,
        password: &str,
        database: Option<&str>,
        timeout: Duration,
    ) -> Result<Conn> {
        let client = Client::connect_native(addr, user, password, database, timeout)
            .await
            .map_err(into_anyhow)
            .with_context(|| format!("login to {addr} as {user}"))?;
        Ok(Conn::of(client))
    }

    /// As [`Conn::connect`], inside TLS (the server's certificate checked as `tls` was set
    /// up to).
    pub async fn connect_tls(
        addr: &str,
        user: &str,
        password: &str,
        tls: &holdfast_client::tls::TlsClient,
        timeout: Duration,
    ) -> Result<Conn> {
        let client = Client::connect_native_tls(addr, user, password, None, tls, timeout)
            .await
            .map_err(into_anyhow)
            .with_context(|| format!("TLS login to {addr} as {user}"))?;
        Ok(Conn::of(client))
    }

    /// As [`Conn::connect`] (inside TLS with `tls`), sending connection attributes as a
    /// driver does (`attributes`: the encoded block).
    pub async fn connect_with_attributes(
        addr: &str,
        user: &str,
        password: &str,
        tls: Option<&holdfast_client::tls::TlsClient>,
        attributes: &[u8],
        timeout: Duration,
    ) -> Result<Conn> {
        let client =
            Client::connect_native_with_attributes(addr, user, password, tls, attributes, timeout)
                .await
                .map_err(into_anyhow)
                .with_context(|| format!("login to {addr} as {user}"))?;
        Ok(Conn::of(client))
    }

    fn of(client: Client) -> Conn {
        Conn {
            server_version: String::from_utf8_lossy(client.greeting.server_version()).into_owned(),
            connection_id: client.greeting.connection_id,
            client,
        }
    }

    /// Runs a text query and drains its result; returns the number of rows of its last
    /// result set (0 for an OK).
    pub async fn query(&mut self, sql: &str) -> Result<u64> {
        let r = self
            .client
            .execute(sql.as_bytes(), CONTROL_MAX_PACKET)
            .await
            .map_err(into_anyhow)
            .with_context(|| format!("query {sql:?} failed"))?;
        Ok(r.rows.len() as u64)
    }

    /// Sends COM_QUIT and closes the connection.
    pub async fn quit(self) -> Result<()> {
        self.client.quit().await.context("closing the connection")
    }
}
