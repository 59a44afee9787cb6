//! Reading a record out of a script's reply.
//!
//! `begin` and `get` answer with the record they found. Usually it comes
//! packed into one bulk string,
//!
//! `state:1 | fingerprint:32 | '1' if a response follows, else '0' | fence | ':' | lease left ms | ':' | response`,
//!
//! because the redis crate's reply parser spends about a thousand
//! instructions on each element of an array: the five-element reply this
//! replaced cost the gateway some 13k instructions per replay (callgrind),
//! one bulk string a fraction of that. A record that does not fit the
//! packing (an unknown state, a fingerprint that is not 32 bytes) still
//! comes as the five fields `{st, fp, fence, resp, remaining}`, so that the
//! record codec reports it as corrupt rather than this file guessing.

use redis::{FromRedisValue, Value};

use super::super::record_codec::{RecordCodec, StoredFields};
use crate::store::StoreError;

/// The record in a reply of the `begin` or `get` script, fields unchecked.
pub(super) fn stored_fields(codec: &RecordCodec, reply: Value) -> Result<StoredFields, StoreError> {
    match reply {
        Value::BulkString(packed) => unpack(codec, packed),
        Value::Array(fields) => five_fields(codec, fields),
        _ => Err(codec.corrupt("not an array")),
    }
}

/// Where the fields after the fingerprint and the marker start.
const HEADER: usize = 1 + 32 + 1;

fn unpack(codec: &RecordCodec, mut packed: Vec<u8>) -> Result<StoredFields, StoreError> {
    let truncated = || codec.corrupt("truncated packed reply");
    if packed.len() < HEADER + 2 {
        return Err(truncated());
    }
    let has_response = match packed[HEADER - 1] {
        b'1' => true,
        b'0' => false,
        _ => return Err(codec.corrupt("bad response marker")),
    };
    let mut parts = packed[HEADER..].splitn(3, |&b| b == b':');
    let fence = parts.next().and_then(number);
    let lease_remaining_ms = number(parts.next().ok_or_else(truncated)?);
    let response_at = packed.len() - parts.next().ok_or_else(truncated)?.len();
    let state = vec![packed[0]];
    let fingerprint = packed[1..33].to_vec();
    // The response keeps the reply's own buffer: its head is cut off in place.
    let response = has_response.then(|| {
        packed.drain(..response_at);
        packed
    });
    Ok(StoredFields { state, fingerprint, fence, lease_remaining_ms, response })
}

/// A decimal number written as text, read in place.
fn number<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

fn five_fields(codec: &RecordCodec, fields: Vec<Value>) -> Result<StoredFields, StoreError> {
    let [st, fp, fence, resp, pttl] = <[Value; 5]>::try_from(fields).map_err(|_| codec.corrupt("wrong field count"))?;
    let bytes = |v: Value| Vec::<u8>::from_redis_value(v).map_err(|_| codec.corrupt("field is not a string"));
    let fingerprint = bytes(fp)?;
    Ok(StoredFields {
        state: bytes(st)?,
        fingerprint,
        fence: Vec::<u8>::from_redis_value(fence)
            .ok()
            .and_then(|f| String::from_utf8(f).ok())
            .and_then(|f| f.parse().ok()),
        lease_remaining_ms: i64::from_redis_value(pttl).ok(),
        response: match resp {
            Value::Nil => None,
            other => Some(bytes(other)?),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec() -> RecordCodec {
        RecordCodec::new("redis record")
    }

    fn packed(state: u8, marker: u8, rest: &[u8]) -> Value {
        let mut bytes = vec![state];
        bytes.extend_from_slice(&[7; 32]);
        bytes.push(marker);
        bytes.extend_from_slice(rest);
        Value::BulkString(bytes)
    }

    #[test]
    fn a_packed_reply_reads_as_the_five_fields_would() {
        let completed = stored_fields(&codec(), packed(b'c', b'1', b"42:0:\x01body:with:colons")).unwrap();
        assert_eq!(completed.state, b"c");
        assert_eq!(completed.fingerprint, vec![7; 32]);
        assert_eq!(completed.fence, Some(42));
        assert_eq!(completed.lease_remaining_ms, Some(0));
        assert_eq!(completed.response.as_deref(), Some(&b"\x01body:with:colons"[..]));

        let not_kept = stored_fields(&codec(), packed(b'c', b'0', b"42:0:")).unwrap();
        assert_eq!(not_kept.response, None);
        let in_flight = stored_fields(&codec(), packed(b'i', b'0', b"9:1500:")).unwrap();
        assert_eq!((in_flight.fence, in_flight.lease_remaining_ms), (Some(9), Some(1500)));
        let empty_response = stored_fields(&codec(), packed(b'c', b'1', b":0:")).unwrap();
        assert_eq!((empty_response.fence, empty_response.response), (None, Some(vec![])));
    }

    #[test]
    fn a_broken_packed_reply_is_corrupt() {
        let error = |reply| stored_fields(&codec(), reply).map(|_| ()).unwrap_err().to_string();
        assert!(error(Value::BulkString(b"c".to_vec())).ends_with("truncated packed reply"));
        assert!(error(packed(b'c', b'1', b"42")).ends_with("truncated packed reply"));
        assert!(error(packed(b'c', b'1', b"42:0")).ends_with("truncated packed reply"));
        assert!(error(packed(b'c', b'x', b"42:0:")).ends_with("bad response marker"));
        assert!(error(Value::Int(1)).ends_with("not an array"));
    }
}
