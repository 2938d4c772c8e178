//! TLS on MySQL connections: the PEM files, the upgrade of a server connection after its
//! greeting (an SSLRequest, then the TLS handshake, then the login inside it), and
//! [`Prefixed`], which hands a TLS acceptor the bytes a client sent right behind its
//! SSLRequest.

use crate::conn::{BoxedIo, PacketConn};
use crate::ClientError;
use bytes::{Buf, BytesMut};
use holdfast_wire::caps::CLIENT_SSL;
use holdfast_wire::handshake::{Greeting, LoginRequest};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: String },
    #[error("{path}: {detail}")]
    Invalid { path: String, detail: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsSetupError> {
    std::fs::read(path).map_err(|source| TlsSetupError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Every certificate in a PEM file, in order (a chain: leaf first).
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsSetupError::Invalid {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsSetupError::NoCertificate {
            path: path.display().to_string(),
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file.
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    let pem = zeroize::Zeroizing::new(read(path)?);
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsSetupError::NoKey {
        path: path.display().to_string(),
    })
}

/// The ring provider, named once (rustls may be built with others in the same binary).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How much of a server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// The chain up to the CA; any name (as `--ssl-verify-server-cert` off with a CA).
    Ca,
    /// The chain and the name or IP address holdfast connects to.
    Full,
}

/// TLS settings for connections to servers.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Trusts the CA certificates in `ca` (PEM), presenting `identity` (certificate chain
    /// and key files) when the server asks for a client certificate.
    pub fn new(
        ca: &Path,
        verify: Verify,
        identity: Option<(&Path, &Path)>,
    ) -> Result<TlsClient, TlsSetupError> {
        let mut roots = RootCertStore::empty();
        for cert in load_certificates(ca)? {
            roots.add(cert).map_err(|e| TlsSetupError::Invalid {
                path: ca.display().to_string(),
                detail: e.to_string(),
            })?;
        }
        let provider = provider();
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| TlsSetupError::Invalid {
                path: ca.display().to_string(),
                detail: e.to_string(),
            })?;
        let verifier: Arc<dyn ServerCertVerifier> = match verify {
            Verify::Full => webpki,
            Verify::Ca => Arc::new(ChainOnly(webpki)),
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match identity {
            Some((chain, key)) => {
                builder.with_client_auth_cert(load_certificates(chain)?, load_private_key(key)?)?
            }
            None => builder.with_no_client_auth(),
        };
        // An upgrade continues the connection in the new process (`tls_resume`).
        config.enable_secret_extraction = true;
        Ok(TlsClient {
            config: Arc::new(config),
        })
    }

    /// Runs the TLS handshake over `stream` towards `host` (a name or an IP address).
    pub async fn connect(&self, stream: BoxedIo, host: &str) -> io::Result<BoxedIo> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // Tracked: the session's TLS state can be handed to another process, with its
        // traffic secrets (a key update after the hand-over is followed): logged into a
        // log of this connection's own.
        let secrets = Arc::new(crate::tls_resume::SecretLog::default());
        let mut config = (*self.config).clone();
        config.key_log = secrets.clone();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tracked = crate::tls_resume::Tracked::with_secrets(stream, secrets);
        Ok(Box::new(connector.connect(name, tracked).await?))
    }
}

/// verify-ca: the chain must lead to the CA; the name is not checked. Everything else is
/// the standard verifier's.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The standard verifier checks the chain before the name, so a name error means
        // the chain was good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The host part of a `host:port` address (`[v6]:port` too), as a TLS server name.
pub fn host_of(address: &str) -> &str {
    match address.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
            host.trim_start_matches('[').trim_end_matches(']')
        }
        _ => address,
    }
}

/// Upgrades a freshly greeted server connection to TLS before `login` is sent: writes its
/// SSLRequest (sequence id 1; `login`'s capabilities must include CLIENT_SSL), then runs
/// the handshake. `login` itself follows inside TLS with sequence id 2.
pub async fn start_tls(
    conn: &mut PacketConn,
    greeting: &Greeting,
    tls: &TlsClient,
    host: &str,
    login: &LoginRequest,
) -> Result<(), ClientError> {
    if greeting.capabilities & CLIENT_SSL == 0 {
        return Err(ClientError::TlsNotOffered);
    }
    conn.write_packet(&login.ssl_request(), 1).await?;
    let (stream, buffered) = conn.take_stream();
    if !buffered.is_empty() {
        // The server speaks only after the client's TLS hello.
        return Err(ClientError::Tls(io::Error::new(
            io::ErrorKind::InvalidData,
            "the server sent data before the TLS handshake",
        )));
    }
    let secured = tls.connect(stream, host).await.map_err(ClientError::Tls)?;
    conn.replace_stream(secured);
    Ok(())
}

/// A stream that first yields `prefix` (bytes already read from `inner`) and then reads
/// `inner`. Writes go straight to `inner`.
pub struct Prefixed {
    prefix: BytesMut,
    inner: BoxedIo,
}

impl Prefixed {
    pub fn new(prefix: BytesMut, inner: BoxedIo) -> Self {
        Prefixed { prefix, inner }
    }

    pub fn prefix_empty(&self) -> bool {
        self.prefix.is_empty()
    }

    pub fn inner(&self) -> &dyn crate::conn::Io {
        self.inner.as_ref()
    }

    pub fn into_parts(self) -> (BytesMut, BoxedIo) {
        (self.prefix, self.inner)
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
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

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn host_of_addresses() {
        assert_eq!(host_of("127.0.0.1:3306"), "127.0.0.1");
        assert_eq!(host_of("[::1]:3306"), "::1");
        assert_eq!(host_of("db.example:3306"), "db.example");
        assert_eq!(host_of("db.example"), "db.example");
    }
}
