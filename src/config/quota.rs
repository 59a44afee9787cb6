//! `gateway.tenant_quota`: how many live keys and stored bytes one tenant
//! may hold in the store.
//!
//! ```toml
//! tenant_quota = { max_keys = 100000, max_bytes = "256MiB" }
//! ```
//!
//! Off unless set. (Errors name only the field: the config loader puts
//! `gateway.tenant_quota: ` in front.)
//!
//! Off unless set. Either limit may be left out (no limit of that kind),
//! not both; each must be at least 1. The stores enforce it
//! (`crate::store`), the gateway answers `429 tenant-quota`.

use serde::{Deserialize, Serialize};

use super::ByteSize;

/// Per-tenant limits, checked when a tenant's request would create a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "QuotaFields", into = "QuotaFields")]
pub struct TenantQuota {
    /// Live records a tenant may hold (in flight, completed or unknown).
    pub max_keys: u64,
    /// Bytes of stored responses a tenant may hold before its new keys are
    /// refused. A completion is never refused, so the bytes held may pass
    /// this by what the tenant's attempts in flight store when they end.
    pub max_bytes: u64,
}

impl TenantQuota {
    /// The limits, `u64::MAX` standing for "no limit".
    pub fn new(max_keys: u64, max_bytes: u64) -> Self {
        Self { max_keys, max_bytes }
    }
}

/// The table as written.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct QuotaFields {
    // Signed, so that `-1` gets this file's message instead of serde's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_keys: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_bytes: Option<ByteSize>,
}

/// Why a `tenant_quota` table is refused; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// Neither limit is set.
    #[error("must set max_keys = <n>, max_bytes = \"<size>\" or both")]
    NoLimit,
    /// `max_keys` is zero or negative.
    #[error("max_keys = {0}: must be at least 1 (leave it out for no limit on keys)")]
    MaxKeys(i64),
    /// `max_bytes` is zero.
    #[error("max_bytes = \"0B\": must be at least 1B (leave it out for no limit on bytes)")]
    MaxBytesZero,
}

impl TryFrom<QuotaFields> for TenantQuota {
    type Error = QuotaError;

    fn try_from(fields: QuotaFields) -> Result<Self, QuotaError> {
        if fields.max_keys.is_none() && fields.max_bytes.is_none() {
            return Err(QuotaError::NoLimit);
        }
        let max_keys = match fields.max_keys {
            None => u64::MAX,
            Some(n) => u64::try_from(n).ok().filter(|n| *n > 0).ok_or(QuotaError::MaxKeys(n))?,
        };
        let max_bytes = match fields.max_bytes {
            None => u64::MAX,
            Some(ByteSize(0)) => return Err(QuotaError::MaxBytesZero),
            Some(ByteSize(n)) => n,
        };
        Ok(Self { max_keys, max_bytes })
    }
}

impl From<TenantQuota> for QuotaFields {
    fn from(quota: TenantQuota) -> Self {
        Self {
            max_keys: (quota.max_keys != u64::MAX).then(|| i64::try_from(quota.max_keys).unwrap_or(i64::MAX)),
            max_bytes: (quota.max_bytes != u64::MAX).then_some(ByteSize(quota.max_bytes)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TenantQuota, String> {
        #[derive(Deserialize)]
        struct Wrapper {
            tenant_quota: TenantQuota,
        }
        toml::from_str::<Wrapper>(text).map(|w| w.tenant_quota).map_err(|e| e.to_string())
    }

    #[test]
    fn either_limit_or_both_reads_and_prints_back() {
        for (text, quota) in [
            ("tenant_quota = { max_keys = 10, max_bytes = \"1MiB\" }", TenantQuota::new(10, 1 << 20)),
            ("tenant_quota = { max_keys = 10 }", TenantQuota::new(10, u64::MAX)),
            ("tenant_quota = { max_bytes = \"1KB\" }", TenantQuota::new(u64::MAX, 1000)),
        ] {
            assert_eq!(parse(text), Ok(quota), "{text}");
            #[derive(Serialize)]
            struct Wrapper {
                tenant_quota: TenantQuota,
            }
            let printed = toml::to_string(&Wrapper { tenant_quota: quota }).unwrap();
            assert_eq!(parse(&printed), Ok(quota), "{printed}");
        }
    }

    #[test]
    fn zero_negative_unparsable_or_empty_limits_are_refused_by_name() {
        for (text, says) in [
            ("tenant_quota = {}", "must set max_keys"),
            ("tenant_quota = { max_keys = 0 }", "max_keys = 0: must be at least 1"),
            ("tenant_quota = { max_keys = -5 }", "max_keys = -5: must be at least 1"),
            ("tenant_quota = { max_bytes = \"0MiB\" }", "max_bytes = \"0B\": must be at least 1B"),
            ("tenant_quota = { max_bytes = \"lots\" }", "size"),
            ("tenant_quota = { max_bytes = \"-1MiB\" }", "size"),
            ("tenant_quota = { max_keys = \"ten\" }", "invalid type"),
            ("tenant_quota = { max_entries = 5 }", "unknown field"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
