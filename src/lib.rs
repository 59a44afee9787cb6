//! idemgate makes retries safe.
//!
//! A map of the crate, floor by floor. A room uses only rooms on its own
//! floor or below; none reaches up (`python3 ../shared/tools/layering.py .`
//! prints the graph from the code's `crate::` paths and checks it).
//!
//! 1. The pure core — [`idempotency`]: key parsing, tenant scoping, the
//!    request fingerprint, the record and the decision table. No I/O.
//! 2. Plain, validated data — [`config`]: typed configuration from file,
//!    environment and flags; it calls nothing but the core.
//! 3. The infrastructure floor, knowing nothing of idempotency:
//!    [`http`] (the pooled client, bodies, the one accept loop and its
//!    per-connection limits, hop-by-hop headers, TLS), [`postgres`] (the
//!    pool, schema name, `sslmode`, migrations), [`metrics`] (the
//!    Prometheus set), [`lease`] (holding a lease while work runs, settling
//!    before it lapses), [`log_sink`] (the process's log output: one
//!    buffer, one writer thread), [`escape`] (outside text made safe for
//!    a log line) and [`webhook`] (webhook providers' signature schemes:
//!    verifying a delivery with rotated secrets, the clock passed in).
//! 4. The domain rooms: [`store`] (the [`store::Store`] trait and its
//!    backends — embedded memory, Redis, Redis Cluster, Postgres — held to
//!    one conformance suite), [`gateway`] (the reverse proxy: routing, the
//!    tenant sources, the idempotency guard, the request rewrite, RFC 9457
//!    problems) and
//!    [`outbox`] (the transactional outbox: enqueue, claims with leases and
//!    fences, publishers, retry, the relay's lanes).
//! 5. The admin surface — [`admin`]: health, readiness, metrics, the
//!    bearer-protected admin API of the gateway and the standalone relay,
//!    and the operators' console built on it (static files, `/admin/ui/`).
//! 6. Wiring — [`app`]: config in, running processes out, and the one
//!    config check every command runs; [`demo`], the toy payments API of
//!    `idemgate demo`; then the binary.

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
pub mod lease;
pub mod log_sink;
pub mod metrics;
pub mod outbox;
pub mod postgres;
pub mod store;
pub mod webhook;
