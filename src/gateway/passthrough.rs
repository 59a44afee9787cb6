//! Forwarding without a record: requests a route does not guard, guarded
//! ones without a key on routes that do not require one, and those whose
//! key was to be in a body that turned out not to hold one. Nothing here
//! touches the store.

use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;

use super::problem::Problem;
use super::reply::Reply;
use super::routes::Route;
use super::{Disposition, Gateway, headers, rewrite};
use crate::http::body::{BoxedBody, boxed};
use crate::http::connection::ConnectionInfo;
use crate::http::request_body::Paced;
use crate::store::Store;

impl<S: Store> Gateway<S> {
    /// Forwards without touching the store, streaming both bodies; a
    /// client that stalls its body longer than `request_body_timeout`
    /// between two chunks ends the upstream request. A failed forward is
    /// counted as `upstream_error`, like a guarded one, so alerts on
    /// upstream errors see unguarded traffic too.
    pub(super) async fn passthrough(
        &self,
        route: &Route,
        request: Request<Incoming>,
        connection: &ConnectionInfo,
    ) -> Reply {
        let (parts, body) = request.into_parts();
        let body = match http_body::Body::is_end_stream(&body) {
            true => boxed(body),
            false => boxed(Paced::new(body, self.policy.request_body_timeout)),
        };
        self.forward_unguarded(route, parts, body, connection).await
    }

    /// Forwards a request without a record: a streamed passthrough, or a
    /// body that was read whole to look for its key and had none.
    pub(super) async fn forward_unguarded(
        &self,
        route: &Route,
        parts: http::request::Parts,
        body: BoxedBody,
        connection: &ConnectionInfo,
    ) -> Reply {
        let request = match rewrite::rewrite(route, parts, body, &connection.client, None) {
            Ok(request) => request,
            Err(e) => {
                tracing::warn!(route = %route.name, error = %e, "cannot rewrite request");
                return Reply::problem(Disposition::UpstreamError, Problem::Internal);
            }
        };
        let sent = Instant::now();
        let timeout = self.policy.upstream_timeout;
        let result = tokio::time::timeout(timeout, route.upstream.send(request, timeout))
            .await
            .unwrap_or(Err(crate::http::client::UpstreamError::TimedOut(timeout)));
        route.observe_upstream(&self.metrics, sent.elapsed());
        match result {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                headers::clean_response_head(&mut parts);
                Reply::new(Disposition::Passthrough, Response::from_parts(parts, boxed(body)))
            }
            Err(e) => {
                tracing::warn!(route = %route.name, error = %e, "upstream failed");
                Reply::problem(Disposition::UpstreamError, Problem::unguarded(&e))
            }
        }
    }
}
