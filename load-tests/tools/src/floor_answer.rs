//! `floor-answer`: the *replay floor* of PERFORMANCE.md, the limit for a
//! replay on the pinned stack. P11 and P4 (replays, which touch no upstream)
//! are reported against it.
//!
//! The same server as `floor-proxy` (`floor.rs`: per core by default), but
//! every request is answered at once with a fixed `201` and the two bytes
//! `ok`, the body the gateway scenarios' upstream returns and so the one
//! idemgate replays there, with `idempotent-replayed: true` as a replay has.
//! The request body is read first, as a replay must read it to compare its
//! fingerprint.
//!
//! Flags: `--listen 127.0.0.1:PORT`, `--runtime per-core|work-stealing`
//! (default per-core), `--threads N` (default: the available cores),
//! `--lifetime-ms N` (default 15 minutes).

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::Args;
use crate::floor::{Settings, serve};

pub fn main(args: &Args) -> Result<(), String> {
    let settings = Settings::from_args(args)?;
    serve(&settings, || answer)
}

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let _ = request.into_body().collect().await;
    let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
    *response.status_mut() = StatusCode::CREATED;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    Ok(response)
}
