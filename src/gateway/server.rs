//! Serving the gateway: the shared listener ([`crate::http::listener`])
//! with the gateway as its handler, then a drain of upstream attempts, so
//! their records are settled rather than left in flight.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::Gateway;
use crate::http::connection::ConnectionInfo;
use crate::http::listener::{ServerLimits, serve_listener};
use crate::store::Store;

/// Serves the gateway on `listener` until `shutdown` resolves, then drains
/// connections and upstream attempts. Open connections hold `slots`.
pub async fn serve<S: Store>(
    listener: TcpListener,
    gateway: Arc<Gateway<S>>,
    limits: ServerLimits,
    slots: Arc<Semaphore>,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let handler = gateway.clone();
    let handle = move |request, connection: Arc<ConnectionInfo>| {
        let gateway = handler.clone();
        async move { gateway.handle(request, &connection).await }
    };
    serve_listener(listener, "gateway", &limits, slots, tls, handle, shutdown).await;
    gateway.tasks().close();
    let grace = limits.shutdown_grace;
    if tokio::time::timeout(grace, gateway.tasks().wait()).await.is_err() {
        tracing::warn!("upstream attempts still running after the grace period; their leases will expire");
    }
}
