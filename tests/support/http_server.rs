//! The one accept loop of the tests' HTTP servers: binds `127.0.0.1:0`,
//! accepts every connection and serves it with hyper-util's auto builder
//! (HTTP/1 and HTTP/2, or HTTP/1 only), optionally behind TLS, calling a
//! handler for each request. Dropping the [`HttpServer`] stops it: the
//! listener closes and open connections are dropped.
//!
//! Unlike the gateway's own listener (`idemgate::http::listener`), it sets
//! no limits at all — no connection cap, no header or idle timeout beyond
//! hyper's defaults — so a test server behaves only as its handler says.
//! A handler's `Err` closes the connection without an answer.

use std::error::Error as StdError;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::{CancellationToken, DropGuard};

type BoxError = Box<dyn StdError + Send + Sync>;

/// How a server speaks; the default is plain HTTP/1 and HTTP/2 (auto).
#[derive(Clone, Default)]
pub struct Options {
    http1_only: bool,
    tls: Option<TlsAcceptor>,
    on_accept: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl Options {
    /// HTTP/1 only, as `hyper::server::conn::http1::Builder::new()` serves it.
    pub fn http1_only(mut self) -> Self {
        self.http1_only = true;
        self
    }

    /// A TLS handshake first on every connection; one that fails is dropped.
    pub fn tls(mut self, acceptor: TlsAcceptor) -> Self {
        self.tls = Some(acceptor);
        self
    }

    /// Called once for every connection accepted, before it is served.
    pub fn on_accept(mut self, count: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_accept = Some(Arc::new(count));
        self
    }
}

/// A running test server; dropping it stops it.
pub struct HttpServer {
    pub addr: SocketAddr,
    _stop: DropGuard,
}

impl HttpServer {
    /// Serves `handler` over plain HTTP/1 and HTTP/2 on a free loopback port.
    pub async fn start<F, Fut, B, E>(handler: F) -> Self
    where
        F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<B>, E>> + Send + 'static,
        E: Into<BoxError>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        Self::start_with(Options::default(), handler).await
    }

    /// Serves `handler` as `options` say on a free loopback port.
    pub async fn start_with<F, Fut, B, E>(options: Options, handler: F) -> Self
    where
        F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<B>, E>> + Send + 'static,
        E: Into<BoxError>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        if options.http1_only {
            builder = builder.http1_only();
        }
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = stopped.cancelled() => return,
                };
                let Ok((stream, _)) = accepted else { continue };
                if let Some(on_accept) = &options.on_accept {
                    on_accept();
                }
                let (builder, tls, service) =
                    (builder.clone(), options.tls.clone(), hyper::service::service_fn(handler.clone()));
                let stopped = stopped.clone();
                tokio::spawn(async move {
                    let served = async move {
                        let _ = match tls {
                            None => builder.serve_connection(TokioIo::new(stream), service).await,
                            Some(acceptor) => match acceptor.accept(stream).await {
                                Ok(stream) => builder.serve_connection(TokioIo::new(stream), service).await,
                                Err(_) => return,
                            },
                        };
                    };
                    tokio::select! {
                        () = served => {}
                        () = stopped.cancelled() => {}
                    }
                });
            }
        });
        Self { addr, _stop: stop.drop_guard() }
    }
}
