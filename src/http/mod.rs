//! The HTTP floor: what every room that speaks HTTP shares, and nothing
//! about idempotency.
//!
//! - [`client`] — one pooled keep-alive client per origin, and its errors,
//!   each saying whether the request may have been sent. The gateway
//!   forwards with it; the outbox relay publishes with it.
//! - [`body`] — the one boxed body type every handler returns.
//! - [`request_body`] — reading a client's body under limits of size, time
//!   and per-connection memory, and the lingering close after a refusal.
//! - [`listener`] and [`connection`] — the one accept loop (HTTP/1.1, h2c,
//!   TLS) with its per-connection limits, for the gateway and every
//!   internal listener; `accept_errors` keeps its failures to a line a
//!   second.
//! - [`head`] — copying a message head out of hyper's read buffer, so a
//!   head held while a request is in flight does not make its connection
//!   allocate a second one.
//! - [`headers`] — the hop-by-hop headers no hop may pass on.
//! - [`sending`] — large responses handed over a slice at a time, and a
//!   connection whose client stops reading one dropped after
//!   `send_timeout`.
//! - [`refusal`] — the HTTP/1 parser's bare refusals rewritten as
//!   problem+json on their way out.
//! - [`path`] — one spelling of a request path: normalised, or refused
//!   where upstreams disagree about it.
//! - [`tls`] — rustls on both sides: roots for clients, an acceptor for
//!   listeners.
//! - [`trace_context`] — W3C `traceparent`/`tracestate`: the trace id, and
//!   the child span a new hop sends.

mod accept_errors;
pub mod body;
pub mod client;
pub mod connection;
pub mod head;
pub mod headers;
pub mod listener;
pub mod path;
pub mod refusal;
pub mod request_body;
pub mod sending;
pub mod tls;
pub mod trace_context;
