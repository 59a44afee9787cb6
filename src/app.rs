//! Wiring: config in, running gateway out. Shared by the binary and tests.

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::{Config, LogFormat};
use crate::gateway::Gateway;
use crate::gateway::server::{self, ServerLimits};
use crate::store::AnyStore;

/// Opens the store, binds the listener and serves until `shutdown` resolves.
pub async fn serve(config: &Config, shutdown: impl Future<Output = ()>) -> Result<(), String> {
    let gateway = build(config).await?;
    let listener = server::bind(config.listen).await?;
    serve_on(listener, gateway, config, shutdown).await
}

/// `serve --relay`: the gateway and the outbox relay in one process. One
/// signal stops both: the gateway drains, the relay finishes its batch.
pub async fn serve_with_relay(config: &Config, shutdown: impl Future<Output = ()>) -> Result<(), String> {
    let (relay, listen) = crate::outbox::relay::from_config(config).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let relay_task = tokio::spawn(relay.run(listen, stop.clone()));
    let gateway = serve(config, stop.clone().cancelled_owned());
    tokio::pin!(gateway);
    let served = tokio::select! {
        served = &mut gateway => served,
        _ = shutdown => {
            stop.cancel();
            gateway.await
        }
    };
    stop.cancel();
    relay_task.await.map_err(|e| e.to_string())?;
    served
}

/// Opens the store and builds the gateway (no listener yet).
pub async fn build(config: &Config) -> Result<Arc<Gateway<AnyStore>>, String> {
    if config.routes.is_empty() {
        return Err("no upstream configured: pass --upstream URL or add [[routes]] to the config file".into());
    }
    let store = AnyStore::open(config.store.expose())
        .await
        .map_err(|e| format!("cannot open store {}: {e}", config.store.redacted()))?;
    tracing::info!(store = store.kind(), routes = config.routes.len(), "store open");
    Ok(Arc::new(Gateway::new(config, store)?))
}

/// Serves a built gateway on a bound listener (tests bind port 0).
pub async fn serve_on(
    listener: TcpListener,
    gateway: Arc<Gateway<AnyStore>>,
    config: &Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(listen = %address, "idemgate gateway listening");
    let tls = match (&config.tls.cert_file, &config.tls.key_file) {
        (Some(cert), Some(key)) => Some(crate::gateway::tls::acceptor(cert, key)?),
        _ => None,
    };
    server::serve(listener, gateway, limits(config), tls, shutdown).await;
    Ok(())
}

/// The listener limits a config sets.
pub fn limits(config: &Config) -> ServerLimits {
    ServerLimits {
        max_connections: config.gateway.max_connections,
        header_read_timeout: config.gateway.header_read_timeout.0,
        shutdown_grace: config.gateway.shutdown_grace.0,
    }
}

/// Installs the log subscriber: `RUST_LOG` wins over `log.level`.
pub fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match config.log.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
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
