//! Parsing the `Idempotency-Key` header into an [`IdempotencyKey`].
//!
//! Two spellings are accepted: the IETF draft's structured-field string
//! (`"abc"`, with `\"` and `\\` escapes) and the bare token that Stripe-style
//! clients send (`abc`). Either way the key is 1 to 255 printable ASCII
//! characters. Anything else — two header fields, a list, parameters, a
//! control character, a bad escape — is rejected, because guessing what a
//! malformed key meant could merge two different requests.

use http::HeaderMap;
use http::header::HeaderName;

/// The header that carries the key.
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key accepted, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key (1..=255 printable ASCII characters).
#[derive(Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

/// Why a key was rejected; the text is shown to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// More than one `Idempotency-Key` field.
    #[error("the Idempotency-Key header appears more than once")]
    Repeated,
    /// The key is empty.
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("the Idempotency-Key is longer than 255 characters")]
    TooLong,
    /// A character outside printable ASCII.
    #[error("the Idempotency-Key contains a character outside printable ASCII")]
    NotPrintableAscii,
    /// A structured-field string that does not parse.
    #[error("the Idempotency-Key is not a valid structured-field string: {0}")]
    BadString(&'static str),
    /// A bare token containing a separator (looks like a list or parameters).
    #[error("the Idempotency-Key must be a single string, not a list or parameters")]
    NotSingle,
    /// A key from a route's other source (a named header, a JSON pointer)
    /// is unusable; the text names the source and why, never the value.
    #[error("{0}")]
    Source(String),
}

impl IdempotencyKey {
    /// Reads the key from request headers: `Ok(None)` when absent.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, KeyError> {
        let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
        let Some(first) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse(first.as_bytes()).map(Some)
    }

    /// Parses one header value.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let trimmed = trim_spaces(raw);
        let key = match trimmed.first() {
            Some(b'"') => parse_sf_string(trimmed)?,
            _ => parse_bare(trimmed)?,
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        Ok(Self(key))
    }

    /// Validates an already-decoded key (admin API): length and printable ASCII only.
    pub fn new(key: &str) -> Result<Self, KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        if !key.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(KeyError::NotPrintableAscii);
        }
        Ok(Self(key.to_owned()))
    }

    /// The key's characters.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// The key is a client secret of sorts: never print it by accident.
impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdempotencyKey(..)")
    }
}

fn trim_spaces(raw: &[u8]) -> &[u8] {
    let start = raw.iter().position(|b| *b != b' ' && *b != b'\t');
    let end = raw.iter().rposition(|b| *b != b' ' && *b != b'\t');
    match (start, end) {
        (Some(start), Some(end)) => &raw[start..=end],
        _ => &[],
    }
}

/// RFC 8941 §4.2.5: `"` chars `"`, where chars are 0x20..=0x7E except `"`
/// and `\`, or the escapes `\"` and `\\`. Nothing may follow the closing quote.
fn parse_sf_string(raw: &[u8]) -> Result<String, KeyError> {
    let mut out = String::with_capacity(raw.len());
    let mut bytes = raw[1..].iter();
    loop {
        match bytes.next() {
            None => return Err(KeyError::BadString("missing closing quote")),
            Some(b'\\') => match bytes.next() {
                Some(c @ (b'"' | b'\\')) => out.push(char::from(*c)),
                _ => return Err(KeyError::BadString("only \\\" and \\\\ may be escaped")),
            },
            Some(b'"') => break,
            Some(c) if (0x20..=0x7e).contains(c) => out.push(char::from(*c)),
            Some(_) => return Err(KeyError::NotPrintableAscii),
        }
        if out.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
    }
    if bytes.next().is_some() {
        return Err(KeyError::NotSingle);
    }
    Ok(out)
}

/// A bare token: visible ASCII without the separators that would make it a
/// list (`,`), parameters (`;`) or a half-quoted string.
fn parse_bare(raw: &[u8]) -> Result<String, KeyError> {
    if raw.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    let mut out = String::with_capacity(raw.len());
    for c in raw {
        match c {
            b',' | b';' | b'"' | b'\\' | b' ' | b'\t' => return Err(KeyError::NotSingle),
            0x21..=0x7e => out.push(char::from(*c)),
            _ => return Err(KeyError::NotPrintableAscii),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn parse(raw: &str) -> Result<String, KeyError> {
        IdempotencyKey::parse(raw.as_bytes()).map(|k| k.0)
    }

    #[test]
    fn bare_tokens_and_sf_strings_are_both_accepted() {
        assert_eq!(parse("8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
        assert_eq!(parse("\"abc\"").unwrap(), "abc");
        assert_eq!(parse(" \"a b\" ").unwrap(), "a b");
        assert_eq!(parse(r#""q\"uote\\d""#).unwrap(), r#"q"uote\d"#);
    }

    #[test]
    fn malformed_keys_are_rejected_with_a_reason() {
        assert_eq!(parse(""), Err(KeyError::Empty));
        assert_eq!(parse("\"\""), Err(KeyError::Empty));
        assert_eq!(parse("   "), Err(KeyError::Empty));
        assert_eq!(parse(&"k".repeat(256)), Err(KeyError::TooLong));
        assert_eq!(parse(&format!("\"{}\"", "k".repeat(256))), Err(KeyError::TooLong));
        assert!(parse(&"k".repeat(255)).is_ok());
        assert_eq!(parse("\"abc"), Err(KeyError::BadString("missing closing quote")));
        assert!(matches!(parse(r#""a\n""#), Err(KeyError::BadString(_))));
        assert_eq!(parse("\"a\", \"b\""), Err(KeyError::NotSingle));
        assert_eq!(parse("a,b"), Err(KeyError::NotSingle));
        assert_eq!(parse("\"a\";p=1"), Err(KeyError::NotSingle));
        assert_eq!(parse("a b"), Err(KeyError::NotSingle));
        assert_eq!(IdempotencyKey::parse("k\u{e9}y".as_bytes()).map(|k| k.0), Err(KeyError::NotPrintableAscii));
        assert_eq!(IdempotencyKey::parse(b"\"k\x01\"").map(|k| k.0), Err(KeyError::NotPrintableAscii));
    }

    #[test]
    fn two_header_fields_are_rejected_and_none_is_absent() {
        let mut headers = HeaderMap::new();
        assert_eq!(IdempotencyKey::from_headers(&headers), Ok(None));
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert!(IdempotencyKey::from_headers(&headers).unwrap().is_some());
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert_eq!(IdempotencyKey::from_headers(&headers), Err(KeyError::Repeated));
    }

    #[test]
    fn debug_output_hides_the_key() {
        let key = IdempotencyKey::parse(b"secret-key").unwrap();
        assert!(!format!("{key:?}").contains("secret"));
    }

    proptest! {
        #[test]
        fn parsing_never_panics_and_accepted_keys_are_printable(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(key) = IdempotencyKey::parse(&raw) {
                prop_assert!((1..=MAX_KEY_LEN).contains(&key.as_str().len()));
                prop_assert!(key.as_str().bytes().all(|b| (0x20..=0x7e).contains(&b)));
            }
        }

        #[test]
        fn any_printable_key_round_trips_as_an_sf_string(key in "[ -~]{1,255}") {
            let escaped = key.replace('\\', "\\\\").replace('"', "\\\"");
            let parsed = IdempotencyKey::parse(format!("\"{escaped}\"").as_bytes()).unwrap();
            prop_assert_eq!(parsed.as_str(), key.as_str());
        }
    }
}
