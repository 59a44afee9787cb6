//! A route's key source (`key = …`) and webhook intake (`webhook = …`).
//!
//! ```toml
//! key = { header = "idempotency-key" }   # the default: today's Idempotency-Key syntax
//! key = { header = "x-github-delivery" } # another header: its raw value
//! key = { json = "/id" }                 # a JSON pointer (RFC 6901) into the body
//! webhook = { scheme = "stripe", secrets_file = "/run/secrets/stripe-whsec", tolerance = "5m" }
//! ```
//!
//! Both are read once, here, into enums; nothing later checks optional
//! fields again. A webhook [`Scheme`] is plain data about a provider (its
//! name, where its event id is, how long it keeps redelivering, whether it
//! signs a timestamp): `check-config` reads it to warn about a `key_ttl`
//! shorter than that window, and the `webhook` room verifies by it. It
//! lives here, not in that room, because config depends on nothing above
//! the pure core.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigDuration, Secret};

/// The header the default key source reads.
pub const DEFAULT_KEY_HEADER: &str = "idempotency-key";

/// Where a route's key comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "KeySourceFields", into = "KeySourceFields")]
pub enum KeySource {
    /// `{ header = "…" }`: `idempotency-key` (the draft's syntax, bare or
    /// quoted), or another header's raw value (one field, 1–255 printable
    /// ASCII).
    Header(http::HeaderName),
    /// `{ json = "/pointer" }`: the string or integer at an RFC 6901
    /// pointer into the JSON body.
    Json(String),
}

impl Default for KeySource {
    fn default() -> Self {
        Self::Header(http::HeaderName::from_static(DEFAULT_KEY_HEADER))
    }
}

impl KeySource {
    /// `true` for the default source, whose keys are scoped by tenant only
    /// (records stored before routes had key sources stay addressable).
    pub fn is_default(&self) -> bool {
        matches!(self, Self::Header(name) if name.as_str() == DEFAULT_KEY_HEADER)
    }
}

/// The table as written.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct KeySourceFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    json: Option<String>,
}

/// Why a route's `key` table is refused; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySourceError {
    /// `header` is not a header name.
    #[error("key.header = {0:?} is not a valid header name")]
    Header(String),
    /// `json` is not an RFC 6901 pointer (see [`check_pointer`]).
    #[error("key.json = {pointer:?}: {why}")]
    Pointer {
        /// As configured.
        pointer: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Neither `header` nor `json`, or both.
    #[error("key must set exactly one of header = \"<name>\" or json = \"/pointer\"")]
    Kinds,
}

impl TryFrom<KeySourceFields> for KeySource {
    type Error = KeySourceError;

    fn try_from(fields: KeySourceFields) -> Result<Self, KeySourceError> {
        match (fields.header, fields.json) {
            (Some(header), None) => {
                // Parsed here, once: `http` keeps every name lower-cased.
                super::ConfigHeaderName::try_from(header)
                    .map(|name| Self::Header(name.0))
                    .map_err(|bad| KeySourceError::Header(bad.0))
            }
            (None, Some(pointer)) => match check_pointer(&pointer) {
                Ok(()) => Ok(Self::Json(pointer)),
                Err(why) => Err(KeySourceError::Pointer { pointer, why }),
            },
            _ => Err(KeySourceError::Kinds),
        }
    }
}

impl From<KeySource> for KeySourceFields {
    fn from(source: KeySource) -> Self {
        match source {
            KeySource::Header(header) => Self { header: Some(header.as_str().to_owned()), json: None },
            KeySource::Json(json) => Self { header: None, json: Some(json) },
        }
    }
}

/// RFC 6901 syntax: `/`-separated reference tokens where `~` is only
/// `~0` or `~1`. The empty pointer (the whole document) is refused: a
/// whole body is not an event id.
pub fn check_pointer(pointer: &str) -> Result<(), &'static str> {
    if !pointer.starts_with('/') {
        return Err("a JSON pointer starts with '/' (the whole document is not a key)");
    }
    let mut bytes = pointer.bytes();
    while let Some(b) = bytes.next() {
        if b == b'~' && !matches!(bytes.next(), Some(b'0' | b'1')) {
            return Err("'~' must be followed by 0 or 1 (RFC 6901)");
        }
    }
    Ok(())
}

/// A webhook provider's signature scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// Standard Webhooks (Svix and others): `webhook-id`,
    /// `webhook-timestamp`, `webhook-signature: v1,<base64> …`.
    StandardWebhooks,
    /// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>,…`.
    Stripe,
    /// GitHub: `X-Hub-Signature-256: sha256=<hex>`.
    Github,
    /// Shopify: `X-Shopify-Hmac-Sha256: <base64>`.
    Shopify,
}

impl Scheme {
    /// Every scheme.
    pub const ALL: [Self; 4] = [Self::StandardWebhooks, Self::Stripe, Self::Github, Self::Shopify];

    /// The name the config file uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::StandardWebhooks => "standard-webhooks",
            Self::Stripe => "stripe",
            Self::Github => "github",
            Self::Shopify => "shopify",
        }
    }

    /// Where the provider puts the event id: the key of a route that sets
    /// no `key` of its own.
    pub fn default_key(self) -> KeySource {
        match self {
            Self::StandardWebhooks => KeySource::Header(http::HeaderName::from_static("webhook-id")),
            Self::Stripe => KeySource::Json("/id".into()),
            Self::Github => KeySource::Header(http::HeaderName::from_static("x-github-delivery")),
            Self::Shopify => KeySource::Header(http::HeaderName::from_static("x-shopify-webhook-id")),
        }
    }

    /// How long after its first attempt the provider may still deliver an
    /// event again; a `key_ttl` shorter than this lets a late redelivery
    /// run again, and `check-config` says so.
    pub fn retry_window(self) -> Duration {
        const HOUR: u64 = 3600;
        match self {
            // The spec's example schedule (spec/standard-webhooks.md,
            // "Retry schedule"): the last of its ten attempts is 75 h 35 min
            // 5 s after the first. Senders may use their own; Svix's is this one.
            Self::StandardWebhooks => Duration::from_secs(75 * HOUR + 35 * 60 + 5),
            // "In live mode, Stripe attempts to deliver a given event to
            // your webhook endpoint for up to 3 days" (docs.stripe.com/webhooks).
            Self::Stripe => Duration::from_secs(72 * HOUR),
            // GitHub never redelivers by itself; deliveries of the past
            // 3 days can be redelivered by hand or through its API
            // (docs.github.com, "Redelivering webhooks"; 7 days on
            // GitHub Enterprise Server, whose users should set key_ttl = "7d").
            Self::Github => Duration::from_secs(72 * HOUR),
            // "Webhooks will now be retried a total of 8 times over 4 hours"
            // (shopify.dev changelog, effective 2024-09-10; 48 h before).
            Self::Shopify => Duration::from_secs(4 * HOUR),
        }
    }

    /// Whether the signature covers the event id that `key` finds: a key
    /// in the body (every scheme signs the body), or Standard Webhooks'
    /// `webhook-id` (signed with the body). GitHub's and Shopify's id
    /// headers are not signed: anyone holding one captured delivery could
    /// resend it under another id.
    pub fn signs_key(self, key: &KeySource) -> bool {
        match key {
            KeySource::Json(_) => true,
            KeySource::Header(name) => self == Self::StandardWebhooks && name.as_str() == "webhook-id",
        }
    }

    /// Whether the signed content carries a timestamp that `tolerance`
    /// bounds (GitHub and Shopify sign the body alone).
    pub fn signs_timestamp(self) -> bool {
        matches!(self, Self::StandardWebhooks | Self::Stripe)
    }
}

/// The most secrets one route accepts at once (each costs one HMAC of
/// every delivery that fails the ones before it).
pub const MAX_SECRETS: usize = 8;

/// `webhook = { scheme = …, secrets = […] or secrets_file = … }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// The provider's signature scheme.
    pub scheme: Scheme,
    /// The signing secrets, all accepted (rotation); printed redacted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<Secret>,
    /// A file with one secret per line (blank lines and `#` comments
    /// skipped), read at start; rotation is a second line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_file: Option<PathBuf>,
    /// How far a signed timestamp may be from the gateway's clock, either way.
    #[serde(default = "default_tolerance")]
    pub tolerance: ConfigDuration,
}

/// Five minutes, as Stripe's and the Standard Webhooks libraries' own default.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

fn default_tolerance() -> ConfigDuration {
    ConfigDuration(DEFAULT_TOLERANCE)
}

/// Why a route's `webhook` table is refused; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    /// Neither `secrets` nor `secrets_file`.
    #[error("webhook needs secrets = [\"…\"] or secrets_file = \"…\"")]
    NoSecrets,
    /// Both `secrets` and `secrets_file`.
    #[error("webhook takes secrets or secrets_file, not both")]
    TwoSources,
    /// More than [`MAX_SECRETS`].
    #[error("webhook.secrets: at most {MAX_SECRETS}")]
    TooManySecrets,
    /// A secret is blank.
    #[error("webhook.secrets: a secret is empty")]
    EmptySecret,
    /// `tolerance` under a second.
    #[error("webhook.tolerance = {0}: must be at least 1s")]
    Tolerance(ConfigDuration),
}

impl WebhookConfig {
    /// Checks what parsing cannot: one source of secrets, a usable tolerance.
    pub fn check(&self) -> Result<(), WebhookError> {
        match (self.secrets.is_empty(), &self.secrets_file) {
            (true, None) => return Err(WebhookError::NoSecrets),
            (false, Some(_)) => return Err(WebhookError::TwoSources),
            _ => {}
        }
        if self.secrets.len() > MAX_SECRETS {
            return Err(WebhookError::TooManySecrets);
        }
        if self.secrets.iter().any(|s| s.expose().trim().is_empty()) {
            return Err(WebhookError::EmptySecret);
        }
        if self.tolerance.0 < Duration::from_secs(1) {
            return Err(WebhookError::Tolerance(self.tolerance));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct RouteKey {
        key: KeySource,
    }

    #[test]
    fn pointers_follow_rfc_6901() {
        for good in ["/id", "/data/object/id", "/a~0b", "/a~1b", "/0", "/"] {
            assert_eq!(check_pointer(good), Ok(()), "{good}");
        }
        for bad in ["", "id", "/a~", "/a~2"] {
            assert!(check_pointer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_scheme_names_itself_and_its_key() {
        for scheme in Scheme::ALL {
            let parsed: Scheme = serde_json::from_value(serde_json::json!(scheme.name())).unwrap();
            assert_eq!(parsed, scheme);
            assert!(!scheme.default_key().is_default(), "{scheme:?}: a provider sends no Idempotency-Key");
            assert!(scheme.retry_window() >= Duration::from_secs(3600));
        }
        assert!(KeySource::default().is_default());
        assert!(KeySource::Header(http::HeaderName::from_static("idempotency-key")).is_default());
        let parsed: KeySource = toml::from_str::<RouteKey>("key = { header = \"Idempotency-Key\" }").unwrap().key;
        assert!(parsed.is_default(), "a header name is matched without regard to case");
    }
}
