//! The route table: path prefix → upstream and policy. First match wins.

use std::sync::Arc;

use http::uri::PathAndQuery;
use http::{Method, Uri};

use super::upstream::Upstream;
use crate::config::{RouteConfig, check_upstream_url};
use crate::idempotency::StatusPolicy;

/// A route compiled from its config.
#[derive(Debug, Clone)]
pub struct Route {
    /// Name for logs and metrics.
    pub name: String,
    /// Path prefix.
    pub prefix: String,
    /// Upstream base path, without a trailing `/` (often empty).
    pub base_path: String,
    /// Guarded methods.
    pub methods: Vec<Method>,
    /// Guarded requests need a key.
    pub require_key: bool,
    /// Forward the client's `Host`.
    pub keep_host: bool,
    /// Which outcomes are stored.
    pub status_policy: StatusPolicy,
    /// The pooled client for this route's upstream.
    pub upstream: Upstream,
}

impl Route {
    /// Compiles a validated route config.
    pub fn from_config(config: &RouteConfig, default_policy: &StatusPolicy) -> Result<Self, String> {
        let uri = check_upstream_url(&config.upstream)?;
        let upstream = Upstream::new(&uri, config.ca_file.as_deref(), config.max_connections)
            .map_err(|e| format!("route {:?}: {e}", config.name))?;
        let base_path = uri.path().trim_end_matches('/').to_owned();
        let methods = config
            .methods
            .iter()
            .map(|m| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|e| format!("route {:?}: {e}", config.name))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            name: config.name.clone(),
            prefix: config.prefix.clone(),
            base_path,
            methods,
            require_key: config.require_key,
            keep_host: config.keep_host,
            status_policy: config
                .release_statuses
                .clone()
                .map(|release| StatusPolicy { release })
                .unwrap_or_else(|| default_policy.clone()),
            upstream,
        })
    }

    /// `true` when requests with this method are guarded.
    pub fn guards(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// The upstream URI for a request URI: base path + the request's path and query.
    pub fn upstream_uri(&self, uri: &Uri) -> Result<Uri, http::Error> {
        let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
        if self.base_path.is_empty() {
            return Ok(Uri::from(uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"))));
        }
        Uri::builder().path_and_query(format!("{}{path_and_query}", self.base_path)).build()
    }
}

/// Routes in match order.
#[derive(Debug, Clone, Default)]
pub struct RouteTable(Vec<Arc<Route>>);

impl RouteTable {
    /// Compiles every route.
    pub fn from_config(routes: &[RouteConfig], default_policy: &StatusPolicy) -> Result<Self, String> {
        routes.iter().map(|r| Route::from_config(r, default_policy).map(Arc::new)).collect::<Result<_, _>>().map(Self)
    }

    /// The first route whose prefix matches `path`.
    pub fn find(&self, path: &str) -> Option<&Arc<Route>> {
        self.0.iter().find(|r| path.starts_with(&r.prefix))
    }

    /// The routes.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, prefix: &str, upstream: &str) -> RouteConfig {
        RouteConfig {
            name: name.into(),
            prefix: prefix.into(),
            upstream: upstream.into(),
            methods: vec!["POST".into(), "patch".into()],
            require_key: false,
            keep_host: false,
            ca_file: None,
            max_connections: 4,
            release_statuses: None,
        }
    }

    #[test]
    fn the_first_matching_prefix_wins_and_paths_join_the_base() {
        let table = RouteTable::from_config(
            &[route("pay", "/v1/pay", "http://127.0.0.1:9000/api/"), route("all", "/", "http://127.0.0.1:9001")],
            &StatusPolicy::default(),
        )
        .unwrap();
        let pay = table.find("/v1/payments").unwrap();
        assert_eq!(pay.name, "pay");
        assert_eq!(pay.upstream_uri(&"/v1/payments?x=1".parse().unwrap()).unwrap(), "/api/v1/payments?x=1");
        assert!(pay.guards(&Method::PATCH) && !pay.guards(&Method::GET));
        assert_eq!(table.find("/other").unwrap().name, "all");
    }
}
