//! The idempotency guard: one guarded request from key to settled record.
//!
//! Order matters and is the point of this file:
//! 1. the body is read whole under its size, time and per-connection memory
//!    limits *before* any store operation, so a refused request never
//!    creates a record (and a refused upload still reads its `413`); on a
//!    webhook route the delivery's signature is verified next, before its
//!    key is even looked at (a forged delivery gets `401`, whatever else is
//!    wrong with it, and occupies nothing), and a key in the body is
//!    found now. A verified delivery's tenant is its route; where the
//!    signature covers its event id, the id is its fingerprint, so a
//!    redelivery replays, never `422`s (`routes::Webhook::id_is_signed`);
//! 2. `try_begin` acquires the key or reports its record in one atomic step
//!    (or, for a new key of a tenant over its `tenant_quota`, refuses it
//!    with `429` and records nothing — never taken for a store failure, so
//!    `fail_mode = "open"` cannot forward past a quota);
//! 3. an acquired attempt runs in a tracked task that renews its lease for
//!    as long as it runs. The client waits for it at most
//!    `upstream_timeout`, then gets `504` while the attempt goes on until
//!    `upstream_deadline`: an upstream that is merely slow may still act,
//!    and its late answer is what retries must get;
//! 4. the attempt then settles its record under its fence *before* the
//!    client is answered, so a client that retries the moment it has an
//!    answer gets the replay. What it settles to follows one rule — store
//!    what says the upstream acted, release only what proves it did not,
//!    and hold as unknown what nobody can tell — and a settle that meets a
//!    failing store is retried, renewing the lease, while the lease lasts.
//!    If the lease lapses first, the client is answered then, and the
//!    settle goes on under its fence until `upstream_deadline`: the store
//!    refuses it if another attempt took over, and takes it otherwise;
//! 5. the client's disconnect cannot cancel steps 3 and 4.
//!
//! The files, one a stage: this one (read, verify, key, tenant, begin),
//! `existing.rs` (a key that has a record), `attempt.rs` (an acquired
//! attempt, and fail-open forwarding), `rules.rs` (what they decide, as
//! plain functions) and `store_calls.rs` (every store call of the guard,
//! under the one store timeout).

use std::sync::Arc;
use std::sync::atomic::AtomicU16;
use std::time::SystemTime;

use http::header::{self, HeaderValue};
use http::{Request, Response, Version};
use hyper::body::Incoming;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::problem::Problem;
use super::reply::{Handled, Reply};
use super::routes::{Delivery, Route};
use super::{Disposition, Gateway};
use crate::http::body::{BoxedBody, full};
use crate::http::connection::ConnectionInfo;
use crate::http::request_body::{BodyError, linger, read_whole};
use crate::idempotency::{Fence, Fingerprint, IdempotencyKey, ScopedKey, TenantError};
use crate::store::{Begin, Store};
use crate::webhook::FailureKind;
use attempt::Attempt;
use existing::Existing;
pub(super) use store_calls::StoreCalls;
use store_calls::StoreOp;

mod attempt;
mod existing;
mod rules;
mod store_calls;

/// Guards one request: one that carries a key in its head, or (`key`
/// `None`) one whose key is found after its body is read and verified.
pub(super) async fn run<S: Store>(
    gateway: &Arc<Gateway<S>>,
    route: &Arc<Route>,
    request: Request<Incoming>,
    key: Option<IdempotencyKey>,
    connection: &ConnectionInfo,
) -> Handled {
    // Taken before anything is read or recorded, and held by an acquired
    // attempt until it has settled, whatever happens to the stream.
    let Ok(running) = connection.running.clone().try_acquire_owned() else {
        return Reply::problem(Disposition::ConnectionBusy, Problem::ConnectionBusy).into();
    };
    let policy = &gateway.policy;
    let (parts, mut body) = request.into_parts();
    let limit = policy.max_request_body;
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let read = match declared {
        Some(len) if len > limit => Err(BodyError::TooLarge(limit)),
        // Only HTTP/2 multiplexes bodies on one connection; an HTTP/1.1
        // connection holds one request's body at a time.
        _ => {
            let budget = (parts.version == Version::HTTP_2).then_some(&connection.body_budget);
            read_whole(&mut body, limit, budget, policy.request_body_timeout).await
        }
    };
    let body = match read {
        Ok(body) => body,
        Err(error) => return Reply::new(Disposition::BadBody, refuse_body(error, body, parts.version)).into(),
    };
    if let Some(webhook) = &route.webhook
        && let Err(failure) = webhook.verifier.verify(&parts.headers, &body.bytes, SystemTime::now())
    {
        let (outcome, delivery) = match failure.kind {
            FailureKind::Signature => (Disposition::WebhookSignature, Delivery::SignatureFailed),
            FailureKind::Timestamp => (Disposition::WebhookTimestamp, Delivery::TimestampFailed),
        };
        route.count_delivery(&gateway.metrics, delivery, Some(failure.reason));
        return Reply::problem(outcome, Problem::from(failure)).into();
    }
    let key = match key.map_or_else(|| route.key.find(&parts.headers, &body.bytes), |key| Ok(Some(key))) {
        Ok(Some(key)) => key,
        Ok(None) if route.require_key || route.webhook.is_some() => {
            count_verified(gateway, route, Disposition::MissingKey);
            return Reply::problem(Disposition::MissingKey, Problem::missing_key(&route.key)).into();
        }
        // A key in the body that is not there: forwarded as a request
        // without a key is, from the body already read.
        Ok(None) => {
            drop(running);
            return Box::pin(gateway.forward_unguarded(route, parts, full(body.bytes), connection)).await.into();
        }
        Err(e) => {
            count_verified(gateway, route, Disposition::InvalidKey);
            return Reply::problem(Disposition::InvalidKey, Problem::InvalidKey(e)).into();
        }
    };
    let Scoped { key: scoped, fingerprint } = match scope(gateway, route, &parts, &key, &body.bytes) {
        Ok(scoped) => scoped,
        Err(reply) => return reply.into(),
    };
    let hashed = Some(scoped.log_id());
    let fence = Fence::random();
    let begin = gateway
        .store_calls
        .call(StoreOp::Begin, gateway.store.try_begin(&scoped, &fingerprint, fence, policy.lease))
        .await;
    let begun_at = Instant::now();
    let attempt = Attempt {
        gateway: gateway.clone(),
        route: route.clone(),
        scoped,
        fingerprint,
        fence,
        client: connection.client.clone(),
        hashed: hashed.clone(),
        head_status: AtomicU16::new(0),
    };
    let reply = match begin {
        Ok(Begin::Acquired { took_over }) => {
            if took_over {
                gateway.metrics.lease_takeovers.inc();
                tracing::info!(key = hashed.as_deref(), "took over an expired lease");
            }
            let (reply, answer) = oneshot::channel();
            // A separate task: neither the client's disconnect nor its
            // `upstream_timeout` may abandon the attempt or its record.
            // Boxed, because a task's cell holds its future inline and tokio
            // moves that cell (kilobytes here) several times per spawn.
            gateway.tasks.spawn(Box::pin(attempt.run(parts, body, begun_at, reply, running)));
            answer.await.unwrap_or_else(|_| Reply::problem(Disposition::UpstreamError, Problem::Internal))
        }
        Ok(Begin::Existing(record)) => {
            let existing = Existing { gateway, route, scoped: &attempt.scoped, hashed: attempt.hashed.as_deref() };
            existing.answer(record, &attempt.fingerprint).await
        }
        Ok(Begin::OverQuota(limit)) => {
            gateway.metrics.tenant_quota_refusals.with_label_values(&[limit.as_str()]).inc();
            Reply::problem(Disposition::TenantQuota, Problem::TenantQuota(limit))
        }
        // Boxed: the store-down path (a whole unguarded forward) is rare,
        // and inline it would size every guarded request's future.
        Err(e) => Box::pin(attempt.store_down(e, parts, body)).await,
    };
    count_verified(gateway, route, reply.disposition);
    Handled { reply, logged_key: hashed }
}

/// A guarded request's key in its key space, and what makes two requests
/// with that key the same one.
struct Scoped {
    key: ScopedKey,
    fingerprint: Fingerprint,
}

/// Scopes `key`: a webhook delivery's to its route (the fingerprint its
/// event id where the signature covers it), any other's to its tenant.
/// The refusal is the reply itself: it is returned at once, so a box would
/// only allocate.
#[allow(clippy::result_large_err)]
fn scope<S>(
    gateway: &Gateway<S>,
    route: &Route,
    parts: &http::request::Parts,
    key: &IdempotencyKey,
    body: &[u8],
) -> Result<Scoped, Reply> {
    let fingerprint_of = || gateway.fingerprint.fingerprint(&parts.method, &parts.uri, &parts.headers, body);
    if let Some(webhook) = &route.webhook {
        let fingerprint = match webhook.id_is_signed {
            true => Fingerprint::of_event(key),
            false => fingerprint_of(),
        };
        return Ok(Scoped { key: ScopedKey::for_route(&webhook.tenant, &route.name, key), fingerprint });
    }
    let tenant = match gateway.tenant.tenant_of(&parts.headers) {
        Ok(tenant) => tenant,
        Err(TenantError::Unauthenticated { challenge, why }) => {
            return Err(Reply::problem(Disposition::Unauthenticated, Problem::Unauthenticated { challenge, why }));
        }
        Err(e) => return Err(Reply::problem(Disposition::AmbiguousTenant, Problem::AmbiguousTenant(e))),
    };
    let key = match route.key.route_scoped() {
        true => ScopedKey::for_route(&tenant, &route.name, key),
        false => ScopedKey::new(&tenant, key),
    };
    Ok(Scoped { key, fingerprint: fingerprint_of() })
}

/// Counts a verified webhook delivery: replayed when the store answered it.
fn count_verified<S: Store>(gateway: &Gateway<S>, route: &Route, outcome: Disposition) {
    if route.webhook.is_some() {
        let delivery = if outcome == Disposition::Replayed { Delivery::Replayed } else { Delivery::Verified };
        route.count_delivery(&gateway.metrics, delivery, None);
    }
}

/// The answer to a body that was refused before anything was recorded.
/// An oversized HTTP/1 upload is drained in the background and its
/// connection closed after the `413`, so the client reads the `413` instead
/// of a reset.
fn refuse_body(error: BodyError, body: Incoming, version: Version) -> Response<BoxedBody> {
    match error {
        BodyError::TooLarge(limit) => {
            let mut response = Problem::BodyTooLarge { limit }.to_response();
            if version <= Version::HTTP_11 {
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                linger(body);
            }
            response
        }
        BodyError::TimedOut(_) => Problem::BodyTimeout.to_response(),
        BodyError::Broken(_) => Problem::BadRequestBody.to_response(),
    }
}
