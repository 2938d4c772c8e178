//! A minimal HTTP/1.1 client for the admin API, used by `holdfast ctl`, the benchmarks and
//! drills (`holdfast-bench`) and the integration tests: one request per connection,
//! `Connection: close`, the answer read to the end (chunked bodies are de-chunked).

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on `addr`: the status code and body.
pub async fn http_get(addr: &str, path: &str) -> io::Result<(u16, String)> {
    http_request(addr, "GET", path, None).await
}

/// `POST path` on `addr` with an optional JSON body: the status code and body.
pub async fn http_post(addr: &str, path: &str, json: Option<&str>) -> io::Result<(u16, String)> {
    http_request(addr, "POST", path, json).await
}

/// `METHOD path` on `addr` with an optional JSON body: the status code and body.
pub async fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    json: Option<&str>,
) -> io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(request_text(addr, method, path, json).as_bytes())
        .await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    parse_response(&String::from_utf8_lossy(&answer))
}

/// [`http_request`] without a body for callers outside an async runtime (it runs its own,
/// so it must not be called from inside one). `timeout` bounds the whole exchange: a
/// `POST /pause?tier=stop` answers only once the server is down.
pub fn blocking_request(
    addr: &str,
    method: &str,
    path: &str,
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        tokio::time::timeout(timeout, http_request(addr, method, path, None))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer to {method} {path} from {addr} within {timeout:?}"),
                )
            })?
    })
}

fn request_text(addr: &str, method: &str, path: &str, json: Option<&str>) -> String {
    let body = json.unwrap_or("");
    let content_type = if json.is_some() {
        "Content-Type: application/json\r\n"
    } else {
        ""
    };
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n\
         {content_type}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The status code and (de-chunked) body of an HTTP/1.1 answer.
fn parse_response(text: &str) -> io::Result<(u16, String)> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| invalid("no end of headers in the HTTP answer"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| invalid("no status code in the HTTP answer"))?;
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

    #[test]
    fn writes_a_request_with_its_body_length() {
        assert_eq!(
            request_text("h:1", "POST", "/x", Some("{}")),
            "POST /x HTTP/1.1\r\nHost: h:1\r\nConnection: close\r\nAccept: */*\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
    }
}
