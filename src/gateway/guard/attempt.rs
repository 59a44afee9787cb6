//! One guarded request's forward. Acquired: forward, wait for the answer
//! (the client at most `upstream_timeout`, the attempt until
//! `upstream_deadline`), renew the lease meanwhile, apply the settlement
//! rule and settle the record. Store down at begin: refuse, or forward
//! without a record (`fail_mode`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::{Request, Response, StatusCode, response};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::time::Instant;

use super::rules::{self, Settle};
use super::store_calls::StoreOp;
use crate::config::{FailMode, ForwardKey};
use crate::gateway::headers::{clean_response_head, headers_to_store};
use crate::gateway::problem::Problem;
use crate::gateway::reply::Reply;
use crate::gateway::rewrite::rewrite;
use crate::gateway::routes::Route;
use crate::gateway::{Disposition, Gateway};
use crate::http::body::{BoxedBody, Prefixed, boxed, full};
use crate::http::client::{UpstreamBody, UpstreamError};
use crate::http::connection::ClientInfo;
use crate::http::head::detach_headers;
use crate::http::request_body::BufferedBody;
use crate::http::sending::mark_settled;
use crate::idempotency::{Completion, Fence, Fingerprint, ScopedKey, StoredResponse};
use crate::lease::{Abandoned, Lease, Renewal, SettleBounds, Settlement};
use crate::store::{Store, StoreError};

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

/// What an ended forward comes to ([`Attempt::conclude`]).
struct Conclusion {
    /// What the record becomes.
    settle: Settle,
    /// The response the record keeps for replay, if any.
    stored: Option<StoredResponse>,
    /// What the client hears.
    reply: Reply,
}

/// One guarded request's dealings with the store and the upstream.
pub(super) struct Attempt<S> {
    pub(super) gateway: Arc<Gateway<S>>,
    pub(super) route: Arc<Route>,
    pub(super) scoped: ScopedKey,
    pub(super) fingerprint: Fingerprint,
    pub(super) fence: Fence,
    pub(super) client: ClientInfo,
    /// The logged form of the key.
    pub(super) hashed: Option<String>,
    /// The upstream's response status once its head arrived (0 before).
    pub(super) head_status: AtomicU16,
}

impl<S: Store> Attempt<S> {
    /// Runs an acquired attempt to its settled record; answers the client
    /// on `reply` (at `upstream_timeout` at the latest, with a `504`).
    /// `_running` is the connection's slot, held until the record settled
    /// (a parameter, not a wrapping future: that would copy this future,
    /// kilobytes, once more per request).
    pub(super) async fn run(
        self,
        parts: http::request::Parts,
        body: BufferedBody,
        begun_at: Instant,
        reply: oneshot::Sender<Reply>,
        _running: OwnedSemaphorePermit,
    ) {
        let policy = &self.gateway.policy;
        let mut reply = Some(reply);
        let mut lease = Lease::new(policy.lease, begun_at);
        let forwarded_key = match policy.forward_key {
            ForwardKey::Original => None,
            ForwardKey::Derived => HeaderValue::from_str(&self.scoped.to_hex()).ok(),
        };
        // The forward and the settle are boxed, each only for as long as it
        // runs: inline, this future (spawned boxed, one per request in
        // flight) held room for both, and for the forward twice: 8,304
        // bytes, against 2,568 now plus the one running (2,096 or 1,272).
        let forward = match rewrite(&self.route, parts, full(body.bytes.clone()), &self.client, forwarded_key) {
            Ok(request) => {
                let mut forward = Box::pin(self.forward(request));
                let waited = self.renewing(&mut lease, tokio::time::timeout(policy.upstream_timeout, &mut forward));
                match waited.await {
                    Ok(forward) => forward,
                    Err(_) => {
                        tracing::warn!(
                            route = %self.route.name,
                            key = self.hashed.as_deref(),
                            "the upstream is slower than upstream_timeout: answering 504, the attempt goes on"
                        );
                        answer(&mut reply, Disposition::TimedOut, Problem::UpstreamTimeout { still_running: true });
                        // The deadline's timer only starts now: the common,
                        // fast path pays for one timer, not two.
                        let rest = policy.upstream_deadline.saturating_sub(policy.upstream_timeout);
                        match self.renewing(&mut lease, tokio::time::timeout(rest, forward)).await {
                            Ok(forward) => forward,
                            Err(_) => self.past_deadline(),
                        }
                    }
                }
            }
            Err(error) => Forward::Failed { status: None, error },
        };
        drop(body);
        let Conclusion { settle, stored, reply: mut conclusion } = self.conclude(forward);
        let kept = stored.is_some();
        if Box::pin(self.settle(&mut lease, begun_at, settle, stored)).await && kept {
            // The record holds this answer: a retry replays it.
            mark_settled(&mut conclusion.response);
        }
        if reply.is_none() {
            tracing::info!(
                route = %self.route.name,
                key = self.hashed.as_deref(),
                outcome = conclusion.disposition.as_str(),
                "a late upstream answer settled its record"
            );
        }
        if let Some(reply) = reply {
            let _ = reply.send(conclusion);
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
    async fn forward(&self, request: Request<BoxedBody>) -> Forward {
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
            // Held across the body read and the store call: its values must
            // not keep the upstream connection's read buffer.
            detach_headers(&mut head.headers);
            // Sized by the declared length: grown by doubling instead, a
            // 1 MiB body sat in a 2 MiB allocation for its key's TTL.
            let declared = http_body::Body::size_hint(&body).exact().unwrap_or(0);
            let mut prefix =
                BytesMut::with_capacity(usize::try_from(declared).unwrap_or(cap).min(cap.saturating_add(1)));
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
        self.route.observe_upstream(&self.gateway.metrics, elapsed);
        match result {
            Ok(buffered) => Forward::Answered(buffered),
            Err(error) => Forward::Failed { status, error },
        }
    }

    /// What the record becomes ([`rules`]), the record's response, what
    /// the client hears.
    fn conclude(&self, forward: Forward) -> Conclusion {
        let route = &self.route;
        match forward {
            Forward::Answered(buffered) => {
                let whole = buffered.rest.is_none();
                let (settle, outcome) =
                    rules::settle_answer(buffered.head.status.as_u16(), whole, &route.status_policy);
                let stored = (settle == Settle::Complete { keep_response: true }).then(|| StoredResponse {
                    status: buffered.head.status.as_u16(),
                    headers: headers_to_store(&buffered.head.headers, &self.gateway.policy.response_header_deny).into(),
                    body: buffered.prefix.clone(),
                });
                Conclusion { settle, stored, reply: Reply::new(outcome, respond(buffered)) }
            }
            Forward::Failed { status, error } => {
                tracing::warn!(route = %route.name, key = self.hashed.as_deref(), error = %error, "upstream failed");
                let status = status.map(|s| s.as_u16());
                let (settle, outcome, problem) =
                    rules::settle_failure(status, error.may_have_been_sent(), &route.status_policy, route.on_unknown);
                Conclusion { settle, stored: None, reply: Reply::problem(outcome, problem) }
            }
        }
    }

    /// The store failed at begin: refuse (`fail_mode = "closed"`) or
    /// forward without a record (`"open"`). A begin the replicas did not
    /// acknowledge (`wait_replicas`) is refused either way: the store is up
    /// and was asked for durability, and forwarding without it would give
    /// up exactly what was asked for.
    pub(super) async fn store_down(self, error: StoreError, parts: http::request::Parts, body: BufferedBody) -> Reply {
        tracing::warn!(key = self.hashed.as_deref(), error = %error, "store unavailable");
        let unreplicated = matches!(error, StoreError::Unreplicated { .. });
        match self.gateway.policy.fail_mode {
            _ if unreplicated => Reply::problem(Disposition::StoreError, Problem::StoreUnavailable),
            FailMode::Closed => Reply::problem(Disposition::StoreError, Problem::StoreUnavailable),
            FailMode::Open => {
                let response = match rewrite(&self.route, parts, full(body.bytes.clone()), &self.client, None) {
                    Ok(request) => match self.forward_unguarded(request).await {
                        Forward::Answered(buffered) => respond(buffered),
                        Forward::Failed { error, .. } => Problem::unguarded(&error).to_response(),
                    },
                    Err(_) => Problem::Internal.to_response(),
                };
                Reply::new(Disposition::FailOpen, response)
            }
        }
    }

    /// Fail-open forwarding: no record, so the client's own wait bounds it.
    async fn forward_unguarded(&self, request: Request<BoxedBody>) -> Forward {
        let timeout = self.gateway.policy.upstream_timeout;
        match tokio::time::timeout(timeout, self.forward(request)).await {
            Ok(forward) => forward,
            Err(_) => Forward::Failed { status: None, error: UpstreamError::TimedOut(timeout) },
        }
    }

    /// Runs `work` while renewing the lease ([`Lease::renewing`]).
    async fn renewing<T>(&self, lease: &mut Lease, work: impl Future<Output = T>) -> T {
        let gateway = &self.gateway;
        let length = gateway.policy.lease;
        let renew = || gateway.store_calls.call(StoreOp::Renew, gateway.store.renew(&self.scoped, self.fence, length));
        let observe = |renewal: &Renewal<StoreError>| match renewal {
            Renewal::Renewed => {}
            Renewal::Lost => {
                gateway.metrics.fence_rejections.with_label_values(&["renew"]).inc();
                // Fenced out: another attempt owns the key now. Finish
                // for our client; our settle will be refused.
                tracing::warn!(route = %self.route.name, "lease lost while the upstream call was running");
            }
            Renewal::Failed(e) => {
                tracing::warn!(route = %self.route.name, error = %e, "lease renewal failed; will retry");
            }
        };
        lease.renewing(work, renew, observe).await
    }

    /// Settles the record under this attempt's fence, retrying a failing
    /// store ([`Lease::settle`]): a record left in flight would let a retry
    /// take over and run the request again once the lease ends, so a store
    /// blip shorter than the lease must never get that far. A completion
    /// goes on past the lapse until `upstream_deadline`: fenced, it lands
    /// only if nobody took over, and then it is still the truth. The
    /// client waits for it: an answer means the record is settled (or
    /// could not be by the deadline), so a client that retries only after
    /// its answer replays.
    /// Whether the record was settled as asked.
    async fn settle(
        &self,
        lease: &mut Lease,
        begun_at: Instant,
        settle: Settle,
        stored: Option<StoredResponse>,
    ) -> bool {
        let gateway = &self.gateway;
        let (length, ttl) = (gateway.policy.lease, self.route.key_ttl.unwrap_or(gateway.policy.key_ttl));
        let (operation, completion) = match settle {
            Settle::Complete { .. } => (StoreOp::Complete, Some(Completion::from_response(stored.as_ref()))),
            Settle::Unknown => (StoreOp::Complete, Some(Completion::Unknown)),
            Settle::Release => (StoreOp::Release, None),
        };
        let try_settle = |limit| async move {
            let store = &gateway.store;
            match completion {
                Some(completion) => {
                    let complete = store.complete(&self.scoped, &self.fingerprint, self.fence, completion, ttl);
                    gateway.store_calls.call_within(operation, limit, complete).await
                }
                None => {
                    gateway.store_calls.call_within(operation, limit, store.release(&self.scoped, self.fence)).await
                }
            }
        };
        let renew = || gateway.store_calls.call(StoreOp::Renew, gateway.store.renew(&self.scoped, self.fence, length));
        // A release that does not land leaves the record to its lease, which
        // is all a late release could achieve: only a completion goes on.
        let until = completion.is_some().then_some(begun_at + gateway.policy.upstream_deadline);
        let bounds = SettleBounds { one_try: gateway.store_calls.timeout(), until };
        let mut settling = Settling { attempt: self, lapsed: false };
        let settled = lease.settle(bounds, try_settle, renew, &mut settling).await;
        let lapsed = settling.lapsed;
        match settled {
            Ok(true) if lapsed => {
                gateway.metrics.settled_after_lapse.inc();
                tracing::info!(route = %self.route.name, key = self.hashed.as_deref(),
                    "settled the record after its lease had lapsed: nobody had taken it over");
                true
            }
            Ok(true) => true,
            Ok(false) => {
                gateway.metrics.fence_rejections.with_label_values(&[operation.as_str()]).inc();
                tracing::warn!(route = %self.route.name, key = self.hashed.as_deref(), "fenced out: the record belongs to a newer attempt; not settled");
                false
            }
            Err(Abandoned { error: error @ StoreError::Unreplicated { .. }, tries }) => {
                // The primary holds the completion; only a failover before
                // the replicas catch up loses it. The client cannot wait
                // longer than the lease without the record lapsing anyway.
                gateway.metrics.settle_abandoned.inc();
                gateway.metrics.unreplicated_answers.inc();
                tracing::error!(route = %self.route.name, key = self.hashed.as_deref(), error = %error, tries,
                    "answering although the replicas did not acknowledge the completed record before its lease would end; \
                     a failover before they catch up loses it, and a retry after that runs the request again");
                false
            }
            Err(Abandoned { error, tries }) => {
                gateway.metrics.settle_abandoned.inc();
                tracing::error!(route = %self.route.name, key = self.hashed.as_deref(), error = %error, tries,
                    "cannot settle the record: the store stayed down past its lease and upstream_deadline; \
                     a retry may run the request again");
                false
            }
        }
    }
}

/// What an attempt's settle hears ([`Lease::settle`]).
struct Settling<'a, S> {
    attempt: &'a Attempt<S>,
    lapsed: bool,
}

impl<S: Store> Settlement<StoreError> for &mut Settling<'_, S> {
    fn failed(&mut self, error: &StoreError, tries: u32) {
        if tries == 1 {
            let attempt = self.attempt;
            tracing::warn!(route = %attempt.route.name, key = attempt.hashed.as_deref(), error = %error,
                "cannot settle the record yet; retrying while the lease holds");
        }
    }

    fn lapsed(&mut self) {
        self.lapsed = true;
        let attempt = self.attempt;
        tracing::warn!(route = %attempt.route.name, key = attempt.hashed.as_deref(),
            "the lease lapsed before the record could be settled: settling under the fence until \
             upstream_deadline (a retry that reaches the store first runs again)");
    }

    /// A completion the replicas did not acknowledge is on the primary
    /// already; waiting on for them would only queue `WAIT`s on the shared
    /// connection.
    fn worth_trying_after_lapse(&self, error: &StoreError) -> bool {
        !matches!(error, StoreError::Unreplicated { .. })
    }
}

/// Sends a problem to the waiting client, once.
fn answer(reply: &mut Option<oneshot::Sender<Reply>>, disposition: Disposition, problem: Problem) {
    if let Some(reply) = reply.take() {
        let _ = reply.send(Reply::problem(disposition, problem));
    }
}

/// The client's response: the buffered head and prefix, then any unread rest.
fn respond(buffered: Buffered) -> Response<BoxedBody> {
    let body = match buffered.rest {
        Some(rest) => boxed(Prefixed::new(buffered.prefix, rest)),
        None => full(buffered.prefix),
    };
    Response::from_parts(buffered.head, body)
}
