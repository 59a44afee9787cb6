//! `{ header = "x-tenant-id" }`: the value of a header that a trusted auth
//! proxy sets (and strips from what clients send). Without it, the
//! anonymous tenant.

use http::HeaderMap;
use http::header::HeaderName;

use super::{Source, single_field};
use crate::idempotency::{Tenant, TenantError};

/// The tenant is a header's value.
pub(super) struct Header(HeaderName);

impl Header {
    pub(super) fn new(name: HeaderName) -> Self {
        Self(name)
    }
}

impl Source for Header {
    fn tenant_of(&self, headers: &HeaderMap) -> Result<Tenant, TenantError> {
        Ok(Tenant::from_bytes(single_field(headers, &self.0)?.map(|v| v.as_bytes().to_vec()).unwrap_or_default()))
    }

    fn tenant_named(&self, value: Option<&str>) -> Tenant {
        Tenant::from_bytes(value.filter(|v| http::HeaderValue::from_str(v).is_ok()).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::headers;
    use super::*;

    #[test]
    fn the_tenant_is_the_headers_value_and_a_repeat_is_refused() {
        let source = Header::new(HeaderName::from_static("x-tenant-id"));
        assert_eq!(source.tenant_of(&headers(&[("x-tenant-id", "t1")])), Ok(Tenant::from_bytes("t1")));
        assert_eq!(source.tenant_of(&HeaderMap::new()), Ok(Tenant::from_bytes("")));
        let spoofed = headers(&[("x-tenant-id", "attacker"), ("x-tenant-id", "victim")]);
        let name = HeaderName::from_static("x-tenant-id");
        assert_eq!(source.tenant_of(&spoofed), Err(TenantError::Repeated { header: name }));
        assert_eq!(source.tenant_named(Some("t1")), Tenant::from_bytes("t1"));
    }
}
