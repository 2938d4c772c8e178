//! A minimal asynchronous MySQL client: TCP login with `mysql_native_password` and text
//! queries whose results are drained. Enough for the idle-session memory measurement of
//! the benchmark and for tests that need a real protocol login; not a general driver.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use sha1::{Digest, Sha1};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CLIENT_LONG_PASSWORD: u32 = 1;
const CLIENT_CONNECT_WITH_DB: u32 = 8;
const CLIENT_PROTOCOL_41: u32 = 0x200;
const CLIENT_TRANSACTIONS: u32 = 0x2000;
const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
const CLIENT_MULTI_RESULTS: u32 = 0x2_0000;
const CLIENT_PLUGIN_AUTH: u32 = 0x8_0000;
const CLIENT_DEPRECATE_EOF: u32 = 0x100_0000;

const MAX_PAYLOAD: usize = 0xff_ffff;
const NATIVE_PLUGIN: &str = "mysql_native_password";
/// utf8mb4_general_ci.
const CHARSET: u8 = 45;

/// `SHA1(password) XOR SHA1(scramble || SHA1(SHA1(password)))`; empty for an empty password.
pub fn native_password_response(password: &[u8], scramble: &[u8]) -> Vec<u8> {
    if password.is_empty() {
        return Vec::new();
    }
    let stage1 = Sha1::digest(password);
    let stage2 = Sha1::digest(stage1);
    let mut h = Sha1::new();
    h.update(scramble);
    h.update(stage2);
    let mix = h.finalize();
    stage1.iter().zip(mix.iter()).map(|(a, b)| a ^ b).collect()
}

/// A server error (ERR packet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// Error number, e.g. 1045.
    pub code: u16,
    /// SQLSTATE, e.g. `28000` (empty if the server sent none).
    pub state: String,
    /// Human-readable message.
    pub message: String,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ERROR {} ({}): {}", self.code, self.state, self.message)
    }
}

impl std::error::Error for ServerError {}

fn parse_err(p: &[u8]) -> ServerError {
    let code = if p.len() >= 3 {
        u16::from_le_bytes([p[1], p[2]])
    } else {
        0
    };
    let (state, msg) = if p.len() >= 9 && p[3] == b'#' {
        (String::from_utf8_lossy(&p[4..9]).into_owned(), &p[9..])
    } else {
        (String::new(), p.get(3..).unwrap_or(&[]))
    };
    ServerError {
        code,
        state,
        message: String::from_utf8_lossy(msg).into_owned(),
    }
}

/// One logged-in connection.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    seq: u8,
    caps: u32,
    /// Server version from the greeting.
    pub server_version: String,
    /// Connection id from the greeting.
    pub connection_id: u32,
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
        tokio::time::timeout(timeout, Self::connect_inner(addr, user, password, database))
            .await
            .with_context(|| format!("login to {addr} as {user} timed out after {timeout:?}"))?
    }

    async fn connect_inner(
        addr: &str,
        user: &str,
        password: &str,
        database: Option<&str>,
    ) -> Result<Conn> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true).ok();
        let mut conn = Conn {
            stream,
            seq: 0,
            caps: 0,
            server_version: String::new(),
            connection_id: 0,
        };
        let greeting = conn
            .read_packet()
            .await
            .context("reading the server greeting")?;
        if greeting.first() == Some(&0xff) {
            return Err(parse_err(&greeting)).context("the server refused the connection");
        }
        let hs = parse_greeting(&greeting).context("parsing the server greeting")?;
        conn.server_version = hs.version;
        conn.connection_id = hs.connection_id;

        let mut caps = CLIENT_PROTOCOL_41
            | CLIENT_SECURE_CONNECTION
            | CLIENT_PLUGIN_AUTH
            | CLIENT_LONG_PASSWORD
            | CLIENT_TRANSACTIONS
            | CLIENT_MULTI_RESULTS
            | CLIENT_DEPRECATE_EOF;
        if database.is_some() {
            caps |= CLIENT_CONNECT_WITH_DB;
        }
        ensure!(
            hs.caps & CLIENT_PROTOCOL_41 != 0,
            "the server does not speak protocol 4.1"
        );
        caps &= hs.caps | CLIENT_LONG_PASSWORD;
        conn.caps = caps;

        let auth = if hs.plugin.is_empty() || hs.plugin == NATIVE_PLUGIN {
            native_password_response(password.as_bytes(), &hs.scramble)
        } else {
            // We answer for mysql_native_password regardless; the server will switch.
            Vec::new()
        };
        let mut resp = Vec::with_capacity(128);
        resp.extend_from_slice(&caps.to_le_bytes());
        resp.extend_from_slice(&(MAX_PAYLOAD as u32).to_le_bytes());
        resp.push(CHARSET);
        resp.extend_from_slice(&[0u8; 23]);
        resp.extend_from_slice(user.as_bytes());
        resp.push(0);
        resp.push(u8::try_from(auth.len()).context("auth response too long")?);
        resp.extend_from_slice(&auth);
        if let Some(db) = database {
            resp.extend_from_slice(db.as_bytes());
            resp.push(0);
        }
        resp.extend_from_slice(NATIVE_PLUGIN.as_bytes());
        resp.push(0);
        conn.write_packet(&resp).await?;

        loop {
            let reply = conn
                .read_packet()
                .await
                .context("reading the login reply")?;
            match reply.first() {
                Some(0x00) => return Ok(conn),
                Some(0xff) => {
                    return Err(parse_err(&reply))
                        .with_context(|| format!("login as {user} refused"))
                }
                Some(0xfe) => {
                    // AuthSwitchRequest: plugin name NUL, then plugin data.
                    let rest = &reply[1..];
                    let nul = rest
                        .iter()
                        .position(|b| *b == 0)
                        .context("malformed auth switch request")?;
                    let plugin = String::from_utf8_lossy(&rest[..nul]).into_owned();
                    if plugin != NATIVE_PLUGIN {
                        bail!("the server asked for auth plugin {plugin:?}; this client only speaks {NATIVE_PLUGIN}");
                    }
                    let mut data = &rest[nul + 1..];
                    if data.last() == Some(&0) {
                        data = &data[..data.len() - 1];
                    }
                    let auth = native_password_response(password.as_bytes(), data);
                    conn.write_packet(&auth).await?;
                }
                Some(0x01) => {
                    bail!("unexpected auth-more-data packet during {NATIVE_PLUGIN} login")
                }
                _ => bail!(
                    "unexpected login reply {:02x?}",
                    &reply[..reply.len().min(16)]
                ),
            }
        }
    }

    /// Runs a text query and drains its result; returns the number of rows (0 for an OK).
    pub async fn query(&mut self, sql: &str) -> Result<u64> {
        self.seq = 0;
        let mut pkt = Vec::with_capacity(sql.len() + 1);
        pkt.push(0x03);
        pkt.extend_from_slice(sql.as_bytes());
        self.write_packet(&pkt).await?;
        let first = self.read_packet().await?;
        match first.first() {
            Some(0x00) => return Ok(0),
            Some(0xff) => {
                return Err(parse_err(&first)).with_context(|| format!("query {sql:?} failed"))
            }
            _ => {}
        }
        let (columns, _) = read_lenenc(&first).context("bad column count")?;
        for _ in 0..columns {
            self.read_packet().await?;
        }
        if self.caps & CLIENT_DEPRECATE_EOF == 0 {
            self.read_packet().await?; // EOF after column definitions
        }
        let mut rows = 0;
        loop {
            let p = self.read_packet().await?;
            match p.first() {
                Some(0xfe) if p.len() < MAX_PAYLOAD => break,
                Some(0xff) => {
                    return Err(parse_err(&p)).with_context(|| format!("query {sql:?} failed"))
                }
                _ => rows += 1,
            }
        }
        Ok(rows)
    }

    /// Sends COM_QUIT and closes the connection.
    pub async fn quit(mut self) -> Result<()> {
        self.seq = 0;
        self.write_packet(&[0x01]).await?;
        self.stream.shutdown().await.ok();
        Ok(())
    }

    async fn read_packet(&mut self) -> Result<Vec<u8>> {
        let mut payload = Vec::new();
        loop {
            let mut head = [0u8; 4];
            self.stream
                .read_exact(&mut head)
                .await
                .context("connection closed by the server")?;
            let len = usize::from(head[0]) | usize::from(head[1]) << 8 | usize::from(head[2]) << 16;
            self.seq = head[3].wrapping_add(1);
            let start = payload.len();
            payload.resize(start + len, 0);
            self.stream
                .read_exact(&mut payload[start..])
                .await
                .context("connection closed by the server mid-packet")?;
            if len < MAX_PAYLOAD {
                return Ok(payload);
            }
        }
    }

    async fn write_packet(&mut self, payload: &[u8]) -> Result<()> {
        let mut buf = Vec::with_capacity(payload.len() + 8);
        let mut chunks = payload.chunks(MAX_PAYLOAD).peekable();
        if payload.is_empty() {
            buf.extend_from_slice(&[0, 0, 0, self.seq]);
            self.seq = self.seq.wrapping_add(1);
        }
        while let Some(chunk) = chunks.next() {
            let len = chunk.len() as u32;
            buf.extend_from_slice(&len.to_le_bytes()[..3]);
            buf.push(self.seq);
            self.seq = self.seq.wrapping_add(1);
            buf.extend_from_slice(chunk);
            if chunks.peek().is_none() && chunk.len() == MAX_PAYLOAD {
                buf.extend_from_slice(&[0, 0, 0, self.seq]);
                self.seq = self.seq.wrapping_add(1);
            }
        }
        self.stream
            .write_all(&buf)
            .await
            .context("writing to the server")
    }
}

struct Greeting {
    version: String,
    connection_id: u32,
    caps: u32,
    scramble: Vec<u8>,
    plugin: String,
}

fn parse_greeting(p: &[u8]) -> Result<Greeting> {
    ensure!(
        p.first() == Some(&10),
        "not a HandshakeV10 (protocol byte {:?})",
        p.first()
    );
    let mut pos = 1;
    let nul = p[pos..]
        .iter()
        .position(|b| *b == 0)
        .context("unterminated server version")?;
    let version = String::from_utf8_lossy(&p[pos..pos + nul]).into_owned();
    pos += nul + 1;
    let take = |pos: &mut usize, n: usize| -> Result<&[u8]> {
        let s = p.get(*pos..*pos + n).context("greeting too short")?;
        *pos += n;
        Ok(s)
    };
    let id = take(&mut pos, 4)?;
    let connection_id = u32::from_le_bytes([id[0], id[1], id[2], id[3]]);
    let mut scramble = take(&mut pos, 8)?.to_vec();
    take(&mut pos, 1)?; // filler
    let lo = take(&mut pos, 2)?;
    let mut caps = u32::from(u16::from_le_bytes([lo[0], lo[1]]));
    let mut plugin = String::new();
    if pos < p.len() {
        take(&mut pos, 1)?; // charset
        take(&mut pos, 2)?; // status
        let hi = take(&mut pos, 2)?;
        caps |= u32::from(u16::from_le_bytes([hi[0], hi[1]])) << 16;
        let auth_len = usize::from(take(&mut pos, 1)?[0]);
        take(&mut pos, 10)?; // reserved (MariaDB: extended capabilities in the last 4)
        if caps & CLIENT_SECURE_CONNECTION != 0 {
            let n = auth_len.saturating_sub(8).max(13);
            let part2 = take(&mut pos, n)?;
            // The last byte is a NUL terminator, not scramble.
            let part2 = part2.strip_suffix(&[0]).unwrap_or(part2);
            scramble.extend_from_slice(part2);
        }
        if caps & CLIENT_PLUGIN_AUTH != 0 && pos < p.len() {
            let rest = &p[pos..];
            let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
            plugin = String::from_utf8_lossy(&rest[..end]).into_owned();
        }
    }
    Ok(Greeting {
        version,
        connection_id,
        caps,
        scramble,
        plugin,
    })
}

fn read_lenenc(p: &[u8]) -> Result<(u64, usize)> {
    let first = *p.first().context("empty packet")?;
    let n = |k: usize| -> Result<u64> {
        let b = p
            .get(1..1 + k)
            .context("truncated length-encoded integer")?;
        Ok(b.iter().rev().fold(0u64, |acc, x| acc << 8 | u64::from(*x)))
    };
    Ok(match first {
        0..=0xfa => (u64::from(first), 1),
        0xfc => (n(2)?, 3),
        0xfd => (n(3)?, 4),
        0xfe => (n(8)?, 9),
        _ => bail!("invalid length-encoded integer prefix {first:#x}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scramble_matches_known_vector() {
        // mysql_native_password with a 20-byte scramble; checked against the server's
        // stored form: SHA1(response XOR SHA1(scramble || stored)) == stored.
        let scramble = b"abcdefghijklmnopqrst";
        let resp = native_password_response(b"app_pass", scramble);
        assert_eq!(resp.len(), 20);
        let stored = Sha1::digest(Sha1::digest(b"app_pass"));
        let mut h = Sha1::new();
        h.update(scramble);
        h.update(stored);
        let mix = h.finalize();
        let stage1: Vec<u8> = resp.iter().zip(mix.iter()).map(|(a, b)| a ^ b).collect();
        assert_eq!(Sha1::digest(&stage1).as_slice(), stored.as_slice());
        assert!(native_password_response(b"", scramble).is_empty());
    }

    #[test]
    fn parses_lenenc() {
        assert_eq!(read_lenenc(&[5]).unwrap(), (5, 1));
        assert_eq!(read_lenenc(&[0xfc, 0x01, 0x02]).unwrap(), (0x0201, 3));
        assert!(read_lenenc(&[0xff]).is_err());
    }

    #[test]
    fn parses_err_packet() {
        let mut p = vec![0xff, 0x15, 0x04, b'#'];
        p.extend_from_slice(b"28000Access denied");
        let e = parse_err(&p);
        assert_eq!(e.code, 1045);
        assert_eq!(e.state, "28000");
        assert_eq!(e.message, "Access denied");
    }
}
