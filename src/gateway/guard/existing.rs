//! Requests whose key already has a record, and requests the store could
//! not record: replay, `409`, `422`, `502 outcome-unknown`, waiting for a
//! running attempt, and fail-closed or fail-open.

use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;

use super::attempt::{Attempt, Forward, respond};
use super::{Answer, rules, unguarded_problem};
use crate::config::{ConcurrentMode, FailMode};
use crate::gateway::headers::IDEMPOTENT_REPLAYED;
use crate::gateway::problem::Problem;
use crate::gateway::rewrite::rewrite;
use crate::gateway::{Disposition, StoreOp};
use crate::http::body::{ResponseBody, full};
use crate::http::client::UpstreamError;
use crate::http::request_body::BufferedBody;
use crate::http::sending::mark_settled;
use crate::idempotency::{Fingerprint, Record, StoredResponse, decide};
use crate::store::{Store, StoreError};

impl<S: Store> Attempt<S> {
    /// The answer to a request whose key already has a record. With
    /// `concurrent = "wait"` a duplicate of a running attempt polls (never
    /// begins) until that attempt settles: it replays a completion, and if
    /// the attempt was released or taken over it gets `409` instead of
    /// running the request itself, so N waiters never run it N times.
    pub(super) async fn answer_existing(&self, mut record: Record, fingerprint: &Fingerprint) -> Answer {
        let policy = &self.gateway.policy;
        let awaited = match record {
            Record::InFlight { fence, .. } => Some(fence),
            _ => None,
        };
        let wait_until = Instant::now() + policy.wait_timeout;
        let mut pause = rules::FIRST_PAUSE;
        let in_flight = |retry_after| (Disposition::Conflict, Problem::RequestInFlight { retry_after }.to_response());
        loop {
            let lease_left = match rules::answer_for(decide(&record, fingerprint)) {
                rules::Answer::Final(outcome, problem) => return (outcome, problem.to_response()),
                rules::Answer::Replay(stored) => return (Disposition::Replayed, replay(stored)),
                rules::Answer::Busy { lease_left } => lease_left,
            };
            if policy.concurrent != ConcurrentMode::Wait || Instant::now() + pause >= wait_until {
                return in_flight(rules::retry_after(self.route.latency.get(), lease_left));
            }
            tokio::time::sleep(pause).await;
            pause = rules::next_pause(pause);
            record = match self.gateway.store_call(StoreOp::Get, self.gateway.store.get(&self.scoped)).await {
                Ok(Some(next)) => match next {
                    Record::InFlight { fence, .. } if Some(fence) != awaited => {
                        return in_flight(rules::LAPSED_RETRY_AFTER);
                    }
                    next => next,
                },
                // Released (or lapsed): the awaited attempt left no result.
                Ok(None) => return in_flight(rules::LAPSED_RETRY_AFTER),
                Err(e) => {
                    tracing::warn!(key = self.hashed.as_deref(), error = %e, "store unavailable while waiting");
                    return (Disposition::StoreError, Problem::StoreUnavailable.to_response());
                }
            };
        }
    }

    /// The store failed at begin: refuse (`fail_mode = "closed"`) or
    /// forward without a record (`"open"`). A begin the replicas did not
    /// acknowledge (`wait_replicas`) is refused either way: the store is up
    /// and was asked for durability, and forwarding without it would give
    /// up exactly what was asked for.
    pub(super) async fn store_down(self, error: StoreError, parts: http::request::Parts, body: BufferedBody) -> Answer {
        tracing::warn!(key = self.hashed.as_deref(), error = %error, "store unavailable");
        let unreplicated = matches!(error, StoreError::Unreplicated { .. });
        match self.gateway.policy.fail_mode {
            _ if unreplicated => (Disposition::StoreError, Problem::StoreUnavailable.to_response()),
            FailMode::Closed => (Disposition::StoreError, Problem::StoreUnavailable.to_response()),
            FailMode::Open => {
                let response = match rewrite(&self.route, parts, full(body.bytes.clone()), &self.client, None) {
                    Ok(request) => match self.forward_unguarded(request).await {
                        Forward::Answered(buffered) => respond(buffered),
                        Forward::Failed { error, .. } => unguarded_problem(&error),
                    },
                    Err(_) => Problem::Internal.to_response(),
                };
                (Disposition::FailOpen, response)
            }
        }
    }

    /// Fail-open forwarding: no record, so the client's own wait bounds it.
    async fn forward_unguarded(&self, request: Request<ResponseBody>) -> Forward {
        let timeout = self.gateway.policy.upstream_timeout;
        match tokio::time::timeout(timeout, self.forward(request)).await {
            Ok(forward) => forward,
            Err(_) => Forward::Failed { status: None, error: UpstreamError::TimedOut(timeout) },
        }
    }
}

/// A stored response, sent again with `Idempotent-Replayed: true`.
fn replay(stored: &StoredResponse) -> Response<ResponseBody> {
    let mut response = Response::new(full(stored.body.clone()));
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    headers.reserve(stored.headers.len() + 1);
    headers.extend(stored.headers.iter().map(|(name, value)| (name.clone(), value.clone())));
    headers.insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    mark_settled(&mut response);
    response
}
