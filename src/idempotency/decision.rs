//! The decision table: what to do with a request given the stored record.
//!
//! | stored record          | incoming request     | decision                 |
//! |------------------------|----------------------|--------------------------|
//! | none                   | any                  | [`Decision::Start`]      |
//! | any                    | other fingerprint    | [`Decision::Mismatch`]   |
//! | in flight, lease live  | same fingerprint     | [`Decision::InFlight`]   |
//! | in flight, expired     | same fingerprint     | [`Decision::TakeOver`]   |
//! | completed with body    | same fingerprint     | [`Decision::Replay`]     |
//! | completed, body too big| same fingerprint     | [`Decision::NotReplayable`] |
//! | outcome unknown        | same fingerprint     | [`Decision::OutcomeUnknown`] |
//!
//! The memory store applies this function under its lock; the Redis and
//! Postgres stores mirror it in one script or statement each, and the shared
//! conformance suite checks that they agree with it.

use std::time::Duration;

use super::fingerprint::Fingerprint;
use super::record::{Record, StoredResponse};

/// What the gateway does with a guarded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'a> {
    /// No record: create one and forward.
    Start,
    /// The previous attempt's lease ran out: take over and forward.
    TakeOver,
    /// The key was used for a different request: `422`.
    Mismatch,
    /// Another attempt holds a live lease: `409`, retry after this long.
    InFlight {
        /// Time left on the other attempt's lease.
        retry_after: Duration,
    },
    /// Replay the stored response.
    Replay(&'a StoredResponse),
    /// Completed, but the response was too large to keep.
    NotReplayable,
    /// The first attempt's outcome is unknown: `502`, nothing forwarded.
    OutcomeUnknown,
}

/// Applies the table.
pub fn decide<'a>(record: Option<&'a Record>, fingerprint: &Fingerprint) -> Decision<'a> {
    let Some(record) = record else {
        return Decision::Start;
    };
    if record.fingerprint() != fingerprint {
        return Decision::Mismatch;
    }
    match record {
        Record::InFlight { lease_remaining, .. } if lease_remaining.is_zero() => Decision::TakeOver,
        Record::InFlight { lease_remaining, .. } => Decision::InFlight { retry_after: *lease_remaining },
        Record::Completed { response: Some(response), .. } => Decision::Replay(response),
        Record::Completed { response: None, .. } => Decision::NotReplayable,
        Record::Unknown { .. } => Decision::OutcomeUnknown,
    }
}

/// Whether an upstream status means "the upstream acted" (store the
/// response) rather than "it did not" (release the key so a retry runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusPolicy {
    /// Statuses below 500 that release the record instead of storing it.
    pub release: Vec<u16>,
}

impl Default for StatusPolicy {
    /// Validation and auth failures (which change nothing by convention) and
    /// transient refusals release; every other non-5xx status is stored.
    fn default() -> Self {
        Self { release: vec![400, 401, 403, 408, 409, 422, 425, 429] }
    }
}

impl StatusPolicy {
    /// `true` when the response should be stored for replay.
    pub fn stores(&self, status: u16) -> bool {
        status < 500 && !self.release.contains(&status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::record::Fence;

    const FP: Fingerprint = Fingerprint([1; 32]);
    const OTHER: Fingerprint = Fingerprint([2; 32]);

    fn in_flight(fingerprint: Fingerprint, secs: u64) -> Record {
        Record::InFlight { fingerprint, fence: Fence(7), lease_remaining: Duration::from_secs(secs) }
    }

    fn completed(fingerprint: Fingerprint, body: Option<&'static str>) -> Record {
        let response = body.map(|b| StoredResponse { status: 201, headers: vec![], body: b.into() });
        Record::Completed { fingerprint, response }
    }

    #[test]
    fn the_table_holds_row_by_row() {
        assert_eq!(decide(None, &FP), Decision::Start);
        assert_eq!(decide(Some(&in_flight(OTHER, 5)), &FP), Decision::Mismatch);
        assert_eq!(decide(Some(&in_flight(OTHER, 0)), &FP), Decision::Mismatch);
        assert_eq!(decide(Some(&completed(OTHER, Some("x"))), &FP), Decision::Mismatch);
        assert_eq!(decide(Some(&in_flight(FP, 5)), &FP), Decision::InFlight { retry_after: Duration::from_secs(5) });
        assert_eq!(decide(Some(&in_flight(FP, 0)), &FP), Decision::TakeOver);
        let done = completed(FP, Some("ok"));
        assert!(matches!(decide(Some(&done), &FP), Decision::Replay(r) if r.body == "ok"));
        assert_eq!(decide(Some(&completed(FP, None)), &FP), Decision::NotReplayable);
        assert_eq!(decide(Some(&Record::Unknown { fingerprint: FP }), &FP), Decision::OutcomeUnknown);
        assert_eq!(decide(Some(&Record::Unknown { fingerprint: OTHER }), &FP), Decision::Mismatch);
    }

    #[test]
    fn the_default_policy_stores_what_says_the_upstream_acted() {
        let policy = StatusPolicy::default();
        for status in [200, 201, 204, 301, 302, 402, 404, 410] {
            assert!(policy.stores(status), "{status} should be stored");
        }
        for status in [400, 401, 403, 408, 409, 422, 425, 429, 500, 502, 503, 504] {
            assert!(!policy.stores(status), "{status} should release");
        }
    }
}
