//! The idempotency guard: one guarded request from key to settled record.
//!
//! Order matters and is the point of this file:
//! 1. the body is read whole under its size, time and per-connection memory
//!    limits *before* any store operation, so a refused request never
//!    creates a record (and a refused upload still reads its `413`);
//! 2. `try_begin` acquires the key or reports its record in one atomic step;
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
//!    failing store is retried, renewing the lease, while the lease lasts;
//! 5. the client's disconnect cannot cancel steps 3 and 4.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version, response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::body::{Prefixed, ResponseBody, boxed, full};
use super::connection::ConnectionInfo;
use super::headers::{IDEMPOTENT_REPLAYED, clean_response_head, headers_to_store};
use super::problem::Problem;
use super::request_body::{BodyError, BufferedBody, linger, read_whole};
use super::routes::Route;
use super::upstream::{ClientInfo, UpstreamBody, UpstreamError, rewrite};
use super::{Gateway, Outcome};
use crate::config::{ConcurrentMode, FailMode, ForwardKey, OnUnknown};
use crate::idempotency::{
    Completion, Decision, Fence, Fingerprint, IdempotencyKey, Record, ScopedKey, StoredResponse, decide,
};
use crate::store::{Begin, Store};

type Guarded = (Outcome, Option<String>, Response<ResponseBody>);
type Answer = (Outcome, Response<ResponseBody>);

/// Guards one request that carries a key.
pub(super) async fn run<S: Store>(
    gateway: &Arc<Gateway<S>>,
    route: &Arc<Route>,
    request: Request<Incoming>,
    key: IdempotencyKey,
    connection: &ConnectionInfo,
) -> Guarded {
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
        Err(error) => return (Outcome::BadBody, None, refuse_body(error, body, parts.version)),
    };
    let tenant = match gateway.tenant.tenant_of(&parts.headers) {
        Ok(tenant) => tenant,
        Err(e) => return (Outcome::AmbiguousTenant, None, Problem::AmbiguousTenant(e).to_response()),
    };
    let scoped = ScopedKey::new(&tenant, &key);
    let hashed = Some(scoped.to_hex()[..16].to_owned());
    let fingerprint = gateway.fingerprint.fingerprint(&parts.method, &parts.uri, &parts.headers, &body.bytes);
    let fence = Fence::random();
    let begin = gateway.bounded("begin", gateway.store.try_begin(&scoped, &fingerprint, fence, policy.lease)).await;
    let begun_at = Instant::now();
    let attempt = Attempt {
        gateway: gateway.clone(),
        route: route.clone(),
        scoped,
        fence,
        client: connection.client.clone(),
        hashed: hashed.clone(),
        head_status: AtomicU16::new(0),
    };
    let (outcome, response) = match begin {
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
            gateway.tasks.spawn(Box::pin(attempt.run(parts, body, begun_at, reply)));
            answer.await.unwrap_or_else(|_| (Outcome::UpstreamError, Problem::Internal.to_response()))
        }
        Ok(Begin::Existing(record)) => attempt.answer_existing(record, &fingerprint).await,
        Err(e) => attempt.store_down(e, parts, body).await,
    };
    (outcome, hashed, response)
}

/// The answer to a body that was refused before anything was recorded.
/// An oversized HTTP/1 upload is drained in the background and its
/// connection closed after the `413`, so the client reads the `413` instead
/// of a reset.
fn refuse_body(error: BodyError, body: Incoming, version: Version) -> Response<ResponseBody> {
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

/// A stored response, sent again with `Idempotent-Replayed: true`.
fn replay(stored: &StoredResponse) -> Response<ResponseBody> {
    let mut response = Response::new(full(stored.body.clone()));
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    for (name, value) in &stored.headers {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_maybe_shared(value.clone()))
        {
            headers.append(name, value);
        }
    }
    headers.insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// An upstream response whose body was read up to the stored-response cap.
struct Buffered {
    head: response::Parts,
    prefix: Bytes,
    /// The unread rest when the body was larger than the cap.
    rest: Option<UpstreamBody>,
}

/// How a forward ended. Lives for one match, so the size difference
/// between its variants costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Forward {
    Answered(Buffered),
    /// The upstream failed; `status` is set when a head had arrived first.
    Failed {
        status: Option<StatusCode>,
        error: UpstreamError,
    },
}

/// What an attempt does to its record at the end.
enum Settlement {
    /// The upstream acted: keep its response (or the fact, when too large).
    Complete(Option<StoredResponse>),
    /// Nobody knows whether the upstream acted: hold the key.
    Unknown,
    /// The upstream provably did not act, or said so: a retry runs again.
    Release,
}

/// One guarded request's dealings with the store and the upstream.
struct Attempt<S> {
    gateway: Arc<Gateway<S>>,
    route: Arc<Route>,
    scoped: ScopedKey,
    fence: Fence,
    client: ClientInfo,
    /// The logged form of the key.
    hashed: Option<String>,
    /// The upstream's response status once its head arrived (0 before).
    head_status: AtomicU16,
}

impl<S: Store> Attempt<S> {
    /// Runs an acquired attempt to its settled record; answers the client
    /// on `reply` (at `upstream_timeout` at the latest, with a `504`).
    async fn run(
        self,
        parts: http::request::Parts,
        body: BufferedBody,
        begun_at: Instant,
        reply: oneshot::Sender<Answer>,
    ) {
        let policy = &self.gateway.policy;
        let mut reply = Some(reply);
        let mut renewed_at = begun_at;
        let forwarded_key = match policy.forward_key {
            ForwardKey::Original => None,
            ForwardKey::Derived => HeaderValue::from_str(&self.scoped.to_hex()).ok(),
        };
        let forward = match rewrite(&self.route, parts, full(body.bytes.clone()), &self.client, forwarded_key) {
            Ok(request) => {
                let forward = self.forward(request);
                tokio::pin!(forward);
                let waited =
                    self.renewing(&mut renewed_at, tokio::time::timeout(policy.upstream_timeout, &mut forward));
                match waited.await {
                    Ok(forward) => forward,
                    Err(_) => {
                        tracing::warn!(
                            route = %self.route.name,
                            key = self.hashed.as_deref(),
                            "the upstream is slower than upstream_timeout: answering 504, the attempt goes on"
                        );
                        answer(&mut reply, (Outcome::TimedOut, Problem::UpstreamTimeout { still_running: true }));
                        // The deadline's timer only starts now: the common,
                        // fast path pays for one timer, not two.
                        let rest = policy.upstream_deadline.saturating_sub(policy.upstream_timeout);
                        match self.renewing(&mut renewed_at, tokio::time::timeout(rest, forward)).await {
                            Ok(forward) => forward,
                            Err(_) => self.past_deadline(),
                        }
                    }
                }
            }
            Err(error) => Forward::Failed { status: None, error },
        };
        drop(body);
        let (settlement, outcome, response) = self.conclude(forward);
        self.settle(&mut renewed_at, settlement).await;
        if reply.is_none() {
            tracing::info!(
                route = %self.route.name,
                key = self.hashed.as_deref(),
                outcome = outcome.as_str(),
                "a late upstream answer settled its record"
            );
        }
        if let Some(reply) = reply {
            let _ = reply.send((outcome, response));
        }
    }

    /// The attempt ran past `upstream_deadline`.
    fn past_deadline(&self) -> Forward {
        let deadline = self.gateway.policy.upstream_deadline;
        self.route.latency.observe(deadline);
        let status = StatusCode::from_u16(self.head_status.load(Ordering::Relaxed)).ok();
        Forward::Failed { status, error: UpstreamError::TimedOut(deadline) }
    }

    /// Sends the request and reads the body up to the cap; the caller
    /// bounds how long that may take.
    async fn forward(&self, request: Request<ResponseBody>) -> Forward {
        let policy = &self.gateway.policy;
        let cap = policy.max_stored_response;
        let mut status = None;
        let sent = Instant::now();
        let call = async {
            let response = self.route.upstream.send(request, policy.upstream_timeout).await?;
            let (mut head, mut body) = response.into_parts();
            status = Some(head.status);
            self.head_status.store(head.status.as_u16(), Ordering::Relaxed);
            clean_response_head(&mut head);
            let mut prefix = BytesMut::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(UpstreamError::Body)?;
                if let Ok(data) = frame.into_data() {
                    prefix.extend_from_slice(&data);
                    if prefix.len() > cap {
                        return Ok(Buffered { head, prefix: prefix.freeze(), rest: Some(body) });
                    }
                }
            }
            Ok(Buffered { head, prefix: prefix.freeze(), rest: None })
        };
        let result = call.await;
        let elapsed = sent.elapsed();
        self.route.latency.observe(elapsed);
        self.gateway
            .metrics
            .upstream_latency
            .with_label_values(&[self.route.name.as_str()])
            .observe(elapsed.as_secs_f64());
        match result {
            Ok(buffered) => Forward::Answered(buffered),
            Err(error) => Forward::Failed { status, error },
        }
    }

    /// The one settlement rule: what the record becomes, and what the
    /// client hears.
    fn conclude(&self, forward: Forward) -> (Settlement, Outcome, Response<ResponseBody>) {
        let stores = |status: StatusCode| self.route.status_policy.stores(status.as_u16());
        let (error, status) = match forward {
            Forward::Answered(buffered) if !stores(buffered.head.status) => {
                return (Settlement::Release, Outcome::Released, respond(buffered));
            }
            Forward::Answered(buffered) => {
                let stored = buffered.rest.is_none().then(|| StoredResponse {
                    status: buffered.head.status.as_u16(),
                    headers: headers_to_store(&buffered.head.headers, &self.gateway.policy.response_header_deny),
                    body: buffered.prefix.clone(),
                });
                return (Settlement::Complete(stored), Outcome::Forwarded, respond(buffered));
            }
            Forward::Failed { status, error } => (error, status),
        };
        tracing::warn!(route = %self.route.name, key = self.hashed.as_deref(), error = %error, "upstream failed");
        match status {
            // A head that says the upstream acted, then a broken body: the
            // effect happened, so the key must not run again.
            Some(status) if stores(status) => {
                (Settlement::Complete(None), Outcome::UpstreamError, Problem::ResponseIncomplete.to_response())
            }
            Some(_) => {
                (Settlement::Release, Outcome::UpstreamError, Problem::UpstreamUnavailable { sent: true }.to_response())
            }
            None if !error.may_have_been_sent() => (
                Settlement::Release,
                Outcome::UpstreamError,
                Problem::UpstreamUnavailable { sent: false }.to_response(),
            ),
            None => match self.route.on_unknown {
                OnUnknown::Hold => {
                    (Settlement::Unknown, Outcome::Unknown, Problem::OutcomeUnknown { held: true }.to_response())
                }
                OnUnknown::Release => {
                    (Settlement::Release, Outcome::Unknown, Problem::OutcomeUnknown { held: false }.to_response())
                }
            },
        }
    }

    /// Runs `work` while renewing the lease every third of it; `renewed_at`
    /// tracks when the store last confirmed the lease.
    async fn renewing<T>(&self, renewed_at: &mut Instant, work: impl Future<Output = T>) -> T {
        let lease = self.gateway.policy.lease;
        tokio::pin!(work);
        let mut held = true;
        let mut next = *renewed_at + lease / 3;
        loop {
            let renew = async {
                tokio::time::sleep_until(next).await;
                let asked = Instant::now();
                (asked, self.gateway.bounded("renew", self.gateway.store.renew(&self.scoped, self.fence, lease)).await)
            };
            tokio::select! {
                output = &mut work => return output,
                (asked, renewed) = renew, if held => match renewed {
                    Ok(true) => {
                        *renewed_at = asked;
                        next = asked + lease / 3;
                    }
                    Ok(false) => {
                        self.gateway.metrics.fence_rejections.with_label_values(&["renew"]).inc();
                        // Fenced out: another attempt owns the key now. Finish
                        // for our client; our settle will be refused.
                        tracing::warn!(route = %self.route.name, "lease lost while the upstream call was running");
                        held = false;
                    }
                    Err(e) => {
                        tracing::warn!(route = %self.route.name, error = %e, "lease renewal failed; will retry");
                        next = Instant::now() + (lease / 10).max(Duration::from_millis(50));
                    }
                },
            }
        }
    }

    /// Settles the record under this attempt's fence. A failing store is
    /// retried with backoff, renewing the lease in between, for as long as
    /// the lease holds: a record left in flight would let a retry take over
    /// and run the request again once the lease ends, so a store blip
    /// shorter than the lease must never get that far.
    async fn settle(&self, renewed_at: &mut Instant, settlement: Settlement) {
        let gateway = &self.gateway;
        let (lease, ttl) = (gateway.policy.lease, gateway.policy.key_ttl);
        let (operation, completion) = match &settlement {
            Settlement::Complete(response) => ("complete", Some(Completion::from_response(response.as_ref()))),
            Settlement::Unknown => ("complete", Some(Completion::Unknown)),
            Settlement::Release => ("release", None),
        };
        let mut pause = Duration::from_millis(50);
        loop {
            let result = match completion {
                Some(completion) => {
                    gateway.bounded(operation, gateway.store.complete(&self.scoped, self.fence, completion, ttl)).await
                }
                None => gateway.bounded(operation, gateway.store.release(&self.scoped, self.fence)).await,
            };
            let error = match result {
                Ok(true) => return,
                Ok(false) => {
                    gateway.metrics.fence_rejections.with_label_values(&[operation]).inc();
                    tracing::warn!(route = %self.route.name, key = self.hashed.as_deref(), "fenced out: the record belongs to a newer attempt; not settled");
                    return;
                }
                Err(error) => error,
            };
            // One more try must be over before the lease ends.
            let lapses_at = *renewed_at + lease;
            if Instant::now() + pause + gateway.policy.store_timeout >= lapses_at {
                gateway.metrics.settle_abandoned.inc();
                tracing::error!(route = %self.route.name, key = self.hashed.as_deref(), error = %error,
                    "cannot settle the record before its lease ends; a retry after that may run the request again");
                return;
            }
            tracing::warn!(route = %self.route.name, key = self.hashed.as_deref(), error = %error, "cannot settle the record yet; retrying while the lease holds");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            let asked = Instant::now();
            if let Ok(true) = gateway.bounded("renew", gateway.store.renew(&self.scoped, self.fence, lease)).await {
                *renewed_at = asked;
            }
        }
    }

    /// The answer to a request whose key already has a record. With
    /// `concurrent = "wait"` a duplicate of a running attempt polls (never
    /// begins) until that attempt settles: it replays a completion, and if
    /// the attempt was released or taken over it gets `409` instead of
    /// running the request itself, so N waiters never run it N times.
    async fn answer_existing(&self, mut record: Record, fingerprint: &Fingerprint) -> Answer {
        let policy = &self.gateway.policy;
        let awaited = match record {
            Record::InFlight { fence, .. } => Some(fence),
            _ => None,
        };
        let wait_until = Instant::now() + policy.wait_timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            let retry_after = match decide(Some(&record), fingerprint) {
                Decision::Mismatch => return (Outcome::Mismatch, Problem::KeyMismatch.to_response()),
                Decision::Replay(stored) => return (Outcome::Replayed, replay(stored)),
                Decision::NotReplayable => {
                    return (Outcome::NotReplayable, Problem::ResponseNotReplayable.to_response());
                }
                Decision::OutcomeUnknown => {
                    return (Outcome::Held, Problem::OutcomeUnknown { held: true }.to_response());
                }
                Decision::InFlight { retry_after } => retry_after,
                // Only if the record changed between two reads: busy.
                Decision::Start | Decision::TakeOver => Duration::from_secs(1),
            };
            let in_flight = |retry_after| (Outcome::Conflict, Problem::RequestInFlight { retry_after }.to_response());
            if policy.concurrent != ConcurrentMode::Wait || Instant::now() + pause >= wait_until {
                // When the running attempt will most likely be done: the
                // route's recent latency, at least 1 s, at most the lease left.
                let estimate = self.route.latency.get().max(Duration::from_secs(1)).min(retry_after);
                return in_flight(estimate);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
            record = match self.gateway.bounded("get", self.gateway.store.get(&self.scoped)).await {
                Ok(Some(next)) => match next {
                    Record::InFlight { fence, .. } if Some(fence) != awaited => {
                        return in_flight(Duration::from_secs(1));
                    }
                    next => next,
                },
                // Released (or lapsed): the awaited attempt left no result.
                Ok(None) => return in_flight(Duration::from_secs(1)),
                Err(e) => {
                    tracing::warn!(key = self.hashed.as_deref(), error = %e, "store unavailable while waiting");
                    return (Outcome::StoreError, Problem::StoreUnavailable.to_response());
                }
            };
        }
    }

    /// The store failed at begin: refuse (`fail_mode = "closed"`) or
    /// forward without a record (`"open"`).
    async fn store_down(
        self,
        error: crate::store::StoreError,
        parts: http::request::Parts,
        body: BufferedBody,
    ) -> Answer {
        tracing::warn!(key = self.hashed.as_deref(), error = %error, "store unavailable");
        match self.gateway.policy.fail_mode {
            FailMode::Closed => (Outcome::StoreError, Problem::StoreUnavailable.to_response()),
            FailMode::Open => {
                let response = match rewrite(&self.route, parts, full(body.bytes.clone()), &self.client, None) {
                    Ok(request) => match self.forward_unguarded(request).await {
                        Forward::Answered(buffered) => respond(buffered),
                        Forward::Failed { error, .. } => unguarded_problem(&error),
                    },
                    Err(_) => Problem::Internal.to_response(),
                };
                (Outcome::FailOpen, response)
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

/// Sends `answer` to the waiting client, once.
fn answer(reply: &mut Option<oneshot::Sender<Answer>>, (outcome, problem): (Outcome, Problem)) {
    if let Some(reply) = reply.take() {
        let _ = reply.send((outcome, problem.to_response()));
    }
}

/// The problem for a request forwarded without a record.
pub(super) fn unguarded_problem(error: &UpstreamError) -> Response<ResponseBody> {
    match error {
        UpstreamError::TimedOut(_) => Problem::UpstreamTimeout { still_running: false }.to_response(),
        error => Problem::UpstreamUnavailable { sent: error.may_have_been_sent() }.to_response(),
    }
}

/// The client's response: the buffered head and prefix, then any unread rest.
fn respond(buffered: Buffered) -> Response<ResponseBody> {
    let body = match buffered.rest {
        Some(rest) => boxed(Prefixed::new(buffered.prefix, rest)),
        None => full(buffered.prefix),
    };
    Response::from_parts(buffered.head, body)
}
