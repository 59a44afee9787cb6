//! Why a command could not start or stopped: one error for the wiring,
//! each variant the error of the room that refused, so the binary prints
//! one line naming the field, file or address at fault.

use crate::admin::TokenError;
use crate::config::ConfigError;
use crate::gateway::BuildError;
use crate::http::listener::BindError;
use crate::http::tls::TlsError;
use crate::outbox::OutboxError;
use crate::outbox::publisher::PublisherError;
use crate::postgres::PostgresError;
use crate::store::StoreError;
use crate::store::sealing::SealingError;

use super::{MAX_WORKER_THREADS, WORKER_THREADS};

/// Why `serve`, `relay` or `check-config` stopped.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The config is not valid on its own.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A route, or a header name of the gateway's (boxed: it is large, and rare).
    #[error(transparent)]
    Gateway(Box<BuildError>),
    /// The listener's certificate or key (boxed likewise).
    #[error(transparent)]
    Tls(Box<TlsError>),
    /// The admin token.
    #[error(transparent)]
    AdminToken(#[from] TokenError),
    /// The store's sealing keys.
    #[error(transparent)]
    Sealing(#[from] SealingError),
    /// A listener could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The store could not be opened (`url` redacted).
    #[error("cannot open store {url}: {source}")]
    Store {
        /// The store URL, password redacted.
        url: String,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// A destination of the relay.
    #[error(transparent)]
    Destination(#[from] PublisherError),
    /// The outbox database's URL or schema.
    #[error(transparent)]
    Postgres(#[from] PostgresError),
    /// The relay stopped on what no retry can fix (a wrong schema, a refused login).
    #[error(transparent)]
    Relay(#[from] OutboxError),
    /// Something the command needs is not configured; says what and where.
    #[error("{0}")]
    Missing(&'static str),
    /// The outbox half of the config (database URL, destinations).
    #[error(transparent)]
    OutboxConfig(#[from] crate::outbox::check::CheckError),
    /// A core thread of `runtime = "per-core"` could not start or stopped.
    #[error("a core of the per-core runtime failed: {0}")]
    Core(String),
    /// The relay's task ended abnormally.
    #[error("the outbox relay stopped: {0}")]
    RelayStopped(String),
}

/// `TOKIO_WORKER_THREADS` holds what is not a number of threads from 1 to
/// [`MAX_WORKER_THREADS`](super::MAX_WORKER_THREADS) (the value as set).
#[derive(Debug, thiserror::Error)]
#[error(
    "{WORKER_THREADS}={0:?} is not a number of worker threads: write a whole number from 1 to \
     {MAX_WORKER_THREADS}, or unset it for one per CPU"
)]
pub struct WorkerThreadsError(pub std::ffi::OsString);

impl From<BuildError> for StartError {
    fn from(e: BuildError) -> Self {
        Self::Gateway(Box::new(e))
    }
}

impl From<TlsError> for StartError {
    fn from(e: TlsError) -> Self {
        Self::Tls(Box::new(e))
    }
}
