//! Percent-decoding for admin paths and query strings.
//!
//! The two differ in one character. A query value is form-style, as every
//! HTML form and most HTTP clients write it: `+` is a space (so
//! `?tenant=Bearer+abc` means `Bearer abc`) and `%2B` is a `+`. A path
//! segment keeps `+` as it is, because keys may contain `+`.

use std::borrow::Cow;

use percent_encoding::percent_decode_str;

use crate::http::path::escape_at;

/// Decodes `%XX` escapes in a path segment; `+` stays `+`. `None` for a
/// broken escape or invalid UTF-8.
pub(super) fn percent_decode(text: &str) -> Option<String> {
    decode(text, false)
}

/// Decodes a form-style query value: `+` is a space, then `%XX` escapes.
/// `None` for a broken escape or invalid UTF-8.
fn query_value_decode(text: &str) -> Option<String> {
    decode(text, true)
}

/// The crate's decoding, stricter: a `%` that starts no escape is refused
/// (the crate passes it through), as the gateway's own paths refuse it.
fn decode(text: &str, plus_is_space: bool) -> Option<String> {
    let bytes = text.as_bytes();
    if (0..bytes.len()).any(|at| bytes[at] == b'%' && escape_at(&bytes[at..]).is_none()) {
        return None;
    }
    let text = match plus_is_space {
        true => Cow::Owned(text.replace('+', " ")),
        false => Cow::Borrowed(text),
    };
    percent_decode_str(&text).decode_utf8().ok().map(Cow::into_owned)
}

/// Why a query parameter cannot be read; a `400` to the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum QueryError {
    /// Given twice: which one was meant is not guessed.
    #[error("the query parameter {0:?} appears more than once")]
    Repeated(String),
    /// A broken escape or invalid UTF-8.
    #[error("the query parameter {0:?} is not valid percent-encoding")]
    Encoding(String),
}

/// The decoded value of query parameter `name`, if present once.
pub(super) fn param(query: Option<&str>, name: &str) -> Result<Option<String>, QueryError> {
    let mut found = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == name {
            if found.is_some() {
                return Err(QueryError::Repeated(name.to_owned()));
            }
            found = Some(query_value_decode(v).ok_or_else(|| QueryError::Encoding(name.to_owned()))?);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_and_broken_ones_are_refused() {
        assert_eq!(percent_decode("a%2Fb%20c+d").as_deref(), Some("a/b c+d"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%ff"), None);
    }

    #[test]
    fn a_parameter_is_read_once() {
        assert_eq!(param(Some("tenant=Bearer%20abc&x=1"), "tenant").unwrap().as_deref(), Some("Bearer abc"));
        assert_eq!(param(None, "tenant").unwrap(), None);
        assert!(param(Some("tenant=a&tenant=b"), "tenant").is_err());
    }

    #[test]
    fn a_plus_in_a_query_value_is_a_space_and_an_escaped_plus_is_a_plus() {
        assert_eq!(param(Some("tenant=Bearer+abc"), "tenant").unwrap().as_deref(), Some("Bearer abc"));
        assert_eq!(param(Some("tenant=Bearer+a%2Bb"), "tenant").unwrap().as_deref(), Some("Bearer a+b"));
        assert_eq!(param(Some("tenant=++"), "tenant").unwrap().as_deref(), Some("  "));
        assert!(param(Some("tenant=a+%zz"), "tenant").is_err());
    }

    #[test]
    fn a_plus_in_a_path_segment_stays_a_plus() {
        assert_eq!(percent_decode("order+7").as_deref(), Some("order+7"));
        assert_eq!(percent_decode("order%2B7").as_deref(), Some("order+7"));
    }
}
