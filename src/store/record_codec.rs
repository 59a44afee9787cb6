//! A record as the networked stores keep it, both ways: stored fields to a
//! checked [`Record`], a [`Completion`] to the fields it writes.
//!
//! Redis and Postgres keep the same fields — state (`i` in flight, `c`
//! completed, `u` outcome unknown), fingerprint, fence, lease left, and the
//! response encoded ([`super::codec`]) and sealed with `store_encryption`
//! keys ([`super::sealing`]) — and differ only in how they travel (a reply
//! array, a row). Each backend reads its raw fields into [`StoredFields`];
//! the checking, the state letters and the sealing are here, once, so the
//! two cannot drift apart.

use std::sync::Arc;
use std::time::Duration;

use super::StoreError;
use super::sealing::{self, Sealer};
use crate::idempotency::{Completion, Fence, Fingerprint, Record, ScopedKey, StoredResponse};

/// The state letter of an in-flight record.
pub(super) const IN_FLIGHT: u8 = b'i';
/// The state letter of a completed record.
pub(super) const COMPLETED: u8 = b'c';
/// The state letter of a record whose outcome is unknown.
pub(super) const UNKNOWN: u8 = b'u';

/// One record's fields as a backend read them, not yet checked.
pub(super) struct StoredFields {
    /// The state as stored: one of the letters above, or corrupt.
    pub(super) state: Vec<u8>,
    /// Must be 32 bytes.
    pub(super) fingerprint: Vec<u8>,
    /// The fence; `None` when it did not read as a number. Only an
    /// in-flight record needs one.
    pub(super) fence: Option<u64>,
    /// The lease left, by the store's clock; `None` when it did not read as
    /// a number. Only an in-flight record needs one.
    pub(super) lease_remaining_ms: Option<i64>,
    /// The stored (maybe sealed) response of a completed record; `None`
    /// when it was too large to keep.
    pub(super) response: Option<Vec<u8>>,
}

/// What a completion writes over an in-flight record.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct CompletedFields {
    /// [`COMPLETED`] or [`UNKNOWN`].
    pub(super) state: u8,
    /// The response to keep, encoded and sealed; `None` when there is none.
    pub(super) response: Option<Vec<u8>>,
}

/// Reads and writes records for one backend, sealing responses when keys are set.
#[derive(Clone)]
pub(super) struct RecordCodec {
    /// Names the backend in corruption errors (`"redis record"`).
    source: &'static str,
    sealer: Option<Arc<Sealer>>,
}

impl RecordCodec {
    /// A codec whose errors name `source`; no sealing until [`RecordCodec::sealed`].
    pub(super) fn new(source: &'static str) -> Self {
        Self { source, sealer: None }
    }

    /// Seals stored responses with these keys from now on.
    pub(super) fn sealed(mut self, sealer: Option<Arc<Sealer>>) -> Self {
        self.sealer = sealer;
        self
    }

    /// The keys it seals with, if any.
    pub(super) fn sealer(&self) -> Option<Arc<Sealer>> {
        self.sealer.clone()
    }

    /// A corruption error that names this backend's records.
    pub(super) fn corrupt(&self, what: &str) -> StoreError {
        StoreError::Corrupt(format!("{}: {what}", self.source))
    }

    /// Checks a stored record's fields; opens its response for `key`.
    pub(super) fn decode(&self, key: &ScopedKey, fields: StoredFields) -> Result<Record, StoreError> {
        let fingerprint =
            Fingerprint(fields.fingerprint.try_into().map_err(|_| self.corrupt("fingerprint is not 32 bytes"))?);
        match fields.state.as_slice() {
            [IN_FLIGHT] => {
                let fence = fields.fence.ok_or_else(|| self.corrupt("bad fence"))?;
                let remaining = fields.lease_remaining_ms.ok_or_else(|| self.corrupt("bad ttl"))?;
                Ok(Record::InFlight {
                    fingerprint,
                    fence: Fence(fence),
                    lease_remaining: Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
                })
            }
            [COMPLETED] => {
                let response = fields.response.map(|stored| self.open(key, stored)).transpose()?;
                Ok(Record::Completed { fingerprint, response })
            }
            [UNKNOWN] => Ok(Record::Unknown { fingerprint }),
            _ => Err(self.corrupt("unknown state")),
        }
    }

    /// The fields a completion writes for `key`: its state, and its response sealed.
    pub(super) fn encode(&self, key: &ScopedKey, completion: Completion<'_>) -> Result<CompletedFields, StoreError> {
        let sealer = self.sealer.as_deref();
        Ok(match completion {
            Completion::Response(response) => {
                CompletedFields { state: COMPLETED, response: Some(sealing::seal_response(sealer, key, response)?) }
            }
            Completion::NotKept => CompletedFields { state: COMPLETED, response: None },
            Completion::Unknown => CompletedFields { state: UNKNOWN, response: None },
        })
    }

    fn open(&self, key: &ScopedKey, stored: Vec<u8>) -> Result<StoredResponse, StoreError> {
        sealing::open_response(self.sealer.as_deref(), key, stored)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    const K1: &str = "k1:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn key(n: u8) -> ScopedKey {
        ScopedKey::from_digest([n; 32])
    }

    fn response() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: http::HeaderMap::from_iter([(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            )])
            .into(),
            body: Bytes::from_static(b"{\"id\":1}"),
        }
    }

    fn fields(state: &[u8]) -> StoredFields {
        StoredFields {
            state: state.to_vec(),
            fingerprint: vec![7; 32],
            fence: Some(9),
            lease_remaining_ms: Some(1500),
            response: None,
        }
    }

    fn sealed_codec() -> RecordCodec {
        RecordCodec::new("test record").sealed(Some(Arc::new(Sealer::from_spec(K1).unwrap())))
    }

    #[test]
    fn a_completed_record_reads_back_what_its_completion_wrote() {
        for codec in [RecordCodec::new("test record"), sealed_codec()] {
            let written = codec.encode(&key(1), Completion::Response(&response())).unwrap();
            assert_eq!(written.state, COMPLETED);
            let stored = StoredFields { response: written.response, ..fields(&[written.state]) };
            let record = codec.decode(&key(1), stored).unwrap();
            assert_eq!(record, Record::Completed { fingerprint: Fingerprint([7; 32]), response: Some(response()) });
        }
    }

    #[test]
    fn a_sealed_response_opens_only_on_its_own_record() {
        let codec = sealed_codec();
        let written = codec.encode(&key(1), Completion::Response(&response())).unwrap();
        let moved = StoredFields { response: written.response, ..fields(b"c") };
        assert!(matches!(codec.decode(&key(2), moved), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn completions_without_a_response_write_their_state_only() {
        let codec = sealed_codec();
        let not_kept = codec.encode(&key(1), Completion::NotKept).unwrap();
        assert_eq!(not_kept, CompletedFields { state: COMPLETED, response: None });
        assert_eq!(
            codec.encode(&key(1), Completion::Unknown).unwrap(),
            CompletedFields { state: UNKNOWN, response: None }
        );
        let record = codec.decode(&key(1), fields(b"c")).unwrap();
        assert_eq!(record, Record::Completed { fingerprint: Fingerprint([7; 32]), response: None });
        assert_eq!(codec.decode(&key(1), fields(b"u")).unwrap(), Record::Unknown { fingerprint: Fingerprint([7; 32]) });
    }

    #[test]
    fn an_in_flight_record_carries_its_fence_and_the_lease_left() {
        let codec = RecordCodec::new("test record");
        let record = codec.decode(&key(1), fields(b"i")).unwrap();
        let lease_remaining = Duration::from_millis(1500);
        assert_eq!(record, Record::InFlight { fingerprint: Fingerprint([7; 32]), fence: Fence(9), lease_remaining });
        let past = StoredFields { lease_remaining_ms: Some(-5), ..fields(b"i") };
        assert!(matches!(
            codec.decode(&key(1), past).unwrap(),
            Record::InFlight { lease_remaining: Duration::ZERO, .. }
        ));
    }

    #[test]
    fn corrupt_fields_are_errors_that_name_the_backend_and_the_field() {
        let codec = RecordCodec::new("test record");
        let error = |fields| codec.decode(&key(1), fields).unwrap_err().to_string();
        let short = StoredFields { fingerprint: vec![1; 31], ..fields(b"c") };
        assert_eq!(error(short), "stored record is corrupt: test record: fingerprint is not 32 bytes");
        assert_eq!(error(fields(b"x")), "stored record is corrupt: test record: unknown state");
        assert_eq!(error(fields(b"ii")), "stored record is corrupt: test record: unknown state");
        assert!(error(StoredFields { fence: None, ..fields(b"i") }).ends_with("bad fence"));
        assert!(error(StoredFields { lease_remaining_ms: None, ..fields(b"i") }).ends_with("bad ttl"));
        // Only an in-flight record needs its fence and lease.
        assert!(codec.decode(&key(1), StoredFields { fence: None, lease_remaining_ms: None, ..fields(b"u") }).is_ok());
    }
}
