//! A request whose key already has a record: replay, `409`, `422`,
//! `502 outcome-unknown`, or (`concurrent = "wait"`) wait for the attempt
//! that holds the key. It never forwards and never writes: it only reads
//! the record ([`rules::answer_for`] decides what to answer).

use http::header::HeaderValue;
use http::{Response, StatusCode};
use tokio::time::Instant;

use super::rules;
use super::store_calls::StoreOp;
use crate::config::ConcurrentMode;
use crate::gateway::headers::IDEMPOTENT_REPLAYED;
use crate::gateway::problem::Problem;
use crate::gateway::reply::Reply;
use crate::gateway::routes::Route;
use crate::gateway::{Disposition, Gateway};
use crate::http::body::{BoxedBody, full};
use crate::http::sending::mark_settled;
use crate::idempotency::{Fingerprint, Record, ScopedKey, StoredResponse, decide};
use crate::store::Store;

/// A guarded request whose `try_begin` found its key's record.
pub(super) struct Existing<'a, S> {
    pub(super) gateway: &'a Gateway<S>,
    pub(super) route: &'a Route,
    pub(super) scoped: &'a ScopedKey,
    /// The logged form of the key.
    pub(super) hashed: Option<&'a str>,
}

impl<S: Store> Existing<'_, S> {
    /// The answer to a request whose key already has a record. With
    /// `concurrent = "wait"` a duplicate of a running attempt polls (never
    /// begins) until that attempt settles: it replays a completion, and if
    /// the attempt was released or taken over it gets `409` instead of
    /// running the request itself, so N waiters never run it N times.
    pub(super) async fn answer(&self, mut record: Record, fingerprint: &Fingerprint) -> Reply {
        let policy = &self.gateway.policy;
        let awaited = match record {
            Record::InFlight { fence, .. } => Some(fence),
            _ => None,
        };
        let wait_until = Instant::now() + policy.wait_timeout;
        let mut pause = rules::FIRST_PAUSE;
        let in_flight = |retry_after| Reply::problem(Disposition::Conflict, Problem::RequestInFlight { retry_after });
        loop {
            let lease_left = match rules::answer_for(decide(&record, fingerprint)) {
                rules::Answer::Final(outcome, problem) => return Reply::problem(outcome, problem),
                rules::Answer::Replay(stored) => return Reply::new(Disposition::Replayed, replay(stored)),
                rules::Answer::Busy { lease_left } => lease_left,
            };
            if policy.concurrent != ConcurrentMode::Wait || Instant::now() + pause >= wait_until {
                return in_flight(rules::retry_after(self.route.latency.get(), lease_left));
            }
            tokio::time::sleep(pause).await;
            pause = rules::next_pause(pause);
            let gateway = self.gateway;
            record = match gateway.store_calls.call(StoreOp::Get, gateway.store.get(self.scoped)).await {
                Ok(Some(next)) => match next {
                    Record::InFlight { fence, .. } if Some(fence) != awaited => {
                        return in_flight(rules::LAPSED_RETRY_AFTER);
                    }
                    next => next,
                },
                // Released (or lapsed): the awaited attempt left no result.
                Ok(None) => return in_flight(rules::LAPSED_RETRY_AFTER),
                Err(e) => {
                    tracing::warn!(key = self.hashed, error = %e, "store unavailable while waiting");
                    return Reply::problem(Disposition::StoreError, Problem::StoreUnavailable);
                }
            };
        }
    }
}

/// A stored response, sent again with `Idempotent-Replayed: true`.
fn replay(stored: &StoredResponse) -> Response<BoxedBody> {
    let mut response = Response::new(full(stored.body.clone()));
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    headers.reserve(stored.headers.len() + 1);
    headers.extend(stored.headers.iter().map(|(name, value)| (name.clone(), value.clone())));
    headers.insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    mark_settled(&mut response);
    response
}
