//! The open-file limit: raised at start to the hard limit, and compared
//! with what the config may hold open at once.
//!
//! Every client connection, upstream connection and store connection is a
//! file descriptor. Many systems start services with a soft limit of 1,024
//! (the hard limit is often far higher), below the default
//! `gateway.max_connections` of 10,000: past the limit `accept` fails, new
//! clients wait in the kernel's backlog and a legitimate request can wait
//! seconds behind idle sockets. So the process raises its soft limit to
//! the hard one (raising the hard limit needs privileges it should not
//! have; that is the service manager's job), and warns when even that
//! cannot hold `max_connections` plus the pools.

use crate::config::{Config, StoreKind};

/// Descriptors kept spare for what is not counted: log files, the runtime's
/// epoll and wakers, listeners, DNS lookups, certificate files.
const SPARE: u64 = 64;

/// Connections a Redis store may hold: one multiplexed connection per node,
/// a few nodes (a Cluster, Sentinels).
const REDIS_CONNECTIONS: u64 = 16;

/// The open-file limit after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
}

/// Raises the soft open-file limit to the hard limit.
pub fn raise() -> std::io::Result<OpenFileLimit> {
    let (before, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    let soft = if before < hard { rlimit::increase_nofile_limit(hard)? } else { before };
    Ok(OpenFileLimit { before, soft, hard })
}

/// What a config may hold open at once, by part, as the warning names them.
pub fn needed(config: &Config, with_relay: bool) -> Vec<(&'static str, u64)> {
    let mut parts = vec![
        ("gateway.max_connections", config.gateway.max_connections as u64),
        ("the routes' max_connections", config.routes.iter().map(|r| r.max_connections as u64).sum()),
        ("the admin listener", crate::http::listener::ServerLimits::internal().max_connections as u64),
    ];
    let store = match config.store.store_kind() {
        Some(StoreKind::Redis) => REDIS_CONNECTIONS,
        Some(StoreKind::Postgres) => postgres_pool_size(config.store.expose()),
        Some(StoreKind::Memory) | None => 0,
    };
    parts.push(("the store's connections", store));
    if config.relay.database_url.is_some() {
        // The admin API's two, and with --relay the relay's pool and its LISTEN session.
        let relay = if with_relay { config.relay.pool_size as u64 + 1 } else { 0 };
        parts.push(("the outbox database's connections", 2 + relay));
    }
    parts.push(("spare", SPARE));
    parts
}

/// The warning when `needed` does not fit under the soft limit.
pub fn warning(needed: &[(&'static str, u64)], limit: &OpenFileLimit) -> Option<String> {
    let total: u64 = needed.iter().map(|(_, n)| n).sum();
    if total <= limit.soft {
        return None;
    }
    let parts: Vec<String> = needed.iter().filter(|(_, n)| *n > 0).map(|(what, n)| format!("{what} {n}")).collect();
    Some(format!(
        "the open-file limit is {} (hard limit {}), below what this config may hold open at once: {} = {total}; \
         past the limit new connections wait in the kernel's backlog while accepts fail. Raise the hard limit \
         (LimitNOFILE= in a systemd unit, ulimit -Hn, the container runtime's nofile ulimit) or lower \
         gateway.max_connections",
        limit.soft,
        limit.hard,
        parts.join(" + "),
    ))
}

/// Raises the limit and logs what it did and whether the config fits.
pub fn raise_and_check(config: &Config, with_relay: bool) {
    match raise() {
        Ok(limit) => {
            if limit.soft != limit.before {
                tracing::info!(from = limit.before, to = limit.soft, "raised the open-file limit to the hard limit");
            }
            if let Some(warning) = warning(&needed(config, with_relay), &limit) {
                tracing::warn!("{warning}");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read or raise the open-file limit"),
    }
}

/// `pool_size=N` of a `postgres://` store URL (its default, 16, otherwise).
fn postgres_pool_size(url: &str) -> u64 {
    url.split_once('?')
        .into_iter()
        .flat_map(|(_, query)| query.split('&'))
        .find_map(|pair| pair.strip_prefix("pool_size=")?.parse().ok())
        .unwrap_or(16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    fn config(store: &str) -> Config {
        let flags = Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            store: Some(store.into()),
            ..Default::default()
        };
        Config::load(None, Vec::new(), &flags).unwrap()
    }

    #[test]
    fn the_default_config_does_not_fit_in_1024_and_fits_in_a_raised_limit() {
        let needed = needed(&config("memory://"), false);
        let total: u64 = needed.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 10_000 + 512 + 256 + 64);
        let low = OpenFileLimit { before: 1024, soft: 1024, hard: 1024 };
        let warned = warning(&needed, &low).unwrap();
        assert!(
            warned.contains("is 1024 (hard limit 1024)") && warned.contains("gateway.max_connections 10000"),
            "{warned}"
        );
        assert!(warned.contains(&format!("= {total}")), "{warned}");
        assert_eq!(warning(&needed, &OpenFileLimit { before: 1024, soft: 1 << 20, hard: 1 << 20 }), None);
    }

    #[test]
    fn the_stores_and_the_outbox_pools_count() {
        let parts = needed(&config("postgres://u@127.0.0.1/db?pool_size=40"), false);
        assert!(parts.contains(&("the store's connections", 40)));
        let parts = needed(&config("redis://127.0.0.1:6379/0"), false);
        assert!(parts.contains(&("the store's connections", REDIS_CONNECTIONS)));
        let mut with_outbox = config("memory://");
        with_outbox.relay.database_url = Some(crate::config::ServiceUrl::new("postgres://u@127.0.0.1/app"));
        let pool = with_outbox.relay.pool_size as u64;
        assert!(needed(&with_outbox, true).contains(&("the outbox database's connections", 2 + pool + 1)));
        assert!(needed(&with_outbox, false).contains(&("the outbox database's connections", 2)));
    }

    #[test]
    fn raising_leaves_the_soft_limit_at_the_hard_one() {
        let limit = raise().unwrap();
        assert_eq!(limit.soft, limit.hard);
    }
}
