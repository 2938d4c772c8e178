//! The PROXY protocol version 2 header (HAProxy's specification, section 2.2): sent first on
//! a backend connection so that the server sees the client's address, not holdfast's.
//! MariaDB accepts it from the networks in `proxy_protocol_networks`, before or with the
//! client's first packet; a connection from there without a header stays a plain one.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

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
