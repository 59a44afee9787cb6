//! `{ fixed = "default" }`: every request is one tenant (a gateway in front
//! of one client, or one whose clients share their keys on purpose).

use http::HeaderMap;

use super::Source;
use crate::idempotency::{Tenant, TenantError};

/// One tenant for all.
pub(super) struct Fixed(Tenant);

impl Fixed {
    pub(super) fn new(tenant: &str) -> Self {
        Self(Tenant::from_bytes(tenant))
    }
}

impl Source for Fixed {
    fn tenant_of(&self, _: &HeaderMap) -> Result<Tenant, TenantError> {
        Ok(self.0.clone())
    }

    fn tenant_named(&self, _: Option<&str>) -> Tenant {
        self.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::headers;
    use super::*;

    #[test]
    fn every_request_and_every_admin_value_is_the_one_tenant() {
        let twice = headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]);
        assert_eq!(Fixed::new("default").tenant_of(&twice), Ok(Tenant::from_bytes("default")));
        assert_eq!(Fixed::new("default").tenant_named(Some("ignored")), Tenant::from_bytes("default"));
    }
}
