//! Shared test support: real servers on free loopback ports.
//!
//! Each integration test binary includes this module and uses a part of it.
#![allow(dead_code, unreachable_pub)]

pub mod amqp;
pub mod config_file;
pub mod failover_load;
pub mod gateway;
pub mod http_server;
pub mod jwt;
pub mod nats;
pub mod outbox;
pub mod outbox_check;
pub mod pgbouncer;
pub mod postgres;
pub mod postgres_server;
pub mod postgres_tls;
pub mod raw_http;
pub mod redis_cluster_replicas;
pub mod redis_replicas;
pub mod redis_server;
pub mod relay_process;
pub mod roles;
pub mod services;
pub mod sink;
pub mod upstream;
