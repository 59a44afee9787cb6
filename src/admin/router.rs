//! The admin routing, for both listeners: method and path to a [`Route`],
//! then the bearer check on `/admin/…`, as plain functions.
//!
//! The order is part of the API: an unknown path is `404` and a known path
//! with another method `405` (with `Allow`) before any token is looked at,
//! because the request is wrong either way. A listener without the keys
//! routes ([`GatewayRoutes::Absent`], the standalone relay) answers `404` there
//! as for any unknown path, whatever the method or token.
//!
//! The console's static files (`/admin/ui/…`, see [`super::ui`]) route here
//! too, outside [`ROUTES`] (they are files, not API calls, and carry no
//! data), and need no token: every call the page then makes does.

use http::{HeaderMap, Method};

use super::{AccessDenied, AdminAccess};
use crate::gateway::problem::Problem;

/// Every route the gateway's admin listener serves: (method, path template).
/// The relay's serves the same minus `/admin/keys/{key}` and
/// `/admin/gateway/outcomes`.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/admin/keys/{key}"),
    ("DELETE", "/admin/keys/{key}"),
    ("GET", "/admin/gateway/outcomes"),
    ("GET", "/admin/outbox/destinations"),
    ("GET", "/admin/outbox/dead"),
    ("POST", "/admin/outbox/dead/{id}/redrive"),
    ("POST", "/admin/outbox/redrive"),
    ("GET", "/admin/outbox/unroutable"),
];

/// Whether a listener serves the gateway's own routes
/// (`/admin/keys/{key}`, `/admin/gateway/outcomes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GatewayRoutes {
    /// The gateway's listener: it has a store to look in and requests to count.
    Served,
    /// The relay's listener: the paths answer `404`.
    Absent,
}

/// What an admin request asks for, once its method and path are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route<'a> {
    /// Answered alike on both listeners.
    Shared(SharedRoute<'a>),
    /// `GET /readyz`: each listener knows what it waits for.
    Readiness,
    /// `GET` (or, with `purge`, `DELETE`) `/admin/keys/{key}`, the key as
    /// sent (still percent-encoded).
    Key {
        /// The path segment.
        raw_key: &'a str,
        /// `DELETE`: remove the record.
        purge: bool,
    },
    /// `GET /admin/gateway/outcomes`: requests per outcome, per minute.
    Outcomes,
}

impl Route<'_> {
    /// Whether the route is under `/admin/`, where the bearer check applies.
    /// Decided on the route, not on the raw path: `//admin/…` routes as
    /// `/admin/…` does, so it must be checked as that does.
    fn is_behind_bearer(&self) -> bool {
        use SharedRoute::*;
        matches!(
            self,
            Route::Key { .. } | Route::Outcomes | Route::Shared(Destinations | DeadRows | Redrive(_) | UnroutableRows)
        )
    }
}

/// The routes both listeners answer the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SharedRoute<'a> {
    /// `GET /healthz`.
    Liveness,
    /// `GET /metrics`.
    Metrics,
    /// `GET /admin/ui/…`: a console file, by the name after `/admin/ui/`
    /// (`""` for the page itself); `None` for `/admin/ui`, which redirects.
    Console(Option<&'a str>),
    /// `GET /admin/outbox/destinations`.
    Destinations,
    /// `GET /admin/outbox/dead`.
    DeadRows,
    /// `POST /admin/outbox/dead/{id}/redrive` with the id as sent, or
    /// `POST /admin/outbox/redrive` (`None`: every dead row).
    Redrive(Option<&'a str>),
    /// `GET /admin/outbox/unroutable`.
    UnroutableRows,
}

/// Why no route answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Miss {
    /// No such path.
    NotFound,
    /// The path exists with these methods only (the `Allow` value).
    MethodNotAllowed(&'static str),
}

/// The route a method and path name, or why there is none.
pub(super) fn route<'a>(method: &Method, path: &'a str, keys: GatewayRoutes) -> Result<Route<'a>, Miss> {
    use SharedRoute::*;
    let only = |wanted: Method, route: Route<'a>| (*method == wanted).then_some(route);
    let segments: Vec<&'a str> = path.trim_start_matches('/').split('/').collect();
    let (allow, route) = match *segments.as_slice() {
        ["healthz"] => ("GET", only(Method::GET, Route::Shared(Liveness))),
        ["readyz"] => ("GET", only(Method::GET, Route::Readiness)),
        ["metrics"] => ("GET", only(Method::GET, Route::Shared(Metrics))),
        ["admin", "keys", raw_key] if keys == GatewayRoutes::Served && !raw_key.is_empty() => {
            let purge = *method == Method::DELETE;
            ("GET, DELETE", (purge || *method == Method::GET).then_some(Route::Key { raw_key, purge }))
        }
        ["admin", "gateway", "outcomes"] if keys == GatewayRoutes::Served => {
            ("GET", only(Method::GET, Route::Outcomes))
        }
        ["admin", "outbox", "destinations"] => ("GET", only(Method::GET, Route::Shared(Destinations))),
        ["admin", "outbox", "dead"] => ("GET", only(Method::GET, Route::Shared(DeadRows))),
        ["admin", "ui"] => ("GET", only(Method::GET, Route::Shared(Console(None)))),
        ["admin", "ui", file] => ("GET", only(Method::GET, Route::Shared(Console(Some(file))))),
        ["admin", "outbox", "dead", id, "redrive"] if !id.is_empty() => {
            ("POST", only(Method::POST, Route::Shared(Redrive(Some(id)))))
        }
        ["admin", "outbox", "redrive"] => ("POST", only(Method::POST, Route::Shared(Redrive(None)))),
        ["admin", "outbox", "unroutable"] => ("GET", only(Method::GET, Route::Shared(UnroutableRows))),
        _ => return Err(Miss::NotFound),
    };
    route.ok_or(Miss::MethodNotAllowed(allow))
}

/// The route, once the bearer check has let it through when it is under
/// `/admin/`; otherwise the problem to answer with.
pub(super) fn admit<'a>(
    method: &Method,
    path: &'a str,
    headers: &HeaderMap,
    keys: GatewayRoutes,
    access: &AdminAccess,
) -> Result<Route<'a>, Problem> {
    let route = route(method, path, keys).map_err(|miss| match miss {
        Miss::NotFound => Problem::NotFound,
        Miss::MethodNotAllowed(allow) => Problem::MethodNotAllowed(allow),
    })?;
    if route.is_behind_bearer() {
        access.check(headers).map_err(|denied| match denied {
            AccessDenied::Unauthorized => Problem::Unauthorized,
            AccessDenied::Disabled => Problem::AdminDisabled,
        })?;
    }
    Ok(route)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AdminConfig, Secret};
    use GatewayRoutes::{Absent, Served};
    use SharedRoute::*;

    fn get(path: &str, keys: GatewayRoutes) -> Result<Route<'_>, Miss> {
        route(&Method::GET, path, keys)
    }

    #[test]
    fn every_route_is_found_by_its_method_and_path() {
        let post = |path| route(&Method::POST, path, Served);
        assert_eq!(get("/healthz", Served), Ok(Route::Shared(Liveness)));
        assert_eq!(get("/readyz", Served), Ok(Route::Readiness));
        assert_eq!(get("/metrics", Served), Ok(Route::Shared(Metrics)));
        assert_eq!(get("/admin/keys/a%2Fb", Served), Ok(Route::Key { raw_key: "a%2Fb", purge: false }));
        assert_eq!(route(&Method::DELETE, "/admin/keys/k", Served), Ok(Route::Key { raw_key: "k", purge: true }));
        assert_eq!(get("/admin/gateway/outcomes", Served), Ok(Route::Outcomes));
        assert_eq!(get("/admin/outbox/destinations", Served), Ok(Route::Shared(Destinations)));
        assert_eq!(get("/admin/outbox/dead", Served), Ok(Route::Shared(DeadRows)));
        assert_eq!(get("/admin/ui", Served), Ok(Route::Shared(Console(None))));
        assert_eq!(get("/admin/ui/", Served), Ok(Route::Shared(Console(Some("")))));
        assert_eq!(get("/admin/ui/console.js", Absent), Ok(Route::Shared(Console(Some("console.js")))));
        assert_eq!(post("/admin/outbox/dead/7/redrive"), Ok(Route::Shared(Redrive(Some("7")))));
        assert_eq!(post("/admin/outbox/redrive"), Ok(Route::Shared(Redrive(None))));
        assert_eq!(get("/admin/outbox/unroutable", Served), Ok(Route::Shared(UnroutableRows)));
    }

    #[test]
    fn without_the_keys_routes_the_same_paths_route_alike_and_the_keys_paths_are_not_found() {
        for path in [
            "/healthz",
            "/readyz",
            "/metrics",
            "/admin/outbox/destinations",
            "/admin/outbox/dead",
            "/admin/outbox/unroutable",
            "/admin/ui/",
        ] {
            assert_eq!(get(path, Absent), get(path, Served), "{path}");
        }
        assert_eq!(route(&Method::POST, "/admin/outbox/redrive", Absent), Ok(Route::Shared(Redrive(None))));
        for method in [Method::GET, Method::DELETE, Method::PUT] {
            assert_eq!(route(&method, "/admin/keys/k", Absent), Err(Miss::NotFound), "{method}");
            assert_eq!(route(&method, "/admin/gateway/outcomes", Absent), Err(Miss::NotFound), "{method}");
        }
    }

    #[test]
    fn unknown_paths_are_not_found_whatever_the_method() {
        for path in [
            "/",
            "",
            "/healthz/",
            "/healthz/x",
            "/admin",
            "/admin/",
            "/admin/keys",
            "/admin/keys/",
            "/admin/keys/k/x",
            "/admin/outbox",
            "/admin/outbox/dead//redrive",
            "/admin/outbox/dead/7",
            "/HEALTHZ",
            "/admin/ui/a/b",
            "/admin/gateway",
        ] {
            assert_eq!(get(path, Served), Err(Miss::NotFound), "{path:?}");
            assert_eq!(route(&Method::POST, path, Served), Err(Miss::NotFound), "{path:?}");
        }
    }

    #[test]
    fn a_known_path_with_another_method_names_the_allowed_ones() {
        let not_allowed = |method: Method, path| route(&method, path, Served);
        assert_eq!(not_allowed(Method::POST, "/readyz"), Err(Miss::MethodNotAllowed("GET")));
        assert_eq!(not_allowed(Method::HEAD, "/healthz"), Err(Miss::MethodNotAllowed("GET")));
        assert_eq!(not_allowed(Method::PUT, "/admin/keys/k"), Err(Miss::MethodNotAllowed("GET, DELETE")));
        assert_eq!(not_allowed(Method::GET, "/admin/outbox/redrive"), Err(Miss::MethodNotAllowed("POST")));
        assert_eq!(not_allowed(Method::GET, "/admin/outbox/dead/7/redrive"), Err(Miss::MethodNotAllowed("POST")));
        assert_eq!(not_allowed(Method::DELETE, "/admin/outbox/dead"), Err(Miss::MethodNotAllowed("GET")));
    }

    /// `ROUTES` is what openapi.yaml is checked against; the router must agree with it.
    #[test]
    fn the_router_serves_exactly_the_routes_table() {
        let methods = [Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::HEAD];
        for (_, template) in ROUTES {
            let path = template.replace("{key}", "k").replace("{id}", "7");
            let listed: Vec<&str> = ROUTES.iter().filter(|(_, t)| t == template).map(|(m, _)| *m).collect();
            let allow = listed.join(", ");
            for method in &methods {
                match route(method, &path, Served) {
                    Ok(found) => {
                        assert_eq!(found.is_behind_bearer(), template.starts_with("/admin/"), "{path}");
                        assert!(listed.contains(&method.as_str()), "{method} {path} is not in ROUTES")
                    }
                    Err(Miss::MethodNotAllowed(got)) => {
                        assert!(!listed.contains(&method.as_str()), "{method} {path} is in ROUTES");
                        assert_eq!(got, allow, "{path}");
                    }
                    Err(Miss::NotFound) => panic!("{method} {path} not found"),
                }
            }
        }
    }

    fn token_access() -> AdminAccess {
        let config = AdminConfig { token: Some(Secret::new("0123456789abcdef-token")), ..Default::default() };
        AdminAccess::from_config(&config).unwrap()
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
        headers
    }

    #[test]
    fn only_admin_paths_need_the_token() {
        let access = token_access();
        let none = HeaderMap::new();
        let admit_get = |path, headers: &HeaderMap| admit(&Method::GET, path, headers, Served, &access);
        for path in ["/healthz", "/readyz", "/metrics", "/admin/ui", "/admin/ui/", "/admin/ui/console.css"] {
            assert!(admit_get(path, &none).is_ok(), "{path}");
        }
        assert_eq!(admit_get("/admin/gateway/outcomes", &none), Err(Problem::Unauthorized));
        assert_eq!(admit_get("/admin/outbox/destinations", &none), Err(Problem::Unauthorized));
        assert_eq!(admit_get("/admin/outbox/dead", &none), Err(Problem::Unauthorized));
        assert_eq!(admit_get("//admin/outbox/dead", &none), Err(Problem::Unauthorized), "routed alike, checked alike");
        assert_eq!(admit_get("/admin/keys/k", &bearer("wrong-token-0123456789")), Err(Problem::Unauthorized));
        let good = bearer("0123456789abcdef-token");
        assert_eq!(admit_get("/admin/keys/k", &good), Ok(Route::Key { raw_key: "k", purge: false }));
        let off = AdminAccess::from_config(&AdminConfig::default()).unwrap();
        assert_eq!(admit(&Method::GET, "/admin/outbox/dead", &good, Served, &off), Err(Problem::AdminDisabled));
        assert!(admit(&Method::GET, "/metrics", &none, Served, &off).is_ok());
    }

    #[test]
    fn a_wrong_path_or_method_is_answered_before_the_token_is_looked_at() {
        let access = token_access();
        let none = HeaderMap::new();
        assert_eq!(admit(&Method::GET, "/admin/nope", &none, Served, &access), Err(Problem::NotFound));
        assert_eq!(
            admit(&Method::PUT, "/admin/keys/k", &none, Served, &access),
            Err(Problem::MethodNotAllowed("GET, DELETE"))
        );
        assert_eq!(admit(&Method::GET, "/admin/keys/k", &none, Absent, &access), Err(Problem::NotFound));
    }
}
