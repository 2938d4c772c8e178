//! Connection phase: the server greeting, the client's login, auth switches, COM_CHANGE_USER.

use crate::caps::*;
use crate::codec::{put_lenenc_bytes, Reader};
use crate::error::{Result, WireError};
use crate::interned::Interner;
use std::sync::{Arc, LazyLock};

/// The server's initial greeting (protocol version 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    pub server_version: Vec<u8>,
    pub connection_id: u32,
    /// Auth plugin data: 20 bytes for mysql_native_password.
    pub scramble: Vec<u8>,
    pub capabilities: u32,
    pub charset: u8,
    pub status: u16,
    pub auth_plugin: Vec<u8>,
    /// MariaDB's extended capabilities (`caps::MARIADB_CLIENT_*`); sent only when
    /// `capabilities` lacks CLIENT_LONG_PASSWORD, as MariaDB does.
    pub mariadb_caps: u32,
}

impl Greeting {
    pub fn parse(payload: &[u8]) -> Result<Self> {
        let mut r = Reader::new(payload);
        let proto = r.u8("protocol version")?;
        if proto == 0xff {
            return Err(WireError::Unexpected(
                proto,
                "greeting (server sent an error)",
            ));
        }
        if proto != 10 {
            return Err(WireError::Malformed("unsupported protocol version"));
        }
        let server_version = r.null_terminated("server version")?.to_vec();
        let connection_id = r.u32("connection id")?;
        let mut scramble = r.take(8, "scramble part 1")?.to_vec();
        r.skip(1, "filler")?;
        let mut capabilities = u32::from(r.u16("capabilities")?);
        let mut charset = 0;
        let mut status = 0;
        let mut auth_plugin = Vec::new();
        let mut mariadb_caps = 0;
        if !r.is_empty() {
            charset = r.u8("charset")?;
            status = r.u16("status")?;
            capabilities |= u32::from(r.u16("capabilities upper")?) << 16;
            let data_len = r.u8("auth data length")?;
            r.skip(6, "reserved")?;
            let ext = r.u32("MariaDB capabilities")?;
            if capabilities & CLIENT_LONG_PASSWORD == 0 {
                mariadb_caps = ext;
            }
            if capabilities & CLIENT_SECURE_CONNECTION != 0 {
                let n = usize::from(data_len).saturating_sub(8).max(13);
                let part2 = r.take(n.min(r.remaining()), "scramble part 2")?;
                let part2 = part2.strip_suffix(&[0]).unwrap_or(part2);
                scramble.extend_from_slice(part2);
            }
            if capabilities & CLIENT_PLUGIN_AUTH != 0 && !r.is_empty() {
                let rest = r.rest();
                auth_plugin = rest.strip_suffix(&[0]).unwrap_or(rest).to_vec();
            }
        }
        Ok(Greeting {
            server_version,
            connection_id,
            scramble,
            capabilities,
            charset,
            status,
            auth_plugin,
            mariadb_caps,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        out.push(10);
        out.extend_from_slice(&self.server_version);
        out.push(0);
        out.extend_from_slice(&self.connection_id.to_le_bytes());
        let (part1, part2) = self.scramble.split_at(self.scramble.len().min(8));
        out.extend_from_slice(part1);
        out.push(0);
        out.extend_from_slice(&(self.capabilities as u16).to_le_bytes());
        out.push(self.charset);
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&((self.capabilities >> 16) as u16).to_le_bytes());
        out.push((self.scramble.len() + 1) as u8);
        out.extend_from_slice(&[0; 6]);
        let ext = if self.capabilities & CLIENT_LONG_PASSWORD == 0 {
            self.mariadb_caps
        } else {
            0
        };
        out.extend_from_slice(&ext.to_le_bytes());
        out.extend_from_slice(part2);
        out.push(0);
        out.extend_from_slice(&self.auth_plugin);
        out.push(0);
        out
    }
}

/// A server's greeting as a connection keeps it once logged in (issue 22: memory per idle
/// session). The server version and the auth plugin's name are the same for every
/// connection to a server, so connections share them ([`shared_texts`]); the scramble is
/// the connection's own (a COM_CHANGE_USER answers it) and is kept inline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptGreeting {
    /// The server version, then the auth plugin's name; then, for a scramble longer than
    /// 20 bytes, the scramble (and the texts are the connection's own).
    texts: Arc<[u8]>,
    version_end: u16,
    plugin_end: u16,
    /// A scramble of up to 20 bytes (MySQL's and MariaDB's are 20)...
    scramble: [u8; SCRAMBLE_LEN],
    /// ...and its length (`LONG_SCRAMBLE`: a longer one, in `texts`).
    scramble_len: u8,
    pub connection_id: u32,
    pub capabilities: u32,
    pub charset: u8,
    pub status: u16,
    pub mariadb_caps: u32,
}

/// The length of MySQL's and MariaDB's scramble, which a [`KeptGreeting`] keeps inline.
const SCRAMBLE_LEN: usize = 20;
const LONG_SCRAMBLE: u8 = u8::MAX;

/// How long a kept server version or plugin name is at most (so that their ends fit in
/// 16 bits): servers send a few dozen bytes; a longer one is cut.
const MAX_KEPT_TEXT: usize = 4096;

/// `texts` as an allocation shared with every live greeting that had the same (taken on a
/// login, never per request).
fn shared_texts(texts: &[u8]) -> Arc<[u8]> {
    static SHARED: LazyLock<Interner<[u8]>> = LazyLock::new(Interner::default);
    SHARED.get(texts)
}

impl KeptGreeting {
    pub fn server_version(&self) -> &[u8] {
        self.texts
            .get(..usize::from(self.version_end))
            .unwrap_or_default()
    }

    /// Auth plugin data: 20 bytes for mysql_native_password.
    pub fn scramble(&self) -> &[u8] {
        if self.scramble_len == LONG_SCRAMBLE {
            self.texts
                .get(usize::from(self.plugin_end)..)
                .unwrap_or_default()
        } else {
            self.scramble
                .get(..usize::from(self.scramble_len))
                .unwrap_or_default()
        }
    }

    pub fn auth_plugin(&self) -> &[u8] {
        self.texts
            .get(usize::from(self.version_end)..usize::from(self.plugin_end))
            .unwrap_or_default()
    }

    /// The greeting whole again (e.g. to encode it).
    pub fn to_greeting(&self) -> Greeting {
        Greeting {
            server_version: self.server_version().to_vec(),
            connection_id: self.connection_id,
            scramble: self.scramble().to_vec(),
            capabilities: self.capabilities,
            charset: self.charset,
            status: self.status,
            auth_plugin: self.auth_plugin().to_vec(),
            mariadb_caps: self.mariadb_caps,
        }
    }
}

impl From<Greeting> for KeptGreeting {
    fn from(g: Greeting) -> Self {
        let cut = |text: &[u8]| text.len().min(MAX_KEPT_TEXT);
        let version = g
            .server_version
            .get(..cut(&g.server_version))
            .unwrap_or_default();
        let plugin = g.auth_plugin.get(..cut(&g.auth_plugin)).unwrap_or_default();
        // (Both at most MAX_KEPT_TEXT: the ends fit.)
        let version_end = version.len() as u16;
        let plugin_end = (version.len() + plugin.len()) as u16;
        let mut scramble = [0; SCRAMBLE_LEN];
        let (texts, scramble_len) = match scramble.get_mut(..g.scramble.len()) {
            Some(inline) => {
                inline.copy_from_slice(&g.scramble);
                // (At most 20: it fit.)
                let len = g.scramble.len() as u8;
                (shared_texts(&[version, plugin].concat()), len)
            }
            None => (
                Arc::from([version, plugin, &g.scramble].concat()),
                LONG_SCRAMBLE,
            ),
        };
        KeptGreeting {
            texts,
            version_end,
            plugin_end,
            scramble,
            scramble_len,
            connection_id: g.connection_id,
            capabilities: g.capabilities,
            charset: g.charset,
            status: g.status,
            mariadb_caps: g.mariadb_caps,
        }
    }
}

/// The client's HandshakeResponse41, or the short SSLRequest that precedes a TLS handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRequest {
    pub capabilities: u32,
    pub max_packet: u32,
    pub charset: u8,
    pub user: Vec<u8>,
    pub auth_response: Vec<u8>,
    pub database: Option<Vec<u8>>,
    pub auth_plugin: Vec<u8>,
    /// Raw connection attributes block (without its length prefix).
    pub attributes: Vec<u8>,
    /// MariaDB's extended capabilities, in the last 4 filler bytes (sent, and read, only
    /// when `capabilities` lacks CLIENT_LONG_PASSWORD).
    pub mariadb_caps: u32,
}

/// What the first client packet turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHello {
    Login(LoginRequest),
    SslRequest { capabilities: u32 },
}

impl ClientHello {
    pub fn parse(payload: &[u8]) -> Result<Self> {
        let mut r = Reader::new(payload);
        let capabilities = r.u32("client capabilities")?;
        if capabilities & CLIENT_PROTOCOL_41 == 0 {
            return Err(WireError::Malformed(
                "pre-4.1 client protocol is not supported",
            ));
        }
        let max_packet = r.u32("max packet size")?;
        let charset = r.u8("charset")?;
        r.skip(19, "filler")?;
        let ext = r.u32("MariaDB capabilities")?;
        let mariadb_caps = if capabilities & CLIENT_LONG_PASSWORD == 0 {
            ext
        } else {
            0
        };
        if r.is_empty() && capabilities & CLIENT_SSL != 0 {
            return Ok(ClientHello::SslRequest { capabilities });
        }
        let user = r.null_terminated("user name")?.to_vec();
        let auth_response = if capabilities & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA != 0 {
            r.lenenc_bytes("auth response")?.to_vec()
        } else if capabilities & CLIENT_SECURE_CONNECTION != 0 {
            let n = r.u8("auth response length")?;
            r.take(usize::from(n), "auth response")?.to_vec()
        } else {
            r.null_terminated("auth response")?.to_vec()
        };
        let mut database = None;
        if capabilities & CLIENT_CONNECT_WITH_DB != 0 && !r.is_empty() {
            database = Some(r.null_terminated("database")?.to_vec());
        }
        let mut auth_plugin = Vec::new();
        if capabilities & CLIENT_PLUGIN_AUTH != 0 && !r.is_empty() {
            auth_plugin = r.null_terminated("auth plugin")?.to_vec();
        }
        let mut attributes = Vec::new();
        if capabilities & CLIENT_CONNECT_ATTRS != 0 && !r.is_empty() {
            attributes = r.lenenc_bytes("connection attributes")?.to_vec();
        }
        Ok(ClientHello::Login(LoginRequest {
            capabilities,
            max_packet,
            charset,
            user,
            auth_response,
            database,
            auth_plugin,
            attributes,
            mariadb_caps,
        }))
    }
}

impl LoginRequest {
    /// Encodes a HandshakeResponse41. Always uses the lenenc auth-data form, so
    /// `capabilities` must include CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA.
    pub fn encode(&self) -> Vec<u8> {
        let mut caps = self.capabilities | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA;
        if self.database.is_some() {
            caps |= CLIENT_CONNECT_WITH_DB;
        } else {
            caps &= !CLIENT_CONNECT_WITH_DB;
        }
        if self.attributes.is_empty() {
            caps &= !CLIENT_CONNECT_ATTRS;
        }
        if self.mariadb_caps != 0 {
            caps &= !CLIENT_LONG_PASSWORD;
        }
        let mut out = Vec::with_capacity(64 + self.user.len() + self.attributes.len());
        out.extend_from_slice(&caps.to_le_bytes());
        out.extend_from_slice(&self.max_packet.to_le_bytes());
        out.push(self.charset);
        out.extend_from_slice(&[0; 19]);
        out.extend_from_slice(&self.mariadb_caps.to_le_bytes());
        out.extend_from_slice(&self.user);
        out.push(0);
        put_lenenc_bytes(&mut out, &self.auth_response);
        if let Some(db) = &self.database {
            out.extend_from_slice(db);
            out.push(0);
        }
        if caps & CLIENT_PLUGIN_AUTH != 0 {
            out.extend_from_slice(&self.auth_plugin);
            out.push(0);
        }
        if caps & CLIENT_CONNECT_ATTRS != 0 {
            put_lenenc_bytes(&mut out, &self.attributes);
        }
        out
    }
}

/// An SSLRequest: the first 32 bytes of a HandshakeResponse41 with CLIENT_SSL set, after
/// which the client starts TLS and sends its whole login request (sequence id 2) inside it.
pub fn ssl_request(capabilities: u32, max_packet: u32, charset: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&(capabilities | CLIENT_SSL).to_le_bytes());
    out.extend_from_slice(&max_packet.to_le_bytes());
    out.push(charset);
    out.extend_from_slice(&[0; 23]);
    out
}

impl LoginRequest {
    /// The SSLRequest that goes before this login request when it is sent inside TLS
    /// (its capabilities must include CLIENT_SSL): the same first 32 bytes, so that the
    /// server sees the same capabilities in both.
    pub fn ssl_request(&self) -> Vec<u8> {
        let mut out = self.encode();
        out.truncate(32);
        out
    }
}

/// Connection attributes as key/value pairs (lossy UTF-8), for status pages and logs.
pub fn parse_attributes(block: &[u8]) -> Vec<(String, String)> {
    let mut r = Reader::new(block);
    let mut out = Vec::new();
    while !r.is_empty() {
        let (Ok(k), Ok(v)) = (r.lenenc_bytes("attr key"), r.lenenc_bytes("attr value")) else {
            break;
        };
        out.push((
            String::from_utf8_lossy(k).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    }
    out
}

/// AuthSwitchRequest (0xfe): the server asks for another plugin's answer to `data`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSwitch {
    pub plugin: Vec<u8>,
    pub data: Vec<u8>,
}

impl AuthSwitch {
    pub fn parse(payload: &[u8]) -> Result<Self> {
        let mut r = Reader::new(payload);
        let header = r.u8("auth switch header")?;
        if header != 0xfe {
            return Err(WireError::Unexpected(header, "auth switch request"));
        }
        if r.is_empty() {
            // Old servers: switch to mysql_old_password with the original scramble.
            return Ok(AuthSwitch {
                plugin: b"mysql_old_password".to_vec(),
                data: Vec::new(),
            });
        }
        let plugin = r.null_terminated("auth plugin")?.to_vec();
        let rest = r.rest();
        let data = rest.strip_suffix(&[0]).unwrap_or(rest).to_vec();
        Ok(AuthSwitch { plugin, data })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + self.plugin.len() + self.data.len() + 1);
        out.push(0xfe);
        out.extend_from_slice(&self.plugin);
        out.push(0);
        out.extend_from_slice(&self.data);
        out.push(0);
        out
    }
}

/// COM_CHANGE_USER as sent by a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeUser {
    pub user: Vec<u8>,
    pub auth_response: Vec<u8>,
    pub database: Vec<u8>,
    pub charset: Option<u16>,
    pub auth_plugin: Vec<u8>,
    pub attributes: Vec<u8>,
}

impl ChangeUser {
    /// Parses the payload (command byte included) under the client's capabilities.
    pub fn parse(payload: &[u8], capabilities: u32) -> Result<Self> {
        let mut r = Reader::new(payload);
        r.skip(1, "command")?;
        let user = r.null_terminated("user")?.to_vec();
        let auth_response = if capabilities & CLIENT_SECURE_CONNECTION != 0 {
            let n = r.u8("auth length")?;
            r.take(usize::from(n), "auth response")?.to_vec()
        } else {
            r.null_terminated("auth response")?.to_vec()
        };
        let database = if r.is_empty() {
            Vec::new()
        } else {
            r.null_terminated("database")?.to_vec()
        };
        let mut charset = None;
        if r.remaining() >= 2 {
            charset = Some(r.u16("charset")?);
        }
        let mut auth_plugin = Vec::new();
        if capabilities & CLIENT_PLUGIN_AUTH != 0 && !r.is_empty() {
            auth_plugin = r.null_terminated("auth plugin")?.to_vec();
        }
        let mut attributes = Vec::new();
        if capabilities & CLIENT_CONNECT_ATTRS != 0 && !r.is_empty() {
            attributes = r.lenenc_bytes("attributes")?.to_vec();
        }
        Ok(ChangeUser {
            user,
            auth_response,
            database,
            charset,
            auth_plugin,
            attributes,
        })
    }

    /// Encodes for a backend connection with `capabilities` (SECURE_CONNECTION and
    /// PLUGIN_AUTH are always on there).
    pub fn encode(&self, capabilities: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.user.len());
        out.push(crate::command::COM_CHANGE_USER);
        out.extend_from_slice(&self.user);
        out.push(0);
        out.push(self.auth_response.len().min(255) as u8);
        out.extend_from_slice(&self.auth_response[..self.auth_response.len().min(255)]);
        out.extend_from_slice(&self.database);
        out.push(0);
        out.extend_from_slice(&self.charset.unwrap_or(33).to_le_bytes());
        out.extend_from_slice(&self.auth_plugin);
        out.push(0);
        if capabilities & CLIENT_CONNECT_ATTRS != 0 {
            put_lenenc_bytes(&mut out, &self.attributes);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A MariaDB-like greeting with every field set.
    fn a_greeting() -> Greeting {
        Greeting {
            server_version: b"5.5.5-10.11.6-MariaDB-holdfast".to_vec(),
            connection_id: 42,
            scramble: b"abcdefghijklmnopqrst".to_vec(),
            capabilities: PROXY_CAPABILITIES,
            charset: 45,
            status: SERVER_STATUS_AUTOCOMMIT,
            auth_plugin: b"mysql_native_password".to_vec(),
            mariadb_caps: 0,
        }
    }

    #[test]
    fn greeting_round_trip() {
        let g = a_greeting();
        assert_eq!(Greeting::parse(&g.encode()).unwrap(), g);
        // MariaDB's form: CLIENT_LONG_PASSWORD clear, extended capabilities in the last
        // 4 reserved bytes.
        let mariadb = Greeting {
            capabilities: PROXY_CAPABILITIES & !CLIENT_LONG_PASSWORD,
            mariadb_caps: PROXY_MARIADB_CAPABILITIES,
            ..g.clone()
        };
        let encoded = mariadb.encode();
        assert_eq!(Greeting::parse(&encoded).unwrap(), mariadb);
        // With CLIENT_LONG_PASSWORD set those bytes are filler, whatever they hold.
        let mut mysql = encoded.clone();
        let caps_at = 1 + g.server_version.len() + 1 + 4 + 8 + 1;
        mysql[caps_at] |= CLIENT_LONG_PASSWORD as u8;
        assert_eq!(Greeting::parse(&mysql).unwrap().mariadb_caps, 0);
    }

    #[test]
    fn a_kept_greeting_gives_back_each_string() {
        let g = Greeting {
            mariadb_caps: PROXY_MARIADB_CAPABILITIES,
            ..a_greeting()
        };
        let kept = KeptGreeting::from(g.clone());
        assert_eq!(kept.server_version(), &g.server_version[..]);
        assert_eq!(kept.scramble(), &g.scramble[..]);
        assert_eq!(kept.auth_plugin(), &g.auth_plugin[..]);
        assert_eq!(kept.to_greeting(), g);
        // Empty strings (a server without plugin auth) stay empty.
        let bare = Greeting {
            auth_plugin: Vec::new(),
            scramble: Vec::new(),
            ..g
        };
        assert_eq!(KeptGreeting::from(bare.clone()).to_greeting(), bare);
        // A scramble longer than MySQL's 20 bytes is kept whole, a shorter one as it is.
        for len in [40, 21, 8] {
            let other = Greeting {
                scramble: (0..len).collect(),
                ..a_greeting()
            };
            assert_eq!(KeptGreeting::from(other.clone()).to_greeting(), other);
        }
        // A server version past what is kept is cut, not wrapped around.
        let long_version = Greeting {
            server_version: vec![b'9'; 70_000],
            ..a_greeting()
        };
        let kept = KeptGreeting::from(long_version);
        assert_eq!(kept.server_version(), &[b'9'; MAX_KEPT_TEXT][..]);
        assert_eq!(kept.auth_plugin(), b"mysql_native_password");
        assert_eq!(kept.scramble(), b"abcdefghijklmnopqrst");
    }

    #[test]
    fn connections_to_one_server_share_its_greetings_texts() {
        let first = KeptGreeting::from(a_greeting());
        let second = KeptGreeting::from(Greeting {
            connection_id: 43,
            scramble: b"tsrqponmlkjihgfedcba".to_vec(),
            ..a_greeting()
        });
        assert!(Arc::ptr_eq(&first.texts, &second.texts));
        assert_eq!(second.scramble(), b"tsrqponmlkjihgfedcba");
        assert_eq!(first.scramble(), b"abcdefghijklmnopqrst");
        // Another server's version is its own.
        let other = KeptGreeting::from(Greeting {
            server_version: b"8.0.36".to_vec(),
            ..a_greeting()
        });
        assert!(!Arc::ptr_eq(&first.texts, &other.texts));
        assert_eq!(other.server_version(), b"8.0.36");
        assert_eq!(other.auth_plugin(), b"mysql_native_password");
        // What a logged-in connection holds of it beside the shared texts (issue 22).
        assert!(std::mem::size_of::<KeptGreeting>() <= 56);
    }

    #[test]
    fn login_round_trip() {
        let l = LoginRequest {
            capabilities: PROXY_CAPABILITIES,
            max_packet: 1 << 24,
            charset: 45,
            user: b"app".to_vec(),
            auth_response: vec![1; 20],
            database: Some(b"sbtest".to_vec()),
            auth_plugin: b"mysql_native_password".to_vec(),
            attributes: vec![3, b'a', b'b', b'c', 1, b'x'],
            mariadb_caps: 0,
        };
        assert_eq!(
            ClientHello::parse(&l.encode()).unwrap(),
            ClientHello::Login(l.clone())
        );
        let mariadb = LoginRequest {
            capabilities: PROXY_CAPABILITIES & !CLIENT_LONG_PASSWORD,
            mariadb_caps: MARIADB_CLIENT_EXTENDED_TYPE_INFO,
            ..l.clone()
        };
        assert_eq!(
            ClientHello::parse(&mariadb.encode()).unwrap(),
            ClientHello::Login(mariadb.clone())
        );
        assert_eq!(
            parse_attributes(&l.attributes),
            vec![("abc".into(), "x".into())]
        );
    }

    #[test]
    fn ssl_request_detected() {
        let mut p = (CLIENT_PROTOCOL_41 | CLIENT_SSL).to_le_bytes().to_vec();
        p.extend_from_slice(&[0; 28]);
        assert!(matches!(
            ClientHello::parse(&p),
            Ok(ClientHello::SslRequest { .. })
        ));
        let login = LoginRequest {
            capabilities: CLIENT_PROTOCOL_41 | CLIENT_SSL | CLIENT_CONNECT_WITH_DB,
            max_packet: 1 << 24,
            charset: 45,
            user: b"app".to_vec(),
            auth_response: vec![1; 20],
            database: None,
            auth_plugin: Vec::new(),
            attributes: Vec::new(),
            mariadb_caps: 0,
        };
        // No database: CONNECT_WITH_DB is off in both packets.
        let encoded = login.encode();
        assert_eq!(login.ssl_request(), encoded[..32]);
        assert_eq!(
            ClientHello::parse(&login.ssl_request()).unwrap(),
            ClientHello::SslRequest {
                capabilities: (CLIENT_PROTOCOL_41
                    | CLIENT_SSL
                    | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA)
            }
        );
        let caps = CLIENT_PROTOCOL_41 | CLIENT_PLUGIN_AUTH;
        assert_eq!(
            ClientHello::parse(&ssl_request(caps, 1 << 24, 45)).unwrap(),
            ClientHello::SslRequest {
                capabilities: caps | CLIENT_SSL
            }
        );
    }

    #[test]
    fn change_user_round_trip() {
        let c = ChangeUser {
            user: b"app".to_vec(),
            auth_response: vec![5; 20],
            database: b"db".to_vec(),
            charset: Some(45),
            auth_plugin: b"mysql_native_password".to_vec(),
            attributes: Vec::new(),
        };
        let caps = CLIENT_SECURE_CONNECTION | CLIENT_PLUGIN_AUTH | CLIENT_PROTOCOL_41;
        assert_eq!(ChangeUser::parse(&c.encode(caps), caps).unwrap(), c);
    }
}
