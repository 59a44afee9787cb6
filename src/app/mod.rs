//! Wiring: config in, running processes out. Shared by the binary and tests.
//!
//! - this module: the gateway (`serve`, `serve --relay`), logging, signals;
//! - [`relay`]: `idemgate relay`;
//! - [`check`]: everything a config is checked for before anything starts,
//!   the same for `check-config`, `serve` and `relay`;
//! - [`open_files`]: the open-file limit, raised at start.

pub mod check;
mod error;
pub mod open_files;
pub mod relay;

pub use error::StartError;

use std::sync::Arc;

use tokio::net::TcpListener;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

use crate::admin::{Admin, AdminAccess};
use crate::config::{Config, LogFormat};
use crate::gateway::Gateway;
use crate::gateway::request_log::{self, LineFormat};
use crate::gateway::server;
use crate::http::listener::{ServerLimits, bind};
use crate::log_sink;
use crate::metrics::Metrics;
use crate::store::AnyStore;

/// The two listening sockets: client traffic and the admin listener.
pub struct Listeners {
    /// Client traffic.
    pub gateway: TcpListener,
    /// Health, metrics and the admin API.
    pub admin: TcpListener,
}

/// Opens the store, binds both listeners and serves until `shutdown` resolves.
pub async fn serve(config: &Config, shutdown: impl Future<Output = ()>) -> Result<(), StartError> {
    let gateway = build(config).await?;
    let listeners = Listeners { gateway: bind(config.listen).await?, admin: bind(config.admin_listen).await? };
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
    let listeners = Listeners { gateway: bind(config.listen).await?, admin: bind(config.admin_listen).await? };
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
    let sealer = crate::store::sealing::Sealer::from_config(&config.store_encryption)?.map(Arc::new);
    let store = AnyStore::open(config.store.expose(), sealer)
        .await
        .map_err(|source| StartError::Store { url: config.store.redacted(), source })?
        .with_quota(config.gateway.tenant_quota);
    tracing::info!(store = store.kind(), routes = config.routes.len(), "store open");
    Ok(Arc::new(Gateway::new(config, store, Arc::new(Metrics::new()))?))
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
    server::serve(listeners.gateway, gateway, limits(config), tls, shutdown).await;
    let _ = stop_admin.send(());
    let _ = admin_task.await;
    Ok(())
}

/// The outbox database the admin API lists dead rows from, when the config
/// names one. Connections open lazily: a database that is down at start
/// shows in `/readyz`, it does not stop the gateway.
fn outbox_database(config: &Config) -> Result<Option<crate::postgres::Database>, StartError> {
    let Some(url) = &config.relay.database_url else { return Ok(None) };
    let schema = crate::postgres::Schema::new(&config.relay.schema)?;
    Ok(Some(crate::postgres::Database::connect(url.expose(), 2, schema)?))
}

/// The listener limits a config sets.
pub fn limits(config: &Config) -> ServerLimits {
    let g = &config.gateway;
    ServerLimits {
        max_connections: g.max_connections,
        header_read_timeout: g.header_read_timeout.0,
        idle_timeout: g.idle_timeout.0,
        max_streams_per_connection: g.max_streams_per_connection,
        connection_body_budget: g.connection_body_budget.0,
        connection_response_budget: g.connection_response_budget.0,
        shutdown_grace: g.shutdown_grace.0,
        send_timeout: g.send_timeout.0,
    }
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
