//! The gateway end to end: the `idemgate` gateway in front of a real
//! upstream on port 0 that counts its side effects, with real stores.
//!
//! One test binary, one module per guarantee:
//!
//! - [`guarded`]: a keyed request reaches the upstream once; retries replay,
//!   a different request under the same key is refused, tenants are kept
//!   apart, and every store (memory, Redis, Sentinel, Cluster, Postgres)
//!   keeps that promise;
//! - [`hostile_http`]: malformed requests, other spellings of a guarded
//!   request and forged upstream framing cannot get around the guard;
//! - [`protocols`]: TLS and HTTP/2 on both sides, and one h2 connection
//!   cannot hold more than its share;
//! - [`upstream_pool`]: the upstream connection pool's limits and reuse;
//! - [`memory_store`]: bounded memory per connection in the real binary;
//! - [`log_output`]: requests never wait for a log nobody reads;
//! - [`admin`]: the admin listener and `openapi.yaml` in step;
//! - [`tenant_quota`]: a tenant flooding new keys is held to its quota
//!   while a quiet one is served, on every store;
//! - [`webhooks`]: provider deliveries verified, forwarded once byte for
//!   byte, redeliveries answered from the store, forgeries refused.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod guarded;
mod hostile_http;
mod log_output;
mod memory_store;
mod protocols;
mod tenant_quota;
mod upstream_pool;
mod webhooks;
