//! Continuing a TLS session in another process (`holdfast ctl upgrade` hands live sessions
//! over). The kernel here has no kTLS, so a socket cannot carry its TLS state: the old
//! process takes the traffic keys and sequence numbers out of rustls ([`take_tls`]), and the
//! new one goes on with [`ResumedTls`], a record layer of its own: AEAD over those keys
//! (AES-GCM, ChaCha20-Poly1305; TLS 1.2 and 1.3), alerts, and the post-handshake messages a
//! peer may still send (a session ticket is dropped; a TLS 1.3 key update is followed).
//!
//! rustls gives the keys, not the TLS 1.3 traffic secrets a key update derives the next
//! keys from: each connection's configuration logs its first application traffic secrets
//! into a [`SecretLog`] of its own (rustls' `KeyLog`), and [`take_tls`] walks them forward
//! to the generation whose keys rustls gave (it may have updated them itself).
//!
//! Received bytes of a record not complete yet would be lost with rustls (it holds them
//! undecrypted): the stream under it ([`Tracked`]) follows the record boundaries of what it
//! reads, without copying, and the state is taken only between records.

use crate::conn::BoxedIo;
use crate::tls::Prefixed;
use bytes::{Buf, BytesMut};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};
use std::io::{self, Read};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use zeroize::Zeroize;

const HEADER: usize = 5;
const TAG: usize = 16;
const MAX_PLAINTEXT: usize = 1 << 14;
/// TLS 1.3 allows 256 bytes of expansion, TLS 1.2 2048.
const MAX_RECORD: usize = MAX_PLAINTEXT + 2048;

const CHANGE_CIPHER_SPEC: u8 = 20;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Version {
    Tls12,
    Tls13,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Cipher {
    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Cipher::Aes128Gcm => &aead::AES_128_GCM,
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }

    /// TLS 1.2's AES-GCM records carry 8 bytes of the nonce.
    fn explicit_nonce(self, version: Version) -> usize {
        match (version, self) {
            (Version::Tls12, Cipher::Aes128Gcm | Cipher::Aes256Gcm) => 8,
            _ => 0,
        }
    }
}

impl Cipher {
    /// The records one key may seal (the limits rustls keeps for the same suites).
    fn confidentiality_limit(self, version: Version) -> u64 {
        match (self, version) {
            (Cipher::Chacha20Poly1305, _) => u64::MAX,
            (Cipher::Aes256Gcm, Version::Tls13) => 1 << 23,
            (Cipher::Aes128Gcm | Cipher::Aes256Gcm, _) => 1 << 24,
        }
    }

    /// TLS 1.3's hash for the suite of this cipher, and its key length.
    fn tls13(self) -> (ring::hkdf::Algorithm, usize) {
        match self {
            Cipher::Aes128Gcm => (ring::hkdf::HKDF_SHA256, 16),
            Cipher::Aes256Gcm => (ring::hkdf::HKDF_SHA384, 32),
            Cipher::Chacha20Poly1305 => (ring::hkdf::HKDF_SHA256, 32),
        }
    }
}

/// One direction's keys and the sequence number of its next record; in TLS 1.3 its
/// traffic secret too, when known (a key update derives the next keys from it). Zeroized
/// when dropped.
#[derive(Clone, Serialize, Deserialize)]
pub struct Direction {
    seq: u64,
    key: Material,
    iv: [u8; 12],
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<Material>,
}

impl Drop for Direction {
    fn drop(&mut self) {
        self.iv.zeroize();
    }
}

/// A key or a traffic secret (16 to 48 bytes) held in place: every idle TLS connection
/// keeps two of each, and small heap blocks of their own would cost an idle session a
/// few hundred bytes (issue 22). Zeroized when dropped; serialized as the bytes' sequence
/// (as a `Vec<u8>` was before: a hand-over between the two versions reads it).
#[derive(Clone)]
struct Material {
    len: u8,
    bytes: [u8; MATERIAL_MAX],
}

/// The longest key or secret: a SHA-384 traffic secret.
const MATERIAL_MAX: usize = 48;

impl Material {
    /// `None` when `bytes` is longer than [`MATERIAL_MAX`].
    fn new(bytes: &[u8]) -> Option<Material> {
        let mut m = Material {
            len: u8::try_from(bytes.len()).ok()?,
            bytes: [0; MATERIAL_MAX],
        };
        m.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(m)
    }
}

impl std::ops::Deref for Material {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl Drop for Material {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

impl Serialize for Material {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Material {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut bytes = zeroize::Zeroizing::new(Vec::<u8>::deserialize(deserializer)?);
        let material = Material::new(&bytes)
            .ok_or_else(|| serde::de::Error::custom("a key or secret longer than 48 bytes"));
        bytes.zeroize();
        material
    }
}

impl Direction {
    /// A TLS 1.3 direction at `seq` whose keys derive from `secret` (RFC 8446, 7.3).
    fn from_secret(cipher: Cipher, seq: u64, secret: Material) -> Option<Direction> {
        let (hash, key_len) = cipher.tls13();
        let key = zeroize::Zeroizing::new(expand_label(hash, &secret, b"key", key_len)?);
        let iv = zeroize::Zeroizing::new(expand_label(hash, &secret, b"iv", 12)?);
        Some(Direction {
            seq,
            key: Material::new(&key)?,
            iv: <[u8; 12]>::try_from(&iv[..]).ok()?,
            secret: Some(secret),
        })
    }

    /// The next generation of keys (RFC 8446, 7.2): from the next traffic secret, the
    /// sequence number back to 0. `false` without a secret.
    fn update(&mut self, cipher: Cipher) -> bool {
        let (hash, _) = cipher.tls13();
        let Some(secret) = self.secret.as_ref() else {
            return false;
        };
        let Some(next) = expand_label(hash, secret, b"traffic upd", hash_len(hash)) else {
            return false;
        };
        let next = zeroize::Zeroizing::new(next);
        let Some(next) = Material::new(&next).and_then(|n| Direction::from_secret(cipher, 0, n))
        else {
            return false;
        };
        // (The old ones are zeroized as they drop.)
        *self = next;
        true
    }

    /// This direction as a parked connection keeps it (see [`DormantTls`]).
    fn dormant(&self, version: Version, cipher: Cipher) -> Dormant {
        if let (Version::Tls13, Some(secret)) = (version, &self.secret) {
            // Only when the secret gives these very keys back.
            if let Some(d) = Direction::from_secret(cipher, self.seq, secret.clone()) {
                if d.key[..] == self.key[..] && d.iv == self.iv {
                    return Dormant::Secret {
                        seq: self.seq,
                        secret: secret.clone(),
                    };
                }
            }
        }
        Dormant::Keys(Box::new(self.clone()))
    }

    /// Finds the generation of `secret` (the first) whose keys are this direction's and
    /// keeps its secret; unknown after a few (rustls updates keys rarely).
    fn find_secret(&mut self, cipher: Cipher, secret: &[u8]) {
        let (hash, key_len) = cipher.tls13();
        let mut secret = secret.to_vec();
        for _ in 0..64 {
            if expand_label(hash, &secret, b"key", key_len).as_deref() == Some(&self.key[..])
                && expand_label(hash, &secret, b"iv", 12).as_deref() == Some(&self.iv[..])
            {
                self.secret = Material::new(&secret);
                secret.zeroize();
                return;
            }
            match expand_label(hash, &secret, b"traffic upd", hash_len(hash)) {
                Some(next) => {
                    secret.zeroize();
                    secret = next;
                }
                None => break,
            }
        }
        secret.zeroize();
    }
}

/// The length of a traffic secret: the hash's output.
fn hash_len(hash: ring::hkdf::Algorithm) -> usize {
    ring::hkdf::KeyType::len(&hash)
}

/// TLS 1.3's HKDF-Expand-Label with an empty context (RFC 8446, 7.1).
fn expand_label(
    hash: ring::hkdf::Algorithm,
    secret: &[u8],
    label: &[u8],
    len: usize,
) -> Option<Vec<u8>> {
    struct Len(usize);
    impl ring::hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let prk = ring::hkdf::Prk::new_less_safe(hash, secret);
    let length = u16::try_from(len).ok()?.to_be_bytes();
    let label_len = [u8::try_from(6 + label.len()).ok()?];
    let info: [&[u8]; 5] = [&length, &label_len, b"tls13 ", label, &[0]];
    let okm = prk.expand(&info, Len(len)).ok()?;
    let mut out = vec![0u8; len];
    okm.fill(&mut out).ok()?;
    Some(out)
}

/// A connection's first TLS 1.3 application traffic secrets, as rustls logs them (its
/// configuration's `key_log`, one log per connection): kept for [`take_tls`], zeroized
/// when dropped. Nothing is written anywhere.
#[derive(Default)]
pub struct SecretLog {
    /// The client's and the server's.
    secrets: std::sync::Mutex<Secrets>,
}

impl std::fmt::Debug for SecretLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretLog").finish_non_exhaustive()
    }
}

/// The client's and the server's first application traffic secrets.
type Secrets = (Option<Vec<u8>>, Option<Vec<u8>>);

const CLIENT_SECRET: &str = "CLIENT_TRAFFIC_SECRET_0";
const SERVER_SECRET: &str = "SERVER_TRAFFIC_SECRET_0";

impl rustls::KeyLog for SecretLog {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        let mut s = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
        let slot = match label {
            CLIENT_SECRET => &mut s.0,
            SERVER_SECRET => &mut s.1,
            _ => return,
        };
        if let Some(mut old) = slot.replace(secret.to_vec()) {
            old.zeroize();
        }
    }

    fn will_log(&self, label: &str) -> bool {
        label == CLIENT_SECRET || label == SERVER_SECRET
    }
}

impl SecretLog {
    fn take(&self) -> Secrets {
        std::mem::take(&mut *self.secrets.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for SecretLog {
    fn drop(&mut self) {
        let (mut c, mut s) = self.take();
        c.zeroize();
        s.zeroize();
    }
}

/// A TLS session's record-layer state, as one process hands it to the next.
#[derive(Serialize, Deserialize)]
pub struct TlsState {
    version: Version,
    cipher: Cipher,
    tx: Direction,
    rx: Direction,
    /// Received bytes of records not decrypted yet.
    pending: Vec<u8>,
}

impl std::fmt::Debug for TlsState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsState")
            .field("version", &self.version)
            .field("cipher", &self.cipher)
            .finish_non_exhaustive()
    }
}

/// A TLS state as a parked idle connection keeps it (issue 22: memory per idle session;
/// `holdfast-proxy`'s `parking.rs`): a TLS 1.3 direction whose traffic secret is known
/// keeps that secret and its sequence number, and derives its key and IV again when it
/// wakes; any other keeps its keys, boxed. Zeroized when dropped.
pub struct DormantTls {
    version: Version,
    cipher: Cipher,
    tx: Dormant,
    rx: Dormant,
    /// Received bytes of records not decrypted yet: none on an idle connection, so boxed
    /// once more when there are any (8 bytes where a boxed slice is 16).
    #[allow(clippy::box_collection)]
    pending: Option<Box<Vec<u8>>>,
}

enum Dormant {
    Secret { seq: u64, secret: Material },
    Keys(Box<Direction>),
}

impl Dormant {
    fn wake(self, cipher: Cipher) -> io::Result<Direction> {
        match self {
            Dormant::Secret { seq, secret } => Direction::from_secret(cipher, seq, secret)
                .ok_or_else(|| protocol("the keys of a traffic secret could not be derived")),
            Dormant::Keys(direction) => Ok(*direction),
        }
    }
}

impl TlsState {
    /// The state as a parked connection keeps it.
    pub fn into_dormant(self) -> DormantTls {
        DormantTls {
            version: self.version,
            cipher: self.cipher,
            tx: self.tx.dormant(self.version, self.cipher),
            rx: self.rx.dormant(self.version, self.cipher),
            pending: (!self.pending.is_empty()).then(|| Box::new(self.pending)),
        }
    }
}

impl DormantTls {
    /// The state to go on with, its keys derived again where they were dropped.
    pub fn wake(self) -> io::Result<TlsState> {
        let DormantTls {
            version,
            cipher,
            tx,
            rx,
            pending,
        } = self;
        Ok(TlsState {
            version,
            cipher,
            tx: tx.wake(cipher)?,
            rx: rx.wake(cipher)?,
            pending: pending.map_or_else(Vec::new, |p| *p),
        })
    }
}

/// The stream under rustls: passes bytes through and follows the boundaries of the
/// records it reads (see the module documentation).
pub struct Tracked {
    inner: BoxedIo,
    /// The connection's traffic secrets, when its configuration logs them here.
    secrets: Option<std::sync::Arc<SecretLog>>,
    /// The current record's header, as far as it is in.
    header: [u8; HEADER],
    header_len: usize,
    /// Bytes of the current record still to come once its header is in.
    body_left: usize,
}

impl Tracked {
    pub fn new(inner: BoxedIo) -> Self {
        Tracked {
            inner,
            secrets: None,
            header: [0; HEADER],
            header_len: 0,
            body_left: 0,
        }
    }

    /// A stream whose connection logs its traffic secrets into `secrets` (its rustls
    /// configuration's `key_log`): a TLS 1.3 key update can be followed after a hand-over.
    pub fn with_secrets(inner: BoxedIo, secrets: std::sync::Arc<SecretLog>) -> Self {
        Tracked {
            secrets: Some(secrets),
            ..Tracked::new(inner)
        }
    }

    /// Whether the last byte read ended a record (rustls has decrypted every record it
    /// holds).
    fn between_records(&self) -> bool {
        self.header_len == 0
    }

    fn observe(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.header_len < HEADER {
                let take = (HEADER - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&bytes[..take]);
                self.header_len += take;
                bytes = &bytes[take..];
                if self.header_len == HEADER {
                    self.body_left =
                        usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
                    if self.body_left == 0 {
                        self.header_len = 0;
                    }
                }
                continue;
            }
            let take = self.body_left.min(bytes.len());
            self.body_left -= take;
            bytes = &bytes[take..];
            if self.body_left == 0 {
                self.header_len = 0;
            }
        }
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let this = &mut *self;
        let filled = buf.filled();
        this.observe(&filled[before..]);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The plain TCP socket under a stream, when there is one (a `Prefixed` with nothing left
/// to give, or the socket itself).
fn into_tcp(stream: BoxedIo) -> Option<TcpStream> {
    let any = stream.into_any();
    let any = match any.downcast::<TcpStream>() {
        Ok(tcp) => return Some(*tcp),
        Err(any) => any,
    };
    let prefixed = any.downcast::<Prefixed>().ok()?;
    let (prefix, inner) = prefixed.into_parts();
    if !prefix.is_empty() {
        return None;
    }
    into_tcp(inner)
}

fn tcp_under(stream: &dyn crate::conn::Io) -> bool {
    let any = stream.as_any();
    any.is::<TcpStream>()
        || any
            .downcast_ref::<Prefixed>()
            .is_some_and(|p| p.prefix_empty() && tcp_under(p.inner()))
}

/// Whether the stream is TLS run by rustls (not yet [`ResumedTls`], holdfast's own
/// record layer).
pub fn on_rustls(stream: &dyn crate::conn::Io) -> bool {
    let any = stream.as_any();
    any.is::<tokio_rustls::server::TlsStream<Tracked>>()
        || any.is::<tokio_rustls::client::TlsStream<Tracked>>()
}

/// Whether [`take_tls`] can take this stream's TLS state now.
pub fn can_take(stream: &dyn crate::conn::Io) -> bool {
    let any = stream.as_any();
    if let Some(s) = any.downcast_ref::<tokio_rustls::server::TlsStream<Tracked>>() {
        let (io, conn) = s.get_ref();
        return !conn.is_handshaking()
            && !conn.wants_write()
            && io.between_records()
            && tcp_under(io.inner.as_ref());
    }
    if let Some(s) = any.downcast_ref::<tokio_rustls::client::TlsStream<Tracked>>() {
        let (io, conn) = s.get_ref();
        return !conn.is_handshaking()
            && !conn.wants_write()
            && io.between_records()
            && tcp_under(io.inner.as_ref());
    }
    if let Some(s) = any.downcast_ref::<ResumedTls>() {
        return s.out.is_empty();
    }
    false
}

/// Takes a TLS stream apart: its TCP socket, its record-layer state and the plaintext it
/// decrypted and nobody read yet. Check [`can_take`] first: a stream it refuses is lost.
pub fn take_tls(stream: BoxedIo) -> io::Result<(TcpStream, TlsState, Vec<u8>)> {
    let any = stream.into_any();
    let any = match any.downcast::<ResumedTls>() {
        Ok(resumed) => return Ok(resumed.into_parts()),
        Err(any) => any,
    };
    let (mut tracked, conn): (Tracked, rustls::Connection) =
        match any.downcast::<tokio_rustls::server::TlsStream<Tracked>>() {
            Ok(s) => {
                let (io, conn) = s.into_inner();
                (io, rustls::Connection::Server(conn))
            }
            Err(any) => match any.downcast::<tokio_rustls::client::TlsStream<Tracked>>() {
                Ok(s) => {
                    let (io, conn) = s.into_inner();
                    (io, rustls::Connection::Client(conn))
                }
                Err(_) => return Err(unsupported("not a TLS stream holdfast can take apart")),
            },
        };
    let mut conn = conn;
    let server = matches!(conn, rustls::Connection::Server(_));
    // What rustls decrypted and nobody read yet.
    let mut plaintext = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match conn.reader().read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => plaintext.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => Version::Tls13,
        Some(rustls::ProtocolVersion::TLSv1_2) => Version::Tls12,
        _ => return Err(unsupported("a TLS version holdfast cannot continue")),
    };
    let secrets = conn
        .dangerous_extract_secrets()
        .map_err(|e| io::Error::other(format!("taking the TLS keys: {e}")))?;
    let (cipher, mut tx) = direction(secrets.tx)?;
    let (_, mut rx) = direction(secrets.rx)?;
    if let (Version::Tls13, Some(log)) = (version, tracked.secrets.take()) {
        let (mut client, mut server_secret) = log.take();
        let (ours, theirs) = match server {
            true => (&server_secret, &client),
            false => (&client, &server_secret),
        };
        if let Some(s) = ours {
            tx.find_secret(cipher, s);
        }
        if let Some(s) = theirs {
            rx.find_secret(cipher, s);
        }
        client.zeroize();
        server_secret.zeroize();
    }
    if !tracked.between_records() {
        return Err(unsupported("a record half received"));
    }
    let tcp =
        into_tcp(tracked.inner).ok_or_else(|| unsupported("TLS over something else than TCP"))?;
    Ok((
        tcp,
        TlsState {
            version,
            cipher,
            tx,
            rx,
            pending: Vec::new(),
        },
        plaintext,
    ))
}

fn direction(
    (seq, secrets): (u64, rustls::ConnectionTrafficSecrets),
) -> io::Result<(Cipher, Direction)> {
    use rustls::ConnectionTrafficSecrets as S;
    let (cipher, key, iv) = match secrets {
        S::Aes128Gcm { key, iv } => (Cipher::Aes128Gcm, key, iv),
        S::Aes256Gcm { key, iv } => (Cipher::Aes256Gcm, key, iv),
        S::Chacha20Poly1305 { key, iv } => (Cipher::Chacha20Poly1305, key, iv),
        _ => return Err(unsupported("a cipher holdfast cannot continue")),
    };
    let iv: [u8; 12] = iv
        .as_ref()
        .try_into()
        .map_err(|_| unsupported("an IV of another length"))?;
    Ok((
        cipher,
        Direction {
            seq,
            key: Material::new(key.as_ref()).ok_or_else(|| unsupported("a key too long"))?,
            iv,
            secret: None,
        },
    ))
}

fn unsupported(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, what.to_owned())
}

fn protocol(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

/// A TLS session continued from a [`TlsState`] over its TCP socket.
pub struct ResumedTls {
    io: TcpStream,
    version: Version,
    cipher: Cipher,
    tx: Direction,
    rx: Direction,
    tx_key: LessSafeKey,
    rx_key: LessSafeKey,
    /// Received, not decrypted yet.
    raw: BytesMut,
    /// Decrypted, not read yet.
    plain: BytesMut,
    /// Encrypted, not written yet.
    out: BytesMut,
    /// The peer said close_notify (or closed the socket).
    eof: bool,
    /// This side's close_notify is sealed.
    closing: bool,
    /// The records one key seals at most ([`Cipher::confidentiality_limit`]).
    tx_limit: u64,
}

impl ResumedTls {
    pub fn new(io: TcpStream, state: TlsState) -> io::Result<Self> {
        let TlsState {
            version,
            cipher,
            tx,
            rx,
            pending,
        } = state;
        let key = |d: &Direction| {
            UnboundKey::new(cipher.algorithm(), &d.key)
                .map(LessSafeKey::new)
                .map_err(|_| protocol("a key of the wrong length"))
        };
        Ok(ResumedTls {
            tx_key: key(&tx)?,
            rx_key: key(&rx)?,
            io,
            version,
            cipher,
            tx,
            rx,
            raw: BytesMut::from(&pending[..]),
            plain: BytesMut::new(),
            out: BytesMut::new(),
            eof: false,
            closing: false,
            tx_limit: cipher.confidentiality_limit(version),
        })
    }

    /// The socket, the state and the plaintext not read yet, for the next process.
    fn into_parts(self) -> (TcpStream, TlsState, Vec<u8>) {
        let ResumedTls {
            io,
            version,
            cipher,
            tx,
            rx,
            raw,
            plain,
            ..
        } = self;
        (
            io,
            TlsState {
                version,
                cipher,
                tx,
                rx,
                pending: raw.to_vec(),
            },
            plain.to_vec(),
        )
    }

    fn nonce(iv: &[u8; 12], seq: u64) -> [u8; 12] {
        let mut nonce = *iv;
        for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    /// TLS 1.2's additional data: the sequence number, the type, the version, the
    /// plaintext's length.
    fn aad12(seq: u64, kind: u8, len: usize) -> [u8; 13] {
        let mut aad = [0u8; 13];
        aad[..8].copy_from_slice(&seq.to_be_bytes());
        aad[8] = kind;
        aad[9..11].copy_from_slice(&[3, 3]);
        aad[11..].copy_from_slice(&(len as u16).to_be_bytes());
        aad
    }

    /// Appends one record of `kind` carrying `data` (at most 2^14 bytes) to `out`, sealed
    /// in place there.
    fn seal(&mut self, kind: u8, data: &[u8]) -> io::Result<()> {
        let seq = self.tx.seq;
        let nonce = Self::nonce(&self.tx.iv, seq);
        let explicit = self.cipher.explicit_nonce(self.version);
        let tls13 = self.version == Version::Tls13;
        let len = explicit + data.len() + usize::from(tls13) + TAG;
        let outer = if tls13 { APPLICATION_DATA } else { kind };
        let header = [outer, 3, 3, (len >> 8) as u8, len as u8];
        let aad12;
        let aad: &[u8] = if tls13 {
            &header
        } else {
            aad12 = Self::aad12(seq, kind, data.len());
            &aad12
        };
        let before = self.out.len();
        self.out.reserve(HEADER + len);
        self.out.extend_from_slice(&header);
        if explicit > 0 {
            self.out.extend_from_slice(&nonce[4..]);
        }
        let body = self.out.len();
        self.out.extend_from_slice(data);
        if tls13 {
            self.out.extend_from_slice(&[kind]);
        }
        let Ok(tag) = self.tx_key.seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut self.out[body..],
        ) else {
            self.out.truncate(before);
            return Err(protocol("sealing a record failed"));
        };
        self.out.extend_from_slice(tag.as_ref());
        self.tx.seq = self.tx.seq.wrapping_add(1);
        Ok(())
    }

    /// Before a record goes out: at the keys' confidentiality limit (the records one key
    /// may seal before an attacker gains an edge, as rustls counts them), TLS 1.3 moves to
    /// the next keys (a KeyUpdate, sealed with the current ones); TLS 1.2 cannot, and the
    /// connection ends with close_notify, as rustls ends it.
    fn refresh_if_due(&mut self) -> io::Result<()> {
        if self.tx.seq < self.tx_limit {
            return Ok(());
        }
        match self.version {
            Version::Tls13 => {
                // KeyUpdate, update_not_requested.
                self.seal(HANDSHAKE, &[24, 0, 0, 1, 0])?;
                self.next_tx_keys()
            }
            Version::Tls12 => {
                if !self.closing {
                    self.closing = true;
                    self.seal(ALERT, &[1, 0])?;
                }
                Err(protocol(
                    "the keys reached their confidentiality limit (TLS 1.2 cannot update them)",
                ))
            }
        }
    }

    /// This side's next TLS 1.3 keys, from its next traffic secret.
    fn next_tx_keys(&mut self) -> io::Result<()> {
        if !self.tx.update(self.cipher) {
            return Err(protocol(
                "this side's keys are due for an update, and its traffic secret is not known here",
            ));
        }
        self.tx_key = UnboundKey::new(self.cipher.algorithm(), &self.tx.key)
            .map(LessSafeKey::new)
            .map_err(|_| protocol("a key of the wrong length"))?;
        Ok(())
    }

    /// Decrypts the first record in `raw` if it is complete, in place: its content type
    /// and plaintext. `None`: more bytes are needed.
    fn open(&mut self) -> io::Result<Option<(u8, BytesMut)>> {
        if self.raw.len() < HEADER {
            return Ok(None);
        }
        let kind = self.raw[0];
        let len = usize::from(u16::from_be_bytes([self.raw[3], self.raw[4]]));
        if len > MAX_RECORD {
            return Err(protocol("a record too long"));
        }
        if self.raw.len() < HEADER + len {
            return Ok(None);
        }
        let header: [u8; HEADER] = [
            self.raw[0],
            self.raw[1],
            self.raw[2],
            self.raw[3],
            self.raw[4],
        ];
        self.raw.advance(HEADER);
        let mut body = self.raw.split_to(len);
        if kind == CHANGE_CIPHER_SPEC && self.version == Version::Tls13 {
            // Middlebox compatibility: unprotected, ignored.
            return Ok(Some((CHANGE_CIPHER_SPEC, BytesMut::new())));
        }
        let seq = self.rx.seq;
        let explicit = self.cipher.explicit_nonce(self.version);
        if body.len() < explicit + TAG {
            return Err(protocol("a record too short"));
        }
        let nonce = match explicit {
            0 => Self::nonce(&self.rx.iv, seq),
            _ => {
                let mut n = [0u8; 12];
                n[..4].copy_from_slice(&self.rx.iv[..4]);
                n[4..].copy_from_slice(&body[..8]);
                body.advance(8);
                n
            }
        };
        let aad12;
        let aad: &[u8] = match self.version {
            Version::Tls13 => &header,
            Version::Tls12 => {
                aad12 = Self::aad12(seq, kind, body.len() - TAG);
                &aad12
            }
        };
        let plain_len = self
            .rx_key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut body[..],
            )
            .map_err(|_| protocol("a record that does not decrypt"))?
            .len();
        body.truncate(plain_len);
        self.rx.seq = self.rx.seq.wrapping_add(1);
        match self.version {
            Version::Tls12 => Ok(Some((kind, body))),
            Version::Tls13 => {
                // The content type is the last byte that is not padding.
                let end = body
                    .iter()
                    .rposition(|&b| b != 0)
                    .ok_or_else(|| protocol("a record without a content type"))?;
                let inner = body[end];
                body.truncate(end);
                Ok(Some((inner, body)))
            }
        }
    }

    /// Takes one decrypted record: application data into `plain`, the rest handled.
    fn accept(&mut self, kind: u8, data: BytesMut) -> io::Result<()> {
        match kind {
            // (Decrypted where it was received: taken as it is when nothing waits before it.)
            APPLICATION_DATA if self.plain.is_empty() => self.plain = data,
            APPLICATION_DATA => self.plain.extend_from_slice(&data),
            CHANGE_CIPHER_SPEC => {}
            ALERT => match data.get(1) {
                Some(0) => self.eof = true,
                Some(d) => return Err(protocol(&format!("the peer sent alert {d}"))),
                None => return Err(protocol("an empty alert")),
            },
            HANDSHAKE => {
                let mut rest = &data[..];
                while rest.len() >= 4 {
                    let len = (usize::from(rest[1]) << 16)
                        | (usize::from(rest[2]) << 8)
                        | usize::from(rest[3]);
                    match rest[0] {
                        // NewSessionTicket: for a resumption holdfast does not attempt.
                        4 if self.version == Version::Tls13 => {}
                        24 if self.version == Version::Tls13 => {
                            let requested = rest.get(4) == Some(&1);
                            self.key_update(requested)?;
                        }
                        t => {
                            return Err(protocol(&format!(
                                "handshake message {t} after the handshake"
                            )))
                        }
                    }
                    rest = rest.get(4 + len..).unwrap_or_default();
                }
            }
            t => return Err(protocol(&format!("a record of type {t}"))),
        }
        Ok(())
    }

    /// The peer's KeyUpdate (it is the last message of its record): its next records
    /// use the next keys; asked to, this side says KeyUpdate too (with its current keys)
    /// and uses its next keys from the record after.
    fn key_update(&mut self, requested: bool) -> io::Result<()> {
        let unknown =
            || protocol("the peer updated its keys, and the traffic secret is not known here");
        if !self.rx.update(self.cipher) {
            return Err(unknown());
        }
        self.rx_key = UnboundKey::new(self.cipher.algorithm(), &self.rx.key)
            .map(LessSafeKey::new)
            .map_err(|_| protocol("a key of the wrong length"))?;
        if requested {
            // KeyUpdate, update_not_requested.
            self.seal(HANDSHAKE, &[24, 0, 0, 1, 0])?;
            self.next_tx_keys()?;
        }
        Ok(())
    }

    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ResumedTls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.plain.is_empty() {
                let n = this.plain.len().min(buf.remaining());
                buf.put_slice(&this.plain[..n]);
                this.plain.advance(n);
                if this.plain.is_empty() {
                    // (It may share the buffer records arrive in: not kept while idle.)
                    this.plain = BytesMut::new();
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if let Some((kind, data)) = this.open()? {
                this.accept(kind, data)?;
                continue;
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                if !this.raw.is_empty() {
                    return Poll::Ready(Err(protocol("the connection closed inside a record")));
                }
                this.eof = true;
                continue;
            }
            this.raw.extend_from_slice(read.filled());
        }
    }
}

impl AsyncWrite for ResumedTls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        // What was sealed before goes first; then this is sealed whole (it is the caller's
        // once accepted) and written as far as the socket takes it.
        ready!(this.poll_write_out(cx))?;
        let n = buf.len().min(MAX_PLAINTEXT);
        if let Err(e) = this.refresh_if_due() {
            // (A close_notify sealed on the way out goes if the socket takes it now.)
            let _ = this.poll_write_out(cx);
            return Poll::Ready(Err(e));
        }
        this.seal(APPLICATION_DATA, &buf[..n])?;
        if let Poll::Ready(Err(e)) = this.poll_write_out(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.closing {
            this.closing = true;
            this.seal(ALERT, &[1, 0])?;
        }
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The keys' serialized form is a `Vec<u8>`'s: a hand-over between a process that held
    /// them in vectors and one that holds them in place reads either way.
    #[test]
    fn keys_and_secrets_read_and_write_as_byte_vectors_did() {
        #[derive(Serialize, Deserialize)]
        struct Before {
            seq: u64,
            key: Vec<u8>,
            iv: [u8; 12],
            #[serde(default, skip_serializing_if = "Option::is_none")]
            secret: Option<Vec<u8>>,
        }
        let before = Before {
            seq: 7,
            key: (1..=32).collect(),
            iv: [9; 12],
            secret: Some((100..148).collect()),
        };
        let json = serde_json::to_string(&before).expect("json");
        let now: Direction = serde_json::from_str(&json).expect("read as the new form");
        assert_eq!(
            (now.seq, &now.key[..], now.iv),
            (7, &before.key[..], [9; 12])
        );
        assert_eq!(now.secret.as_deref(), before.secret.as_deref());
        assert_eq!(serde_json::to_string(&now).expect("json"), json);
        let back: Before = serde_json::from_str(&json).expect("read as the old form");
        assert_eq!(back.key, before.key);
        // Without a secret, and a key too long for any cipher.
        let json = r#"{"seq":1,"key":[1,2,3],"iv":[0,0,0,0,0,0,0,0,0,0,0,0]}"#;
        let d: Direction = serde_json::from_str(json).expect("no secret");
        assert!(d.secret.is_none());
        assert_eq!(&d.key[..], &[1, 2, 3]);
        let long = format!(
            r#"{{"seq":1,"key":{:?},"iv":[0,0,0,0,0,0,0,0,0,0,0,0]}}"#,
            vec![1u8; 49]
        );
        assert!(serde_json::from_str::<Direction>(&long).is_err());
    }

    fn provider(suite: rustls::SupportedCipherSuite) -> Arc<rustls::crypto::CryptoProvider> {
        let mut p = rustls::crypto::ring::default_provider();
        p.cipher_suites = vec![suite];
        Arc::new(p)
    }

    /// The server's and the client's configurations; holdfast's side logs its traffic
    /// secrets into `log` (as holdfast's configurations do, one log per connection).
    fn configs(
        suite: rustls::SupportedCipherSuite,
        log: &Arc<SecretLog>,
        holdfast_serves: bool,
    ) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("a certificate");
        let der = CertificateDer::from(cert.der().to_vec());
        let version = match suite {
            rustls::SupportedCipherSuite::Tls13(_) => &rustls::version::TLS13,
            rustls::SupportedCipherSuite::Tls12(_) => &rustls::version::TLS12,
        };
        let mut server = rustls::ServerConfig::builder_with_provider(provider(suite))
            .with_protocol_versions(&[version])
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![der.clone()],
                PrivateKeyDer::try_from(key.serialize_der()).expect("a key"),
            )
            .expect("a server config");
        server.enable_secret_extraction = true;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).expect("a root");
        let mut client = rustls::ClientConfig::builder_with_provider(provider(suite))
            .with_protocol_versions(&[version])
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.enable_secret_extraction = true;
        match holdfast_serves {
            true => server.key_log = log.clone(),
            false => client.key_log = log.clone(),
        }
        (Arc::new(server), Arc::new(client))
    }

    /// A TLS connection over loopback TCP: holdfast's side (tracked, as a server when
    /// `holdfast_serves`, else as a client) and the peer's (plain rustls).
    async fn pair(
        suite: rustls::SupportedCipherSuite,
        holdfast_serves: bool,
    ) -> (BoxedIo, BoxedIo) {
        let log = Arc::new(SecretLog::default());
        let (server, client) = configs(suite, &log, holdfast_serves);
        let theirs = log.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connect = tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.expect("connect");
            let connector = tokio_rustls::TlsConnector::from(client);
            let name = ServerName::try_from("localhost").expect("a name");
            let io: BoxedIo = match holdfast_serves {
                true => Box::new(
                    connector
                        .connect(name, tcp)
                        .await
                        .expect("client handshake"),
                ),
                false => Box::new(
                    connector
                        .connect(name, Tracked::with_secrets(Box::new(tcp), theirs))
                        .await
                        .expect("client handshake"),
                ),
            };
            io
        });
        let (tcp, _) = listener.accept().await.expect("accept");
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let served: BoxedIo = match holdfast_serves {
            true => Box::new(
                acceptor
                    .accept(Tracked::with_secrets(
                        Box::new(Prefixed::new(BytesMut::new(), Box::new(tcp))),
                        log,
                    ))
                    .await
                    .expect("server handshake"),
            ),
            false => Box::new(acceptor.accept(tcp).await.expect("server handshake")),
        };
        let connected = connect.await.expect("the client task");
        match holdfast_serves {
            true => (served, connected),
            false => (connected, served),
        }
    }

    async fn hand_over(stream: BoxedIo) -> (BoxedIo, Vec<u8>) {
        assert!(can_take(stream.as_ref()));
        let (tcp, state, plaintext) = take_tls(stream).expect("the TLS state");
        // As the hand-over channel carries it.
        let json = serde_json::to_vec(&state).expect("serialised");
        drop(state);
        let state: TlsState = serde_json::from_slice(&json).expect("deserialised");
        let resumed = ResumedTls::new(tcp, state).expect("resumed");
        (Box::new(resumed), plaintext)
    }

    /// As a parked idle connection does (`parking.rs` in holdfast-proxy): the state
    /// taken, kept dormant, and woken. A TLS 1.3 one keeps its secrets and not its keys.
    async fn park_and_wake(stream: BoxedIo, tls13: bool) -> (BoxedIo, Vec<u8>) {
        assert!(can_take(stream.as_ref()));
        let (tcp, state, plaintext) = take_tls(stream).expect("the TLS state");
        let dormant = state.into_dormant();
        for d in [&dormant.tx, &dormant.rx] {
            assert_eq!(
                matches!(d, Dormant::Secret { .. }),
                tls13,
                "TLS 1.3: {tls13}"
            );
        }
        let resumed = ResumedTls::new(tcp, dormant.wake().expect("woken")).expect("resumed");
        (Box::new(resumed), plaintext)
    }

    /// The peer (plain rustls) updates its keys and asks this side to (TLS 1.3
    /// KeyUpdate), with its next write.
    fn update_keys(peer: BoxedIo) -> BoxedIo {
        let any = peer.into_any();
        match any.downcast::<tokio_rustls::client::TlsStream<TcpStream>>() {
            Ok(mut s) => {
                s.get_mut().1.refresh_traffic_keys().expect("a key update");
                s
            }
            Err(any) => {
                let mut s = any
                    .downcast::<tokio_rustls::server::TlsStream<TcpStream>>()
                    .expect("a rustls stream");
                s.get_mut().1.refresh_traffic_keys().expect("a key update");
                s
            }
        }
    }

    /// A key update from the peer, then data both ways (with each side's next keys).
    async fn keys_updated(ours: &mut BoxedIo, peer: BoxedIo, round: u8) -> BoxedIo {
        let mut peer = update_keys(peer);
        let sent = [b'k', round, 1, 2, 3];
        peer.write_all(&sent).await.expect("write");
        peer.flush().await.expect("flush");
        assert_eq!(read_n(ours, Vec::new(), 5).await, sent);
        let answer = [b'a', round, 3, 2, 1];
        ours.write_all(&answer).await.expect("write");
        ours.flush().await.expect("flush");
        let mut buf = [0u8; 5];
        peer.read_exact(&mut buf).await.expect("read");
        assert_eq!(buf, answer);
        peer
    }

    async fn read_n(io: &mut BoxedIo, mut already: Vec<u8>, n: usize) -> Vec<u8> {
        let have = already.len().min(n);
        let mut rest = vec![0u8; n - have];
        io.read_exact(&mut rest).await.expect("read");
        already.truncate(have);
        already.extend_from_slice(&rest);
        already
    }

    async fn exchange(suite: rustls::SupportedCipherSuite, holdfast_serves: bool) {
        let (mut ours, mut peer) = pair(suite, holdfast_serves).await;
        let tls13 = matches!(suite, rustls::SupportedCipherSuite::Tls13(_));
        if tls13 {
            // Keys updated while rustls still runs holdfast's side: the state taken is of
            // the second generation, found from the first secret.
            peer = keys_updated(&mut ours, peer, 0).await;
        }
        peer.write_all(b"hello 1").await.expect("write");
        peer.flush().await.expect("flush");
        let got = read_n(&mut ours, Vec::new(), 7).await;
        assert_eq!(got, b"hello 1");
        ours.write_all(b"answer 1").await.expect("write");
        ours.flush().await.expect("flush");
        let mut buf = [0u8; 8];
        peer.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"answer 1");
        // Part of a message read, the rest decrypted inside rustls and not read: it goes
        // with the state.
        peer.write_all(b"hello 2, a longer one")
            .await
            .expect("write");
        peer.flush().await.expect("flush");
        let mut three = [0u8; 3];
        ours.read_exact(&mut three).await.expect("read");
        assert_eq!(&three, b"hel");
        let (mut ours, unread) = hand_over(ours).await;
        let got = read_n(&mut ours, unread, 18).await;
        assert_eq!(got, b"lo 2, a longer one");
        if tls13 {
            // Twice: each generation's secret is derived from the one before.
            peer = keys_updated(&mut ours, peer, 1).await;
            peer = keys_updated(&mut ours, peer, 2).await;
        }
        // Several records each way.
        let big: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        ours.write_all(&big).await.expect("write");
        ours.flush().await.expect("flush");
        let mut back = vec![0u8; big.len()];
        peer.read_exact(&mut back).await.expect("read");
        assert_eq!(back, big);
        peer.write_all(&big).await.expect("write");
        peer.flush().await.expect("flush");
        let got = read_n(&mut ours, Vec::new(), big.len()).await;
        assert_eq!(got, big);
        // A second hand-over, from the record layer itself, with data in flight.
        peer.write_all(b"in flight").await.expect("write");
        peer.flush().await.expect("flush");
        let (mut ours, unread) = hand_over(ours).await;
        let got = read_n(&mut ours, unread, 9).await;
        assert_eq!(got, b"in flight");
        if tls13 {
            // The secrets went with the state.
            peer = keys_updated(&mut ours, peer, 3).await;
        }
        // Parked and woken, with data in flight; in TLS 1.3 the keys derived again from
        // the secrets (a generation after the first) carry on, key updates included.
        peer.write_all(b"parked").await.expect("write");
        peer.flush().await.expect("flush");
        let (mut ours, unread) = park_and_wake(ours, tls13).await;
        let got = read_n(&mut ours, unread, 6).await;
        assert_eq!(got, b"parked");
        if tls13 {
            peer = keys_updated(&mut ours, peer, 4).await;
        }
        ours.write_all(b"still here").await.expect("write");
        ours.flush().await.expect("flush");
        let mut buf = [0u8; 10];
        peer.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"still here");
        // The peer's close_notify ends the stream cleanly; ours reaches the peer.
        peer.shutdown().await.expect("shutdown");
        let mut rest = Vec::new();
        ours.read_to_end(&mut rest).await.expect("a clean end");
        assert!(rest.is_empty());
        ours.shutdown().await.expect("shutdown");
        let mut rest = Vec::new();
        let _ = peer.read_to_end(&mut rest).await;
        assert!(rest.is_empty());
    }

    /// What a parked idle TLS connection holds (issue 22: memory per idle session).
    #[test]
    fn a_dormant_state_is_smaller_than_the_state() {
        let (dormant, state) = (size_of::<DormantTls>(), size_of::<TlsState>());
        assert!(dormant <= 144, "{dormant} bytes");
        assert!(dormant * 3 / 2 <= state, "{dormant} and {state} bytes");
    }

    #[tokio::test]
    async fn a_session_goes_on_after_its_keys_are_taken_for_each_cipher_and_version() {
        use rustls::crypto::ring::cipher_suite::*;
        for suite in [
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
            TLS13_CHACHA20_POLY1305_SHA256,
            TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ] {
            for holdfast_serves in [true, false] {
                exchange(suite, holdfast_serves).await;
            }
        }
    }

    /// After a login, a connection leaves rustls for holdfast's own record layer
    /// (`PacketConn::leave_rustls`): what the peer sent before (buffered by holdfast, or
    /// decrypted inside rustls, or still in the socket) is read after it, and the
    /// connection goes on both ways, a TLS 1.3 key update included.
    #[tokio::test]
    async fn a_connection_leaves_rustls_after_its_login_and_goes_on() {
        use crate::conn::PacketConn;
        use rustls::crypto::ring::cipher_suite::*;
        for suite in [
            TLS13_AES_128_GCM_SHA256,
            TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ] {
            for holdfast_serves in [true, false] {
                let (ours, mut peer) = pair(suite, holdfast_serves).await;
                let mut ours = PacketConn::new(ours);
                assert!(ours.on_rustls());
                // Three packets before it leaves: the first read, the second buffered or
                // decrypted and unread, the third sent after the first was read.
                let packets: Vec<Vec<u8>> = (0..3u8)
                    .map(|i| holdfast_wire::frame::packet(&[i; 300], i))
                    .collect();
                peer.write_all(&[&packets[0][..], &packets[1][..]].concat())
                    .await
                    .expect("write");
                peer.flush().await.expect("flush");
                let first = ours.read_packet(1 << 20).await.expect("the first packet");
                assert_eq!((&first.payload[..], first.seq), (&[0u8; 300][..], 0));
                peer.write_all(&packets[2]).await.expect("write");
                peer.flush().await.expect("flush");
                ours.leave_rustls().expect("left rustls");
                assert!(!ours.on_rustls(), "on holdfast's record layer now");
                for i in 1..3u8 {
                    let p = ours
                        .read_packet(1 << 20)
                        .await
                        .expect("a packet sent before");
                    assert_eq!((&p.payload[..], p.seq), (&[i; 300][..], i));
                }
                // Leaving again changes nothing.
                ours.leave_rustls().expect("still fine");
                let big: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
                ours.write_packet(&big, 3).await.expect("write");
                let mut back = vec![0u8; big.len() + 4];
                peer.read_exact(&mut back).await.expect("read");
                assert_eq!(&back[4..], &big[..]);
                if matches!(suite, rustls::SupportedCipherSuite::Tls13(_)) {
                    let (mut io, unread) = ours.take_stream();
                    assert!(unread.is_empty());
                    peer = keys_updated(&mut io, peer, 0).await;
                    ours.replace_stream(io);
                }
                peer.write_all(&holdfast_wire::frame::packet(&big, 4))
                    .await
                    .expect("write");
                peer.flush().await.expect("flush");
                let p = ours.read_packet(1 << 20).await.expect("the big packet");
                assert_eq!((&p.payload[..], p.seq), (&big[..], 4));
            }
        }
    }

    /// At its keys' confidentiality limit, holdfast's record layer moves to the next keys
    /// in TLS 1.3 (the peer follows the KeyUpdate and reads on), and ends a TLS 1.2
    /// connection with close_notify, as rustls does (the limit is lowered here: 2^23 records
    /// are too many for a test).
    #[tokio::test]
    async fn keys_at_their_confidentiality_limit_are_updated_or_the_connection_ends() {
        use rustls::crypto::ring::cipher_suite::*;
        for suite in [
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
            TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ] {
            let tls13 = matches!(suite, rustls::SupportedCipherSuite::Tls13(_));
            for holdfast_serves in [true, false] {
                let (ours, mut peer) = pair(suite, holdfast_serves).await;
                let (ours, _) = hand_over(ours).await;
                let mut ours = ours
                    .into_any()
                    .downcast::<ResumedTls>()
                    .expect("holdfast's record layer");
                ours.tx_limit = ours.tx.seq + 3;
                let key = ours.tx.key.to_vec();
                let mut ended = false;
                for i in 0..10u8 {
                    let sent = [b'r', i];
                    match ours.write_all(&sent).await {
                        Ok(()) => {}
                        Err(e) => {
                            assert!(!tls13, "{suite:?}: {e}");
                            assert_eq!(i, 3, "{suite:?}: the record past the limit fails");
                            let mut rest = Vec::new();
                            let _ = peer.read_to_end(&mut rest).await;
                            assert!(rest.is_empty(), "{suite:?}: close_notify, no data");
                            ended = true;
                            break;
                        }
                    }
                    ours.flush().await.expect("flush");
                    let mut got = [0u8; 2];
                    peer.read_exact(&mut got).await.expect("the peer reads on");
                    assert_eq!(got, sent, "{suite:?}");
                }
                assert_eq!(ended, !tls13, "{suite:?}: only TLS 1.2 ends at the limit");
                if tls13 {
                    assert_ne!(&ours.tx.key[..], &key[..], "{suite:?}: the keys moved on");
                }
            }
        }
    }

    #[test]
    fn the_tracker_follows_record_boundaries() {
        let (a, _) = tokio::io::duplex(1);
        let mut t = Tracked::new(Box::new(a));
        assert!(t.between_records());
        // A whole record, then part of the next header.
        t.observe(&[23, 3, 3, 0, 2, 9, 9, 23, 3]);
        assert!(!t.between_records());
        // The rest of the header and 2 of 4 body bytes.
        t.observe(&[3, 0, 4, 1, 2]);
        assert!(!t.between_records());
        t.observe(&[3, 4]);
        assert!(t.between_records());
        // Records split anywhere, several in one read.
        t.observe(&[21, 3, 3, 0, 2, 1, 0, 23, 3, 3, 0, 1, 7, 23]);
        assert!(!t.between_records());
        t.observe(&[3, 3, 0, 0]);
        assert!(t.between_records());
    }
}
