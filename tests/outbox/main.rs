//! The outbox relay against the real PostgreSQL: each test in a schema of
//! its own, publishing to a real HTTP destination on port 0 that records
//! what it receives. Most tests drive the relay one step at a time
//! (`try_execute_step`: one claim step of each of the lanes `Relay::run`
//! runs, awaited until settled); the waits that remain are for time itself (a
//! lease or a backoff running out) or bounded waits for an outcome.
//!
//! One test binary, one module per guarantee:
//!
//! - [`once_per_key`]: a message is enqueued once per derived key and only
//!   with the business transaction that commits it — duplicates, a rollback
//!   and migrations run twice change nothing, and every request carries the
//!   derived key;
//! - [`leases_and_fences`]: a claim is a lease fenced by its attempt count —
//!   a relay lost mid-delivery is redelivered under the same key, stale
//!   claims (alone or in a batch) change nothing, a slow publish renews its
//!   lease, and a row whose leases keep expiring is buried;
//! - [`retries`]: what a destination answers decides a row's fate — a `4xx`
//!   is dead at once and can be redriven (also through the admin API), a
//!   `5xx` is retried up to `max_attempts`, a `429` waits its `Retry-After`,
//!   and the metrics count every attempt;
//! - [`ordering`]: per ordering key, delivery follows commit order — a
//!   failing head blocks only its own key, and four relays (one crashing)
//!   keep the order;
//! - [`set_based`]: `enqueue_many` means row by row what `enqueue` means —
//!   once per key within and across calls, nothing without the commit, per
//!   ordering key input order within a call and commit order across
//!   transactions, also when two race on the same keys, and no deadlock
//!   between calls and single enqueues whatever the order of their keys;
//! - [`wake_ups`]: a relay finds new rows without notifications (polling),
//!   promptly with them (`NOTIFY`), and again after its `LISTEN` session drops;
//! - [`inspection`]: what an operator sees through the admin API — counts
//!   per destination, rows held behind a dead head, dead rows paged;
//! - [`retention`]: a long-running outbox stays cheap — history is dropped
//!   by whole day partitions, and relay sessions never sort, so a claim reads
//!   only the rows it takes; retention never waits for an enqueuer's
//!   ordering key (so never deadlocks with one);
//! - [`enqueue`]: the derived key, byte for byte the same from SQL and
//!   Rust, and what `enqueue` and `enqueue_many` refuse;
//! - [`lanes`]: destinations are isolated (a slow one holds up no other),
//!   a claim is bounded by bytes, and a test's step is one claim per lane,
//!   settled before it returns;
//! - [`publisher`]: a `2xx` whose body breaks off is delivered once, and no
//!   header, credential or destination's body corrupts a request or a log;
//! - [`unroutable`]: rows for a destination the relay does not have wait
//!   in sight (gauge, warning, admin API) and flow once one does;
//! - [`trace`]: one trace from the request that caused an effect to each
//!   attempt at its delivery;
//! - [`roles`]: a service role that can only enqueue and a relay role that
//!   owns nothing are enough;
//! - [`amqp`]: `kind = "amqp"` destinations — once per derived key in a
//!   RabbitMQ queue, persistent and in order per key; a returned message
//!   or a missing exchange is no delivery;
//! - [`memory`]: the relay binary's memory stays bounded by bytes;
//! - [`nats`]: `kind = "nats"` destinations — once per derived key in a
//!   JetStream stream, in order per key, through a broker restart;
//! - [`postgres_tls`]: the relay and the store over TLS to PostgreSQL;
//! - [`pgbouncer`]: behind PgBouncer in transaction mode (opt-in).

#[path = "../support/mod.rs"]
mod support;

mod amqp;
mod enqueue;
mod inspection;
mod lanes;
mod leases_and_fences;
mod memory;
mod nats;
mod once_per_key;
mod ordering;
mod pgbouncer;
mod postgres_tls;
mod publisher;
mod retention;
mod retries;
mod roles;
mod set_based;
mod trace;
mod unroutable;
mod wake_ups;

use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);
const SHORT_LEASE: Duration = Duration::from_millis(200);
const PAST_SHORT_LEASE: Duration = Duration::from_millis(350);
