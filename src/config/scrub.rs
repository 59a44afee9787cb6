//! The config's secrets, found once, and a [`Scrubber`] that takes every
//! occurrence of them out of a text before it is stored or printed.
//!
//! Redacting a secret where the config prints it ([`super::Secret`],
//! [`super::ServiceUrl`]) is not enough: a destination may echo the
//! request headers it was sent (a `401` page that shows them is common),
//! and its answer becomes a dead row's `last_error`, the admin API's
//! listing and a log line. So every text from outside that the relay keeps
//! (a failure reason) is scrubbed where it is formed, with one scrubber
//! built from the whole config at start: each destination's header values
//! (and the credentials after an `Authorization` scheme such as `Bearer`),
//! the passwords of destination, database and store URLs (as written and
//! percent-decoded, and a destination's as the `Basic` credentials it is
//! sent as), the admin token and the store's sealing keys.
//!
//! What it cannot promise: a secret the other side sends back transformed
//! (HTML-escaped, re-encoded) is not recognised, and values shorter than
//! [`MIN_SECRET`] bytes are left alone: they are no secret worth the name,
//! and blanking them would garble every reason (`HTTP 5[redacted]`).

use std::borrow::Cow;
use std::sync::Arc;

use base64::Engine;

use super::{Config, DestinationConfig};

/// What every occurrence of a secret becomes.
pub const REDACTED: &str = "[redacted]";

/// The shortest value treated as a secret, in bytes.
pub const MIN_SECRET: usize = 4;

/// Takes the config's secrets out of texts. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Scrubber {
    /// Longest first, so a secret inside another goes with it.
    secrets: Arc<[String]>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scrubber({} secrets)", self.secrets.len())
    }
}

impl Scrubber {
    /// A scrubber for `secrets` (those shorter than [`MIN_SECRET`] dropped).
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| s.len() >= MIN_SECRET).collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Self { secrets: secrets.into() }
    }

    /// The secrets of `destinations` alone.
    pub fn of_destinations<'a>(destinations: impl IntoIterator<Item = &'a DestinationConfig>) -> Self {
        Self::new(destinations.into_iter().flat_map(destination_secrets))
    }

    /// `text` with every occurrence of every secret replaced by [`REDACTED`].
    pub fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for secret in self.secrets.iter() {
            if text.contains(secret.as_str()) {
                text = Cow::Owned(text.replace(secret.as_str(), REDACTED));
            }
        }
        text
    }

    /// `bytes` cut from a longer text, without a tail that begins a
    /// secret: the part of a secret that fell inside the cut is not
    /// recognised by [`Scrubber::scrub`], so it goes too.
    pub fn trim_cut<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        let mut end = bytes.len();
        for secret in self.secrets.iter() {
            let starts = (1..secret.len()).rev().find(|&n| bytes.ends_with(&secret.as_bytes()[..n]));
            if let Some(n) = starts {
                end = end.min(bytes.len() - n);
            }
        }
        &bytes[..end]
    }
}

impl Config {
    /// The one scrubber for everything this config's processes store or
    /// print from outside (see [`Scrubber`]). Reads `admin.token_file` if
    /// set (an unreadable one is the admin listener's error, not this).
    pub fn scrubber(&self) -> Scrubber {
        let mut secrets: Vec<String> = self.destinations.values().flat_map(destination_secrets).collect();
        if let Some(url) = &self.relay.database_url {
            secrets.extend(url_secrets(url.expose()));
        }
        secrets.extend(url_secrets(self.store.expose()));
        if let Some(token) = &self.admin.token {
            secrets.push(token.expose().to_string());
        }
        if let Some(token) = self.admin.token_file.as_ref().and_then(|path| std::fs::read_to_string(path).ok()) {
            secrets.push(token.trim().to_string());
        }
        if let Some(keys) = &self.store_encryption.keys {
            secrets.push(keys.expose().to_string());
            secrets.extend(keys.expose().split(',').filter_map(|key| key.split_once(':')).map(|(_, k)| k.into()));
        }
        Scrubber::new(secrets)
    }
}

/// A destination's header values, the credentials after an auth scheme
/// (`Bearer <token>`), and its URL's password in every form it is sent.
fn destination_secrets(destination: &DestinationConfig) -> Vec<String> {
    let mut secrets = Vec::new();
    for value in destination.headers.values() {
        secrets.push(value.clone());
        let is_scheme =
            |scheme: &str| !scheme.is_empty() && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if let Some((_, credentials)) = value.split_once(' ').filter(|(scheme, _)| is_scheme(scheme)) {
            secrets.push(credentials.trim().to_string());
        }
    }
    secrets.extend(url_secrets(&destination.url));
    if let Some((user, password)) = userinfo(&destination.url) {
        // As `Target` sends it: Basic base64(user ":" password), decoded parts.
        let (user, password) = (decoded(user), decoded(password.unwrap_or("")));
        if !password.is_empty() {
            secrets.push(base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")));
        }
    }
    secrets
}

/// A URL's password (as written and percent-decoded), and the value of a
/// `password=` or `sentinel_password=` in its query.
fn url_secrets(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    match userinfo(url) {
        Some((_, Some(password))) => {
            secrets.push(password.to_string());
            secrets.push(decoded(password));
        }
        // A NATS URL's lone user name is a token.
        Some((token, None))
            if url.split_once("://").is_some_and(|(scheme, _)| super::secret::is_nats_scheme(scheme)) =>
        {
            secrets.push(token.to_string());
            secrets.push(decoded(token));
        }
        _ => {}
    }
    let query = url.split_once('?').map_or("", |(_, query)| query);
    for pair in query.split('&') {
        if let Some(("password" | "sentinel_password", value)) = pair.split_once('=') {
            secrets.push(value.to_string());
            secrets.push(decoded(value));
        }
    }
    secrets
}

/// The user and the password (if any) of `scheme://user:password@host…`.
fn userinfo(url: &str) -> Option<(&str, Option<&str>)> {
    let (_, rest) = url.split_once("://")?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let (userinfo, _) = authority.rsplit_once('@')?;
    Some(match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    })
}

fn decoded(part: &str) -> String {
    percent_encoding::percent_decode_str(part).decode_utf8_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Secret, ServiceUrl};

    #[test]
    fn every_occurrence_of_every_secret_is_replaced_and_the_rest_kept() {
        let scrubber = Scrubber::new(["s3cret-token".to_string(), "Bearer s3cret-token".into(), "ab".into()]);
        let echoed = "HTTP 401: authorization: Bearer s3cret-token\nx: s3cret-token; ab";
        assert_eq!(scrubber.scrub(echoed), "HTTP 401: authorization: [redacted]\nx: [redacted]; ab");
        assert!(matches!(scrubber.scrub("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_cut_through_a_secret_takes_its_first_part_away() {
        let scrubber = Scrubber::new(["s3cret-token".to_string()]);
        assert_eq!(scrubber.trim_cut(b"denied: s3cre"), b"denied: ");
        assert_eq!(scrubber.trim_cut(b"denied: s3cret-token"), b"denied: s3cret-token", "whole: scrub's job");
        assert_eq!(scrubber.trim_cut(b"denied: x"), b"denied: x");
    }

    #[test]
    fn the_config_yields_headers_credentials_passwords_and_tokens_in_every_form() {
        let mut config = Config::default();
        let mut bearer = DestinationConfig::new("http://h/");
        bearer.headers.insert("authorization".into(), "Bearer tok-123456".into());
        bearer.headers.insert("x-api-key".into(), "key-abcdef".into());
        config.destinations.insert("a".into(), bearer);
        config.destinations.insert("b".into(), DestinationConfig::new("https://alice:p%40ss-word@h/"));
        config.relay.database_url = Some(ServiceUrl::new("postgres://app:db-S3cret@h/app?password=q-S3cret"));
        config.store = ServiceUrl::new("redis://:redis-pw@h:6379/0");
        config.admin.token = Some(Secret::new("admin-token-0123456789"));
        let scrubber = config.scrubber();
        let basic = base64::engine::general_purpose::STANDARD.encode("alice:p@ss-word");
        for secret in [
            "Bearer tok-123456",
            "tok-123456",
            "key-abcdef",
            "p%40ss-word",
            "p@ss-word",
            basic.as_str(),
            "db-S3cret",
            "q-S3cret",
            "redis-pw",
            "admin-token-0123456789",
        ] {
            let text = format!("before {secret} after");
            assert_eq!(scrubber.scrub(&text), "before [redacted] after", "{secret}");
        }
        assert_eq!(scrubber.scrub("alice Bearer"), "alice Bearer", "user names and schemes are no secrets");
    }
}
