//! A compact binary encoding of [`StoredResponse`] for networked stores.
//!
//! `version:u8 | status:u16 | header count:u32 | (len:u32 name, len:u32 value)* | body`,
//! integers big endian. Decoding checks every length against what is left,
//! so a corrupt or foreign value is an error, never a panic.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::StoreError;
use crate::idempotency::StoredResponse;

const VERSION: u8 = 1;

/// Encodes a response.
pub fn encode(response: &StoredResponse) -> Vec<u8> {
    let mut out = BytesMut::with_capacity(response.size());
    out.put_u8(VERSION);
    out.put_u16(response.status);
    out.put_u32(response.headers.len() as u32);
    for (name, value) in &response.headers {
        out.put_u32(name.len() as u32);
        out.put_slice(name.as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value);
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
    let mut headers = Vec::with_capacity(count.min(256));
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
        let name = String::from_utf8(name.to_vec()).map_err(|_| corrupt("header name is not UTF-8"))?;
        headers.push((name, value));
    }
    Ok(StoredResponse { status, headers, body: buf })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_response_round_trips() {
        let response = StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".into(), Bytes::from_static(b"application/json")),
                ("x-a".into(), Bytes::new()),
            ],
            body: Bytes::from_static(b"{\"id\":1}"),
        };
        assert_eq!(decode(encode(&response)).unwrap(), response);
    }

    proptest! {
        #[test]
        fn decoding_garbage_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode(raw);
        }
    }
}
