//! The client against a scripted server on loopback: greeting, login with an auth switch,
//! a result set, an ERR.

use super::*;
use holdfast_wire::auth::verify_native;
use holdfast_wire::binary_row::{TYPE_LONGLONG, UNSIGNED_FLAG};
use holdfast_wire::codec::put_lenenc_bytes;
use holdfast_wire::command::{COM_STMT_CLOSE, COM_STMT_EXECUTE, COM_STMT_PREPARE};
use holdfast_wire::handshake::{AuthSwitch, ClientHello};
use holdfast_wire::packets::{err_payload, ok_payload};
use tokio::net::TcpListener;

const PASSWORD: &str = "s3cret";

fn column(name: &str) -> Vec<u8> {
    let mut p = Vec::new();
    for s in ["def", "", "", "", name, ""] {
        put_lenenc_bytes(&mut p, s.as_bytes());
    }
    p.push(0x0c);
    p.extend_from_slice(&[45, 0, 10, 0, 0, 0, 253, 0, 0, 0, 0, 0]);
    p
}

/// The OK that ends a result set under `CLIENT_DEPRECATE_EOF`.
fn eof() -> Vec<u8> {
    vec![0xfe, 0, 0, 2, 0, 0, 0]
}

/// Serves one TCP connection (see [`serve_stream`]).
async fn serve(listener: TcpListener) -> Result<(), ClientError> {
    let (stream, _) = listener.accept().await.map_err(ConnError::Io)?;
    serve_stream(Box::new(stream)).await
}

/// Serves one connection: switches the login to a fresh scramble, checks the password,
/// then answers `SELECT` with two rows and anything else with an ERR.
async fn serve_stream(stream: BoxedIo) -> Result<(), ClientError> {
    let mut conn = PacketConn::new(stream);
    let greeting = Greeting {
        server_version: b"11.4.0-fake".to_vec(),
        connection_id: 7,
        scramble: b"abcdefghijklmnopqrst".to_vec(),
        capabilities: BACKEND_REQUIRED | CLIENT_DEPRECATE_EOF | CLIENT_MULTI_RESULTS,
        charset: UTF8MB4_GENERAL_CI,
        status: 2,
        auth_plugin: b"client_ed25519".to_vec(),
        mariadb_caps: 0,
    };
    conn.write_packet(&greeting.encode(), 0).await?;
    let hello = conn.read_packet(1 << 20).await?;
    let Ok(ClientHello::Login(login)) = ClientHello::parse(&hello.payload) else {
        return Err(ClientError::UnsupportedPlugin("not a login".into()));
    };
    assert_eq!(login.user, b"app");
    let switch = AuthSwitch {
        plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
        data: b"ABCDEFGHIJKLMNOPQRST".to_vec(),
    };
    conn.write_packet(&switch.encode(), hello.seq + 1).await?;
    let answer = conn.read_packet(1 << 20).await?;
    let verifier = PasswordHash::from_password(PASSWORD.as_bytes()).verifier();
    let reply = match verify_native(&answer.payload, &switch.data, &verifier) {
        Some(_) => ok_payload(0, 0, 2, 0),
        None => err_payload(1045, "28000", "Access denied"),
    };
    conn.write_packet(&reply, answer.seq + 1).await?;
    loop {
        let cmd = match conn.read_packet(1 << 20).await {
            Ok(p) => p,
            Err(ConnError::Closed) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if cmd.payload.first() == Some(&COM_QUIT) {
            return Ok(());
        }
        match cmd.payload.first().copied() {
            Some(COM_STMT_PREPARE) => {
                // Statement 9: one column, no parameters.
                let ok = [0, 9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
                conn.write_packet(&ok, 1).await?;
                conn.write_packet(&column("v"), 2).await?;
                continue;
            }
            Some(COM_STMT_EXECUTE) => {
                let mut def = column("v");
                let at = def.len() - 6; // type byte, then flags
                def[at] = TYPE_LONGLONG;
                def[at + 1] = UNSIGNED_FLAG as u8;
                let mut row = vec![0, 0];
                row.extend_from_slice(&u64::MAX.to_le_bytes());
                for (i, p) in [vec![1], def, row, eof()].iter().enumerate() {
                    conn.write_packet(p, i as u8 + 1).await?;
                }
                continue;
            }
            // No answer.
            Some(COM_STMT_CLOSE) => continue,
            _ => {}
        }
        if cmd.payload.get(1..7) != Some(b"SELECT") {
            conn.write_packet(&err_payload(1064, "42000", "syntax"), 1)
                .await?;
            continue;
        }
        let mut packets = vec![vec![2], column("a"), column("b")];
        for row in [&[1u8, b'x', 0xfb][..], &[0, 1, b'y']] {
            packets.push(row.to_vec());
        }
        packets.push(eof());
        for (i, p) in packets.iter().enumerate() {
            conn.write_packet(p, i as u8 + 1).await?;
        }
    }
}

#[tokio::test]
async fn logs_in_queries_and_reports_errors() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(serve(listener));
    let timeout = Duration::from_secs(5);
    let mut c = Client::connect_native(&addr, "app", PASSWORD, Some("db"), timeout)
        .await
        .unwrap();
    assert_eq!(c.greeting.connection_id, 7);
    assert_ne!(c.capabilities & CLIENT_DEPRECATE_EOF, 0);
    let r = c.execute(b"SELECT a, b", CONTROL_MAX_PACKET).await.unwrap();
    assert_eq!(r.columns, ["a", "b"]);
    assert_eq!(
        r.text_rows(),
        [
            vec![Some("x".to_string()), None],
            vec![Some(String::new()), Some("y".to_string())]
        ]
    );
    let b = c.execute_prepared(b"SELECT @v", 1 << 20).await.unwrap();
    assert_eq!(b.columns.len(), 1);
    assert!(b.columns[0].is_unsigned());
    assert_eq!(
        b.first_row,
        Some(vec![Some(u64::MAX.to_le_bytes().to_vec())])
    );
    let e = c.query("BOGUS").await.unwrap_err();
    assert_eq!(e.server_error().map(|s| s.code), Some(1064), "{e}");
    c.quit().await.unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn wrong_password_is_a_server_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(serve(listener));
    let e = Client::connect_native(&addr, "app", "wrong", None, Duration::from_secs(5))
        .await
        .err()
        .unwrap();
    let s = e.server_error().unwrap();
    assert_eq!((s.code, s.state.as_str()), (1045, "28000"));
    let _ = server.await;
}

/// The same exchange over an in-process pipe: the stream seam, no socket.
#[tokio::test]
async fn logs_in_over_a_duplex_stream() {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(serve_stream(Box::new(theirs)));
    let (conn, greeting) = greet(Box::new(ours)).await.unwrap();
    let secret = PasswordHash::from_password(PASSWORD.as_bytes());
    let as_app = Login {
        user: b"app",
        secret: Some(&secret),
        database: None,
        charset: UTF8MB4_GENERAL_CI,
        attributes: &[],
        mariadb_caps: 0,
    };
    let mut c = login(conn, greeting, &as_app, DEFAULT_CAPABILITIES, None)
        .await
        .unwrap();
    let r = c.query("SELECT a, b").await.unwrap();
    assert_eq!(r.rows.len(), 2);
    c.quit().await.unwrap();
    server.await.unwrap().unwrap();
}

/// A stream taken out for an upgrade: the connection fails while it is out, the bytes
/// already buffered come with it, and the stream put back carries on.
#[tokio::test]
async fn stream_taken_out_and_put_back() {
    use tokio::io::AsyncWriteExt;
    let (ours, mut theirs) = tokio::io::duplex(1024);
    let mut conn = PacketConn::new(Box::new(ours));
    // One whole packet and the first bytes of whatever follows it.
    theirs
        .write_all(&[1, 0, 0, 0, 0x0e, 0x16, 0x03])
        .await
        .unwrap();
    let p = conn.read_packet(1024).await.unwrap();
    assert_eq!(&p.payload[..], &[0x0e]);
    let (stream, buffered) = conn.take_stream();
    assert_eq!(&buffered[..], &[0x16, 0x03]);
    assert!(matches!(
        conn.read_packet(1024).await,
        Err(ConnError::Io(_))
    ));
    assert!(conn.write_packet(&[0x0e], 0).await.is_err());
    let _detached = conn.replace_stream(stream);
    conn.write_packet(&[0x0e], 0).await.unwrap();
    let mut got = [0u8; 5];
    tokio::io::AsyncReadExt::read_exact(&mut theirs, &mut got)
        .await
        .unwrap();
    assert_eq!(got, [1, 0, 0, 0, 0x0e]);
}

/// A boxed socket still writes vectored (one writev for a rewritten packet and the
/// bytes before it): the box forwards `is_write_vectored`.
#[tokio::test]
async fn boxed_tcp_stream_writes_vectored() {
    use tokio::io::AsyncWrite;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accept = tokio::spawn(async move { listener.accept().await });
    let stream = tcp_connect(&addr).await.unwrap();
    assert!(stream.is_write_vectored());
    let conn = PacketConn::new(stream);
    assert!(conn.stream.is_write_vectored());
    accept.await.unwrap().unwrap();
}

#[test]
fn server_error_display() {
    let s = ServerError::parse(&err_payload(1045, "28000", "Access denied")).unwrap();
    assert_eq!(s.to_string(), "ERROR 1045 (28000): Access denied");
}

/// An idle connection's released buffer: the byte that ends the wait and the rest of a
/// short request are read into a small buffer, not a full-size one; a longer request
/// grows it.
#[tokio::test]
async fn a_released_buffer_stays_small_for_a_short_request() {
    let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
    let mut conn = PacketConn::new(Box::new(ours));
    conn.rbuf = bytes::BytesMut::new();
    let short = holdfast_wire::frame::packet(&[3; 100], 0);
    theirs.write_all(&short).await.unwrap();
    assert_eq!(conn.read_one().await.unwrap(), 1);
    assert_eq!(conn.buffer_packet(1 << 20).await.unwrap(), short.len());
    assert!(
        conn.rbuf.capacity() < 1024,
        "a short request after an idle spell took {} bytes",
        conn.rbuf.capacity()
    );
    let _ = conn.rbuf.split_to(short.len());
    let long = holdfast_wire::frame::packet(&[4; 3000], 1);
    theirs.write_all(&long).await.unwrap();
    assert_eq!(conn.buffer_packet(1 << 20).await.unwrap(), long.len());
    assert_eq!(&conn.rbuf[..], &long[..]);
}
