//! `RogueServerMock`: a mock of a compromised MariaDB server, for what a real one never
//! does. It stands in front of a real `mariadbd` and relays both ways byte for byte (so
//! holdfast's monitor and logins see that real server), except one thing: a COM_QUERY whose
//! text contains [`RogueServerMock::TRIGGER`] is not passed on; the mock answers it with a
//! LOCAL INFILE request (0xFB) for a file it names, as a rogue server does to read a
//! client's files. What a client sends back is recorded, never forwarded.
//!
//! Only plain links: it reads the MySQL protocol's framing, so `[backend_tls]` must be off
//! for the connections it sees. A PROXY protocol v2 header in front of a connection is
//! passed on.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// What the mock saw on the connections it answered with a file request.
#[derive(Debug, Default, Clone)]
pub struct RogueRecord {
    /// File requests sent.
    pub requests: usize,
    /// Bytes of file content received (after the request), over all connections.
    pub stolen: Vec<u8>,
    /// File requests the client never answered: it closed the connection or sent a new
    /// command (COM_QUIT) instead.
    pub dropped_after_request: usize,
}

pub struct RogueServerMock {
    pub addr: SocketAddr,
    record: Arc<Mutex<RogueRecord>>,
}

impl RogueServerMock {
    /// The text that makes the mock ask for a file instead of answering the query.
    pub const TRIGGER: &'static str = "rogue_infile";

    /// Listens on a free loopback port, relaying to `upstream`; asks for `file` when
    /// triggered.
    pub fn start(upstream: SocketAddr, file: &str) -> RogueServerMock {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the rogue mock");
        let addr = listener.local_addr().expect("mock address");
        let record = Arc::new(Mutex::new(RogueRecord::default()));
        let (rec, file) = (record.clone(), file.to_string());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let (rec, file) = (rec.clone(), file.clone());
                std::thread::spawn(move || relay(client, server, rec, &file));
            }
        });
        RogueServerMock { addr, record }
    }

    pub fn record(&self) -> RogueRecord {
        self.record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn relay(client: TcpStream, server: TcpStream, rec: Arc<Mutex<RogueRecord>>, file: &str) {
    let (Ok(mut from_server), Ok(client_w)) = (server.try_clone(), client.try_clone()) else {
        return;
    };
    // Both the server's bytes and the mock's own packets go to the client: one writer.
    let to_client = Arc::new(Mutex::new(client_w));
    let down = to_client.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from_server.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut w = down.lock().unwrap_or_else(|p| p.into_inner());
            if w.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let w = down.lock().unwrap_or_else(|p| p.into_inner());
        let _ = w.shutdown(Shutdown::Both);
    });
    let mut from_client = client;
    let mut to_server = server;
    let mut buf: Vec<u8> = Vec::new();
    let mut first = true;
    // A file was asked for: the client's next packets are its content.
    let mut asked_file = false;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match from_client.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        if first {
            let sig = &holdfast_wire::proxy_protocol::SIGNATURE;
            if buf.len() < 16 && sig.starts_with(&buf[..buf.len().min(12)]) {
                continue;
            }
            first = false;
            if buf.starts_with(sig) {
                let len = 16 + u16::from_be_bytes([buf[14], buf[15]]) as usize;
                while buf.len() < len {
                    match from_client.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                if to_server.write_all(&buf[..len]).is_err() {
                    return;
                }
                buf.drain(..len);
            }
        }
        while buf.len() >= 4 {
            let len = u32::from_le_bytes([buf[0], buf[1], buf[2], 0]) as usize;
            if buf.len() < 4 + len {
                break;
            }
            let packet: Vec<u8> = buf.drain(..4 + len).collect();
            let (seq, payload) = (packet[3], &packet[4..]);
            if asked_file && seq == 0 {
                // A new command (COM_QUIT as a connection closes): no file came.
                asked_file = false;
                rec.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .dropped_after_request += 1;
            }
            if asked_file {
                if payload.is_empty() {
                    // The end of the file: answer as a server that loaded it.
                    asked_file = false;
                    let ok = [7, 0, 0, seq.wrapping_add(1), 0, 0, 0, 2, 0, 0, 0];
                    let mut w = to_client.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = w.write_all(&ok);
                } else {
                    let mut r = rec.lock().unwrap_or_else(|p| p.into_inner());
                    r.stolen.extend_from_slice(payload);
                }
                continue;
            }
            let triggered = seq == 0
                && payload.first() == Some(&0x03)
                && payload
                    .windows(RogueServerMock::TRIGGER.len())
                    .any(|w| w == RogueServerMock::TRIGGER.as_bytes());
            if triggered {
                let mut request = vec![0xfb];
                request.extend_from_slice(file.as_bytes());
                let mut out = (request.len() as u32).to_le_bytes()[..3].to_vec();
                out.push(1);
                out.extend_from_slice(&request);
                rec.lock().unwrap_or_else(|p| p.into_inner()).requests += 1;
                asked_file = true;
                let mut w = to_client.lock().unwrap_or_else(|p| p.into_inner());
                if w.write_all(&out).is_err() {
                    return;
                }
                continue;
            }
            if to_server.write_all(&packet).is_err() {
                return;
            }
        }
    }
    if asked_file {
        rec.lock()
            .unwrap_or_else(|p| p.into_inner())
            .dropped_after_request += 1;
    }
    let _ = to_server.shutdown(Shutdown::Both);
}
