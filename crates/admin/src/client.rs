//! A minimal HTTP/1.1 client for the admin API, used by `holdfast ctl`, the benchmarks and
//! drills (`holdfast-bench`) and the integration tests: one request per connection,
//! `Connection: close`, `Authorization: Bearer <token>`, the answer read to the end (chunked
//! bodies are de-chunked).

use std::io;
use std::time::Duration;

use holdfast_config::AdminToken;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zeroize::Zeroizing;

/// An admin API to talk to: its address and the bearer token it wants (requests without
/// one get 401, except `GET /health`).
#[derive(Debug, Clone)]
pub struct AdminClient {
    /// `host:port`.
    pub addr: String,
    token: Option<AdminToken>,
    /// Requests say they were forwarded by another member of the fleet
    /// ([`FORWARDED_HEADER`]).
    forwarded: bool,
}

/// The header a fleet member adds to an operation it forwards to the leader: a member that
/// gets one and does not lead answers instead of forwarding it again.
pub const FORWARDED_HEADER: &str = "x-holdfast-forwarded";

impl AdminClient {
    pub fn new(addr: impl Into<String>, token: Option<AdminToken>) -> Self {
        AdminClient {
            addr: addr.into(),
            token,
            forwarded: false,
        }
    }

    /// The same client, its requests marked as forwarded by a fleet member.
    pub fn forwarding(mut self) -> Self {
        self.forwarded = true;
        self
    }

    /// Whether requests carry a token.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// `GET path`: the status code and body.
    pub async fn get(&self, path: &str) -> io::Result<(u16, String)> {
        self.request("GET", path, None).await
    }

    /// `POST path` with an optional JSON body: the status code and body.
    pub async fn post(&self, path: &str, json: Option<&str>) -> io::Result<(u16, String)> {
        self.request("POST", path, json).await
    }

    /// `METHOD path` with an optional JSON body: the status code and body.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        json: Option<&str>,
    ) -> io::Result<(u16, String)> {
        let mut stream = tokio::net::TcpStream::connect(&self.addr).await?;
        let mut text = request_text(&self.addr, self.token.as_ref(), method, path, json);
        if self.forwarded {
            // (Before the blank line that ends the headers.)
            if let Some(at) = text.find("Connection: close\r\n") {
                text.insert_str(at, &format!("{FORWARDED_HEADER}: 1\r\n"));
            }
        }
        stream.write_all(text.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        parse_response(&String::from_utf8_lossy(&answer))
    }

    /// [`AdminClient::request`] without a body for callers outside an async runtime (it
    /// runs its own, so it must not be called from inside one). `timeout` bounds the whole
    /// exchange: a `POST /pause?tier=stop` answers only once the server is down.
    pub fn blocking_request(
        &self,
        method: &str,
        path: &str,
        timeout: Duration,
    ) -> io::Result<(u16, String)> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            tokio::time::timeout(timeout, self.request(method, path, None))
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no answer to {method} {path} from {} within {timeout:?}",
                            self.addr
                        ),
                    )
                })?
        })
    }
}

/// The request's bytes (zeroized afterwards: they hold the token).
fn request_text(
    addr: &str,
    token: Option<&AdminToken>,
    method: &str,
    path: &str,
    json: Option<&str>,
) -> Zeroizing<String> {
    let body = json.unwrap_or("");
    let content_type = if json.is_some() {
        "Content-Type: application/json\r\n"
    } else {
        ""
    };
    let mut text = Zeroizing::new(format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n"
    ));
    if let Some(t) = token {
        text.push_str("Authorization: Bearer ");
        text.push_str(t.expose());
        text.push_str("\r\n");
    }
    text.push_str(&format!(
        "{content_type}Content-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    text
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
    fn writes_a_request_with_its_token_and_body_length() {
        assert_eq!(
            *request_text("h:1", None, "POST", "/x", Some("{}")),
            "POST /x HTTP/1.1\r\nHost: h:1\r\nConnection: close\r\nAccept: */*\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
        let token = AdminToken::new("0123456789abcdef");
        assert_eq!(
            *request_text("h:1", Some(&token), "GET", "/status", None),
            "GET /status HTTP/1.1\r\nHost: h:1\r\nConnection: close\r\nAccept: */*\r\n\
             Authorization: Bearer 0123456789abcdef\r\nContent-Length: 0\r\n\r\n"
        );
        let client = AdminClient::new("h:1", Some(token));
        assert!(!format!("{client:?}").contains("0123456789abcdef"));
    }
}
