//! The pure core of the gateway: no I/O, no clocks, no async.
//!
//! Parsing the key ([`key`]), scoping it to a tenant ([`scope`]),
//! fingerprinting the request ([`fingerprint`], [`canonical_json`]), the
//! stored record ([`record`]) and the decision table ([`decision`]). The
//! hyper, tower and store code around it only moves bytes and calls these
//! functions, so every rule here is unit- and property-tested in isolation.

pub mod canonical_json;
pub mod decision;
pub mod fingerprint;
pub mod hash;
pub mod key;
pub mod record;
pub mod scope;

pub use decision::{Admission, Decision, StatusPolicy, admit, decide};
pub use fingerprint::{Fingerprint, FingerprintPolicy};
pub use key::{IdempotencyKey, KeyError};
pub use record::{Completion, Fence, Record, StoredResponse};
pub use scope::{ScopedKey, Tenant, TenantError, TenantId};
