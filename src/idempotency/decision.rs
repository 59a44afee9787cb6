//! The decision tables: what a store does when a request begins, and what
//! the gateway answers a request whose key already has a record.
//!
//! [`admit`] — what `try_begin` does, atomically:
//!
//! | stored record                           | begin                          |
//! |-----------------------------------------|--------------------------------|
//! | none                                    | acquire                        |
//! | in flight, no lease left, same request  | acquire, as a takeover         |
//! | any other                               | leave it; report it            |
//!
//! [`decide`] — the answer to a request that found a record:
//!
//! | stored record          | incoming request     | decision                     |
//! |------------------------|----------------------|------------------------------|
//! | any                    | other fingerprint    | [`Decision::Mismatch`]       |
//! | in flight, lease live  | same fingerprint     | [`Decision::InFlight`]       |
//! | in flight, lapsed      | same fingerprint     | [`Decision::Lapsed`]         |
//! | completed with body    | same fingerprint     | [`Decision::Replay`]         |
//! | completed, body too big| same fingerprint     | [`Decision::NotReplayable`]  |
//! | outcome unknown        | same fingerprint     | [`Decision::OutcomeUnknown`] |
//!
//! The memory store applies [`admit`] under its lock; the Redis and
//! Postgres stores mirror it in one script or statement each, and the shared
//! conformance suite checks that they agree with it.

use std::time::Duration;

use super::fingerprint::Fingerprint;
use super::record::{Record, StoredResponse};

/// What a store does when a request begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Create the in-flight record and forward; `took_over` when an earlier
    /// attempt of the same request had lost its lease.
    Acquire {
        /// An earlier attempt's lease had run out.
        took_over: bool,
    },
    /// Leave the record as it is; the gateway answers from it.
    Existing(Record),
}

/// Applies the admission table.
pub fn admit(record: Option<Record>, fingerprint: &Fingerprint) -> Admission {
    match record {
        None => Admission::Acquire { took_over: false },
        Some(Record::InFlight { fingerprint: held, lease_remaining, .. })
            if held == *fingerprint && lease_remaining.is_zero() =>
        {
            Admission::Acquire { took_over: true }
        }
        Some(record) => Admission::Existing(record),
    }
}

/// What the gateway answers a request whose key has a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'a> {
    /// The key was used for a different request: `422`.
    Mismatch,
    /// Another attempt holds a live lease: `409`, retry after this long.
    InFlight {
        /// Time left on the other attempt's lease.
        retry_after: Duration,
    },
    /// The attempt that held it lost its lease; the next begin takes it over.
    /// Seen only on a record read again while waiting: busy for now.
    Lapsed,
    /// Replay the stored response.
    Replay(&'a StoredResponse),
    /// Completed, but the response was too large to keep.
    NotReplayable,
    /// The first attempt's outcome is unknown: `502`, nothing forwarded.
    OutcomeUnknown,
}

/// Applies the answer table.
pub fn decide<'a>(record: &'a Record, fingerprint: &Fingerprint) -> Decision<'a> {
    if record.fingerprint() != fingerprint {
        return Decision::Mismatch;
    }
    match record {
        Record::InFlight { lease_remaining, .. } if lease_remaining.is_zero() => Decision::Lapsed,
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
        let response = body.map(|b| StoredResponse { status: 201, headers: Default::default(), body: b.into() });
        Record::Completed { fingerprint, response }
    }

    #[test]
    fn the_admission_table_holds_row_by_row() {
        assert_eq!(admit(None, &FP), Admission::Acquire { took_over: false });
        assert_eq!(admit(Some(in_flight(FP, 0)), &FP), Admission::Acquire { took_over: true });
        for record in
            [in_flight(FP, 5), in_flight(OTHER, 0), completed(FP, Some("x")), Record::Unknown { fingerprint: FP }]
        {
            assert_eq!(admit(Some(record.clone()), &FP), Admission::Existing(record));
        }
    }

    #[test]
    fn the_answer_table_holds_row_by_row() {
        assert_eq!(decide(&in_flight(OTHER, 5), &FP), Decision::Mismatch);
        assert_eq!(decide(&in_flight(OTHER, 0), &FP), Decision::Mismatch);
        assert_eq!(decide(&completed(OTHER, Some("x")), &FP), Decision::Mismatch);
        assert_eq!(decide(&in_flight(FP, 5), &FP), Decision::InFlight { retry_after: Duration::from_secs(5) });
        assert_eq!(decide(&in_flight(FP, 0), &FP), Decision::Lapsed);
        let done = completed(FP, Some("ok"));
        assert!(matches!(decide(&done, &FP), Decision::Replay(r) if r.body == "ok"));
        assert_eq!(decide(&completed(FP, None), &FP), Decision::NotReplayable);
        assert_eq!(decide(&Record::Unknown { fingerprint: FP }, &FP), Decision::OutcomeUnknown);
        assert_eq!(decide(&Record::Unknown { fingerprint: OTHER }, &FP), Decision::Mismatch);
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
