//! Wiring: config in, running processes out. Shared by the binary and tests.
//!
//! - this module: the gateway (`serve`, `serve --relay`), logging, signals;
//! - [`relay`]: `idemgate relay`;
//! - [`check`]: everything a config is checked for before anything starts,
//!   the same for `check-config`, `serve` and `relay`;
//! - [`open_files`]: the open-file limit, raised at start;
//! - [`cores`]: `runtime = "per-core"`, one runtime per core thread.

pub mod check;
mod cores;
mod error;
pub mod open_files;
pub mod relay;

pub use error::{StartError, WorkerThreadsError};

use std::sync::Arc;

use tokio::net::TcpListener;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

use crate::admin::{Admin, AdminAccess};
use crate::config::{Config, LogFormat, Runtime};
use crate::gateway::Gateway;
use crate::gateway::request_log::{self, LineFormat};
use crate::gateway::server;
use crate::http::listener::{BindError, ServerLimits, SharedListeners, bind, bind_shared};
use crate::log_sink;
use crate::metrics::Metrics;
use crate::store::AnyStore;

/// The listening sockets: client traffic and the admin listener.
pub struct Listeners {
    /// Client traffic: one listener, or one per core ([`bind_gateway`]).
    pub gateway: SharedListeners,
    /// Health, metrics and the admin API.
    pub admin: TcpListener,
}

/// Opens the store, binds both listeners and serves until `shutdown` resolves.
pub async fn serve(config: &Config, shutdown: impl Future<Output = ()>) -> Result<(), StartError> {
    let gateway = build(config).await?;
    let listeners = Listeners { gateway: bind_gateway(config).await?, admin: bind(config.admin_listen).await? };
    gateway.probe_upstreams();
    serve_on(listeners, gateway, config, shutdown).await
}

/// `serve --relay`: the gateway and the outbox relay in one process. One
/// signal stops both: the gateway drains, the relay finishes what it holds.
///
/// The gateway never waits for the outbox database: the relay is built
/// without connecting and waits for its database in the background (see
/// `outbox::relay::start`), so a database that is down at start delays
/// only the relaying. A wrong schema (a deployment error) stops both.
pub async fn serve_with_relay(config: &Config, shutdown: impl Future<Output = ()>) -> Result<(), StartError> {
    let gateway = build(config).await?;
    let (relay, listen) = relay::build(config)?;
    // One /metrics for both halves.
    let relay = relay.with_metrics(gateway.metrics().clone());
    let listeners = Listeners { gateway: bind_gateway(config).await?, admin: bind(config.admin_listen).await? };
    gateway.probe_upstreams();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut relay_task = tokio::spawn(relay.start(listen, stop.clone()));
    let gateway = serve_on(listeners, gateway, config, stop.clone().cancelled_owned());
    tokio::pin!(gateway);
    tokio::pin!(shutdown);
    let mut relay_failed = None;
    let served = tokio::select! {
        served = &mut gateway => served,
        () = &mut shutdown => {
            stop.cancel();
            gateway.await
        }
        finished = &mut relay_task => {
            let why = match finished {
                Ok(Ok(())) => StartError::RelayStopped("it ended before the gateway".into()),
                Ok(Err(e)) => StartError::Relay(e),
                Err(e) => StartError::RelayStopped(e.to_string()),
            };
            tracing::error!(error = %why, "outbox relay failed; stopping the gateway");
            relay_failed = Some(why);
            stop.cancel();
            gateway.await
        }
    };
    stop.cancel();
    if let Some(why) = relay_failed {
        return Err(why);
    }
    match relay_task.await {
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(StartError::RelayStopped(e.to_string())),
        Ok(Ok(())) => served,
    }
}

/// Opens the store and builds the gateway (no listener yet).
pub async fn build(config: &Config) -> Result<Arc<Gateway<AnyStore>>, StartError> {
    if config.routes.is_empty() {
        return Err(StartError::Missing(check::NO_ROUTES));
    }
    let store = open_store(config).await?;
    tracing::info!(store = store.kind(), routes = config.routes.len(), "store open");
    Ok(Arc::new(Gateway::new(config, store, Arc::new(Metrics::new()))?))
}

/// Opens the store the config names, with its sealing keys and quota.
async fn open_store(config: &Config) -> Result<AnyStore, StartError> {
    let sealer = crate::store::sealing::Sealer::from_config(&config.store_encryption)?.map(Arc::new);
    let store = AnyStore::open(config.store.expose(), sealer)
        .await
        .map_err(|source| StartError::Store { url: config.store.redacted(), source })?;
    Ok(store.with_quota(config.gateway.tenant_quota))
}

/// Binds the gateway's listener as `runtime` wants it: one, or one per
/// core thread sharing the address (`SO_REUSEPORT`). Port 0 is chosen once.
pub async fn bind_gateway(config: &Config) -> Result<SharedListeners, BindError> {
    match config.runtime {
        Runtime::WorkStealing => Ok(SharedListeners::one(bind(config.listen).await?)),
        Runtime::PerCore => bind_shared(config.listen, threads()).await,
    }
}

/// The variable Tokio takes its number of worker threads from; it sets
/// the number of core threads of `runtime = "per-core"` too.
pub const WORKER_THREADS: &str = "TOKIO_WORKER_THREADS";

/// The most worker threads asked for that are taken: beyond, a typo (an
/// extra zero) would abort the process at start, out of memory for stacks.
pub const MAX_WORKER_THREADS: usize = 1024;

/// The number of worker threads `TOKIO_WORKER_THREADS` asks for, read
/// here because Tokio would panic on a value that is not one.
pub fn worker_threads(value: Option<std::ffi::OsString>) -> Result<Option<usize>, WorkerThreadsError> {
    let Some(value) = value else { return Ok(None) };
    match value.to_str().map(|text| text.trim().parse::<usize>()) {
        Some(Ok(threads)) if (1..=MAX_WORKER_THREADS).contains(&threads) => Ok(Some(threads)),
        _ => Err(WorkerThreadsError(value)),
    }
}

/// Threads to serve on: `TOKIO_WORKER_THREADS` (the binary refuses a bad
/// value at start), or one per CPU the process may use.
pub fn threads() -> usize {
    worker_threads(std::env::var_os(WORKER_THREADS))
        .ok()
        .flatten()
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Serves a built gateway on bound listeners (tests bind port 0). The admin
/// listener stays up until the gateway has drained, so probes and metrics
/// keep answering during shutdown.
pub async fn serve_on(
    listeners: Listeners,
    gateway: Arc<Gateway<AnyStore>>,
    config: &Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let access = AdminAccess::from_config(&config.admin)?;
    if matches!(access, AdminAccess::Off) {
        tracing::warn!("admin API disabled: no admin token configured (IDEMGATE__ADMIN__TOKEN or admin.token_file)");
    }
    let tls = match (&config.tls.cert_file, &config.tls.key_file) {
        (Some(cert), Some(key)) => Some(crate::http::tls::acceptor(cert, key)?),
        _ => None,
    };
    let address = listeners.gateway.local_addr().ok();
    let admin_address = listeners.admin.local_addr().ok();
    let own = admin_address.unwrap_or(config.admin_listen);
    tracing::info!(listen = ?address, admin = ?admin_address, tls = tls.is_some(), "idemgate gateway listening");
    let destinations = config.destinations.keys().cloned().collect();
    let admin = Arc::new(
        Admin::new(gateway.clone(), access, own).with_outbox(outbox_database(config)?).with_destinations(destinations),
    );
    let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin_task = tokio::spawn(crate::admin::serve(listeners.admin, admin, async {
        let _ = admin_stopped.await;
    }));
    let limits = ServerLimits::from(&config.gateway);
    // Held until the listeners have stopped.
    let SharedListeners { listeners: gateway_listeners, claim: _claim } = listeners.gateway;
    let served = match config.runtime {
        Runtime::PerCore => cores::serve(gateway_listeners, gateway, config, limits, tls, shutdown).await,
        Runtime::WorkStealing => {
            // A set, so that a caller dropping this future stops them too.
            let slots = limits.connection_slots();
            let stop = tokio_util::sync::CancellationToken::new();
            let mut serving = tokio::task::JoinSet::new();
            for listener in gateway_listeners {
                let stopped = stop.clone().cancelled_owned();
                serving.spawn(server::serve(
                    listener,
                    gateway.clone(),
                    limits.clone(),
                    slots.clone(),
                    tls.clone(),
                    stopped,
                ));
            }
            shutdown.await;
            stop.cancel();
            serving.join_all().await;
            Ok(())
        }
    };
    let _ = stop_admin.send(());
    let _ = admin_task.await;
    served
}

/// The outbox database the admin API lists dead rows from, when the config
/// names one. Connections open lazily: a database that is down at start
/// shows in `/readyz`, it does not stop the gateway.
fn outbox_database(config: &Config) -> Result<Option<crate::postgres::Database>, StartError> {
    let Some(url) = &config.relay.database_url else { return Ok(None) };
    let schema = crate::postgres::Schema::new(&config.relay.schema)?;
    Ok(Some(crate::postgres::Database::connect(url.expose(), 2, schema)?))
}

/// Installs the log subscriber: `RUST_LOG` wins over `log.level`. Text
/// logs are coloured only on a terminal, and never with `NO_COLOR` set.
/// Lines go to stderr through the process's log buffer
/// ([`log_sink`]); hold the returned guard until the process ends: its
/// drop writes what is left.
pub fn init_logging(config: &Config) -> Option<log_sink::Flush> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let (sink, flush) = log_sink::start().unzip();
    let writer = match sink {
        Some(sink) => BoxMakeWriter::new(sink),
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colour).with_writer(writer);
    let (installed, format) = match config.log.format {
        LogFormat::Json => (builder.json().try_init(), LineFormat::Json),
        LogFormat::Text => (builder.try_init(), LineFormat::Text),
    };
    // Our subscriber, uncoloured: the gateway may write its request lines
    // itself, in the same format (`gateway::request_log`).
    if installed.is_ok() && !(colour && format == LineFormat::Text) {
        request_log::install(format);
    }
    flush
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
