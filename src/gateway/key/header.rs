//! A key in a named header: its raw value, exactly one field.

use http::HeaderMap;
use http::header::HeaderName;

use crate::idempotency::{IdempotencyKey, KeyError};

pub(super) fn find(name: &HeaderName, headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(KeyError::Source(format!("the {name} header appears more than once")));
    }
    let source = || format!("the {name} header");
    match std::str::from_utf8(value.as_bytes()) {
        Ok(text) => super::checked(text, source).map(Some),
        Err(_) => Err(super::refused(&source(), super::NOT_ASCII)),
    }
}
