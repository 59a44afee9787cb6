//! The listener: accepts connections, serves HTTP/1.1 and h2c, shuts down
//! gracefully.
//!
//! Bounded on every axis: at most `max_connections` open connections (the
//! accept loop waits for a free slot, so excess clients queue in the
//! kernel's backlog instead of costing memory), a header read timeout
//! against slow clients, and a shutdown grace period. On shutdown the
//! listener closes, open connections finish their current requests, and
//! upstream attempts already running are awaited so their records are
//! completed or released rather than left in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use tokio_rustls::TlsAcceptor;

use super::Gateway;
use super::upstream::ClientInfo;
use crate::store::Store;

/// Limits of the listener.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// Time allowed for a client to send its request headers.
    pub header_read_timeout: Duration,
    /// Time allowed for in-flight work after shutdown starts.
    pub shutdown_grace: Duration,
}

/// Serves the gateway on `listener` until `shutdown` resolves, then drains.
/// With `tls`, every connection is a TLS handshake first (bounded by the
/// header read timeout), then h2 or HTTP/1.1 as ALPN chose.
pub async fn serve<S: Store>(
    listener: TcpListener,
    gateway: Arc<Gateway<S>>,
    limits: ServerLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(256);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { break };
        let (stream, addr) = tokio::select! {
            accepted = accept(&listener, "gateway") => accepted,
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let client = ClientInfo::new(addr, tls.is_some());
        let gateway = gateway.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let gateway = gateway.clone();
            let client = client.clone();
            async move { Ok::<_, std::convert::Infallible>(gateway.handle(request, client).await) }
        });
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let handshake_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let result = match tls {
                None => {
                    watcher
                        .watch(builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned())
                        .await
                }
                Some(acceptor) => match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        watcher
                            .watch(builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned())
                            .await
                    }
                    Ok(Err(e)) => Err(e.into()),
                    Err(_) => Err("TLS handshake timed out".into()),
                },
            };
            if let Err(e) = result {
                tracing::debug!(client = %addr, error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    tracing::info!("shutting down: draining connections and upstream attempts");
    let grace = limits.shutdown_grace;
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(?grace, "connections still open after the grace period; closing them");
    }
    gateway.tasks().close();
    if tokio::time::timeout(grace, gateway.tasks().wait()).await.is_err() {
        tracing::warn!("upstream attempts still running after the grace period; their leases will expire");
    }
}

/// The next connection. An accept error (EMFILE and friends) is logged and
/// backed off from instead of spinning.
pub(crate) async fn accept(listener: &TcpListener, name: &str) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(listener = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves an internal listener (admin, relay admin): plain HTTP, one
/// `handle` call per request, until `shutdown` resolves.
pub(crate) async fn serve_internal<F, Fut>(
    listener: TcpListener,
    name: &'static str,
    handle: F,
    shutdown: impl Future<Output = ()>,
) where
    F: Fn(hyper::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = hyper::Response<super::body::ResponseBody>> + Send + 'static,
{
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = accept(&listener, name) => accepted,
            () = &mut shutdown => return,
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let response = handle(request);
                async move { Ok::<_, std::convert::Infallible>(response.await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// Binds a listener, with a clear error.
pub async fn bind(address: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(address).await.map_err(|e| format!("cannot listen on {address}: {e}"))
}
