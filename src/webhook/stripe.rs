//! Stripe: `Stripe-Signature: t=1492774577,v1=5257a8…,v0=6ffbb5…`.
//!
//! Comma-separated `key=value` items: exactly one `t` (Unix seconds),
//! one or more `v1` (hex HMAC-SHA256 of `"{t}.{body}"`, one per active
//! secret while Stripe rolls a secret). `v0` (test-mode legacy), unknown
//! keys and items that are not `key=value` are ignored, as Stripe's own
//! libraries do. The secret (`whsec_…`)
//! is the HMAC key as written.

use http::HeaderMap;
use http::header::HeaderName;

use super::{MAX_CANDIDATES, Signed, hex_tag, malformed, single, unix_seconds};

static STRIPE_SIGNATURE: HeaderName = HeaderName::from_static("stripe-signature");

pub(super) fn parse(headers: &HeaderMap) -> Result<Signed<'_>, super::Failure> {
    let value = single(headers, &STRIPE_SIGNATURE)?;
    let ((t, seconds), candidates) = parse_value(value)?;
    Ok(Signed { candidates, timestamp: Some(seconds), prefix: [t, b".", b"", b""] })
}

/// The `t` item (as sent, and as a number) and the decoded `v1` items.
#[allow(clippy::type_complexity)]
pub(super) fn parse_value(value: &[u8]) -> Result<((&[u8], u64), Vec<[u8; 32]>), super::Failure> {
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for item in value.split(|b| *b == b',') {
        let item = item.trim_ascii();
        // An item that is not key=value (an empty one after a trailing
        // comma, say) is skipped, as Stripe's libraries skip it.
        let Some(equals) = item.iter().position(|b| *b == b'=') else { continue };
        let (key, text) = (&item[..equals], &item[equals + 1..]);
        match key {
            b"t" if timestamp.is_some() => return Err(malformed("Stripe-Signature has two timestamps")),
            b"t" => {
                let seconds = unix_seconds(text).ok_or(malformed("Stripe-Signature's t is not Unix seconds"))?;
                timestamp = Some((text, seconds));
            }
            // A v1 that is not 64 hex digits can match no secret: skipped.
            b"v1" if candidates.len() < MAX_CANDIDATES => candidates.extend(hex_tag(text)),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(malformed("Stripe-Signature has no timestamp (t=)"))?;
    if candidates.is_empty() {
        return Err(malformed("Stripe-Signature has no v1 signature"));
    }
    Ok((timestamp, candidates))
}
