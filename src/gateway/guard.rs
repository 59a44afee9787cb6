//! The idempotency guard: one guarded request from key to settled record.
//!
//! Order matters and is the point of this file:
//! 1. the body is read under `max_request_body` *before* any store
//!    operation, so an oversized request never creates a record;
//! 2. `try_begin` acquires the key or reports its record in one atomic step;
//! 3. an acquired attempt runs in a tracked task that renews its lease while
//!    the upstream works, then completes or releases the record under its
//!    fence *before* the response goes back, so a client that retries the
//!    moment it has an answer gets the replay;
//! 4. the client's disconnect cannot cancel step 3's task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::body::{Prefixed, ResponseBody, boxed, full};
use super::headers::{IDEMPOTENT_REPLAYED, clean_response_head, headers_to_store};
use super::problem::Problem;
use super::routes::Route;
use super::upstream::{ClientInfo, UpstreamBody, UpstreamError, rewrite};
use super::{Gateway, Outcome};
use crate::config::{ConcurrentMode, FailMode, ForwardKey};
use crate::idempotency::{Decision, Fence, IdempotencyKey, ScopedKey, StoredResponse, decide};
use crate::store::{Begin, Store};

type Guarded = (Outcome, Option<String>, Response<ResponseBody>);

/// Guards one request that carries a key.
pub(super) async fn run<S: Store>(
    gateway: &Arc<Gateway<S>>,
    route: &Arc<Route>,
    request: Request<Incoming>,
    key: IdempotencyKey,
    client: ClientInfo,
) -> Guarded {
    let policy = &gateway.policy;
    let (parts, body) = request.into_parts();
    let limit = policy.max_request_body;
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return (Outcome::BadBody, None, Problem::BodyTooLarge { limit }.to_response());
    }
    let body = match Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX)).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return (Outcome::BadBody, None, Problem::BodyTooLarge { limit }.to_response());
        }
        Err(_) => return (Outcome::BadBody, None, Problem::BadRequestBody.to_response()),
    };

    let tenant = match gateway.tenant.tenant_of(&parts.headers) {
        Ok(tenant) => tenant,
        // TODO(main): tenant problem — a placeholder 400 until the real problem type is wired in.
        Err(_) => return (Outcome::InvalidKey, None, Problem::BadRequestBody.to_response()),
    };
    let scoped = ScopedKey::new(&tenant, &key);
    let hashed = Some(scoped.to_hex()[..16].to_owned());
    let fingerprint = gateway.fingerprint.fingerprint(&parts.method, &parts.uri, &parts.headers, &body);
    let fence = Fence::random();
    let wait_until = Instant::now() + policy.wait_timeout;
    let mut pause = Duration::from_millis(10);
    loop {
        let begin = gateway.bounded("begin", gateway.store.try_begin(&scoped, &fingerprint, fence, policy.lease)).await;
        let record = match begin {
            Ok(Begin::Acquired { took_over }) => {
                if took_over {
                    gateway.metrics.lease_takeovers.inc();
                    tracing::info!(key = hashed.as_deref(), "took over an expired lease");
                }
                let attempt = Attempt { gateway: gateway.clone(), route: route.clone(), scoped, fence, client };
                // A separate task: the client's disconnect must not abandon the record.
                // Boxed, because a task's cell holds its future inline and
                // tokio moves that cell (kilobytes here) several times per spawn.
                let task = gateway.tasks.spawn(Box::pin(attempt.run(parts, body)));
                let (outcome, response) =
                    task.await.unwrap_or_else(|_| (Outcome::UpstreamError, Problem::Internal.to_response()));
                return (outcome, hashed, response);
            }
            Ok(Begin::Existing(record)) => record,
            Err(e) => {
                tracing::warn!(key = hashed.as_deref(), error = %e, "store unavailable");
                return match policy.fail_mode {
                    FailMode::Closed => (Outcome::StoreError, hashed, Problem::StoreUnavailable.to_response()),
                    FailMode::Open => {
                        let attempt = Attempt { gateway: gateway.clone(), route: route.clone(), scoped, fence, client };
                        let response = Box::pin(attempt.forward_unguarded(parts, body)).await;
                        (Outcome::FailOpen, hashed, response)
                    }
                };
            }
        };
        let (outcome, response) = match decide(Some(&record), &fingerprint) {
            Decision::Mismatch => (Outcome::Mismatch, Problem::KeyMismatch.to_response()),
            Decision::Replay(stored) => (Outcome::Replayed, replay(stored)),
            Decision::NotReplayable => (Outcome::NotReplayable, Problem::ResponseNotReplayable.to_response()),
            Decision::InFlight { retry_after } => {
                if policy.concurrent == ConcurrentMode::Wait && Instant::now() + pause < wait_until {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(250));
                    continue;
                }
                (Outcome::Conflict, Problem::RequestInFlight { retry_after }.to_response())
            }
            // The store reported a record the table would have acquired:
            // only possible if a record changed between two reads. Busy.
            Decision::Start | Decision::TakeOver => {
                (Outcome::Conflict, Problem::RequestInFlight { retry_after: Duration::from_secs(1) }.to_response())
            }
        };
        return (outcome, hashed, response);
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

/// One acquired attempt at a key.
struct Attempt<S> {
    gateway: Arc<Gateway<S>>,
    route: Arc<Route>,
    scoped: ScopedKey,
    fence: Fence,
    client: ClientInfo,
}

impl<S: Store> Attempt<S> {
    async fn run(self, parts: http::request::Parts, body: Bytes) -> (Outcome, Response<ResponseBody>) {
        let policy = &self.gateway.policy;
        let forwarded_key = match policy.forward_key {
            ForwardKey::Original => None,
            ForwardKey::Derived => HeaderValue::from_str(&self.scoped.to_hex()).ok(),
        };
        let forward = match rewrite(&self.route, parts, full(body), &self.client, forwarded_key) {
            Ok(request) => self.renewing(self.forward(request)).await,
            Err(error) => Forward::Failed { status: None, error },
        };
        match forward {
            Forward::Answered(buffered) => {
                let status = buffered.head.status;
                if !self.route.status_policy.stores(status.as_u16()) {
                    self.settle(Settle::Release).await;
                    return (Outcome::Released, respond(buffered));
                }
                let stored = buffered.rest.is_none().then(|| StoredResponse {
                    status: status.as_u16(),
                    headers: headers_to_store(&buffered.head.headers, &policy.response_header_deny),
                    body: buffered.prefix.clone(),
                });
                self.settle(Settle::Complete(stored)).await;
                (Outcome::Forwarded, respond(buffered))
            }
            Forward::Failed { status, error } => {
                tracing::warn!(route = %self.route.name, error = %error, "upstream failed");
                // A head that says the upstream acted, then a broken body:
                // the effect happened, so the key must not run again.
                let acted = status.is_some_and(|s| self.route.status_policy.stores(s.as_u16()));
                self.settle(if acted { Settle::Complete(None) } else { Settle::Release }).await;
                let timed_out = matches!(error, UpstreamError::TimedOut(_));
                (Outcome::UpstreamError, Problem::UpstreamUnavailable { timed_out }.to_response())
            }
        }
    }

    /// Sends the request and reads the body up to the cap, all within the upstream timeout.
    async fn forward(&self, request: Request<ResponseBody>) -> Forward {
        let timeout = self.gateway.policy.upstream_timeout;
        let cap = self.gateway.policy.max_stored_response;
        let mut status = None;
        let sent = Instant::now();
        let call = async {
            let response = self.route.upstream.send(request, timeout).await?;
            let (mut head, mut body) = response.into_parts();
            status = Some(head.status);
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
        let result = tokio::time::timeout(timeout, call).await;
        self.gateway
            .metrics
            .upstream_latency
            .with_label_values(&[self.route.name.as_str()])
            .observe(sent.elapsed().as_secs_f64());
        match result {
            Ok(Ok(buffered)) => Forward::Answered(buffered),
            Ok(Err(error)) => Forward::Failed { status, error },
            Err(_) => Forward::Failed { status, error: UpstreamError::TimedOut(timeout) },
        }
    }

    /// Runs `work` while renewing the lease every third of it.
    async fn renewing<T>(&self, work: impl Future<Output = T>) -> T {
        let lease = self.gateway.policy.lease;
        tokio::pin!(work);
        let mut held = true;
        loop {
            let renew = async {
                tokio::time::sleep(lease / 3).await;
                self.gateway.bounded("renew", self.gateway.store.renew(&self.scoped, self.fence, lease)).await
            };
            tokio::select! {
                output = &mut work => return output,
                renewed = renew, if held => match renewed {
                    Ok(true) => {}
                    Ok(false) => {
                        self.gateway.metrics.fence_rejections.with_label_values(&["renew"]).inc();
                        // Fenced out: another attempt owns the key now. Finish
                        // for our client; our complete/release will be refused.
                        tracing::warn!(route = %self.route.name, "lease lost while the upstream call was running");
                        held = false;
                    }
                    Err(e) => tracing::warn!(route = %self.route.name, error = %e, "lease renewal failed; will retry"),
                },
            }
        }
    }

    /// Completes or releases the record under this attempt's fence, retrying
    /// a failing store a few times: a record left in flight would let a
    /// retry run again once its lease ends.
    async fn settle(&self, settle: Settle) {
        let gateway = &self.gateway;
        let mut pause = Duration::from_millis(50);
        for attempt in 1..=3 {
            let result = match &settle {
                Settle::Complete(response) => {
                    gateway
                        .bounded(
                            "complete",
                            gateway.store.complete(&self.scoped, self.fence, response.as_ref(), gateway.policy.key_ttl),
                        )
                        .await
                }
                Settle::Release => gateway.bounded("release", gateway.store.release(&self.scoped, self.fence)).await,
            };
            match result {
                Ok(true) => return,
                Ok(false) => {
                    let operation = if matches!(settle, Settle::Release) { "release" } else { "complete" };
                    gateway.metrics.fence_rejections.with_label_values(&[operation]).inc();
                    tracing::warn!(route = %self.route.name, "fenced out: the record belongs to a newer attempt; not settled");
                    return;
                }
                Err(e) if attempt < 3 => {
                    tracing::warn!(route = %self.route.name, error = %e, "cannot settle record; retrying");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(e) => {
                    tracing::error!(route = %self.route.name, error = %e, "cannot settle record; it stays in flight until its lease ends")
                }
            }
        }
    }

    /// Fail-open: forward without any record.
    async fn forward_unguarded(&self, parts: http::request::Parts, body: Bytes) -> Response<ResponseBody> {
        let request = match rewrite(&self.route, parts, full(body), &self.client, None) {
            Ok(request) => request,
            Err(_) => return Problem::Internal.to_response(),
        };
        match self.forward(request).await {
            Forward::Answered(buffered) => respond(buffered),
            Forward::Failed { error, .. } => {
                Problem::UpstreamUnavailable { timed_out: matches!(error, UpstreamError::TimedOut(_)) }.to_response()
            }
        }
    }
}

enum Settle {
    Complete(Option<StoredResponse>),
    Release,
}

/// The client's response: the buffered head and prefix, then any unread rest.
fn respond(buffered: Buffered) -> Response<ResponseBody> {
    let body = match buffered.rest {
        Some(rest) => boxed(Prefixed::new(buffered.prefix, rest)),
        None => full(buffered.prefix),
    };
    Response::from_parts(buffered.head, body)
}
