//! The bare user-space relay, the `bare_relay` target of `holdfast-bench bench`: accept,
//! connect to the server, `tokio::io::copy_bidirectional`, nothing else. No parsing, no
//! state, no metrics: what any user-space proxy on tokio costs at least, the reference
//! holdfast's session mode is measured against.

use anyhow::{Context, Result};
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};

/// Options of `holdfast-bench bare-relay`.
#[derive(clap::Args, Debug, Clone)]
pub struct BareRelayArgs {
    /// Where clients connect.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The server each connection is relayed to.
    #[arg(long)]
    pub to: SocketAddr,
    /// Runtime worker threads (the bench gives it holdfast's default: half the cores).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// How bytes are moved: `tokio` (copy_bidirectional per connection) or `uring` (one
    /// thread, one io_uring, the system calls of all connections batched; `--threads` is
    /// not used).
    #[arg(long, value_enum, default_value_t = Engine::Tokio)]
    pub engine: Engine,
}

/// How the bare relay moves bytes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Tokio,
    Uring,
}

/// Relays until killed.
pub fn run(args: &BareRelayArgs) -> Result<()> {
    if args.engine == Engine::Uring {
        return crate::uring_relay::run(args.listen, args.to);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        loop {
            let (mut client, _) = listener.accept().await.context("accepting")?;
            let to = args.to;
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(to).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    })
}
