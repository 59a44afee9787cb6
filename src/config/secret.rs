//! Values that must never be printed whole: secrets, and service URLs
//! whose password is redacted wherever they are shown.

use serde::{Deserialize, Serialize, Serializer};

/// A value that must never appear in logs or printed configs.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The secret itself; call only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("[redacted]")
    }
}

/// The lower-cased scheme of a URL (`redis+cluster` in `redis+cluster://…`).
fn scheme_of(url: &str) -> String {
    url.split("://").next().unwrap_or("").to_ascii_lowercase()
}

/// The kinds of store a `store` URL can name: the one list of schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// `memory://`
    Memory,
    /// `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`,
    /// `redis+sentinel://`, `rediss+sentinel://`
    Redis,
    /// `postgres://`, `postgresql://`
    Postgres,
}

/// Every scheme a `store` URL may have, and the kind of store it names:
/// parsing, the error for an unknown scheme and its test read this table.
pub const STORE_SCHEMES: [(&str, StoreKind); 9] = [
    ("memory", StoreKind::Memory),
    ("redis", StoreKind::Redis),
    ("rediss", StoreKind::Redis),
    ("redis+cluster", StoreKind::Redis),
    ("rediss+cluster", StoreKind::Redis),
    ("redis+sentinel", StoreKind::Redis),
    ("rediss+sentinel", StoreKind::Redis),
    ("postgres", StoreKind::Postgres),
    ("postgresql", StoreKind::Postgres),
];

impl StoreKind {
    /// The kind `url`'s scheme names, if any.
    pub fn of(url: &str) -> Option<Self> {
        let scheme = scheme_of(url);
        STORE_SCHEMES.iter().find(|(known, _)| *known == scheme).map(|(_, kind)| *kind)
    }

    /// Every scheme, as a reader would write them: `memory://, redis://, … or postgresql://`.
    pub fn schemes() -> String {
        let all: Vec<String> = STORE_SCHEMES.iter().map(|(scheme, _)| format!("{scheme}://")).collect();
        match all.split_last() {
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

/// A store or database URL; its password is redacted when printed.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct ServiceUrl(String);

impl ServiceUrl {
    /// Wraps a URL.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The URL with its password; call only where a connection is made.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// The scheme, lower-cased (`memory`, `redis`, …).
    pub fn scheme(&self) -> String {
        scheme_of(&self.0)
    }

    /// The store this URL names, by its scheme; `None` for a scheme no store has.
    pub fn store_kind(&self) -> Option<StoreKind> {
        StoreKind::of(&self.0)
    }
    /// The URL with any `user:password@` password replaced, and any
    /// `password=` in its query (libpq lets a database URL carry it there)
    /// or `sentinel_password=` (the Sentinels' of a `redis+sentinel://` URL).
    pub fn redacted(&self) -> String {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return self.0.clone();
        };
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let tail = redact_query(tail);
        match authority.rsplit_once('@') {
            // Only a password is a secret: `postgres@host` stays as it is,
            // but a NATS URL's lone user name is a token (`nats://token@host`).
            Some((userinfo, hosts)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:[redacted]@{hosts}{tail}"),
                None if is_nats_scheme(scheme) => format!("{scheme}://[redacted]@{hosts}{tail}"),
                None => format!("{scheme}://{userinfo}@{hosts}{tail}"),
            },
            None => format!("{scheme}://{authority}{tail}"),
        }
    }
}

/// Whether `scheme` is a NATS server's, where a URL's lone user name is a token.
pub(crate) fn is_nats_scheme(scheme: &str) -> bool {
    matches!(scheme, "nats" | "tls")
}

/// `path?query` with the value of every password parameter replaced.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let pairs: Vec<&str> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some(("password", _)) => "password=[redacted]",
            Some(("sentinel_password", _)) => "sentinel_password=[redacted]",
            _ => pair,
        })
        .collect();
    format!("{path}?{}", pairs.join("&"))
}

impl std::fmt::Debug for ServiceUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for ServiceUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

#[cfg(test)]
mod scheme_tests {
    use super::*;

    #[test]
    fn every_store_scheme_is_named_in_the_error_and_parses_to_its_kind() {
        let named = StoreKind::schemes();
        for (scheme, kind) in STORE_SCHEMES {
            assert!(named.contains(&format!("{scheme}://")), "{named}");
            assert_eq!(StoreKind::of(&format!("{}://h/", scheme.to_ascii_uppercase())), Some(kind));
        }
        assert!(named.ends_with(" or postgresql://"), "{named}");
        assert_eq!(StoreKind::of("mysql://h/"), None);
    }
}
