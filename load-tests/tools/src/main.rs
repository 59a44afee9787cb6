//! `lt`: the load-test harness's own tools, one binary with subcommands.
//!
//! wrk drives the closed-loop throughput scenarios; what wrk cannot do is
//! here, each bounded in count and time so it always stops by itself:
//!
//! - `upstream`: a counting upstream (P5) that records how often each
//!   `Idempotency-Key` reached it, with an optional delay so concurrent
//!   duplicates really overlap the first attempt.
//! - `burst`: P5's client — many concurrent requests on one key, repeated.
//! - `rate`: an open-loop generator at a fixed request rate (P6), latency
//!   measured from each request's *scheduled* send time so a stall is not
//!   hidden (no coordinated omission).
//! - `hold`: opens many keep-alive connections, sends one request on each,
//!   and holds them idle (P10).
//! - `sink`: the outbox relay's destination (P7, P8): answers at once and
//!   records each delivery's key and arrival time.
//! - `floor-proxy`: the *floor*, a minimal hyper reverse proxy (per core or
//!   work-stealing) that P1 is measured against; `--correct yes` adds what
//!   every correct proxy does and the floor leaves out (see its module).
//! - `floor-answer`: the *replay floor*, the same server answering a fixed
//!   `201` (P4, P11).
//! - `webhook`: a closed-loop generator of Stripe-signed webhook
//!   deliveries (W1), new or redelivered, each signed when it is sent.
//!
//! Every tool prints one JSON object on stdout for `load-tests/run` to read.
//! Targets are loopback addresses only; anything else is refused.

mod burst;
mod client;
mod floor;
mod floor_answer;
mod floor_proxy;
mod hold;
mod rate;
mod sink;
mod upstream;
mod webhook;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1);
    let Some(command) = argv.next() else {
        eprintln!("usage: lt upstream|burst|rate|hold|sink|floor-proxy|floor-answer|webhook --flag value ...");
        return ExitCode::from(2);
    };
    let result = Args::parse(argv).and_then(|args| match command.as_str() {
        "upstream" => upstream::main(&args),
        "burst" => burst::main(&args),
        "rate" => rate::main(&args),
        "hold" => hold::main(&args),
        "sink" => sink::main(&args),
        "floor-proxy" => floor_proxy::main(&args),
        "floor-answer" => floor_answer::main(&args),
        "webhook" => webhook::main(&args),
        other => Err(format!("unknown command {other:?}")),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("lt {command}: {message}");
            ExitCode::from(2)
        }
    }
}

/// `--name value` pairs; every tool documents its own.
pub struct Args(HashMap<String, String>);

impl Args {
    fn parse(argv: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut map = HashMap::new();
        let mut argv = argv.peekable();
        while let Some(flag) = argv.next() {
            let name = flag.strip_prefix("--").ok_or_else(|| format!("expected --flag, got {flag:?}"))?;
            let value = argv.next().ok_or_else(|| format!("--{name} needs a value"))?;
            map.insert(name.to_string(), value);
        }
        Ok(Self(map))
    }

    /// A string flag, or its default.
    pub fn str(&self, name: &str, default: &str) -> String {
        self.0.get(name).cloned().unwrap_or_else(|| default.to_string())
    }

    /// A number flag, or its default.
    pub fn num(&self, name: &str, default: u64) -> Result<u64, String> {
        self.0.get(name).map_or(Ok(default), |v| v.parse().map_err(|_| format!("--{name}: {v:?} is not a number")))
    }

    /// A loopback socket address (the only kind of target these tools accept).
    pub fn loopback(&self, name: &str) -> Result<SocketAddr, String> {
        let raw = self.0.get(name).ok_or_else(|| format!("--{name} is required"))?;
        let addr: SocketAddr = raw.parse().map_err(|_| format!("--{name}: {raw:?} is not host:port"))?;
        if !addr.ip().is_loopback() {
            return Err(format!("--{name}: {addr} is not a loopback address"));
        }
        Ok(addr)
    }
}

/// Latency samples in microseconds, summarised as percentiles.
pub fn percentiles(samples: &mut [u64]) -> String {
    samples.sort_unstable();
    let at = |q: f64| -> u64 {
        if samples.is_empty() {
            return 0;
        }
        let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        samples[rank - 1]
    };
    format!(
        "\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"p999_us\":{},\"max_us\":{}",
        at(0.50),
        at(0.90),
        at(0.99),
        at(0.999),
        at(1.0)
    )
}

/// A small multi-threaded runtime for the tools.
/// Serves HTTP/1.1 on `listen` (printing the bound address as JSON first),
/// one `answer` call per request, until `lifetime` has passed.
pub async fn serve_http<F, Fut>(listen: SocketAddr, lifetime: std::time::Duration, answer: F) -> Result<(), String>
where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<
            Output = Result<http::Response<http_body_util::Full<bytes::Bytes>>, std::convert::Infallible>,
        > + Send
        + 'static,
{
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| format!("bind {listen}: {e}"))?;
    println!("{{\"listening\":\"{}\"}}", listener.local_addr().map_err(|e| e.to_string())?);
    serve_listener(listener, lifetime, None, answer).await;
    Ok(())
}

/// Serves HTTP/1.1 connections from `listener`, each a task of its own on
/// the current runtime, one `answer` call per request, until `lifetime` has
/// passed; with `header_read_timeout`, a client gets that long for each
/// request head. The one accept loop of every server of the harness.
pub async fn serve_listener<F, Fut, B>(
    listener: tokio::net::TcpListener,
    lifetime: std::time::Duration,
    header_read_timeout: Option<std::time::Duration>,
    answer: F,
) where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<http::Response<B>, std::convert::Infallible>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    if let Some(timeout) = header_read_timeout {
        builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(timeout);
    }
    let serve = async {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let answer = answer.clone();
            let builder = builder.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(answer);
                let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
            });
        }
    };
    let _ = tokio::time::timeout(lifetime, serve).await;
}

pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build().map_err(|e| e.to_string())
}
