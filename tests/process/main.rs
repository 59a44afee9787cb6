//! The `idemgate` binary as users run it: its commands, its config checks,
//! the demo, and a test run on a machine where no server runs.
//!
//! One test binary, one module per guarantee:
//!
//! - [`gateway`]: `idemgate serve` — config checks, a gateway killed
//!   mid-request, graceful termination, process limits;
//! - [`relay`]: the outbox through the real binary, end to end;
//! - [`check_config`]: `idemgate check-config` says what a config means;
//! - [`config_parity`]: `check-config`, `serve` and `relay` share one
//!   validation;
//! - [`demo`]: `idemgate demo` as a newcomer runs it;
//! - [`private_servers`]: the test support starts its own servers when none
//!   runs.

#[path = "../support/mod.rs"]
mod support;

mod check_config;
mod config_parity;
mod demo;
mod gateway;
mod private_servers;
mod relay;
