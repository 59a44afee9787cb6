//! The guard's rules as plain functions over plain data: what an attempt's
//! record becomes when the upstream call ends ([`settle_answer`],
//! [`settle_failure`]), what a
//! request that found a record is answered ([`answer_for`]), and how long a
//! waiting duplicate pauses ([`next_pause`]) and is told to wait
//! ([`retry_after`]). The async code in `attempt.rs` and `existing.rs` only
//! moves bytes and calls these.

use std::time::Duration;

use crate::config::OnUnknown;
use crate::gateway::Disposition;
use crate::gateway::problem::Problem;
use crate::idempotency::{Decision, StatusPolicy, StoredResponse};

/// What an attempt does to its record at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
    /// The upstream acted: keep its response (`keep_response`), or only the
    /// fact when the response is too large or broke off.
    Complete {
        /// The whole response is stored for replay.
        keep_response: bool,
    },
    /// Nobody knows whether the upstream acted: hold the key.
    Unknown,
    /// The upstream provably did not act, or said so: a retry runs again.
    Release,
}

/// The settlement rule for an upstream that answered with `status` and a
/// body read to its end (`whole`: within the stored-response cap): store
/// what says the upstream acted, release what says it did not. The client
/// gets the upstream's response either way.
pub(super) fn settle_answer(status: u16, whole: bool, stores: &StatusPolicy) -> (Settle, Disposition) {
    if stores.stores(status) {
        (Settle::Complete { keep_response: whole }, Disposition::Forwarded)
    } else {
        (Settle::Release, Disposition::Released)
    }
}

/// The settlement rule for a call that failed, after a head with
/// `head_status` or before any: release only what proves the upstream did
/// not act, hold as unknown what nobody can tell (unless the route's
/// `on_unknown` releases it). The client gets the problem.
pub(super) fn settle_failure(
    head_status: Option<u16>,
    may_have_been_sent: bool,
    stores: &StatusPolicy,
    on_unknown: OnUnknown,
) -> (Settle, Disposition, Problem) {
    match head_status {
        // A head that says the upstream acted, then a broken body: the
        // effect happened, so the key must not run again.
        Some(status) if stores.stores(status) => {
            (Settle::Complete { keep_response: false }, Disposition::UpstreamError, Problem::ResponseIncomplete)
        }
        Some(_) => (Settle::Release, Disposition::UpstreamError, Problem::UpstreamUnavailable { sent: true }),
        None if !may_have_been_sent => {
            (Settle::Release, Disposition::UpstreamError, Problem::UpstreamUnavailable { sent: false })
        }
        None => match on_unknown {
            OnUnknown::Hold => (Settle::Unknown, Disposition::Unknown, Problem::OutcomeUnknown { held: true }),
            OnUnknown::Release => (Settle::Release, Disposition::Unknown, Problem::OutcomeUnknown { held: false }),
        },
    }
}

/// The answer to a request whose key has a record.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer<'a> {
    /// A final answer.
    Final(Disposition, Problem),
    /// Replay the stored response.
    Replay(&'a StoredResponse),
    /// Another attempt runs: `409` now, or wait for it (`concurrent = "wait"`).
    Busy {
        /// The lease left on the running attempt.
        lease_left: Duration,
    },
}

/// What [`Decision`] a record leads to, as an answer.
pub(super) fn answer_for(decision: Decision<'_>) -> Answer<'_> {
    match decision {
        Decision::Mismatch => Answer::Final(Disposition::Mismatch, Problem::KeyMismatch),
        Decision::Replay(stored) => Answer::Replay(stored),
        Decision::NotReplayable => Answer::Final(Disposition::NotReplayable, Problem::ResponseNotReplayable),
        Decision::OutcomeUnknown => Answer::Final(Disposition::Held, Problem::OutcomeUnknown { held: true }),
        Decision::InFlight { retry_after } => Answer::Busy { lease_left: retry_after },
        // Its attempt is gone and the next begin takes over: soon free.
        Decision::Lapsed => Answer::Busy { lease_left: LAPSED_RETRY_AFTER },
    }
}

/// What a `409`'s `Retry-After` says: when the running attempt will most
/// likely be done — the route's recent latency, at least 1 s, at most the
/// lease left.
pub(super) fn retry_after(route_latency: Duration, lease_left: Duration) -> Duration {
    route_latency.max(Duration::from_secs(1)).min(lease_left)
}

/// `Retry-After` when the awaited attempt is gone (released, lapsed, taken over).
pub(super) const LAPSED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The first pause of a waiting duplicate between two reads of the record.
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(10);

/// The next pause of a waiting duplicate: doubling, at most 250 ms.
pub(super) fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(Duration::from_millis(250))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_says_the_upstream_acted_is_stored_and_one_that_says_it_did_not_is_released() {
        let policy = StatusPolicy::default();
        assert_eq!(
            settle_answer(201, true, &policy),
            (Settle::Complete { keep_response: true }, Disposition::Forwarded)
        );
        assert_eq!(settle_answer(201, false, &policy).0, Settle::Complete { keep_response: false });
        for status in [409, 429, 500, 503] {
            assert_eq!(settle_answer(status, true, &policy), (Settle::Release, Disposition::Released), "{status}");
        }
    }

    #[test]
    fn a_failure_after_a_head_follows_the_head_and_a_lost_request_is_held() {
        let policy = StatusPolicy::default();
        let failure = |status, sent| settle_failure(status, sent, &policy, OnUnknown::Hold);
        assert_eq!(
            failure(Some(201), true),
            (Settle::Complete { keep_response: false }, Disposition::UpstreamError, Problem::ResponseIncomplete)
        );
        assert_eq!(failure(Some(502), true).0, Settle::Release);
        assert_eq!(
            failure(None, false),
            (Settle::Release, Disposition::UpstreamError, Problem::UpstreamUnavailable { sent: false })
        );
        assert_eq!(
            failure(None, true),
            (Settle::Unknown, Disposition::Unknown, Problem::OutcomeUnknown { held: true })
        );
        let released = settle_failure(None, true, &policy, OnUnknown::Release);
        assert_eq!(released, (Settle::Release, Disposition::Unknown, Problem::OutcomeUnknown { held: false }));
    }

    #[test]
    fn every_decision_has_its_answer() {
        let stored = StoredResponse { status: 201, headers: Default::default(), body: "ok".into() };
        assert_eq!(answer_for(Decision::Replay(&stored)), Answer::Replay(&stored));
        assert_eq!(answer_for(Decision::Mismatch), Answer::Final(Disposition::Mismatch, Problem::KeyMismatch));
        assert_eq!(
            answer_for(Decision::OutcomeUnknown),
            Answer::Final(Disposition::Held, Problem::OutcomeUnknown { held: true })
        );
        let left = Duration::from_secs(7);
        assert_eq!(answer_for(Decision::InFlight { retry_after: left }), Answer::Busy { lease_left: left });
        assert_eq!(answer_for(Decision::Lapsed), Answer::Busy { lease_left: LAPSED_RETRY_AFTER });
    }

    #[test]
    fn retry_after_is_the_routes_latency_between_one_second_and_the_lease_left() {
        let s = Duration::from_secs;
        assert_eq!(retry_after(Duration::from_millis(20), s(30)), s(1));
        assert_eq!(retry_after(s(4), s(30)), s(4));
        assert_eq!(retry_after(s(40), s(30)), s(30));
        assert_eq!(next_pause(Duration::from_millis(10)), Duration::from_millis(20));
        assert_eq!(next_pause(Duration::from_millis(200)), Duration::from_millis(250));
    }
}
