//! Tenants and the scoped address of a key's record.
//!
//! A record is stored under `sha256(tenant ‖ key)`, never under the raw key,
//! so two tenants that pick the same key address two different records and
//! neither can read, replay, block or probe the other's. Where the tenant
//! of a request comes from is the gateway's (`gateway::tenant`); here it is
//! only bytes that feed a hash.

use http::header::HeaderName;

use super::hash::{hash_fields, to_hex};
use super::key::IdempotencyKey;

/// The tenant a request belongs to, as bytes that only feed hashes.
#[derive(Clone, PartialEq, Eq)]
pub struct Tenant(Vec<u8>);

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tenant(..)")
    }
}

/// Why a request's tenant could not be derived; the text is shown to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// The header the tenant comes from has more than one field. Picking
    /// one would let a client put its own field ahead of the one its auth
    /// proxy appends and read another tenant's records.
    #[error("the {header} header appears more than once; the tenant must be unambiguous")]
    Repeated {
        /// The repeated header.
        header: HeaderName,
    },
    /// A source that names a principal (`basic_user`, `jwt_claim`) found
    /// no valid credential: the request has no tenant at all, rather than
    /// a shared default one.
    #[error("{why}")]
    Unauthenticated {
        /// The `WWW-Authenticate` challenge (`Basic realm="idemgate"`, `Bearer`).
        challenge: &'static str,
        /// What was wrong, without echoing the credential.
        why: String,
    },
}

impl Tenant {
    /// A tenant given directly (admin API, tests).
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The short name stores count this tenant's records under.
    pub fn id(&self) -> TenantId {
        let digest = hash_fields(&[b"tenant", &self.0]);
        let mut id = [0; 16];
        id.copy_from_slice(&digest[..16]);
        TenantId(id)
    }
}

/// A short, stable name of a tenant for the stores: the first 16 bytes of
/// `sha256(tenant)`. Stores count a tenant's records under it
/// (`tenant_quota`) without ever seeing the tenant itself; 128 bits make a
/// collision (two tenants sharing one quota) as unlikely as guessing a key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TenantId(pub [u8; 16]);

impl std::fmt::Debug for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TenantId({})", &to_hex(&self.0[..6]))
    }
}

/// `sha256(tenant ‖ key)`: the address of a record in every store, with
/// the [`TenantId`] of the tenant it belongs to (the address alone does
/// not reveal it, and a store that keeps a tenant's quota needs it).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopedKey {
    digest: [u8; 32],
    tenant: TenantId,
}

impl ScopedKey {
    /// Scopes a key to its tenant.
    pub fn new(tenant: &Tenant, key: &IdempotencyKey) -> Self {
        let digest = hash_fields(&[&tenant.0, key.as_str().as_bytes()]);
        Self { digest, tenant: tenant.id() }
    }

    /// Scopes a key from a route's own source (a provider's event id, a
    /// field of the body) to its tenant and its route:
    /// `sha256(tenant ‖ route ‖ key)`, so two routes' id spaces never meet.
    /// Three fields, where [`ScopedKey::new`] hashes two: the length
    /// prefixes keep the two forms apart, and `new`'s digests, which
    /// stored records are addressed by, stay what they were.
    pub fn for_route(tenant: &Tenant, route: &str, key: &IdempotencyKey) -> Self {
        let digest = hash_fields(&[&tenant.0, route.as_bytes(), key.as_str().as_bytes()]);
        Self { digest, tenant: tenant.id() }
    }

    /// Wraps a digest read back from a store; its tenant is
    /// [`TenantId::default`] (tests, where no quota is counted).
    pub fn from_digest(digest: [u8; 32]) -> Self {
        Self { digest, tenant: TenantId::default() }
    }

    /// A digest filed under a given tenant (tests of `tenant_quota`).
    pub fn from_parts(tenant: TenantId, digest: [u8; 32]) -> Self {
        Self { digest, tenant }
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.digest
    }

    /// The tenant the key belongs to.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// Lower-case hex; also the "derived key" forwarded upstream and the
    /// only form of a key that ever appears in logs.
    pub fn to_hex(&self) -> String {
        to_hex(&self.digest)
    }

    /// The first 16 hex digits of [`ScopedKey::to_hex`]: how logs name the
    /// record (hex of 8 bytes, not a 64-digit string cut down).
    pub fn log_id(&self) -> String {
        to_hex(&self.digest[..8])
    }
}

impl std::fmt::Debug for ScopedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScopedKey({})", &self.to_hex()[..12])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> IdempotencyKey {
        IdempotencyKey::parse(k.as_bytes()).unwrap()
    }

    #[test]
    fn the_log_id_is_the_start_of_the_hex() {
        let scoped = ScopedKey::new(&Tenant::from_bytes("t"), &key("k"));
        assert_eq!(scoped.log_id(), scoped.to_hex()[..16]);
    }

    #[test]
    fn tenant_and_key_boundaries_do_not_collide() {
        let ab = Tenant::from_bytes("ab");
        let a = Tenant::from_bytes("a");
        assert_ne!(ScopedKey::new(&ab, &key("c")), ScopedKey::new(&a, &key("bc")));
        assert_eq!(ScopedKey::new(&a, &key("c")), ScopedKey::new(&a, &key("c")));
    }

    #[test]
    fn a_route_scoped_key_meets_neither_another_route_nor_the_default_scope() {
        let tenant = Tenant::from_bytes("route:stripe");
        let routed = ScopedKey::for_route(&tenant, "stripe", &key("evt_1"));
        assert_ne!(routed, ScopedKey::for_route(&tenant, "github", &key("evt_1")));
        assert_ne!(routed, ScopedKey::new(&tenant, &key("evt_1")));
        assert_eq!(routed.tenant(), tenant.id());
        // The default scope's digest is pinned: records stored before key sources existed stay addressable.
        assert_eq!(ScopedKey::new(&Tenant::from_bytes("t"), &key("k")).to_hex(), to_hex(&hash_fields(&[b"t", b"k"])));
    }

    #[test]
    fn the_refusal_names_the_header() {
        let error = TenantError::Repeated { header: HeaderName::from_static("x-tenant-id") };
        assert_eq!(error.to_string(), "the x-tenant-id header appears more than once; the tenant must be unambiguous");
    }
}
