//! A small synchronous raw-protocol client for byte-level tests: log in with chosen
//! capabilities, send arbitrary packets, read responses packet by packet. Packets are built
//! and parsed with `holdfast_wire`. Every read has a socket timeout, so nothing hangs.
//!
//! It stays separate from `holdfast_client` (the async client the proxy, the lab and the
//! harness share) on purpose: byte-level tests need to write half packets and malformed
//! payloads, choose every capability bit, read one packet at a time and see exactly what
//! arrives before a hang-up, all without a runtime in the test thread. A client built to
//! complete well-formed exchanges would have to grow all of that as escape hatches. What
//! is protocol knowledge is shared: the codecs of `holdfast_wire`, and
//! `holdfast_client`'s [`ServerErr`] and text-row decoding.

use anyhow::{bail, ensure, Context, Result};
use holdfast_client::parse_text_row;
use holdfast_wire::auth::PasswordHash;
use holdfast_wire::caps::*;
use holdfast_wire::codec::Reader;
use holdfast_wire::frame::{self, MAX_PAYLOAD};
use holdfast_wire::handshake::{AuthSwitch, Greeting, LoginRequest};
use holdfast_wire::packets::OkPacket;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long any single read may block.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// What a typical modern client asks for (no session tracking).
pub const BASE_CAPS: u32 = CLIENT_PROTOCOL_41
    | CLIENT_SECURE_CONNECTION
    | CLIENT_PLUGIN_AUTH
    | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | CLIENT_LONG_PASSWORD
    | CLIENT_TRANSACTIONS
    | CLIENT_MULTI_STATEMENTS
    | CLIENT_MULTI_RESULTS
    | CLIENT_PS_MULTI_RESULTS;

/// An ERR packet from the server (or holdfast): the client library's [`ServerError`].
///
/// [`ServerError`]: holdfast_client::ServerError
pub use holdfast_client::ServerError as ServerErr;

/// The server error inside an error chain, if there is one.
pub fn server_err(e: &anyhow::Error) -> Option<&ServerErr> {
    e.chain().find_map(|c| c.downcast_ref::<ServerErr>())
}

/// One logical packet.
#[derive(Debug, Clone)]
pub struct Packet {
    /// Sequence id of the last chunk.
    pub seq: u8,
    pub payload: Vec<u8>,
}

/// One response of a (possibly multi-) statement.
#[derive(Debug, Clone)]
pub enum Response {
    /// An OK packet: its raw payload and status flags.
    Ok { payload: Vec<u8>, status: u16 },
    /// A result set: raw row payloads and the status of its terminator.
    Rows {
        columns: usize,
        rows: Vec<Vec<u8>>,
        status: u16,
    },
}

/// A prepared statement as the server (holdfast) announced it.
#[derive(Debug, Clone, Copy)]
pub struct Prepared {
    pub id: u32,
    pub columns: u16,
    pub params: u16,
}

pub struct RawConn {
    pub stream: TcpStream,
    pub caps: u32,
    pub greeting: Greeting,
    buf: Vec<u8>,
    /// The OK packet that ended the login (empty before).
    pub login_ok: Vec<u8>,
    /// MariaDB extended capabilities: asked for before [`RawConn::login`] (those the
    /// greeting offers are sent), negotiated after.
    pub mariadb_caps: u32,
}

/// The `mysql_native_password` answer to a scramble for `password` (empty for none).
fn native_answer(password: &str) -> impl Fn(&[u8]) -> Vec<u8> {
    let secret = (!password.is_empty()).then(|| PasswordHash::from_password(password.as_bytes()));
    move |scramble| {
        secret
            .as_ref()
            .map_or_else(Vec::new, |s| s.scramble_response(scramble).to_vec())
    }
}

/// Opens a TCP connection with read/write timeouts set.
pub fn open(addr: SocketAddr) -> Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Reads one logical packet from a bare stream.
pub fn read_packet_from(stream: &mut TcpStream) -> Result<Packet> {
    let mut payload = Vec::new();
    loop {
        let mut head = [0u8; 4];
        stream
            .read_exact(&mut head)
            .context("reading a packet header")?;
        let len = frame::parse_header(&head).map_or(0, |h| h.len);
        let start = payload.len();
        payload.resize(start + len, 0);
        stream
            .read_exact(&mut payload[start..])
            .context("reading a packet body")?;
        if len < MAX_PAYLOAD {
            return Ok(Packet {
                seq: head[3],
                payload,
            });
        }
    }
}

/// What the peer did when we waited for it to hang up.
#[derive(Debug, PartialEq, Eq)]
pub enum Closing {
    /// Orderly EOF (or a reset) after `bytes` further bytes.
    Closed { bytes: Vec<u8> },
    /// Still open when the deadline passed.
    StillOpen { bytes: Vec<u8> },
}

/// Reads until the peer closes, for at most `timeout`; collects what arrived meanwhile.
pub fn wait_closed(stream: &mut TcpStream, timeout: Duration) -> Closing {
    let deadline = Instant::now() + timeout;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Closing::StillOpen { bytes };
        }
        let _ = stream.set_read_timeout(Some(left.min(Duration::from_millis(500))));
        match stream.read(&mut chunk) {
            Ok(0) => return Closing::Closed { bytes },
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return Closing::Closed { bytes },
        }
    }
}

/// Splits bytes into complete packet payloads (for inspecting what arrived before a close).
pub fn split_packets(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(h) = frame::parse_header(bytes) {
        if bytes.len() < h.packet_len() {
            break;
        }
        out.push(bytes[4..h.packet_len()].to_vec());
        bytes = &bytes[h.packet_len()..];
    }
    out
}

impl RawConn {
    /// Connects and reads the greeting without logging in.
    pub fn greet(addr: SocketAddr) -> Result<RawConn> {
        Self::greet_on(open(addr)?)
    }

    /// Reads the greeting on a stream the caller connected itself (e.g. from another
    /// loopback address); read and write timeouts are set.
    pub fn greet_on(mut stream: TcpStream) -> Result<RawConn> {
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        stream.set_nodelay(true)?;
        let p = read_packet_from(&mut stream).context("reading the greeting")?;
        if p.payload.first() == Some(&0xff) {
            return Err(ServerErr::parse(&p.payload)?).context("the server refused the connection");
        }
        let greeting =
            Greeting::parse(&p.payload).map_err(|e| anyhow::anyhow!("bad greeting: {e}"))?;
        Ok(RawConn {
            stream,
            caps: 0,
            greeting,
            buf: Vec::new(),
            login_ok: Vec::new(),
            mariadb_caps: 0,
        })
    }

    /// Connects and logs in with `mysql_native_password` and capabilities `caps`
    /// (CONNECT_WITH_DB is added when `database` is given).
    pub fn connect(
        addr: SocketAddr,
        user: &str,
        password: &str,
        database: Option<&str>,
        caps: u32,
    ) -> Result<RawConn> {
        let mut c = Self::greet(addr)?;
        c.login(user, password, database, caps)?;
        Ok(c)
    }

    pub fn login(
        &mut self,
        user: &str,
        password: &str,
        database: Option<&str>,
        caps: u32,
    ) -> Result<()> {
        let mut caps = caps & (self.greeting.capabilities | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA);
        if database.is_some() {
            caps |= CLIENT_CONNECT_WITH_DB;
        }
        self.caps = caps;
        let answer = native_answer(password);
        let req = LoginRequest {
            capabilities: caps,
            max_packet: 1 << 30,
            charset: 45,
            user: user.as_bytes().to_vec(),
            auth_response: answer(&self.greeting.scramble),
            database: database.map(|d| d.as_bytes().to_vec()),
            auth_plugin: b"mysql_native_password".to_vec(),
            attributes: Vec::new(),
            mariadb_caps: if self.greeting.capabilities & CLIENT_LONG_PASSWORD == 0 {
                self.mariadb_caps & self.greeting.mariadb_caps
            } else {
                0
            },
        };
        self.mariadb_caps = req.mariadb_caps;
        self.write_packet(&req.encode(), 1)?;
        loop {
            let p = self.read_packet().context("reading the login reply")?;
            match p.payload.first() {
                Some(0x00) => {
                    self.login_ok = p.payload;
                    return Ok(());
                }
                Some(0xff) => {
                    return Err(ServerErr::parse(&p.payload)?)
                        .with_context(|| format!("login as {user} refused"))
                }
                Some(0xfe) => {
                    let sw = AuthSwitch::parse(&p.payload)
                        .map_err(|e| anyhow::anyhow!("bad auth switch: {e}"))?;
                    ensure!(
                        sw.plugin == b"mysql_native_password",
                        "asked for plugin {:?}",
                        String::from_utf8_lossy(&sw.plugin)
                    );
                    self.write_packet(&answer(&sw.data), p.seq.wrapping_add(1))?;
                }
                other => bail!("unexpected login reply {other:?}"),
            }
        }
    }

    /// COM_CHANGE_USER with `mysql_native_password` (answered over the greeting's
    /// scramble, following an auth switch); returns the final OK payload, or the server's
    /// ERR as an error.
    pub fn change_user(&mut self, user: &str, password: &str, database: &str) -> Result<Vec<u8>> {
        let answer = native_answer(password);
        let mut p = vec![0x11];
        p.extend_from_slice(user.as_bytes());
        p.push(0);
        let first = answer(&self.greeting.scramble);
        p.push(first.len() as u8);
        p.extend_from_slice(&first);
        p.extend_from_slice(database.as_bytes());
        p.push(0);
        p.extend_from_slice(&45u16.to_le_bytes());
        p.extend_from_slice(b"mysql_native_password\0");
        if self.caps & CLIENT_CONNECT_ATTRS != 0 {
            p.push(0);
        }
        self.command(&p)?;
        loop {
            let r = self
                .read_packet()
                .context("reading the change-user reply")?;
            match r.payload.first() {
                Some(0x00) => return Ok(r.payload),
                Some(0xff) => return Err(ServerErr::parse(&r.payload)?.into()),
                Some(0xfe) => {
                    let sw = AuthSwitch::parse(&r.payload)
                        .map_err(|e| anyhow::anyhow!("bad auth switch: {e}"))?;
                    self.write_packet(&answer(&sw.data), r.seq.wrapping_add(1))?;
                }
                other => bail!("unexpected change-user reply {other:?}"),
            }
        }
    }

    pub fn deprecate_eof(&self) -> bool {
        self.caps & CLIENT_DEPRECATE_EOF != 0
    }

    pub fn session_track(&self) -> bool {
        self.caps & CLIENT_SESSION_TRACK != 0
    }

    /// Frames `payload` as one logical packet starting at `seq` and sends it.
    pub fn write_packet(&mut self, payload: &[u8], seq: u8) -> Result<()> {
        self.stream
            .write_all(&frame::packet(payload, seq))
            .context("writing a packet")
    }

    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).context("writing raw bytes")
    }

    /// Sends a command (sequence id 0).
    pub fn command(&mut self, payload: &[u8]) -> Result<()> {
        self.write_packet(payload, 0)
    }

    pub fn read_packet(&mut self) -> Result<Packet> {
        self.buf.clear();
        read_packet_from(&mut self.stream)
    }

    fn ok_status(&self, payload: &[u8]) -> Result<u16> {
        let ok = OkPacket::parse(payload, self.session_track())
            .map_err(|e| anyhow::anyhow!("bad OK packet {payload:02x?}: {e}"))?;
        Ok(ok.status)
    }

    fn is_terminator(&self, p: &[u8]) -> bool {
        p.first() == Some(&0xfe)
            && if self.deprecate_eof() {
                p.len() < MAX_PAYLOAD
            } else {
                p.len() < 9
            }
    }

    fn terminator_status(&self, p: &[u8]) -> Result<u16> {
        if self.deprecate_eof() {
            self.ok_status(p)
        } else {
            ensure!(p.len() >= 5, "short EOF packet");
            Ok(u16::from_le_bytes([p[3], p[4]]))
        }
    }

    /// Reads every response of the current command (following MORE_RESULTS_EXISTS). An
    /// ERR ends the command and is returned as a [`ServerErr`] error. A result whose
    /// column definitions end with SERVER_STATUS_CURSOR_EXISTS ends there (a COM_STMT_EXECUTE
    /// cursor; [`RawConn::query`] reads on: in text results the flag only says a stored
    /// program has a cursor open).
    pub fn read_results(&mut self) -> Result<Vec<Response>> {
        self.read_results_of(true)
    }

    fn read_results_of(&mut self, may_open_cursor: bool) -> Result<Vec<Response>> {
        let mut out = Vec::new();
        loop {
            let first = self.read_packet()?;
            let p = first.payload;
            let status;
            match p.first() {
                Some(0x00) => {
                    status = self.ok_status(&p)?;
                    out.push(Response::Ok { payload: p, status });
                }
                Some(0xff) => return Err(ServerErr::parse(&p)?.into()),
                Some(0xfb) => bail!("LOCAL INFILE request not supported by the raw client"),
                _ => {
                    let columns = Reader::new(&p)
                        .lenenc_int("column count")
                        .map_err(|e| anyhow::anyhow!("{e}"))?
                        as usize;
                    for _ in 0..columns {
                        self.read_packet()?;
                    }
                    let mut rows = Vec::new();
                    if !self.deprecate_eof() {
                        let eof = self.read_packet()?.payload;
                        ensure!(
                            self.is_terminator(&eof),
                            "expected EOF after column definitions, got {eof:02x?}"
                        );
                        let st = self.terminator_status(&eof)?;
                        if may_open_cursor && st & SERVER_STATUS_CURSOR_EXISTS != 0 {
                            out.push(Response::Rows {
                                columns,
                                rows,
                                status: st,
                            });
                            return Ok(out);
                        }
                    }
                    loop {
                        let r = self.read_packet()?.payload;
                        if self.is_terminator(&r) {
                            status = self.terminator_status(&r)?;
                            break;
                        }
                        if r.first() == Some(&0xff) {
                            return Err(ServerErr::parse(&r)?.into());
                        }
                        rows.push(r);
                    }
                    out.push(Response::Rows {
                        columns,
                        rows,
                        status,
                    });
                }
            }
            if status & SERVER_MORE_RESULTS_EXISTS == 0 {
                return Ok(out);
            }
        }
    }

    /// COM_QUERY and all its responses.
    pub fn query(&mut self, sql: &str) -> Result<Vec<Response>> {
        let mut p = vec![0x03];
        p.extend_from_slice(sql.as_bytes());
        self.command(&p)?;
        self.read_results_of(false)
            .with_context(|| format!("query {sql:?}"))
    }

    /// The single text value of a one-row, one-column result.
    pub fn query_value(&mut self, sql: &str) -> Result<Option<String>> {
        let res = self.query(sql)?;
        for r in res {
            if let Response::Rows { rows, .. } = r {
                let row = rows.first().context("no row")?;
                let value = parse_text_row(row)
                    .into_iter()
                    .next()
                    .context("no column")?;
                return Ok(value);
            }
        }
        bail!("{sql:?} returned no result set")
    }

    /// COM_STMT_PREPARE; reads the whole answer.
    pub fn prepare(&mut self, sql: &str) -> Result<Prepared> {
        let mut p = vec![0x16];
        p.extend_from_slice(sql.as_bytes());
        self.command(&p)?;
        let first = self.read_packet()?.payload;
        if first.first() == Some(&0xff) {
            return Err(ServerErr::parse(&first)?.into());
        }
        ensure!(
            first.first() == Some(&0x00) && first.len() >= 12,
            "bad prepare OK {first:02x?}"
        );
        let id = u32::from_le_bytes([first[1], first[2], first[3], first[4]]);
        let columns = u16::from_le_bytes([first[5], first[6]]);
        let params = u16::from_le_bytes([first[7], first[8]]);
        for n in [params, columns] {
            if n > 0 {
                for _ in 0..n {
                    self.read_packet()?;
                }
                if !self.deprecate_eof() {
                    self.read_packet()?;
                }
            }
        }
        Ok(Prepared {
            id,
            columns,
            params,
        })
    }

    /// COM_STMT_EXECUTE of a statement without parameters, with cursor `flags`.
    pub fn execute_no_params(&mut self, id: u32, flags: u8) -> Result<Vec<Response>> {
        let mut p = vec![0x17];
        p.extend_from_slice(&id.to_le_bytes());
        p.push(flags);
        p.extend_from_slice(&1u32.to_le_bytes());
        self.command(&p)?;
        self.read_results()
    }

    /// COM_STMT_FETCH: returns the rows and the terminator's status.
    pub fn fetch(&mut self, id: u32, rows: u32) -> Result<(Vec<Vec<u8>>, u16)> {
        let mut p = vec![0x1c];
        p.extend_from_slice(&id.to_le_bytes());
        p.extend_from_slice(&rows.to_le_bytes());
        self.command(&p)?;
        let mut out = Vec::new();
        loop {
            let r = self.read_packet()?.payload;
            if r.first() == Some(&0xff) {
                return Err(ServerErr::parse(&r)?.into());
            }
            if self.is_terminator(&r) {
                return Ok((out, self.terminator_status(&r)?));
            }
            out.push(r);
        }
    }

    /// COM_STMT_CLOSE (no response).
    pub fn close_statement(&mut self, id: u32) -> Result<()> {
        let mut p = vec![0x19];
        p.extend_from_slice(&id.to_le_bytes());
        self.command(&p)
    }

    /// COM_PING.
    pub fn ping(&mut self) -> Result<()> {
        self.command(&[0x0e])?;
        let p = self.read_packet()?.payload;
        match p.first() {
            Some(0x00) => Ok(()),
            Some(0xff) => Err(ServerErr::parse(&p)?.into()),
            _ => bail!("unexpected ping answer {p:02x?}"),
        }
    }
}
