//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of the
//! body under the webhook's secret as written. One signature: GitHub has
//! one secret per webhook, so rotation here means configuring the old and
//! the new secret while the hook's is changed. The legacy SHA-1
//! `X-Hub-Signature` is not accepted.

use http::HeaderMap;
use http::header::HeaderName;

use super::{Signed, hex_tag, malformed, single};

static X_HUB_SIGNATURE_256: HeaderName = HeaderName::from_static("x-hub-signature-256");

pub(super) fn parse(headers: &HeaderMap) -> Result<Signed<'_>, super::Failure> {
    let value = single(headers, &X_HUB_SIGNATURE_256)?;
    let hex = value.strip_prefix(b"sha256=").ok_or(malformed("X-Hub-Signature-256 is not sha256=<hex>"))?;
    let tag = hex_tag(hex).ok_or(malformed("X-Hub-Signature-256 is not sha256=<64 hex digits>"))?;
    Ok(Signed { candidates: vec![tag], timestamp: None, prefix: [b""; 4] })
}
