//! An upstream answer whose framing is ambiguous — `Content-Length` beside
//! `Transfer-Encoding`, a transfer coding other than `chunked`, an
//! unsolicited `101` — is a malformed answer to a request that was sent:
//! the key is held as an unknown outcome, nothing is stored or replayed as
//! a success, and the client never receives a `Content-Length` that differs
//! from the bytes that follow it.

use super::{RawUpstream, exchange, status_of};
use crate::support::gateway::{TestGateway, config};

const MALFORMED: [(&str, &[u8]); 5] = [
    (
        "Content-Length beside chunked",
        b"HTTP/1.1 201 Created\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\nc\r\n{\"paid\":500}\r\n0\r\n\r\n",
    ),
    (
        "gzip, chunked",
        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ntransfer-encoding: gzip, chunked\r\n\r\nc\r\n{\"paid\":500}\r\n0\r\n\r\n",
    ),
    ("gzip alone", b"HTTP/1.1 201 Created\r\ntransfer-encoding: gzip\r\n\r\n{\"paid\":500}"),
    ("an unsolicited 101", b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"),
    ("a 1xx and no final answer", b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n"),
];

fn charge(key: Option<&str>) -> Vec<u8> {
    let key = key.map_or(String::new(), |k| format!("idempotency-key: {k}\r\n"));
    format!("POST /charge HTTP/1.1\r\nhost: x\r\n{key}content-length: 2\r\nconnection: close\r\n\r\n{{}}").into_bytes()
}

/// `true` when every response in `reply` is followed by exactly as many
/// bytes as its `Content-Length` says (and nothing else follows).
fn lengths_hold(reply: &str) -> bool {
    let Some((head, body)) = reply.split_once("\r\n\r\n") else { return reply.is_empty() };
    let declared = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length: ").map(|n| n.trim().parse::<usize>()));
    match declared {
        Some(Ok(n)) => body.len() == n,
        _ => !head.to_ascii_lowercase().contains("transfer-encoding"),
    }
}

#[tokio::test]
async fn a_malformed_answer_holds_the_key_and_is_never_replayed() {
    for (what, answer) in MALFORMED {
        let upstream = RawUpstream::start(answer).await;
        let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
        let first = exchange(&gateway, &charge(Some("k"))).await;
        assert_eq!(status_of(&first), 502, "{what}: {first}");
        assert!(first.contains("outcome-unknown"), "{what}: {first}");
        assert!(lengths_hold(&first), "{what}: {first}");
        for _ in 0..2 {
            let retry = exchange(&gateway, &charge(Some("k"))).await;
            assert_eq!(status_of(&retry), 502, "{what}: {retry}");
            assert!(retry.contains("outcome-unknown") && !retry.contains("idempotent-replayed"), "{what}: {retry}");
        }
        assert_eq!(upstream.requests(), 1, "{what}: the held key is never forwarded again");
    }
}

#[tokio::test]
async fn a_malformed_answer_to_an_unguarded_request_is_a_502_not_a_relay() {
    for (what, answer) in MALFORMED {
        let upstream = RawUpstream::start(answer).await;
        let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
        let reply = exchange(&gateway, &charge(None)).await;
        assert_eq!(status_of(&reply), 502, "{what}: {reply}");
        assert!(reply.contains("upstream-unavailable") && reply.contains("may have acted"), "{what}: {reply}");
        assert!(lengths_hold(&reply), "{what}: {reply}");
        assert_eq!(upstream.requests(), 1, "{what}");
    }
}

/// The well-framed answers still go through: chunked alone, and a length.
#[tokio::test]
async fn plain_framing_is_relayed_and_stored() {
    let answers: [&[u8]; 2] = [
        b"HTTP/1.1 201 Created\r\ntransfer-encoding: Chunked\r\n\r\nc\r\n{\"paid\":500}\r\n0\r\n\r\n",
        b"HTTP/1.1 201 Created\r\ncontent-length: 12\r\n\r\n{\"paid\":500}",
    ];
    for answer in answers {
        let upstream = RawUpstream::start(answer).await;
        let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
        let first = exchange(&gateway, &charge(Some("k"))).await;
        let retry = exchange(&gateway, &charge(Some("k"))).await;
        for reply in [&first, &retry] {
            assert_eq!(status_of(reply), 201, "{reply}");
            assert!(reply.ends_with("{\"paid\":500}") && lengths_hold(reply), "{reply}");
        }
        assert!(retry.contains("idempotent-replayed: true"), "{retry}");
        assert_eq!(upstream.requests(), 1);
    }
}
