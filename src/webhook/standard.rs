//! Standard Webhooks (Svix and others): three headers,
//! `webhook-id: msg_…`, `webhook-timestamp: 1614265330` and
//! `webhook-signature: v1,<base64> v1,<base64>` (space-separated, one per
//! active secret; `v1a` asymmetric signatures and other versions are
//! ignored). The signed content is `"{id}.{timestamp}.{body}"`; the secret
//! is `whsec_` and the base64 of the HMAC key.

use http::HeaderMap;
use http::header::HeaderName;

use super::{MAX_CANDIDATES, Signed, base64_tag, malformed, single, unix_seconds};

static WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
static WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
static WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");

pub(super) fn parse(headers: &HeaderMap) -> Result<Signed<'_>, super::Failure> {
    let signatures = single(headers, &WEBHOOK_SIGNATURE)?;
    let id = single(headers, &WEBHOOK_ID)?;
    let timestamp_text = single(headers, &WEBHOOK_TIMESTAMP)?;
    // The spec: neither may hold a '.', which would move the boundary
    // between the signed fields.
    if id.is_empty() || id.contains(&b'.') {
        return Err(malformed("webhook-id is empty or holds a '.'"));
    }
    let timestamp = unix_seconds(timestamp_text).ok_or(malformed("webhook-timestamp is not Unix seconds"))?;
    let candidates = parse_signatures(signatures);
    if candidates.is_empty() {
        return Err(malformed("webhook-signature has no v1 signature"));
    }
    Ok(Signed { candidates, timestamp: Some(timestamp), prefix: [id, b".", timestamp_text, b"."] })
}

/// The decoded `v1,` signatures, at most [`MAX_CANDIDATES`].
pub(super) fn parse_signatures(value: &[u8]) -> Vec<[u8; 32]> {
    value
        .split(|b| *b == b' ')
        .filter_map(|item| item.strip_prefix(b"v1,"))
        .take(MAX_CANDIDATES)
        .filter_map(base64_tag)
        .collect()
}
