//! The floors' server: the two runtime models the gateway can be built on,
//! with nothing else in them, so `floor-proxy` and `floor-answer` measure the
//! stack (hyper 1.x on Tokio) and not a routing table, a store or a log.
//!
//! - `per-core`: N OS threads, each with a Tokio current-thread runtime and
//!   its own `SO_REUSEPORT` listener on the same address; the kernel spreads
//!   new connections over the listeners, and a connection never leaves the
//!   thread that accepted it (Pingora's no-steal model, DESIGN.md
//!   "Threads").
//! - `work-stealing`: one multi-thread runtime with N workers and one
//!   listener, what `#[tokio::main]` gives.
//!
//! Each runtime calls `make` once for the answer function its connections
//! share: per core that is one per thread (so a proxy's pool is per core),
//! work-stealing one for the process.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use tokio::net::{TcpListener, TcpSocket};

use crate::Args;

/// How the server's threads are organised (`--runtime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    PerCore,
    WorkStealing,
}

impl Model {
    fn name(self) -> &'static str {
        match self {
            Model::PerCore => "per-core",
            Model::WorkStealing => "work-stealing",
        }
    }
}

/// The flags both floors take: `--listen`, `--runtime`, `--threads`, `--lifetime-ms`.
pub struct Settings {
    pub listen: SocketAddr,
    pub model: Model,
    pub threads: usize,
    pub lifetime: Duration,
    /// How long a client has for each request head (none: unbounded).
    pub header_read_timeout: Option<Duration>,
}

impl Settings {
    pub fn from_args(args: &Args) -> Result<Self, String> {
        let model = match args.str("runtime", "per-core").as_str() {
            "per-core" => Model::PerCore,
            "work-stealing" => Model::WorkStealing,
            other => return Err(format!("--runtime: {other:?} is neither per-core nor work-stealing")),
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let threads = args.num("threads", cores)?.clamp(1, 256) as usize;
        let lifetime = Duration::from_millis(args.num("lifetime-ms", 15 * 60 * 1000)?);
        Ok(Self { listen: args.loopback("listen")?, model, threads, lifetime, header_read_timeout: None })
    }
}

/// Serves HTTP/1.1 (keep-alive) on `settings.listen` until its lifetime has
/// passed: one `answer` call per request, `answer` made by `make` once per
/// runtime.
pub fn serve<M, F, Fut, B>(settings: &Settings, make: M) -> Result<(), String>
where
    M: Fn() -> F + Sync,
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    println!(
        "{{\"listening\":\"{}\",\"runtime\":\"{}\",\"threads\":{}}}",
        settings.listen,
        settings.model.name(),
        settings.threads
    );
    match settings.model {
        Model::WorkStealing => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(settings.threads)
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(accept(settings, make()))
        }
        Model::PerCore => std::thread::scope(|scope| {
            let threads: Vec<_> = (0..settings.threads)
                .map(|_| {
                    scope.spawn(|| {
                        let runtime = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .map_err(|e| e.to_string())?;
                        runtime.block_on(accept(settings, make()))
                    })
                })
                .collect();
            threads.into_iter().try_for_each(|t| t.join().map_err(|_| "a server thread panicked".to_string())?)
        }),
    }
}

/// One runtime's accept loop; every connection is a task on this runtime.
async fn accept<F, Fut, B>(settings: &Settings, answer: F) -> Result<(), String>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = listener(settings.listen).map_err(|e| format!("listen on {}: {e}", settings.listen))?;
    crate::serve_listener(listener, settings.lifetime, settings.header_read_timeout, answer).await;
    Ok(())
}

/// A listener with `SO_REUSEPORT`, so every per-core runtime binds its own on
/// the same address (and a work-stealing one binds it alone).
fn listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}
