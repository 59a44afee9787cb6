//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`, the HMAC-SHA256 of the
//! body under the app's client secret as written. No timestamp is signed,
//! so replay protection is the key's record alone (`key_ttl`).

use http::HeaderMap;
use http::header::HeaderName;

use super::{Signed, base64_tag, malformed, single};

static X_SHOPIFY_HMAC_SHA256: HeaderName = HeaderName::from_static("x-shopify-hmac-sha256");

pub(super) fn parse(headers: &HeaderMap) -> Result<Signed<'_>, super::Failure> {
    let value = single(headers, &X_SHOPIFY_HMAC_SHA256)?;
    let tag = base64_tag(value.trim_ascii()).ok_or(malformed("X-Shopify-Hmac-Sha256 is not the base64 of 32 bytes"))?;
    Ok(Signed { candidates: vec![tag], timestamp: None, prefix: [b""; 4] })
}
