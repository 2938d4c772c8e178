//! The PROXY protocol (HAProxy's specification). Outbound, version 2 (section 2.2): sent
//! first on a backend connection so that the server sees the client's address, not
//! holdfast's. MariaDB accepts it from the networks in `proxy_protocol_networks`, before or
//! with the client's first packet; a connection from there without a header stays a plain
//! one. Inbound, versions 1 and 2 ([`parse_header`]): what a load balancer in front of
//! holdfast sends first, read from trusted addresses only.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The 12-byte signature every v2 header starts with.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// Version 2, command PROXY (the connection was relayed for a client).
const VERSION2_PROXY: u8 = 0x21;
/// Address families with transport STREAM (TCP).
const TCP_OVER_IPV4: u8 = 0x11;
const TCP_OVER_IPV6: u8 = 0x21;

/// The header for a connection relayed for `client` to `server`. Both addresses go in
/// the same family: IPv4 when both are IPv4, else IPv6 (an IPv4 one as `::ffff:a.b.c.d`).
pub fn v2_header(client: SocketAddr, server: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 36);
    out.extend_from_slice(&SIGNATURE);
    out.push(VERSION2_PROXY);
    match (client.ip(), server.ip()) {
        (IpAddr::V4(c), IpAddr::V4(s)) => {
            out.push(TCP_OVER_IPV4);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&c.octets());
            out.extend_from_slice(&s.octets());
        }
        (c, s) => {
            out.push(TCP_OVER_IPV6);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&as_v6(c).octets());
            out.extend_from_slice(&as_v6(s).octets());
        }
    }
    out.extend_from_slice(&client.port().to_be_bytes());
    out.extend_from_slice(&server.port().to_be_bytes());
    out
}

/// The start of every version 1 header.
const V1_PREFIX: &[u8] = b"PROXY ";
/// The longest version 1 header, CRLF included (section 2.1).
pub const V1_MAX_LEN: usize = 107;
/// The fixed part of a version 2 header: the signature, version and command, family,
/// length.
const V2_FIXED_LEN: usize = 16;
/// The longest version 2 header: the fixed part and a 16-bit length of addresses and TLVs.
pub const V2_MAX_LEN: usize = V2_FIXED_LEN + u16::MAX as usize;

/// What an inbound header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    /// It was relayed for this client.
    Client(SocketAddr),
    /// The sender speaks for itself (v2 `LOCAL`, e.g. a health check; v1 `UNKNOWN`; an
    /// address family without an IP address): the connection's own address stands.
    Local,
}

/// A malformed inbound header. The specification's answer is to close the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("the connection does not start with a PROXY protocol header")]
    Missing,
    #[error("a PROXY protocol v1 header without CRLF in its first {V1_MAX_LEN} bytes")]
    V1TooLong,
    #[error("a malformed PROXY protocol v1 header: {0}")]
    V1Malformed(&'static str),
    #[error("a PROXY protocol v2 header of version {0} (only 2 is defined)")]
    V2Version(u8),
    #[error("a PROXY protocol v2 header with command {0} (LOCAL or PROXY)")]
    V2Command(u8),
    #[error("a PROXY protocol v2 header for a datagram transport (family byte {0:#04x})")]
    V2Datagram(u8),
    #[error(
        "a PROXY protocol v2 header too short ({len} bytes) for its address family {family:#04x}"
    )]
    V2Short { family: u8, len: usize },
}

/// Whether `buf`, the first bytes a client sent, start a PROXY protocol header (either
/// version): `None` while too few bytes are in to tell. Four bytes always tell against a
/// MySQL client's first packet, whose fourth byte (its sequence number) is 1.
pub fn starts_header(buf: &[u8]) -> Option<bool> {
    let is_prefix = |sig: &[u8]| {
        let n = buf.len().min(sig.len());
        buf[..n] == sig[..n]
    };
    let maybe = is_prefix(V1_PREFIX) || is_prefix(&SIGNATURE);
    if !maybe {
        return Some(false);
    }
    (buf.len() >= 4).then_some(true)
}

/// Reads the header at the start of `buf`. `Ok(None)`: not all of it is in yet (read more;
/// a complete header is never longer than [`V2_MAX_LEN`]); `Ok(Some((carried, len)))`: the
/// header is the first `len` bytes, what follows is the client's.
pub fn parse_header(buf: &[u8]) -> Result<Option<(Carried, usize)>, HeaderError> {
    match starts_header(buf) {
        Some(false) => Err(HeaderError::Missing),
        None => Ok(None),
        Some(true) if buf.starts_with(b"PROX") => parse_v1(buf),
        Some(true) => parse_v2(buf),
    }
}

fn parse_v1(buf: &[u8]) -> Result<Option<(Carried, usize)>, HeaderError> {
    let window = &buf[..buf.len().min(V1_MAX_LEN)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        return match buf.len() >= V1_MAX_LEN {
            true => Err(HeaderError::V1TooLong),
            false => Ok(None),
        };
    };
    let len = end + 2;
    let line =
        std::str::from_utf8(&buf[..end]).map_err(|_| HeaderError::V1Malformed("not ASCII"))?;
    let line = line
        .strip_prefix("PROXY ")
        .ok_or(HeaderError::V1Malformed("no \"PROXY \" at its start"))?;
    // UNKNOWN: the rest of the line is ignored (section 2.1).
    if line == "UNKNOWN" || line.starts_with("UNKNOWN ") {
        return Ok(Some((Carried::Local, len)));
    }
    let fields: Vec<&str> = line.split(' ').collect();
    let [proto, source, _destination, source_port, destination_port] = fields[..] else {
        return Err(HeaderError::V1Malformed(
            "not five fields after PROXY, separated by single spaces",
        ));
    };
    let ip: IpAddr = match proto {
        "TCP4" => source
            .parse::<Ipv4Addr>()
            .map_err(|_| HeaderError::V1Malformed("a bad IPv4 source address"))?
            .into(),
        "TCP6" => source
            .parse::<Ipv6Addr>()
            .map_err(|_| HeaderError::V1Malformed("a bad IPv6 source address"))?
            .into(),
        _ => {
            return Err(HeaderError::V1Malformed(
                "a protocol other than TCP4, TCP6, UNKNOWN",
            ))
        }
    };
    let port = v1_port(source_port)?;
    v1_port(destination_port)?;
    Ok(Some((Carried::Client(SocketAddr::new(ip, port)), len)))
}

/// A port of a v1 header: decimal digits only, at most 65535.
fn v1_port(text: &str) -> Result<u16, HeaderError> {
    let bad = HeaderError::V1Malformed("a bad port");
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad);
    }
    text.parse().map_err(|_| bad)
}

fn parse_v2(buf: &[u8]) -> Result<Option<(Carried, usize)>, HeaderError> {
    if buf.len() < V2_FIXED_LEN {
        // The signature so far is checked by `starts_header`; the rest needs 16 bytes.
        return match buf[..buf.len().min(SIGNATURE.len())]
            == SIGNATURE[..buf.len().min(SIGNATURE.len())]
        {
            true => Ok(None),
            false => Err(HeaderError::Missing),
        };
    }
    if buf[..SIGNATURE.len()] != SIGNATURE {
        return Err(HeaderError::Missing);
    }
    let (version, command) = (buf[12] >> 4, buf[12] & 0x0f);
    if version != 2 {
        return Err(HeaderError::V2Version(version));
    }
    let family = buf[13];
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let total = V2_FIXED_LEN + len;
    if buf.len() < total {
        return Ok(None);
    }
    let body = &buf[V2_FIXED_LEN..total];
    let carried = match command {
        // LOCAL: the addresses (if any) are to be ignored.
        0 => Carried::Local,
        1 => match family {
            TCP_OVER_IPV4 => {
                let a = body.get(..12).ok_or(HeaderError::V2Short { family, len })?;
                let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
                let port = u16::from_be_bytes([a[8], a[9]]);
                Carried::Client(SocketAddr::new(ip.into(), port))
            }
            TCP_OVER_IPV6 => {
                let a = body.get(..36).ok_or(HeaderError::V2Short { family, len })?;
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&a[..16]);
                let port = u16::from_be_bytes([a[32], a[33]]);
                Carried::Client(SocketAddr::new(Ipv6Addr::from(octets).into(), port))
            }
            // UDP over IPv4 or IPv6: never a MySQL client.
            0x12 | 0x22 => return Err(HeaderError::V2Datagram(family)),
            // UNSPEC, UNIX sockets and families yet to be defined: the connection's own
            // address stands (section 2.2).
            _ => Carried::Local,
        },
        other => return Err(HeaderError::V2Command(other)),
    };
    Ok(Some((carried, total)))
}

fn as_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_bytes() {
        let h = v2_header(
            "127.0.0.2:5555".parse().unwrap(),
            "127.0.0.1:3306".parse().unwrap(),
        );
        let mut want = SIGNATURE.to_vec();
        want.extend_from_slice(&[0x21, 0x11, 0, 12]);
        want.extend_from_slice(&[127, 0, 0, 2, 127, 0, 0, 1]);
        want.extend_from_slice(&[0x15, 0xb3, 0x0c, 0xea]);
        assert_eq!(h, want);
    }

    fn addr(s: &str) -> Carried {
        Carried::Client(s.parse().unwrap())
    }

    #[test]
    fn v2_headers_read_back_what_v2_header_writes() {
        for (client, server) in [
            ("10.1.2.3:40000", "127.0.0.1:6033"),
            ("[2001:db8::7]:1", "[::1]:6033"),
            ("10.1.2.3:5", "[::1]:6033"),
        ] {
            let mut h = v2_header(client.parse().unwrap(), server.parse().unwrap());
            let len = h.len();
            h.extend_from_slice(b"rest");
            let (carried, used) = parse_header(&h).unwrap().unwrap();
            assert_eq!(used, len);
            let want: SocketAddr = client.parse().unwrap();
            let got = match carried {
                Carried::Client(a) => a,
                Carried::Local => panic!("{client}: local"),
            };
            // A v4 client with a v6 server goes as v4-mapped.
            assert_eq!(got.port(), want.port());
            assert_eq!(as_v6(got.ip()), as_v6(want.ip()));
            // Every strict prefix asks for more.
            for n in 0..len {
                assert_eq!(parse_header(&h[..n]), Ok(None), "{client}: {n} bytes");
            }
        }
    }

    #[test]
    fn v2_local_tlvs_and_unix_families() {
        let mut h = SIGNATURE.to_vec();
        h.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(parse_header(&h), Ok(Some((Carried::Local, 16))));
        // TCP over IPv4 with a TLV after the addresses: skipped.
        let mut h = SIGNATURE.to_vec();
        h.extend_from_slice(&[0x21, 0x11, 0, 12 + 5]);
        h.extend_from_slice(&[10, 1, 2, 3, 127, 0, 0, 1, 0x9c, 0x40, 0x17, 0x91]);
        h.extend_from_slice(&[0x04, 0, 2, b'i', b'd']);
        assert_eq!(
            parse_header(&h),
            Ok(Some((addr("10.1.2.3:40000"), 16 + 17)))
        );
        // A UNIX socket: the connection's own address.
        let mut h = SIGNATURE.to_vec();
        h.extend_from_slice(&[0x21, 0x31, 0, 216]);
        h.extend_from_slice(&[0; 216]);
        assert_eq!(parse_header(&h), Ok(Some((Carried::Local, 16 + 216))));
    }

    #[test]
    fn malformed_v2_headers_are_refused() {
        let with = |ver_cmd: u8, family: u8, body: &[u8]| {
            let mut h = SIGNATURE.to_vec();
            h.extend_from_slice(&[ver_cmd, family]);
            h.extend_from_slice(&(body.len() as u16).to_be_bytes());
            h.extend_from_slice(body);
            parse_header(&h)
        };
        assert_eq!(with(0x11, 0x11, &[0; 12]), Err(HeaderError::V2Version(1)));
        assert_eq!(with(0x22, 0x11, &[0; 12]), Err(HeaderError::V2Command(2)));
        assert_eq!(
            with(0x21, 0x11, &[0; 11]),
            Err(HeaderError::V2Short {
                family: 0x11,
                len: 11
            })
        );
        assert_eq!(
            with(0x21, 0x21, &[0; 12]),
            Err(HeaderError::V2Short {
                family: 0x21,
                len: 12
            })
        );
        assert_eq!(
            with(0x21, 0x12, &[0; 12]),
            Err(HeaderError::V2Datagram(0x12))
        );
        // A signature that goes wrong part-way.
        let mut h = SIGNATURE.to_vec();
        h[8] = b'X';
        h.extend_from_slice(&[0x21, 0x11, 0, 0]);
        assert_eq!(parse_header(&h), Err(HeaderError::Missing));
        assert_eq!(parse_header(&h[..10]), Err(HeaderError::Missing));
    }

    #[test]
    fn v1_headers() {
        let ok = |s: &str| parse_header(s.as_bytes());
        assert_eq!(
            ok("PROXY TCP4 10.1.2.3 127.0.0.1 56324 6033\r\nxyz"),
            Ok(Some((addr("10.1.2.3:56324"), 42)))
        );
        assert_eq!(
            ok("PROXY TCP6 2001:db8::1 ::1 1 6033\r\n"),
            Ok(Some((addr("[2001:db8::1]:1"), 35)))
        );
        assert_eq!(ok("PROXY UNKNOWN\r\n"), Ok(Some((Carried::Local, 15))));
        assert_eq!(
            ok("PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"),
            Ok(Some((Carried::Local, 35)))
        );
        // Incomplete: more is needed.
        assert_eq!(ok("PROXY TCP4 10.1.2.3 127.0.0.1 5"), Ok(None));
        assert_eq!(ok("PRO"), Ok(None));
        assert_eq!(ok(""), Ok(None));
    }

    #[test]
    fn malformed_v1_headers_are_refused() {
        let bad = |s: &str| parse_header(s.as_bytes()).unwrap_err();
        for s in [
            "PROXY TCP4 10.1.2.3 127.0.0.1 56324\r\n",
            "PROXY TCP4 10.1.2.3  127.0.0.1 1 2\r\n",
            "PROXY TCP4 10.1.2.3 127.0.0.1 1 2 3\r\n",
            "PROXY TCP4 10.1.2 127.0.0.1 1 2\r\n",
            "PROXY TCP4 ::1 127.0.0.1 1 2\r\n",
            "PROXY TCP6 10.1.2.3 ::1 1 2\r\n",
            "PROXY TCP4 10.1.2.3 127.0.0.1 65536 2\r\n",
            "PROXY TCP4 10.1.2.3 127.0.0.1 +1 2\r\n",
            "PROXY TCP4 10.1.2.3 127.0.0.1 1 \r\n",
            "PROXY UDP4 10.1.2.3 127.0.0.1 1 2\r\n",
        ] {
            assert!(
                matches!(bad(s), HeaderError::V1Malformed(_)),
                "{s:?}: {:?}",
                bad(s)
            );
        }
        assert_eq!(bad("PROXY\r\n"), HeaderError::Missing);
        assert_eq!(bad("PROXYTCP4\r\n"), HeaderError::Missing);
        assert_eq!(
            bad(&format!("PROXY TCP4 {}\r\n", "1".repeat(200))),
            HeaderError::V1TooLong
        );
        assert_eq!(
            parse_header(b"PROXY TCP4 \xff 127.0.0.1 1 2\r\n").unwrap_err(),
            HeaderError::V1Malformed("not ASCII")
        );
    }

    #[test]
    fn a_mysql_client_packet_is_no_header() {
        // A handshake response's header: length, then sequence number 1.
        assert_eq!(starts_header(&[0x50, 0x52, 0x4f, 0x01]), Some(false));
        assert_eq!(starts_header(&[0x0d, 0x0a, 0x0d, 0x01]), Some(false));
        assert_eq!(starts_header(&[0x0d, 0x0a, 0x0d]), None);
        assert_eq!(starts_header(b"PROX"), Some(true));
        assert_eq!(starts_header(&SIGNATURE[..4]), Some(true));
        assert_eq!(parse_header(&[0xab, 0, 0, 1]), Err(HeaderError::Missing));
    }

    /// What the fuzz target checks, on mutations of valid headers (a cheap stand-in for
    /// `scripts/fuzz.sh` where cargo-fuzz is not installed).
    #[test]
    fn mutated_headers_never_panic_and_stay_in_bounds() {
        let seeds: Vec<Vec<u8>> = vec![
            v2_header(
                "10.1.2.3:40000".parse().unwrap(),
                "127.0.0.1:6033".parse().unwrap(),
            ),
            v2_header(
                "[2001:db8::1]:1".parse().unwrap(),
                "[::1]:2".parse().unwrap(),
            ),
            b"PROXY TCP4 10.1.2.3 127.0.0.1 56324 6033\r\n".to_vec(),
            b"PROXY TCP6 2001:db8::1 ::1 1 6033\r\n".to_vec(),
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..20_000 {
            let mut data = seeds[round % seeds.len()].clone();
            for _ in 0..(next() % 4 + 1) {
                let at = (next() as usize) % (data.len() + 1);
                match next() % 3 {
                    0 if at < data.len() => data[at] = next() as u8,
                    1 if at < data.len() => {
                        data.truncate(at);
                    }
                    _ => data.insert(at.min(data.len()), next() as u8),
                }
            }
            let _ = starts_header(&data);
            if let Ok(Some((_, len))) = parse_header(&data) {
                assert!(len <= data.len() && len <= V2_MAX_LEN, "{data:?}");
                assert_eq!(
                    parse_header(&data[..len]).ok().flatten().map(|(_, l)| l),
                    Some(len)
                );
            }
        }
    }

    #[test]
    fn mixed_families_go_as_ipv6() {
        let h = v2_header(
            "[2001:db8::1]:40000".parse().unwrap(),
            "10.0.0.5:3306".parse().unwrap(),
        );
        assert_eq!(&h[12..16], &[0x21, 0x21, 0, 36]);
        assert_eq!(h.len(), 16 + 36);
        // The server's IPv4 address, mapped.
        assert_eq!(
            &h[32..48],
            &"::ffff:10.0.0.5".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(&h[48..50], &40000u16.to_be_bytes());
    }
}
