//! The listeners: one accept loop serves HTTP/1.1, h2c and (with a
//! certificate) TLS for the gateway and the internal listeners (admin,
//! relay admin, demo) alike, and shuts down gracefully.
//!
//! Bounded on every axis:
//! - at most `max_connections` open connections (the accept loop waits for a
//!   free slot, so excess clients queue in the kernel's backlog instead of
//!   costing memory);
//! - a TLS handshake, a new connection's first request and every HTTP/1.1
//!   request's headers within `header_read_timeout`; a connection with no
//!   request in flight for `idle_timeout` is closed ([`super::connection`]);
//! - at most `max_streams_per_connection` concurrent HTTP/2 streams, as
//!   many requests still running after their stream was reset
//!   ([`ConnectionInfo::running`]), `connection_body_budget` bytes of
//!   request bodies buffered per connection ([`super::request_body`]), and
//!   `connection_response_budget` bytes of settled answers held for its
//!   client ([`super::sending`]);
//! - a shutdown grace period: on shutdown the listener closes and open
//!   connections finish their current requests (idle ones close at once).
//!
//! The protocol is known before hyper sees a byte: on plaintext from the
//! first bytes, peeked and left unread ([`sniff`]: HTTP/2's preface or not),
//! over TLS from ALPN. A connection then starts on its own protocol's
//! parser, and an HTTP/1.1 connection keeps one 8 KiB read buffer, not 16.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::accept_errors::AcceptErrors;
use super::body::{BoxError, BoxedBody};
use super::connection::{Activity, ClientInfo, ConnectionInfo};
use super::request_body::BodyBudget;

mod binding;
mod limits;
pub use binding::{BindError, Claim, SharedListeners, bind, bind_shared};
pub use limits::ServerLimits;

/// The one accept loop: serves `handle` on every connection of `listener`
/// under `limits` until `shutdown` resolves, then lets open connections
/// finish their requests for up to `limits.shutdown_grace`. Each open
/// connection holds one of `slots` (`max_connections` of them, shared by
/// the listeners of one process: see [`bind_shared`]).
pub async fn serve_listener<F, Fut>(
    listener: TcpListener,
    name: &'static str,
    limits: &ServerLimits,
    slots: Arc<Semaphore>,
    tls: Option<TlsAcceptor>,
    handle: F,
    shutdown: impl Future<Output = ()>,
) where
    F: Fn(hyper::Request<Incoming>, Arc<ConnectionInfo>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = hyper::Response<BoxedBody>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's own limit of 100 header fields stays: raising it makes hyper
    // allocate its header index for every request instead of keeping it inline.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(limits.max_streams_per_connection);
    let builders =
        Arc::new(Builders { http1: builder.clone().http1_only(), http2: builder.clone().http2_only(), builder });
    let closing = CancellationToken::new();
    let connections = TaskTracker::new();
    let mut accept_errors = AcceptErrors::default();
    tokio::pin!(shutdown);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { break };
        let (stream, addr) = tokio::select! {
            accepted = accept(&listener, name, &mut accept_errors) => accepted,
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let connection = Arc::new(ConnectionInfo {
            client: ClientInfo::new(addr, tls.is_some()),
            body_budget: BodyBudget::new(limits.connection_body_budget),
            running: Arc::new(Semaphore::new(limits.max_streams_per_connection as usize)),
            response_budget: super::sending::ResponseBudget::new(limits.connection_response_budget),
        });
        let activity = Arc::new(Activity::new());
        let service = {
            let activity = activity.clone();
            let handle = handle.clone();
            hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                let in_flight = activity.begin();
                super::head::detach_request(&mut request);
                let response = handle(request, connection.clone());
                let answered = activity.clone();
                async move {
                    let response = response.await.map(|body| super::sending::watch(&answered, body));
                    answered.answered();
                    drop(in_flight);
                    Ok::<_, std::convert::Infallible>(response)
                }
            })
        };
        let builders = builders.clone();
        let tls = tls.clone();
        let closing = closing.clone();
        let limits = limits.clone();
        connections.spawn(async move {
            let served = match tls {
                None => {
                    // Before the first request the idle watcher's limit is
                    // `header_read_timeout` from the accept: so is this wait.
                    let speaks = tokio::select! {
                        speaks = tokio::time::timeout(limits.header_read_timeout, sniff(&stream)) => speaks,
                        () = closing.cancelled() => Ok(Ok(Speaks::Unknown)),
                    };
                    match speaks {
                        Ok(Ok(speaks)) if !closing.is_cancelled() => {
                            let builder = builders.pick(speaks);
                            serve_connection(builder, stream, service, &activity, &limits, &closing).await
                        }
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(e)) => Err(e.into()),
                        Err(_) => Err("no request within the header read timeout".into()),
                    }
                }
                // Boxed: a TLS stream and its handshake are kilobytes, and
                // every plaintext connection's task would be sized for them.
                Some(acceptor) => {
                    Box::pin(serve_tls(acceptor, &builders, stream, service, &activity, &limits, &closing)).await
                }
            };
            if let Err(e) = served {
                tracing::debug!(listener = name, client = %addr, error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    if limits.shutdown_grace.is_zero() {
        return;
    }
    tracing::info!(listener = name, "shutting down: draining connections");
    closing.cancel();
    connections.close();
    let grace = limits.shutdown_grace;
    if tokio::time::timeout(grace, connections.wait()).await.is_err() {
        tracing::warn!(listener = name, ?grace, "connections still open after the grace period; closing them");
    }
}

/// The protocol a connection speaks, as far as its first bytes tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    Http1,
    Http2,
    /// Too few bytes to tell (or none): hyper_util's auto builder decides.
    Unknown,
}

/// The HTTP/2 connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One builder per protocol, and the auto-detecting one.
struct Builders {
    builder: auto::Builder<TokioExecutor>,
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn pick(&self, speaks: Speaks) -> &auto::Builder<TokioExecutor> {
        match speaks {
            Speaks::Http1 => &self.http1,
            Speaks::Http2 => &self.http2,
            Speaks::Unknown => &self.builder,
        }
    }
}

/// Tells the protocol of a plaintext connection from its first bytes,
/// without consuming them. The auto builder would read them itself (up to
/// the preface's 24 bytes) and replay them to hyper's HTTP/1 parser as a
/// read of their own; the parser's next read then finds its 8 KiB buffer
/// 24 bytes short and doubles it, so every HTTP/1 connection would hold a
/// 16 KiB read buffer for its whole life.
async fn sniff(stream: &TcpStream) -> std::io::Result<Speaks> {
    let mut first = [0u8; PREFACE.len()];
    let seen = stream.peek(&mut first).await?;
    Ok(speaks(&first[..seen]))
}

fn speaks(first: &[u8]) -> Speaks {
    if first.len() == PREFACE.len() && first == PREFACE {
        Speaks::Http2
    } else if PREFACE.starts_with(first) {
        Speaks::Unknown
    } else {
        Speaks::Http1
    }
}

/// The TLS handshake within `header_read_timeout`, then the connection in
/// the protocol ALPN chose.
async fn serve_tls<S>(
    acceptor: TlsAcceptor,
    builders: &Builders,
    stream: TcpStream,
    service: S,
    activity: &Arc<Activity>,
    limits: &ServerLimits,
    closing: &CancellationToken,
) -> Result<(), BoxError>
where
    S: hyper::service::Service<
            hyper::Request<Incoming>,
            Response = hyper::Response<BoxedBody>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let speaks = match stream.get_ref().1.alpn_protocol() {
                Some(b"h2") => Speaks::Http2,
                Some(b"http/1.1") => Speaks::Http1,
                _ => Speaks::Unknown,
            };
            serve_connection(builders.pick(speaks), stream, service, activity, limits, closing).await
        }
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err("TLS handshake timed out".into()),
    }
}

/// Serves one connection until it ends, closing it gracefully once it has
/// been idle too long or the listener shuts down.
async fn serve_connection<I, S>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: S,
    activity: &Arc<Activity>,
    limits: &ServerLimits,
    closing: &CancellationToken,
) -> Result<(), BoxError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            hyper::Request<Incoming>,
            Response = hyper::Response<BoxedBody>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    // hyper's bare answers to heads it cannot parse become problems.
    let io = super::refusal::Refusals::new(io, activity.clone());
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let idle = activity.idle_for_too_long(limits.header_read_timeout, limits.idle_timeout);
    tokio::pin!(idle);
    let stalled = activity.sending().stalled(limits.send_timeout);
    tokio::pin!(stalled);
    // A graceful close needs the peer's help in HTTP/2 (GOAWAY, then a PING
    // it must acknowledge): a connection still open this long after one was
    // asked for, with no request in flight, is dropped.
    let drop_after = limits.header_read_timeout;
    let overdue = tokio::time::sleep(Duration::MAX);
    tokio::pin!(overdue);
    let mut closing_down = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => return served,
            // Records are settled before they are answered: dropping the
            // connection frees its responses and unsettles nothing.
            () = &mut stalled => {
                return Err(format!("a response waited {:?} for its client to read it", limits.send_timeout).into());
            }
            () = &mut idle, if !closing_down => {
                closing_down = true;
                connection.as_mut().graceful_shutdown();
                overdue.as_mut().reset(tokio::time::Instant::now() + drop_after);
            }
            () = closing.cancelled(), if !closing_down => {
                closing_down = true;
                connection.as_mut().graceful_shutdown();
                overdue.as_mut().reset(tokio::time::Instant::now() + drop_after);
            }
            () = &mut overdue, if closing_down => {
                if activity.in_flight() == 0 {
                    return Ok(());
                }
                overdue.as_mut().reset(tokio::time::Instant::now() + drop_after);
            }
        }
    }
}

/// The next connection. An accept error (EMFILE and friends) is backed off
/// from instead of spinning, and logged at most once a second.
async fn accept(listener: &TcpListener, name: &str, errors: &mut AcceptErrors) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                if let Some(left_out) = errors.note(std::time::Instant::now()) {
                    tracing::warn!(listener = name, error = %e, left_out, "accept failed (left_out: failures since the last such line)");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves an internal listener (admin, relay admin, demo): one `handle`
/// call per request, under [`ServerLimits::internal`], until `shutdown`.
pub async fn serve_internal<F, Fut>(
    listener: TcpListener,
    name: &'static str,
    handle: F,
    shutdown: impl Future<Output = ()>,
) where
    F: Fn(hyper::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = hyper::Response<BoxedBody>> + Send + 'static,
{
    let handle = move |request, _: Arc<ConnectionInfo>| handle(request);
    let limits = ServerLimits::internal();
    let slots = limits.connection_slots();
    serve_listener(listener, name, &limits, slots, None, handle, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_tell_the_protocol_only_when_they_can() {
        assert_eq!(speaks(PREFACE), Speaks::Http2);
        assert_eq!(speaks(b"POST /v1/charges HTTP/1.1\r\n"), Speaks::Http1);
        assert_eq!(speaks(b"G"), Speaks::Http1);
        assert_eq!(speaks(b"PRX"), Speaks::Http1);
        // A prefix of the preface (a first segment of "P", say) could be
        // either: the auto builder reads on until it knows.
        assert_eq!(speaks(b"P"), Speaks::Unknown);
        assert_eq!(speaks(&PREFACE[..23]), Speaks::Unknown);
        assert_eq!(speaks(b""), Speaks::Unknown);
    }
}
