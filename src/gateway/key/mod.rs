//! Key sources: where a guarded request's key is, resolved once per request.
//!
//! | config | key | read |
//! |---|---|---|
//! | `{ header = "idempotency-key" }` (default) | the draft's syntax, bare or quoted | from the head, before the body |
//! | `{ header = "x-github-delivery" }` | the field's raw value, 1–255 printable ASCII | from the head (after verification on a webhook route) |
//! | `{ json = "/id" }` | the string or integer at an RFC 6901 pointer | from the body, read whole first |
//!
//! A key from any source but the default is scoped by its route as well
//! (`ScopedKey::for_route`): a provider's event ids and a client's keys,
//! or two providers', never meet. Absent is not malformed: an absent key
//! leaves the route's `require_key` (and a webhook route, which always
//! requires one) to decide; a malformed one is `400 invalid-key` wherever
//! it comes from, since guessing what it meant could merge two requests.
//! One file per kind of source; adding one is a file and a match arm.

mod header;
mod json;

use http::HeaderMap;
use http::header::HeaderName;

use crate::config;
use crate::idempotency::{IdempotencyKey, KeyError};

/// A route's key source, compiled from its config.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// The `Idempotency-Key` header (the default).
    IdempotencyKey,
    /// Another header's raw value.
    Header(HeaderName),
    /// A JSON pointer into the body.
    Json(json::Pointer),
}

impl KeySource {
    /// Compiles a validated key source.
    pub fn from_config(config: &config::KeySource) -> Self {
        match config {
            source if source.is_default() => Self::IdempotencyKey,
            config::KeySource::Header(name) => Self::Header(name.clone()),
            config::KeySource::Json(pointer) => Self::Json(json::Pointer::new(pointer)),
        }
    }

    /// `true` when the key is in the body, which must be read first.
    pub fn in_body(&self) -> bool {
        matches!(self, Self::Json(_))
    }

    /// `true` for every source but the default: the key is scoped by route too.
    pub fn route_scoped(&self) -> bool {
        !matches!(self, Self::IdempotencyKey)
    }

    /// The request's key: `Ok(None)` when it has none. `body` is only
    /// read by a source [`in_body`](Self::in_body).
    pub fn find(&self, headers: &HeaderMap, body: &[u8]) -> Result<Option<IdempotencyKey>, KeyError> {
        match self {
            Self::IdempotencyKey => IdempotencyKey::from_headers(headers),
            Self::Header(name) => header::find(name, headers),
            Self::Json(pointer) => pointer.find(body),
        }
    }

    /// Where the key is, for a problem's detail ("the webhook-id header").
    pub fn describe(&self) -> String {
        match self {
            Self::IdempotencyKey => "the Idempotency-Key header".into(),
            Self::Header(name) => format!("the {name} header"),
            Self::Json(pointer) => format!("the JSON body at {}", pointer.as_str()),
        }
    }
}

/// A key's text checked as every source's keys are (1–255 printable
/// ASCII), with the error naming `source` instead of `Idempotency-Key`.
fn checked(text: &str, source: impl FnOnce() -> String) -> Result<IdempotencyKey, KeyError> {
    IdempotencyKey::new(text).map_err(|e| {
        let why = match e {
            KeyError::Empty => "is empty",
            KeyError::TooLong => "is longer than 255 characters",
            _ => NOT_ASCII,
        };
        refused(&source(), why)
    })
}

const NOT_ASCII: &str = "holds a character outside printable ASCII";

/// A key refused: where it was, and why (never what it was).
fn refused(source: &str, why: &str) -> KeyError {
    KeyError::Source(format!("the key in {source} {why}"))
}

#[cfg(test)]
mod tests;
