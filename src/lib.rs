//! idemgate makes retries safe.
//!
//! A map of the crate:
//!
//! - [`idempotency`] — the pure core: key parsing, tenant scoping, the
//!   request fingerprint, the record and the decision table. No I/O.
//! - [`store`] — the [`store::Store`] trait and its backends (embedded
//!   memory, Redis, Redis Cluster, Postgres), all held to one conformance suite.
//! - [`gateway`] — the reverse proxy: routing, the idempotency guard as a
//!   tower service, forwarding to upstreams, RFC 9457 problem responses, and
//!   the listener.
//! - [`admin`] — the admin listener: health, readiness, metrics, and the
//!   bearer-protected admin API.
//! - [`metrics`] — the Prometheus metric set.
//! - [`outbox`] — the transactional outbox relay on Postgres: migrations,
//!   the enqueue helper, claiming with leases and fences, publishers, retry;
//!   and the one way to reach Postgres (a URL parsed into the driver's
//!   config and a rustls connector, `sslmode` as in libpq).
//! - [`config`] — typed configuration from file, environment and flags.
//! - [`demo`] — a toy payments API for `idemgate demo`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod admin;
pub mod app;
pub mod config;
pub mod demo;
pub mod escape;
pub mod gateway;
pub mod http;
pub mod idempotency;
pub mod metrics;
pub mod outbox;
pub mod postgres;
pub mod store;
