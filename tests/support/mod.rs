//! Shared test support: real servers on free loopback ports.
//!
//! Each integration test binary includes this module and uses a part of it.
#![allow(dead_code, unreachable_pub)]

pub mod gateway;
pub mod outbox;
pub mod postgres;
pub mod redis_server;
pub mod sink;
pub mod upstream;
