//! A compact binary encoding of [`StoredResponse`] for networked stores.
//!
//! `version:u8 | status:u16 | header count:u32 | (len:u32 name, len:u32 value)* | body`,
//! integers big endian. Decoding checks every length against what is left,
//! so a corrupt or foreign value is an error, never a panic. Names and
//! values are checked once here, where the record is read, and a pair that
//! is no header (never written by [`encode`]) is left out, as a replay
//! always did.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::StoreError;
use crate::idempotency::StoredResponse;

const VERSION: u8 = 1;

/// Encodes a response.
pub fn encode(response: &StoredResponse) -> Vec<u8> {
    let mut out = BytesMut::with_capacity(response.size());
    out.put_u8(VERSION);
    out.put_u16(response.status);
    out.put_u32(response.headers.len() as u32);
    for (name, value) in response.headers.iter() {
        out.put_u32(name.as_str().len() as u32);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
    out.put_slice(&response.body);
    out.to_vec()
}

/// Decodes what [`encode`] wrote.
pub fn decode(bytes: impl Into<Bytes>) -> Result<StoredResponse, StoreError> {
    let mut buf: Bytes = bytes.into();
    let corrupt = |what: &str| StoreError::Corrupt(format!("stored response: {what}"));
    if buf.remaining() < 7 {
        return Err(corrupt("too short"));
    }
    if buf.get_u8() != VERSION {
        return Err(corrupt("unknown version"));
    }
    let status = buf.get_u16();
    let count = buf.get_u32() as usize;
    let mut headers = HeaderMap::with_capacity(count.min(256));
    let take = |buf: &mut Bytes| -> Result<Bytes, StoreError> {
        if buf.remaining() < 4 {
            return Err(corrupt("truncated header"));
        }
        let len = buf.get_u32() as usize;
        if buf.remaining() < len {
            return Err(corrupt("truncated header"));
        }
        Ok(buf.split_to(len))
    };
    for _ in 0..count {
        let name = take(&mut buf)?;
        let value = take(&mut buf)?;
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(&name), HeaderValue::from_maybe_shared(value)) {
            headers.append(name, value);
        }
    }
    Ok(StoredResponse { status, headers: Arc::new(headers), body: buf })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_response_round_trips() {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-a", HeaderValue::from_static(""));
        headers.append("x-b", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_bytes(b"\x80\xff\t").unwrap());
        let response = StoredResponse { status: 201, headers: headers.into(), body: Bytes::from_static(b"{\"id\":1}") };
        assert_eq!(decode(encode(&response)).unwrap(), response);
    }

    #[test]
    fn a_pair_that_is_no_header_is_left_out() {
        let mut raw = vec![1, 0, 200, 0, 0, 0, 2];
        for (name, value) in [(&b"bad name"[..], &b"v"[..]), (b"x-ok", b"ok\r\n")] {
            raw.extend_from_slice(&(name.len() as u32).to_be_bytes());
            raw.extend_from_slice(name);
            raw.extend_from_slice(&(value.len() as u32).to_be_bytes());
            raw.extend_from_slice(value);
        }
        raw.extend_from_slice(b"body");
        let response = decode(raw).unwrap();
        assert!(response.headers.is_empty(), "{:?}", response.headers);
        assert_eq!(&response.body[..], b"body");
    }

    proptest! {
        #[test]
        fn decoding_garbage_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode(raw);
        }
    }
}
