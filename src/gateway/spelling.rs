//! One spelling of a request: what routing, the fingerprint and forwarding
//! see is the same request, however the client spelled it.
//!
//! - The path is normalised in place ([`crate::http::path`]) before the
//!   route is looked up, so the upstream receives the path the guard
//!   judged. A path whose route would change under the readings of the
//!   most forgiving upstreams — `;` parameters stripped (Tomcat, Jetty),
//!   case ignored (IIS, ASP.NET) — is refused: a guard such a client could
//!   step around by spelling is no guard.
//! - The method is judged as the upstream may read it: a method-override
//!   header makes a request guarded when either its own method or the one
//!   it names is; a method equal to a guarded one only when case is
//!   ignored (`post`) is refused.

use std::sync::Arc;

use http::uri::{PathAndQuery, Uri};
use http::{HeaderMap, Method, Request};

use super::problem::Problem;
use super::routes::{Route, RouteTable};
use crate::http::path::{self, PathError};
use crate::idempotency::fingerprint::METHOD_OVERRIDES;

/// Why a request has no one spelling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguity {
    /// The path itself cannot be normalised.
    #[error(transparent)]
    Path(#[from] PathError),
    /// Stripping `;` parameters leads to another route.
    #[error("the path leads to another route once its ';' parameters are stripped, as Tomcat and Jetty strip them")]
    PathParameters,
    /// Ignoring case leads to another route.
    #[error("the path leads to another route when case is ignored, as IIS and ASP.NET ignore it")]
    Case,
    /// The method equals a guarded one only when case is ignored.
    #[error("the method {0:?} is a guarded method in other letters' case")]
    MethodCase(String),
    /// A method-override header is repeated or names no method.
    #[error("a method-override header is repeated or names no method")]
    MethodOverride,
}

/// Normalises the request's path in place and finds its route (`None`:
/// no route matches).
pub(super) fn route<'t, B>(
    routes: &'t RouteTable,
    request: &mut Request<B>,
) -> Result<Option<&'t Arc<Route>>, Problem> {
    let refuse = |ambiguity: Ambiguity| Problem::AmbiguousRequest(ambiguity);
    if let Some(normal) = path::normalize(request.uri().path()).map_err(|e| refuse(e.into()))? {
        *request.uri_mut() = with_path(request.uri(), &normal).ok_or(refuse(Ambiguity::Path(PathError::BadEscape)))?;
    }
    let path = request.uri().path();
    let route = routes.find(path);
    let lenient = path::lenient_view(path).map_err(|e| refuse(e.into()))?;
    if let Some(lenient) = &lenient
        && !same(routes.find(lenient), route)
    {
        return Err(refuse(Ambiguity::PathParameters));
    }
    if routes.case_matters() {
        let views = std::iter::once(path).chain(lenient.as_deref());
        for view in views {
            if !same(routes.find_ignoring_case(view), route) {
                return Err(refuse(Ambiguity::Case));
            }
        }
    }
    Ok(route)
}

/// How the guard judges a request's method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Judged {
    /// Guarded: its method, or the one an override header names, is.
    Guarded,
    /// Passed through.
    Unguarded,
}

/// Judges the request's method on `route`.
pub(super) fn judge_method(route: &Route, method: &Method, headers: &HeaderMap) -> Result<Judged, Problem> {
    let refuse = |ambiguity: Ambiguity| Err(Problem::AmbiguousRequest(ambiguity));
    // A guarded method is guarded whatever an override names (the
    // fingerprint tells such requests apart): the common case stops here.
    if route.guards(method) {
        return Ok(Judged::Guarded);
    }
    match overriding_method(headers) {
        Ok(Some(named)) if route.guards(&named) => return Ok(Judged::Guarded),
        Ok(_) => {}
        Err(()) => return refuse(Ambiguity::MethodOverride),
    }
    if route.methods.iter().any(|guarded| guarded.as_str().eq_ignore_ascii_case(method.as_str())) {
        return refuse(Ambiguity::MethodCase(method.as_str().to_owned()));
    }
    Ok(Judged::Unguarded)
}

/// The method an override header names, upper-cased as the frameworks
/// that honour one read it; `Err` for two fields or no method.
fn overriding_method(headers: &HeaderMap) -> Result<Option<Method>, ()> {
    let mut named = None;
    // One pass over the request's few names, not three hashed lookups.
    for (_, value) in headers.iter().filter(|(name, _)| METHOD_OVERRIDES.contains(name)) {
        let method = value.to_str().ok().map(|v| v.trim().to_ascii_uppercase()).filter(|v| !v.is_empty());
        let method = method.and_then(|v| Method::from_bytes(v.as_bytes()).ok()).ok_or(())?;
        if named.replace(method).is_some() {
            return Err(());
        }
    }
    Ok(named)
}

/// `uri` with its path replaced (the query and any authority kept).
fn with_path(uri: &Uri, path: &str) -> Option<Uri> {
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::from_maybe_shared(path_and_query).ok()?);
    Uri::from_parts(parts).ok()
}

fn same(a: Option<&Arc<Route>>, b: Option<&Arc<Route>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}
