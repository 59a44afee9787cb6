//! The faults that make work run twice, each counted at its effect: the
//! gateway's upstream and store failing mid-request, the relay's database
//! and destination failing mid-delivery, and a randomized run of all of
//! them against the invariants.
//!
//! One test binary, one module per guarantee:
//!
//! - [`gateway`]: an upstream that acts and stalls or resets, a store that
//!   dies or freezes — never a second effect;
//! - [`outbox`]: the relay under faults — no committed row lost, each
//!   derived key's effect applied once;
//! - [`outbox_brokers`]: relays SIGKILLed while publishing to HTTP, NATS
//!   and RabbitMQ at once — nothing lost, each key applied once;
//! - [`outbox_outage`]: database outages heal by themselves;
//! - [`invariants`]: many clients, random keys, duplicates and faults,
//!   checked against the gateway's invariants.

#[path = "../support/mod.rs"]
mod support;

mod gateway;
mod invariants;
mod outbox;
mod outbox_brokers;
mod outbox_outage;
