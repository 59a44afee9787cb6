//! `runtime = "per-core"`: one single-threaded Tokio runtime per thread,
//! as Pingora's no-steal runtime does, instead of one work-stealing pool.
//!
//! Each core thread owns one of the `SO_REUSEPORT` listeners bound by
//! [`super::bind_gateway`] (the kernel spreads new connections over them),
//! and a gateway of its own ([`Gateway::sibling`]): its upstream pools, its
//! attempt tracker, and for Redis its own multiplexed connection, opened on
//! that core so its I/O never crosses threads. What must stay one per
//! process is shared: the memory store and the Postgres pool
//! ([`AnyStore::share`]), metrics and the console's recent outcomes, the
//! `max_connections` slots, the request log, and shutdown. The admin
//! listener and the relay stay on the main runtime.
//!
//! A connection stays on the core that accepted it: a few long-lived
//! client connections (a sidecar's) may all land on one core.
//!
//! On shutdown every core drains its own connections and attempts, and
//! then keeps its runtime running until every core has drained: a pooled
//! Postgres connection that one core's runtime drives may be settling
//! another core's record.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::StartError;
use crate::config::{Config, ServiceUrl};
use crate::gateway::{Gateway, server};
use crate::http::listener::ServerLimits;
use crate::store::AnyStore;

/// What one core needs to serve, moved onto its thread.
struct Core {
    listener: std::net::TcpListener,
    base: Arc<Gateway<AnyStore>>,
    /// The store's URL, for a Redis store's connection of this core.
    store_url: ServiceUrl,
    limits: ServerLimits,
    slots: Arc<Semaphore>,
    tls: Option<TlsAcceptor>,
    stop: CancellationToken,
    all_drained: CancellationToken,
}

/// Serves the gateway on `listeners`, one core thread each, until
/// `shutdown` resolves; returns once every core has drained. `base` is
/// the main runtime's gateway (the admin API's): the cores share its
/// metrics, recent outcomes and, where it can be shared, its store.
pub(super) async fn serve(
    listeners: Vec<TcpListener>,
    base: Arc<Gateway<AnyStore>>,
    config: &Config,
    limits: ServerLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let slots = limits.connection_slots();
    let stop = CancellationToken::new();
    let all_drained = CancellationToken::new();
    // A caller that drops this future stops the cores too.
    let _stop_on_drop = (stop.clone().drop_guard(), all_drained.clone().drop_guard());
    // Each core says here how it ended; one that ends before `shutdown`
    // could not start (or broke), and stops the others.
    let (ended, mut endings) = mpsc::unbounded_channel();
    let cores = listeners.len();
    for (index, listener) in listeners.into_iter().enumerate() {
        let core = Core {
            listener: listener.into_std().map_err(|e| StartError::Core(format!("listener: {e}")))?,
            base: base.clone(),
            store_url: config.store.clone(),
            limits: limits.clone(),
            slots: slots.clone(),
            tls: tls.clone(),
            stop: stop.clone(),
            all_drained: all_drained.clone(),
        };
        let ended = ended.clone();
        let spawned =
            std::thread::Builder::new().name(format!("idemgate-core-{index}")).spawn(move || run(core, ended));
        if let Err(e) = spawned {
            stop.cancel();
            all_drained.cancel();
            return Err(StartError::Core(format!("thread: {e}")));
        }
    }
    drop(ended);
    tracing::info!(cores, "serving with one runtime per core");
    let mut result = Ok(());
    let mut remaining = cores;
    tokio::select! {
        () = shutdown => {}
        Some(early) = endings.recv() => {
            remaining -= 1;
            result = early.and(Err(StartError::Core("a core stopped serving on its own".into())));
        }
    }
    stop.cancel();
    while remaining > 0 {
        let Some(ending) = endings.recv().await else { break };
        remaining -= 1;
        result = result.and(ending);
    }
    all_drained.cancel();
    result
}

/// One core's thread: its runtime, its gateway, its listener, until
/// stopped; says on `ended` how it ended, and then keeps its runtime up
/// until every core has drained.
fn run(core: Core, ended: mpsc::UnboundedSender<Result<(), StartError>>) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ended.send(Err(StartError::Core(format!("runtime: {e}"))));
            return;
        }
    };
    let all_drained = core.all_drained.clone();
    runtime.block_on(async move {
        let _ = ended.send(serve_core(core).await);
        all_drained.cancelled().await;
    });
}

async fn serve_core(core: Core) -> Result<(), StartError> {
    let listener = TcpListener::from_std(core.listener).map_err(|e| StartError::Core(format!("listener: {e}")))?;
    let url = &core.store_url;
    let store = core.base.store().sibling(url.expose()).await;
    let store = store.map_err(|source| StartError::Store { url: url.redacted(), source })?;
    let gateway = Arc::new(core.base.sibling(store));
    server::serve(listener, gateway, core.limits, core.slots, core.tls, core.stop.cancelled_owned()).await;
    Ok(())
}
