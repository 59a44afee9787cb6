//! A Redis store URL, read once: which topology (one server, a Cluster, a
//! Sentinel-managed primary), how to reach it, and the store's options.
//!
//! `redis+sentinel://[user:password@]s1:p1,s2:p2,…/SERVICE[/db]` names the
//! Sentinels and the service they watch; the password is the data nodes'
//! (the Sentinels' is `sentinel_password=`), and `rediss+sentinel://` is TLS
//! to both. Every form takes `wait_replicas=N&wait_timeout=D`
//! ([`Durability`]). Options the store does not know go on to the redis
//! crate's own URL parser, which refuses what it does not know either.

use std::time::Duration;

use percent_encoding::percent_decode_str;
use redis::TlsCertificates;

use super::super::{StoreError, url_options};
use crate::config::ConfigDuration;

/// How many replicas must acknowledge a `begin` and a `complete`, and how
/// long each may wait for them (`WAIT N timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Durability {
    /// `wait_replicas`: replicas that must hold each write before it counts.
    pub(super) replicas: u32,
    /// `wait_timeout`: the longest one `WAIT` may take (default 100 ms).
    pub(super) timeout: Duration,
}

/// The default `wait_timeout`.
pub(super) const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(100);

/// Where the records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Topology {
    /// One server: a URL for the redis crate.
    Single(String),
    /// A Cluster: one URL per seed node.
    Cluster(Vec<String>),
    /// A primary found through Sentinels.
    Sentinel(SentinelTarget),
}

/// The Sentinels, the service they watch and how to reach its data nodes.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct SentinelTarget {
    /// `redis://host:port` (or `rediss://`) of each Sentinel.
    pub(super) sentinels: Vec<String>,
    /// The name the Sentinels monitor the primary under.
    pub(super) service: String,
    /// The database on the data nodes.
    pub(super) db: i64,
    /// TLS to the Sentinels and to the data nodes.
    pub(super) tls: bool,
    /// The data nodes' user and password.
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    /// The Sentinels' password (`sentinel_password=`).
    pub(super) sentinel_password: Option<String>,
}

// Passwords never print, not even in a test's failure message.
impl std::fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelTarget")
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("db", &self.db)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Everything a Redis store URL says.
pub(super) struct Options {
    pub(super) topology: Topology,
    pub(super) prefix: String,
    /// `timeout`: the longest a connect may take (and, on a Cluster, one
    /// node's reply). Not an operation's limit: `gateway.store_timeout` is.
    pub(super) timeout: Duration,
    pub(super) certificates: Option<TlsCertificates>,
    pub(super) durability: Option<Durability>,
}

impl Options {
    /// Reads a store URL; what cannot work is refused here, naming the fix.
    pub(super) fn parse(url: &str) -> Result<Self, StoreError> {
        let invalid = |m: String| Err(StoreError::InvalidUrl(m));
        let base = url.split_once('?').map_or(url, |(base, _)| base);
        let mut prefix = "idemgate:".to_string();
        let mut timeout = Duration::from_secs(2);
        let mut certificates = None;
        let (mut replicas, mut wait_timeout, mut sentinel_password) = (None, None, None);
        let mut passthrough = Vec::new();
        for (name, value) in url_options(url) {
            match name {
                "prefix" if !value.contains(['{', '}']) => prefix = value.to_string(),
                "prefix" => return invalid("prefix must not contain '{' or '}'".into()),
                "timeout" => timeout = duration(value)?,
                "ca_file" => {
                    let pem = std::fs::read(value)
                        .map_err(|e| StoreError::InvalidUrl(format!("cannot read ca_file {value}: {e}")))?;
                    certificates = Some(TlsCertificates { client_tls: None, root_cert: Some(pem) });
                }
                "wait_replicas" => match value.parse::<u32>() {
                    Ok(n) => replicas = Some(n),
                    Err(_) => return invalid(format!("wait_replicas={value}: must be a whole number of replicas")),
                },
                "wait_timeout" => wait_timeout = Some(duration(value)?),
                "sentinel_password" => sentinel_password = Some(decode(value)),
                _ => passthrough.push(format!("{name}={value}")),
            }
        }
        let durability = match (replicas, wait_timeout) {
            (Some(0) | None, Some(_)) => {
                return invalid("wait_timeout needs wait_replicas=N (N ≥ 1) beside it".into());
            }
            (Some(0) | None, None) => None,
            (Some(replicas), timeout) => {
                let timeout = timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT);
                if timeout.is_zero() {
                    // WAIT with 0 blocks until the replicas answer, however long.
                    return invalid("wait_timeout must be more than 0".into());
                }
                Some(Durability { replicas, timeout })
            }
        };
        let suffix = if passthrough.is_empty() { String::new() } else { format!("?{}", passthrough.join("&")) };
        let scheme = base.split("://").next().unwrap_or("").to_ascii_lowercase();
        let rest = base.split_once("://").map_or("", |(_, rest)| rest);
        let topology = match scheme.as_str() {
            "redis+cluster" | "rediss+cluster" => {
                let data = if scheme.starts_with("rediss") { "rediss" } else { "redis" };
                let (userinfo, hosts) = rest.rsplit_once('@').unwrap_or(("", rest));
                let at = if userinfo.is_empty() { String::new() } else { format!("{userinfo}@") };
                let urls: Vec<String> = hosts
                    .trim_end_matches('/')
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(|h| format!("{data}://{at}{h}{suffix}"))
                    .collect();
                if urls.is_empty() {
                    return invalid("a cluster URL needs at least one host:port".into());
                }
                Topology::Cluster(urls)
            }
            "redis+sentinel" | "rediss+sentinel" => {
                if !passthrough.is_empty() {
                    return invalid(format!("unknown option(s) for a Sentinel URL: {}", passthrough.join("&")));
                }
                Topology::Sentinel(sentinel_target(rest, scheme.starts_with("rediss"), sentinel_password.take())?)
            }
            _ => Topology::Single(format!("{base}{suffix}")),
        };
        if sentinel_password.is_some() {
            return invalid("sentinel_password= is an option of redis+sentinel:// URLs only".into());
        }
        Ok(Self { topology, prefix, timeout, certificates, durability })
    }
}

fn duration(value: &str) -> Result<Duration, StoreError> {
    value.parse::<ConfigDuration>().map(|d| d.0).map_err(|e| StoreError::InvalidUrl(e.to_string()))
}

fn decode(value: &str) -> String {
    percent_decode_str(value).decode_utf8_lossy().into_owned()
}

/// `[user:password@]s1:p1,s2:p2/SERVICE[/db]`.
fn sentinel_target(rest: &str, tls: bool, sentinel_password: Option<String>) -> Result<SentinelTarget, StoreError> {
    let invalid =
        |m: &str| StoreError::InvalidUrl(format!("{m}: write redis+sentinel://[:password@]host:port,…/SERVICE[/db]"));
    let (authority, path) = rest.split_once('/').ok_or_else(|| invalid("a Sentinel URL needs the service name"))?;
    let (userinfo, hosts) = authority.rsplit_once('@').unwrap_or(("", authority));
    let (username, password) = match userinfo.split_once(':') {
        Some((user, password)) => (Some(decode(user)).filter(|u| !u.is_empty()), Some(decode(password))),
        None => (Some(decode(userinfo)).filter(|u| !u.is_empty()), None),
    };
    let data = if tls { "rediss" } else { "redis" };
    let sentinels: Vec<String> = hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("{data}://{h}")).collect();
    if sentinels.is_empty() {
        return Err(invalid("a Sentinel URL needs at least one Sentinel host:port"));
    }
    let mut segments = path.trim_end_matches('/').splitn(2, '/');
    let service = decode(segments.next().unwrap_or(""));
    if service.is_empty() {
        return Err(invalid("a Sentinel URL needs the service name"));
    }
    let db = match segments.next() {
        None => 0,
        Some(db) => db.parse().map_err(|_| invalid("the database after the service name must be a number"))?,
    };
    Ok(SentinelTarget { sentinels, service, db, tls, username, password, sentinel_password })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Options {
        Options::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn a_sentinel_url_names_its_sentinels_service_database_and_passwords() {
        let options = parse(
            "rediss+sentinel://:data%40pw@10.0.0.1:26379,10.0.0.2:26380/payments/3?sentinel_password=s3&prefix=p:",
        );
        let Topology::Sentinel(target) = options.topology else { panic!("not a sentinel topology") };
        assert_eq!(target.sentinels, ["rediss://10.0.0.1:26379", "rediss://10.0.0.2:26380"]);
        assert_eq!((target.service.as_str(), target.db, target.tls), ("payments", 3, true));
        assert_eq!((target.username, target.password.as_deref()), (None, Some("data@pw")));
        assert_eq!(target.sentinel_password.as_deref(), Some("s3"));
        assert_eq!(options.prefix, "p:");
        let plain = parse("redis+sentinel://127.0.0.1:26379/mymaster");
        let Topology::Sentinel(target) = plain.topology else { panic!("not a sentinel topology") };
        assert_eq!((target.db, target.tls, target.password), (0, false, None));
    }

    #[test]
    fn a_sentinel_url_without_service_or_sentinels_is_refused() {
        for url in [
            "redis+sentinel://127.0.0.1:26379",
            "redis+sentinel://127.0.0.1:26379/",
            "redis+sentinel:///mymaster",
            "redis+sentinel://127.0.0.1:26379/mymaster/zero",
            "redis+sentinel://127.0.0.1:26379/mymaster?protocol=resp3",
            "redis://127.0.0.1:6379/0?sentinel_password=x",
        ] {
            assert!(matches!(Options::parse(url), Err(StoreError::InvalidUrl(_))), "{url}");
        }
    }

    #[test]
    fn wait_replicas_takes_a_default_timeout_and_zero_means_off() {
        let on = parse("redis://127.0.0.1:6379/0?wait_replicas=2");
        assert_eq!(on.durability, Some(Durability { replicas: 2, timeout: DEFAULT_WAIT_TIMEOUT }));
        let timed = parse("redis+cluster://127.0.0.1:7000?wait_replicas=1&wait_timeout=250ms");
        assert_eq!(timed.durability, Some(Durability { replicas: 1, timeout: Duration::from_millis(250) }));
        assert_eq!(parse("redis://127.0.0.1:6379/0?wait_replicas=0").durability, None);
        assert_eq!(parse("redis://127.0.0.1:6379/0").durability, None);
        for url in [
            "redis://h:1/0?wait_replicas=-1",
            "redis://h:1/0?wait_replicas=one",
            "redis://h:1/0?wait_timeout=1s",
            "redis://h:1/0?wait_replicas=1&wait_timeout=0s",
        ] {
            assert!(matches!(Options::parse(url), Err(StoreError::InvalidUrl(_))), "{url}");
        }
    }

    /// Every Redis scheme of the config's one table (`STORE_SCHEMES`) is
    /// a topology here: `+cluster` a Cluster, `+sentinel` Sentinels, the
    /// rest one server.
    #[test]
    fn every_redis_scheme_of_the_config_has_its_topology() {
        use crate::config::{STORE_SCHEMES, StoreKind};
        for (scheme, _) in STORE_SCHEMES.iter().filter(|(_, kind)| *kind == StoreKind::Redis) {
            let topology = parse(&format!("{scheme}://127.0.0.1:6379/mymaster")).topology;
            let fits = match &topology {
                Topology::Cluster(_) => scheme.ends_with("+cluster"),
                Topology::Sentinel(target) => {
                    scheme.ends_with("+sentinel") && target.tls == scheme.starts_with("rediss")
                }
                Topology::Single(_) => !scheme.contains('+'),
            };
            assert!(fits, "{scheme}: {topology:?}");
        }
    }

    #[test]
    fn cluster_and_single_urls_keep_their_forms() {
        let cluster = parse("rediss+cluster://:pw@a:1,b:2/?timeout=1s");
        assert_eq!(cluster.topology, Topology::Cluster(vec!["rediss://:pw@a:1".into(), "rediss://:pw@b:2".into()]));
        let single = parse("redis://a:1/2?wait_replicas=1&protocol=resp2");
        assert_eq!(single.topology, Topology::Single("redis://a:1/2?protocol=resp2".into()));
    }
}
