//! `holdfast-bench record-layer`: what a TLS connection costs per round trip once it runs
//! on holdfast's own record layer (`ResumedTls`: after a hand-over to another process, and
//! after an idle session parked its sockets) rather than on rustls. Both ends run in this
//! process over loopback TCP: a rustls client, and a server that is rustls (as holdfast
//! serves a client before its session first parks) or, its keys taken out of rustls as a
//! park takes them, `ResumedTls`. The figure is this process's CPU (user + system) per
//! round trip: the client's share is the same in both.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use holdfast_client::conn::BoxedIo;
use holdfast_client::tls::{load_certificates, load_private_key};
use holdfast_client::tls_resume::{take_tls, ResumedTls, SecretLog, Tracked};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Args)]
pub struct RecordLayerArgs {
    /// Round trips per run of 100-byte messages (runs of 16,000-byte ones make a tenth).
    #[arg(long, default_value_t = 100_000)]
    round_trips: usize,
    /// Runs of each record layer, alternated; the median is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// This process's CPU seconds so far.
fn cpu_seconds() -> f64 {
    // SAFETY: `rusage` is plain data that getrusage fills in; it is a live local.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a pointer to a live, writable `rusage`.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

struct Configs {
    server: rustls::ServerConfig,
    client: Arc<rustls::ClientConfig>,
}

fn configs(version: &'static rustls::SupportedProtocolVersion) -> Result<Configs> {
    let dir = std::env::temp_dir().join(format!("holdfast-record-layer-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let tls = holdfast_lab::generate_tls(&dir).map_err(|e| anyhow!("certificates: {e}"))?;
    let provider = holdfast_client::tls::provider();
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[version])?
        .with_no_client_auth()
        .with_single_cert(
            load_certificates(&tls.holdfast_cert)?,
            load_private_key(&tls.holdfast_key)?,
        )?;
    server.enable_secret_extraction = true;
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certificates(&tls.ca)? {
        roots.add(cert)?;
    }
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Configs {
        server,
        client: Arc::new(client),
    })
}

/// A connection: holdfast's side (the server, tracked as holdfast's are) and the client's.
async fn pair(configs: &Configs) -> Result<(BoxedIo, BoxedIo)> {
    let log = Arc::new(SecretLog::default());
    let mut server = configs.server.clone();
    server.key_log = log.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let client = configs.client.clone();
    let connect = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let name =
            rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
        let tls = tokio_rustls::TlsConnector::from(client)
            .connect(name, tcp)
            .await?;
        Ok::<BoxedIo, std::io::Error>(Box::new(tls))
    });
    let (tcp, _) = listener.accept().await?;
    tcp.set_nodelay(true)?;
    let served = tokio_rustls::TlsAcceptor::from(Arc::new(server))
        .accept(Tracked::with_secrets(Box::new(tcp), log))
        .await?;
    let client = connect.await??;
    Ok((Box::new(served), client))
}

async fn round_trips(
    server: &mut BoxedIo,
    client: &mut BoxedIo,
    n: usize,
    size: usize,
) -> Result<()> {
    let message = vec![7u8; size];
    let mut buf = vec![0u8; size];
    for _ in 0..n {
        client.write_all(&message).await?;
        client.flush().await?;
        server.read_exact(&mut buf).await?;
        server.write_all(&buf).await?;
        server.flush().await?;
        client.read_exact(&mut buf).await?;
    }
    Ok(())
}

/// CPU µs per round trip with the server side on rustls or on `ResumedTls`.
async fn measure(configs: &Configs, resumed: bool, n: usize, size: usize) -> Result<f64> {
    let (mut server, mut client) = pair(configs).await?;
    // A few round trips first, as a session's login would.
    round_trips(&mut server, &mut client, 100, size).await?;
    if resumed {
        let (tcp, state, unread) = take_tls(server).context("taking the keys")?;
        anyhow::ensure!(unread.is_empty(), "plaintext left behind");
        server = Box::new(ResumedTls::new(tcp, state)?);
    }
    let before = cpu_seconds();
    round_trips(&mut server, &mut client, n, size).await?;
    Ok((cpu_seconds() - before) * 1e6 / n as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn run(args: &RecordLayerArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    println!("| version | message bytes | rustls µs/round trip | ResumedTls µs/round trip | ResumedTls / rustls | runs (rustls; ResumedTls) |");
    println!("|---|---|---|---|---|---|");
    for (name, version) in [
        ("TLS 1.3", &rustls::version::TLS13),
        ("TLS 1.2", &rustls::version::TLS12),
    ] {
        let configs = configs(version)?;
        for size in [100usize, 16_000] {
            let n = if size > 1000 {
                args.round_trips / 10
            } else {
                args.round_trips
            }
            .max(1);
            let (mut ours, mut rustls) = (Vec::new(), Vec::new());
            for _ in 0..args.rounds.max(1) {
                rustls.push(runtime.block_on(measure(&configs, false, n, size))?);
                ours.push(runtime.block_on(measure(&configs, true, n, size))?);
            }
            let fmt = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (r, o) = (median(rustls.clone()), median(ours.clone()));
            println!(
                "| {name} | {size} | {r:.2} | {o:.2} | {:.3} | {}; {} |",
                o / r,
                fmt(&rustls),
                fmt(&ours)
            );
        }
    }
    eprintln!(
        "record-layer: done in {:.0} s (this process's CPU per round trip, both ends: a rustls client and the server side named)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
