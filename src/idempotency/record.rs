//! The record a store keeps per scoped key, and the response it replays.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;

use super::fingerprint::Fingerprint;

/// Identifies one attempt at a key. Completing or releasing a record only
/// succeeds with the fence of the attempt that holds it, so a gateway whose
/// lease was taken over cannot overwrite the newer attempt's record.
///
/// Fences are random 64-bit values drawn per attempt, not counters: a
/// record can expire and be created again, and a counter kept in the record
/// would then start over and let a stale attempt's fence match again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence(pub u64);

impl Fence {
    /// Draws a fresh fence (never zero, so zero can mean "none" in encodings).
    pub fn random() -> Self {
        Self(rand::random::<u64>().max(1))
    }
}

/// A stored record as a store reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// An attempt is running (or its gateway died and the lease runs out).
    InFlight {
        /// Fingerprint of the request that started it.
        fingerprint: Fingerprint,
        /// Fence of the running attempt.
        fence: Fence,
        /// Time left on the lease by the store's clock; zero when expired.
        lease_remaining: Duration,
    },
    /// The upstream acted; this is what it answered.
    Completed {
        /// Fingerprint of the request that completed it.
        fingerprint: Fingerprint,
        /// The response, or `None` when it was larger than the stored-response cap.
        response: Option<StoredResponse>,
    },
    /// The request was written to the upstream and its outcome was lost (the
    /// connection died before a response head, or the upstream deadline
    /// passed). The upstream may have acted, so the key is held: nothing is
    /// forwarded again until the record expires or an operator purges it.
    Unknown {
        /// Fingerprint of the request whose outcome is unknown.
        fingerprint: Fingerprint,
    },
}

impl Record {
    /// The fingerprint of the request that created the record.
    pub fn fingerprint(&self) -> &Fingerprint {
        match self {
            Self::InFlight { fingerprint, .. }
            | Self::Completed { fingerprint, .. }
            | Self::Unknown { fingerprint } => fingerprint,
        }
    }
}

/// How an attempt ends a record (see [`crate::store::Store::complete`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion<'a> {
    /// The upstream acted and this is its response, kept for replay.
    Response(&'a StoredResponse),
    /// The upstream acted, but its response was too large to keep.
    NotKept,
    /// Nobody knows whether the upstream acted: hold the key.
    Unknown,
}

impl<'a> Completion<'a> {
    /// `Response(r)` for `Some(r)`, `NotKept` for `None`.
    pub fn from_response(response: Option<&'a StoredResponse>) -> Self {
        response.map_or(Self::NotKept, Self::Response)
    }
}

/// A response kept for replay: status, filtered headers and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// The upstream's headers minus hop-by-hop and deny-listed ones, in
    /// its order: parsed once, when the response is stored or read from a
    /// store, and shared, so the memory store hands out a record without
    /// copying them.
    pub headers: Arc<HeaderMap>,
    /// The whole body.
    pub body: Bytes,
}

impl StoredResponse {
    /// Approximate bytes held, for memory accounting.
    pub fn size(&self) -> usize {
        self.body.len() + self.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 16).sum::<usize>() + 32
    }
}
