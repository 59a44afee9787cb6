//! A key in the JSON body, at an RFC 6901 pointer: a string, or an
//! integer (its decimal text; `"42"` and `42` are one key). Anything else
//! there — an object, an array, `null`, a boolean, a fraction — is
//! refused rather than turned into text, so no two different values can
//! become one key. A body that is not JSON has no key; one nested deeper
//! than the parser reads (128 levels) is refused.

use serde_json::Value;

use crate::idempotency::{IdempotencyKey, KeyError};

/// A checked RFC 6901 pointer (config validation checked its syntax).
#[derive(Debug, Clone)]
pub struct Pointer(String);

impl Pointer {
    pub(super) fn new(pointer: &str) -> Self {
        Self(pointer.to_owned())
    }

    /// The pointer as configured.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(super) fn find(&self, body: &[u8]) -> Result<Option<IdempotencyKey>, KeyError> {
        let source = || format!("the JSON body at {}", self.0);
        let document = match serde_json::from_slice::<Value>(body) {
            Ok(document) => document,
            // JSON, but deeper than serde_json reads (128 levels): not a
            // body without a key, which a provider would resend for ever.
            Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
                let why = format!("{} cannot be read: the body nests more than 128 levels deep", source());
                return Err(KeyError::Source(why));
            }
            Err(_) => return Ok(None),
        };
        let kind = match document.pointer(&self.0) {
            None => return Ok(None),
            Some(Value::String(text)) => return super::checked(text, source).map(Some),
            Some(Value::Number(number)) => {
                // With serde_json's arbitrary_precision this is the number as written.
                let text = number.to_string();
                let digits = text.strip_prefix('-').unwrap_or(&text);
                if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                    return super::checked(&text, source).map(Some);
                }
                "a number that is not an integer"
            }
            Some(Value::Object(_)) => "an object",
            Some(Value::Array(_)) => "an array",
            Some(Value::Null) => "null",
            Some(Value::Bool(_)) => "a boolean",
        };
        Err(KeyError::Source(format!("the value in {} is {kind}; a key is a string or an integer", source())))
    }
}
