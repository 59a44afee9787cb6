//! Wake-ups: `LISTEN idemgate_outbox` on a connection of its own.
//!
//! The listening connection lives outside the pool: a pooled connection
//! would be recycled or shared, and LISTEN belongs to one session. Every
//! notification (`enqueue` and `redrive` send one per transaction) is
//! handed to a callback with its payload ([`listen_with`]; the relay wakes
//! the lane of the destination it names, or every lane when it names none),
//! or wakes a [`Notify`] ([`listen`]), which keeps one permit, so a
//! notification that arrives while a claim runs starts the next at once.
//!
//! Notifications are only a hint. If this connection drops it reconnects
//! with a bounded backoff, calling back once after each (re)connect with an
//! empty payload (anything may have been missed); meanwhile the relay's polling keeps
//! delivering. A lost notification costs at most one poll interval.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use super::CHANNEL;
use crate::postgres::{Endpoint, ErrorChain};

const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// Listens until `stop` is cancelled, waking `wake` on every notification.
pub async fn listen(endpoint: Endpoint, wake: Arc<Notify>, stop: CancellationToken) {
    listen_with(endpoint, move |_: &str| wake.notify_one(), stop).await;
}

/// Listens until `stop` is cancelled, reconnecting as needed, with the
/// endpoint's TLS settings, calling `notified` with each notification's
/// payload (`""` after each (re)connect). The session shows as
/// `application_name = idemgate-listen` unless the URL names one.
pub async fn listen_with(mut endpoint: Endpoint, notified: impl Fn(&str) + Send + Sync, stop: CancellationToken) {
    if endpoint.config.get_application_name().is_none() {
        endpoint.config.application_name("idemgate-listen");
    }
    let mut delay = RECONNECT_MIN;
    loop {
        let mut connected = false;
        // A server that accepts but never answers must not hold a shutdown.
        let attempt = tokio::select! {
            result = listen_once(&endpoint, &notified, &stop, &mut connected) => result,
            () = stop.cancelled() => return,
        };
        match attempt {
            Ok(()) if stop.is_cancelled() => return,
            Ok(()) => tracing::warn!("outbox LISTEN connection closed; reconnecting"),
            Err(e) => tracing::warn!(error = %ErrorChain(&e), "outbox LISTEN connection failed; polling continues"),
        }
        // A connection that worked starts the backoff over.
        if connected {
            delay = RECONNECT_MIN;
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.cancelled() => return,
        }
        delay = (delay * 2).min(RECONNECT_MAX);
    }
}

async fn listen_once(
    endpoint: &Endpoint,
    notified: &(impl Fn(&str) + Send + Sync),
    stop: &CancellationToken,
    connected: &mut bool,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = endpoint.connect().await?;
    let driver = async {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(notification))) => notified(notification.payload()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    };
    tokio::pin!(driver);
    let statement = format!("LISTEN {CHANNEL}");
    // The connection must be driven while LISTEN runs.
    tokio::select! {
        result = client.batch_execute(&statement) => result?,
        result = &mut driver => return result,
    }
    tracing::debug!("outbox LISTEN connected");
    *connected = true;
    // Anything enqueued before LISTEN took effect sent its notification to no one.
    notified("");
    tokio::select! {
        result = &mut driver => result,
        _ = stop.cancelled() => Ok(()),
    }
}
