//! One client connection: what a handler knows of it, and how long it may
//! sit idle.
//!
//! hyper bounds an HTTP/1.1 request's headers, but nothing bounds the time
//! before a new connection's first byte (the protocol sniffing of
//! `hyper_util`'s auto builder waits for ever) nor an idle HTTP/2
//! connection: a handful of silent sockets could hold every
//! `max_connections` slot. [`Activity`] counts the requests in flight on a
//! connection, and [`Activity::idle_for_too_long`] resolves when it has had
//! none for too long — `header_read_timeout` before its first request,
//! `idle_timeout` after one — so the listener can close it gracefully.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use http::HeaderValue;

use super::request_body::BodyBudget;
use super::sending::Sending;

/// What a request handler knows of the connection it came on.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// Who connected, and over TLS or not.
    pub client: ClientInfo,
    /// Request-body bytes this connection may hold buffered at once.
    pub body_budget: BodyBudget,
    /// Slots for work a request leaves running after its stream is gone
    /// (the gateway's guarded attempts, which settle their records however
    /// the client leaves): HTTP/2 stops counting a stream the client
    /// resets, so without these one connection that resets every stream
    /// could start any number of upstream calls. As many as the
    /// connection's concurrent streams.
    pub running: Arc<Semaphore>,
    /// Bytes of settled answers this connection may hold for its client
    /// (`connection_response_budget`, [`super::sending`]).
    pub response_budget: super::sending::ResponseBudget,
}

/// Who sent a request, as the listener saw it.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    /// The peer address.
    pub addr: SocketAddr,
    /// `true` when the client connected over TLS.
    pub tls: bool,
    /// The peer's IP as a header value, rendered once per connection.
    ip: HeaderValue,
}

impl ClientInfo {
    /// The client at `addr`, over TLS or not.
    pub fn new(addr: SocketAddr, tls: bool) -> Self {
        let ip = HeaderValue::from_str(&addr.ip().to_string()).expect("an IP address is a valid header value");
        Self { addr, tls, ip }
    }

    /// The peer's IP, rendered as a header value.
    pub fn ip(&self) -> &HeaderValue {
        &self.ip
    }
}

/// Requests in flight on one connection, and since when it has had none.
///
/// Kept to two atomic stores per request and no wake-up: the watcher does
/// not hear about each request, it looks when its timer fires and sleeps
/// on if the connection was busy.
#[derive(Debug)]
pub struct Activity {
    born: Instant,
    in_flight: AtomicUsize,
    started: AtomicU64,
    /// Milliseconds after `born` at which the last request ended.
    idle_since_ms: AtomicU64,
    /// The service returned a response whose head is not written yet
    /// ([`super::refusal`]).
    answered: AtomicBool,
    /// Large response bodies still being sent ([`super::sending`]).
    sending: Sending,
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

impl Activity {
    /// A connection that has just been accepted.
    pub fn new() -> Self {
        Self {
            born: Instant::now(),
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(0),
            answered: AtomicBool::new(false),
            sending: Sending::default(),
        }
    }

    /// The connection's large response bodies still being sent.
    pub fn sending(&self) -> &Sending {
        &self.sending
    }

    /// Marks a response returned by the service: the next write carries it.
    pub fn answered(&self) {
        self.answered.store(true, Ordering::Release);
    }

    /// Whether a response was returned since the last call.
    pub fn take_answered(&self) -> bool {
        self.answered.swap(false, Ordering::AcqRel)
    }

    /// Marks a request in flight until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.started.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Resolves once the connection has had no request in flight for
    /// `first` (before any request) or `idle` (after one). While requests
    /// are in flight it looks again every `idle`, so it closes at most one
    /// `idle` late after a long request, never early.
    pub async fn idle_for_too_long(&self, first: Duration, idle: Duration) {
        loop {
            let now = Instant::now();
            let deadline = if self.in_flight() > 0 {
                now + idle
            } else {
                let limit = if self.started.load(Ordering::Relaxed) == 0 { first } else { idle };
                self.born + Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed)) + limit
            };
            if deadline <= now {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A request in flight on a connection (see [`Activity::begin`]).
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        let now = u64::try_from(activity.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        activity.idle_since_ms.store(now, Ordering::Relaxed);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_idle_after_the_first_request_timeout() {
        let activity = Arc::new(Activity::new());
        let started = Instant::now();
        activity.idle_for_too_long(Duration::from_secs(2), Duration::from_secs(60)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_the_connection_and_the_idle_clock_restarts_after_it() {
        let activity = Arc::new(Activity::new());
        let request = activity.begin();
        let watcher = {
            let activity = activity.clone();
            tokio::spawn(
                async move { activity.idle_for_too_long(Duration::from_secs(2), Duration::from_secs(5)).await },
            )
        };
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!watcher.is_finished(), "idle while a request was in flight");
        let ended = Instant::now();
        drop(request);
        watcher.await.unwrap();
        // Closed one idle period after the request ended, or at the next
        // look after that: never before.
        let waited = ended.elapsed();
        assert!(waited >= Duration::from_secs(5) && waited <= Duration::from_secs(10), "{waited:?}");
    }
}
