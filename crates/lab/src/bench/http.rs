//! A minimal blocking HTTP/1.1 client for holdfast's admin API (the lab cannot depend on
//! `holdfast-admin`): one request per connection, `Connection: close`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// How long connecting to the admin listener may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `METHOD path` to `addr` and returns the status code and body. `timeout` bounds
/// each read and write (a `POST /pause?tier=stop` answers only once the server is down).
pub fn request(addr: &str, method: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let sock: SocketAddr = addr
        .parse()
        .with_context(|| format!("bad admin address {addr:?}"))?;
    let mut stream = TcpStream::connect_timeout(&sock, CONNECT_TIMEOUT)
        .with_context(|| format!("connecting to the admin API at {addr}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .context("setting the read timeout")?;
    stream
        .set_write_timeout(Some(timeout))
        .context("setting the write timeout")?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n\
         Content-Length: 0\r\n\r\n"
    );
    stream
        .write_all(req.as_bytes())
        .with_context(|| format!("sending {method} {path} to {addr}"))?;
    let mut buf = Vec::new();
    stream
        .read_to_end(&mut buf)
        .with_context(|| format!("reading the answer to {method} {path} from {addr}"))?;
    parse_response(&String::from_utf8_lossy(&buf))
        .with_context(|| format!("answer to {method} {path} from {addr}"))
}

/// `GET path`, requiring 200, as JSON.
pub fn get_json(addr: &str, path: &str) -> Result<serde_json::Value> {
    let (code, body) = request(addr, "GET", path, Duration::from_secs(10))?;
    if code != 200 {
        bail!("GET {path}: HTTP {code}: {body}");
    }
    serde_json::from_str(&body).with_context(|| format!("GET {path}: body is not JSON"))
}

fn parse_response(text: &str) -> Result<(u16, String)> {
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of headers in the HTTP answer")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status code in the HTTP answer")?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Ok((code, if chunked { dechunk(body) } else { body.into() }))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_answers() {
        let (code, body) =
            parse_response("HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!((code, body.as_str()), (409, "{}"));
        let (code, body) = parse_response(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((code, body.as_str()), (200, "abcde"));
        assert!(parse_response("garbage").is_err());
    }
}
