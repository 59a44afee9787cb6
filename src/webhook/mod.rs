//! Webhook intake: is this delivery really from the provider?
//!
//! Providers sign each delivery with HMAC-SHA256 under a shared secret;
//! each [`Scheme`] puts the signature (and, for some, a timestamp) in its
//! own header and signs its own content:
//!
//! | scheme | header | signed content | encoding |
//! |---|---|---|---|
//! | `standard-webhooks` | `webhook-signature: v1,<sig> v1,<sig>` | `{webhook-id}.{webhook-timestamp}.{body}` | base64 |
//! | `stripe` | `Stripe-Signature: t=<unix>,v1=<sig>,v1=<sig>` | `{t}.{body}` | hex |
//! | `github` | `X-Hub-Signature-256: sha256=<sig>` | body | hex |
//! | `shopify` | `X-Shopify-Hmac-Sha256: <sig>` | body | base64 |
//!
//! One file per scheme parses its header into a [`Signed`] (the candidate
//! signatures, the signed timestamp and the pieces of the signed content);
//! [`Verifier`] does the rest the same way for all: one HMAC per secret
//! (several secrets are accepted at once, for rotation), compared in
//! constant time against every candidate, then the timestamp against
//! `tolerance`. The signature is checked first, so `webhook-timestamp`
//! is only ever said of a genuine delivery (a late one, or a skewed clock).
//!
//! Bounded work whatever a client sends: at most [`MAX_CANDIDATES`]
//! signatures of a header are decoded (the rest are ignored, so a valid
//! one past them fails as a mismatch), the header itself is bounded by
//! `max_header_bytes`, and the HMACs cost one pass over the body per
//! secret, never per candidate. A signature header sent twice is refused
//! (`webhook-signature`, reason `repeated`): which one counts would be a
//! guess. Pure code: the clock is a parameter, so tests are exact.

mod github;
mod secrets;
mod shopify;
mod standard;
mod stripe;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use http::header::HeaderName;
use ring::hmac;
use subtle::ConstantTimeEq;

pub use crate::config::Scheme;
use crate::config::WebhookConfig;
pub use secrets::SecretError;

/// The most signatures of one header that are decoded and compared.
pub const MAX_CANDIDATES: usize = 16;

/// The length of an HMAC-SHA256 tag.
const TAG_LEN: usize = 32;

/// Which check a delivery failed: the problem it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// `401 webhook-signature`: no valid signature by any configured secret.
    Signature,
    /// `401 webhook-timestamp`: validly signed, but its timestamp is
    /// outside `tolerance`.
    Timestamp,
}

/// Why, in a word that labels a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A header the scheme needs is absent.
    Missing,
    /// A header the scheme needs appears more than once.
    Repeated,
    /// A header does not parse (or carries no signature of a known version).
    Malformed,
    /// No candidate matches any secret's signature.
    Mismatch,
    /// The signed timestamp is older than `tolerance`.
    Stale,
    /// The signed timestamp is further ahead than `tolerance`.
    Future,
}

impl Reason {
    /// Every reason, in declaration order (`reason as usize` is its slot).
    pub const ALL: [Self; 6] =
        [Self::Missing, Self::Repeated, Self::Malformed, Self::Mismatch, Self::Stale, Self::Future];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Repeated => "repeated",
            Self::Malformed => "malformed",
            Self::Mismatch => "mismatch",
            Self::Stale => "stale",
            Self::Future => "future",
        }
    }
}

/// A failed verification: which problem, and why (shown to the sender
/// without any secret or signature in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// The problem.
    pub kind: FailureKind,
    /// The metric reason.
    pub reason: Reason,
    /// A sentence for the problem's detail.
    pub why: &'static str,
}

impl Failure {
    fn signature(reason: Reason, why: &'static str) -> Self {
        Self { kind: FailureKind::Signature, reason, why }
    }
}

/// A delivery's signature header, parsed by its scheme.
struct Signed<'a> {
    /// The decoded signatures (at most [`MAX_CANDIDATES`]).
    candidates: Vec<[u8; TAG_LEN]>,
    /// The signed timestamp, for schemes that sign one.
    timestamp: Option<u64>,
    /// What is signed before the body, in order (`id`, `.`, `t`, `.`).
    prefix: [&'a [u8]; 4],
}

/// Verifies deliveries of one route: its scheme, its secrets, its tolerance.
pub struct Verifier {
    scheme: Scheme,
    keys: Vec<hmac::Key>,
    tolerance: Duration,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Verifier({}, {} secrets)", self.scheme.name(), self.keys.len())
    }
}

impl Verifier {
    /// A verifier for secrets as the provider shows them (`whsec_…` for
    /// Standard Webhooks is decoded; the others' are used as written).
    pub fn new(scheme: Scheme, secrets: &[&str], tolerance: Duration) -> Result<Self, SecretError> {
        let keys = secrets
            .iter()
            .map(|secret| secrets::key_bytes(scheme, secret).map(|bytes| hmac::Key::new(hmac::HMAC_SHA256, &bytes)))
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(SecretError::None);
        }
        Ok(Self { scheme, keys, tolerance })
    }

    /// The verifier a route's config describes; reads `secrets_file` now,
    /// so a missing or empty file stops the start (and `check-config`).
    pub fn from_config(config: &WebhookConfig) -> Result<Self, SecretError> {
        let from_file;
        let secrets: Vec<&str> = match &config.secrets_file {
            Some(path) => {
                from_file = secrets::read_file(path)?;
                from_file.iter().map(String::as_str).collect()
            }
            None => config.secrets.iter().map(|s| s.expose()).collect(),
        };
        Self::new(config.scheme, &secrets, config.tolerance.0)
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Checks a delivery's signature, then its timestamp, at `now`.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8], now: SystemTime) -> Result<(), Failure> {
        let signed = match self.scheme {
            Scheme::StandardWebhooks => standard::parse(headers)?,
            Scheme::Stripe => stripe::parse(headers)?,
            Scheme::Github => github::parse(headers)?,
            Scheme::Shopify => shopify::parse(headers)?,
        };
        if !self.keys.iter().any(|key| matches_any(&tag(key, &signed.prefix, body), &signed.candidates)) {
            return Err(Failure::signature(Reason::Mismatch, "no signature matches a configured secret"));
        }
        match signed.timestamp {
            Some(timestamp) => check_timestamp(timestamp, now, self.tolerance),
            None => Ok(()),
        }
    }
}

/// HMAC-SHA256 over the signed prefix and the body, without joining them.
fn tag(key: &hmac::Key, prefix: &[&[u8]; 4], body: &[u8]) -> hmac::Tag {
    let mut context = hmac::Context::with_key(key);
    for piece in prefix {
        context.update(piece);
    }
    context.update(body);
    context.sign()
}

/// Constant-time in each comparison; the loop does not stop at a match
/// either, so the time says nothing about which candidate matched.
fn matches_any(tag: &hmac::Tag, candidates: &[[u8; TAG_LEN]]) -> bool {
    let mut matched = subtle::Choice::from(0);
    for candidate in candidates {
        matched |= tag.as_ref().ct_eq(candidate);
    }
    matched.into()
}

fn check_timestamp(timestamp: u64, now: SystemTime, tolerance: Duration) -> Result<(), Failure> {
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let tolerance = tolerance.as_secs();
    let kind = FailureKind::Timestamp;
    if timestamp.saturating_add(tolerance) < now {
        return Err(Failure { kind, reason: Reason::Stale, why: "the signed timestamp is older than the tolerance" });
    }
    if timestamp > now.saturating_add(tolerance) {
        return Err(Failure {
            kind,
            reason: Reason::Future,
            why: "the signed timestamp is further ahead of this gateway's clock than the tolerance",
        });
    }
    Ok(())
}

/// The one field of a header the scheme needs.
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<&'a [u8], Failure> {
    let mut values = headers.get_all(name).iter();
    let first =
        values.next().ok_or(Failure::signature(Reason::Missing, "a header the scheme signs with is missing"))?;
    if values.next().is_some() {
        return Err(Failure::signature(Reason::Repeated, "a header the scheme signs with appears more than once"));
    }
    Ok(first.as_bytes())
}

/// A header value that does not parse.
fn malformed(why: &'static str) -> Failure {
    Failure::signature(Reason::Malformed, why)
}

/// A Unix timestamp in decimal seconds (at most 12 digits: year 33658).
fn unix_seconds(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 12 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Lower- or upper-case hex of one tag.
fn hex_tag(text: &[u8]) -> Option<[u8; TAG_LEN]> {
    if text.len() != TAG_LEN * 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0; TAG_LEN];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Standard base64 (padded) of one tag.
fn base64_tag(text: &[u8]) -> Option<[u8; TAG_LEN]> {
    use base64::Engine;
    // 32 bytes are 44 characters; longer text is not a tag and is not decoded.
    if text.len() != 44 {
        return None;
    }
    let mut out = [0; TAG_LEN + 2];
    let written = base64::engine::general_purpose::STANDARD.decode_slice(text, &mut out).ok()?;
    if written != TAG_LEN {
        return None;
    }
    out[..TAG_LEN].try_into().ok()
}

#[cfg(test)]
mod tests;
