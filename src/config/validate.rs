//! What parsing alone cannot check: each value on its own and against the
//! others (a lease shorter than the key TTL, a budget below the body
//! limit). Checks that need a room's own code (a route's CA file, a
//! destination's headers as the relay builds them) are that room's, run
//! together by `crate::app::check`.

use std::time::Duration;

use super::{AdminAuth, Config, ConfigError, OnUnknown, StoreKind};

impl Config {
    /// Checks what parsing alone cannot; returns warnings for choices that
    /// are allowed but risky.
    pub fn validate(&self) -> Result<Vec<String>, ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        let g = &self.gateway;
        let mut warnings = Vec::new();
        if self.store.store_kind().is_none() {
            return invalid(format!("store {:?}: the scheme must be {}", self.store.redacted(), StoreKind::schemes()));
        }
        if g.lease.0 < Duration::from_millis(100) {
            return invalid(format!("gateway.lease = {}: must be at least 100ms", g.lease));
        }
        if g.key_ttl.0 < g.lease.0 {
            return invalid(format!(
                "gateway.key_ttl = {} must not be shorter than gateway.lease = {}",
                g.key_ttl, g.lease
            ));
        }
        if g.upstream_deadline.0 < g.upstream_timeout.0 {
            return invalid(format!(
                "gateway.upstream_deadline = {} must not be shorter than gateway.upstream_timeout = {}",
                g.upstream_deadline, g.upstream_timeout
            ));
        }
        let releasing = std::iter::once(("gateway", g.on_unknown))
            .chain(self.routes.iter().filter_map(|r| Some((r.name.as_str(), r.on_unknown?))))
            .filter(|(_, on_unknown)| *on_unknown == OnUnknown::Release);
        for (name, _) in releasing {
            warnings.push(format!(
                "{name}: on_unknown = \"release\" lets a retry run again a request whose outcome was lost (sent, then no answer): safe only if the upstream deduplicates on the forwarded Idempotency-Key"
            ));
        }
        if g.connection_response_budget.0 < 64 << 10 {
            return invalid(format!(
                "gateway.connection_response_budget = {} must be at least 64KiB (one slice of an answer)",
                g.connection_response_budget
            ));
        }
        if g.connection_body_budget.0 < g.max_request_body.0 {
            return invalid(format!(
                "gateway.connection_body_budget = {} must be at least gateway.max_request_body = {}",
                g.connection_body_budget, g.max_request_body
            ));
        }
        // Above these hyper refuses on its own, with a bare status and no problem body.
        if g.max_uri_bytes.0 > 60 << 10 || g.max_header_bytes.0 > 256 << 10 {
            return invalid(
                "gateway.max_uri_bytes is at most 60KiB and gateway.max_header_bytes at most 256KiB".into(),
            );
        }
        if g.max_streams_per_connection == 0 {
            return invalid("gateway.max_streams_per_connection must be at least 1".into());
        }
        for (name, value) in [
            ("header_read_timeout", g.header_read_timeout),
            ("request_body_timeout", g.request_body_timeout),
            ("idle_timeout", g.idle_timeout),
            ("send_timeout", g.send_timeout),
        ] {
            if value.0.is_zero() {
                return invalid(format!("gateway.{name} must be more than 0s"));
            }
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return invalid("tls needs both cert_file and key_file, or neither".into());
        }
        if self.admin.auth == AdminAuth::Disabled && !self.admin_listen.ip().is_loopback() {
            return invalid(format!(
                "admin.auth = \"disabled\" is only allowed on a loopback admin_listen, not {}",
                self.admin_listen
            ));
        }
        if g.max_connections == 0 {
            return invalid("gateway.max_connections must be at least 1".into());
        }
        if g.tenant == super::TenantConfig::BasicUser {
            warnings.push(BASIC_USER_TRUSTS_THE_NAME.into());
        }
        let mut names = std::collections::BTreeSet::new();
        for route in &self.routes {
            if !names.insert(route.name.as_str()) {
                return invalid(format!("two routes are named {:?}", route.name));
            }
            if !route.prefix.starts_with('/') {
                return invalid(format!("route {:?}: prefix {:?} must start with '/'", route.name, route.prefix));
            }
            check_upstream_url(&route.upstream)
                .map_err(|source| ConfigError::Upstream { route: route.name.clone(), source })?;
            if !(1..=65_536).contains(&route.max_connections) {
                return invalid(format!("route {:?}: max_connections must be between 1 and 65536", route.name));
            }
            check_route_keys(route, g, &mut warnings)?;
        }
        let release_lists =
            std::iter::once(&g.release_statuses).chain(self.routes.iter().filter_map(|r| r.release_statuses.as_ref()));
        for status in release_lists.flatten() {
            if !(100..500).contains(status) {
                return invalid(format!(
                    "release_statuses: {status} must be a status below 500 (every 5xx always releases)"
                ));
            }
        }
        super::relay::validate(&self.relay, &self.destinations, &mut warnings)?;
        Ok(warnings)
    }
}

/// A route's key source, `key_ttl` and webhook intake.
fn check_route_keys(
    route: &super::RouteConfig,
    g: &super::GatewayConfig,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(format!("route {:?}: {m}", route.name)));
    let key_ttl = route.key_ttl.unwrap_or(g.key_ttl);
    if key_ttl.0 < g.lease.0 {
        return invalid(format!("key_ttl = {key_ttl} must not be shorter than gateway.lease = {}", g.lease));
    }
    let Some(webhook) = &route.webhook else { return Ok(()) };
    webhook.check().map_err(|source| ConfigError::Webhook { route: route.name.clone(), source })?;
    // Providers deliver with POST; a webhook route that did not guard it
    // would pass every delivery through unverified.
    if !route.methods.iter().any(|m| m.0 == http::Method::POST) {
        return invalid("a webhook route must guard POST (methods)".into());
    }
    let scheme = webhook.scheme;
    if key_ttl.0 < scheme.retry_window() {
        warnings.push(format!(
            "route {:?}: key_ttl = {key_ttl} is shorter than the {} retry window ({}): a redelivery after key_ttl is \
             forwarded again; set the route's key_ttl to at least that",
            route.name,
            scheme.name(),
            super::ConfigDuration(scheme.retry_window()),
        ));
    }
    Ok(())
}

/// The warning for `basic_user`: the name is taken on trust.
const BASIC_USER_TRUSTS_THE_NAME: &str = "gateway.tenant = { basic_user = true }: the gateway reads the Basic user name and does not check the password, so a client that sends another user's name with that user's key is answered that user's stored response; use it only behind a proxy (or load balancer) that verifies Basic credentials, or use jwt_claim";

/// Checks that an upstream is an absolute `http`/`https` URL with a host.
///
/// An upstream URL may not carry credentials (`user:password@`): the
/// gateway forwards each client's own `Authorization`, and the userinfo
/// would otherwise become the `Host` it sends. Errors print the URL with
/// its password redacted.
pub fn check_upstream_url(url: &str) -> Result<http::Uri, UpstreamUrlError> {
    let shown = super::ServiceUrl::new(url).redacted();
    let uri: http::Uri = match url.parse() {
        Ok(uri) => uri,
        Err(source) => return Err(UpstreamUrlError::NotAUrl { shown, source }),
    };
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(UpstreamUrlError::Scheme(shown)),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(UpstreamUrlError::NoHost(shown));
    }
    if uri.authority().is_some_and(|authority| authority.as_str().contains('@')) {
        return Err(UpstreamUrlError::Credentials(shown));
    }
    if uri.query().is_some() {
        return Err(UpstreamUrlError::Query(shown));
    }
    Ok(uri)
}

/// Why an upstream URL is refused. Each variant holds the URL with its
/// password redacted, as printed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamUrlError {
    /// Not a URI at all.
    #[error("upstream {shown:?} is not a URL: {source}")]
    NotAUrl {
        /// The URL, redacted.
        shown: String,
        /// The parser's reason.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Not `http://` or `https://`.
    #[error("upstream {0:?} must start with http:// or https://")]
    Scheme(String),
    /// No host.
    #[error("upstream {0:?} has no host")]
    NoHost(String),
    /// `user:password@` in the authority.
    #[error(
        "upstream {0:?} carries credentials: the gateway forwards each client's own Authorization; remove user:password@"
    )]
    Credentials(String),
    /// A query string.
    #[error("upstream {0:?} must not have a query")]
    Query(String),
}
