//! Malformed HTTP from a client gets a clear error and does not stall
//! other clients: oversized headers, slow headers, broken chunked bodies,
//! huge declared bodies, and heads the HTTP parser itself refuses.

use std::time::Duration;

use idemgate::config::ConfigDuration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{exchange, status_of};
use crate::support::gateway::{TestGateway, config};
use crate::support::upstream::Upstream;

#[tokio::test]
async fn oversized_headers_are_refused_with_431() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let raw = format!(
        "POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-key: k\r\nx-big: {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let reply = exchange(&gateway, raw.as_bytes()).await;
    assert_eq!(status_of(&reply), 431, "{}", &reply[..reply.len().min(200)]);
    assert_eq!(upstream.total(), 0);
}

#[tokio::test]
async fn long_targets_and_large_headers_get_problem_json_414_and_431() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let cases = [
        (
            format!("GET /{} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", "u".repeat(10 << 10)),
            414,
            "uri-too-long",
        ),
        (
            format!(
                "POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-key: k\r\nx-big: {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                "a".repeat(40 << 10)
            ),
            431,
            "headers-too-large",
        ),
        (
            format!(
                "GET / HTTP/1.1\r\nhost: x\r\n{}connection: close\r\n\r\n",
                (0..90).map(|n| format!("x-{n}: {}\r\n", "v".repeat(400))).collect::<String>()
            ),
            431,
            "headers-too-large",
        ),
    ];
    for (raw, status, kind) in cases {
        let reply = exchange(&gateway, raw.as_bytes()).await;
        assert_eq!(status_of(&reply), status, "{}", &reply[..reply.len().min(300)]);
        assert!(reply.contains("application/problem+json") && reply.contains(kind), "{reply}");
    }
    assert_eq!(upstream.total(), 0);
}

#[tokio::test]
async fn a_client_that_sends_headers_slowly_is_cut_off_without_stalling_others() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.header_read_timeout = ConfigDuration(Duration::from_millis(500));
    let gateway = TestGateway::start(config).await;
    let mut slow = TcpStream::connect(gateway.addr).await.unwrap();
    slow.write_all(b"POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-").await.unwrap();
    // Meanwhile a well-behaved client is served at once.
    assert_eq!(gateway.post("/charge").key("fast").json("{}").send().await.status, 201);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the slow client's connection is closed by the header read timeout");
    assert_eq!(upstream.total(), 1);
}

/// The listener tells HTTP/1.1 from HTTP/2 by peeking at the first bytes:
/// a first segment too short to tell ("P" could begin the HTTP/2 preface)
/// or just short ("G") must still reach hyper whole, and in order.
#[tokio::test]
async fn a_request_whose_first_segment_is_one_byte_is_served() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let requests = [
        "POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-key: split-p\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        "GET /charge HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    ];
    for raw in requests {
        let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        stream.write_all(&raw.as_bytes()[..1]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream.write_all(&raw.as_bytes()[1..]).await.unwrap();
        let mut reply = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut reply)).await;
        let reply = String::from_utf8_lossy(&reply);
        assert!(matches!(status_of(&reply), 200 | 201), "{raw:?}: {reply}");
    }
    assert_eq!(upstream.total(), 2);
}

#[tokio::test]
async fn a_broken_chunked_body_is_400_and_creates_no_record() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let raw = b"POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-key: k-chunk\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\nzz\r\nnot hex\r\n0\r\n\r\n";
    let reply = exchange(&gateway, raw).await;
    assert!(reply.is_empty() || status_of(&reply) == 400, "{reply}");
    assert_eq!(upstream.total(), 0);
    // No record was left behind: the key runs normally.
    let ok = gateway.post("/charge").key("k-chunk").json("{}").send().await;
    assert_eq!(ok.status, 201);
    assert!(!ok.replayed());
}

#[tokio::test]
async fn a_body_cut_off_mid_way_creates_no_record() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(
            b"POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-key: k-cut\r\ncontent-length: 100\r\n\r\n{\"amount\":",
        )
        .await
        .unwrap();
    drop(stream);
    let ok = gateway.post("/charge").key("k-cut").json("{}").send().await;
    assert_eq!(ok.status, 201);
    assert_eq!(upstream.total(), 1);
}

#[tokio::test]
async fn a_huge_declared_body_is_413_before_it_is_sent() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let raw = b"POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-key: k-huge\r\ncontent-length: 10000000000\r\nconnection: close\r\n\r\n";
    let reply = exchange(&gateway, raw).await;
    assert_eq!(status_of(&reply), 413, "{reply}");
    assert!(reply.contains("urn:idemgate:problem:body-too-large"));
    assert_eq!(upstream.total(), 0);
}

#[tokio::test]
async fn a_huge_chunked_body_is_413_once_it_passes_the_limit() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.max_request_body = idemgate::config::ByteSize(64 * 1024);
    let gateway = TestGateway::start(config).await;
    let mut raw = b"POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-key: k-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_vec();
    for _ in 0..20 {
        raw.extend_from_slice(format!("{:x}\r\n{}\r\n", 8192, "x".repeat(8192)).as_bytes());
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let reply = exchange(&gateway, &raw).await;
    assert_eq!(status_of(&reply), 413, "{}", &reply[..reply.len().min(300)]);
    assert_eq!(upstream.total(), 0);
}

#[tokio::test]
async fn an_http_1_0_upstream_does_not_downgrade_the_clients_reply() {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = vec![0; 4096];
                let _ = stream.read(&mut buffer).await;
                let _ = stream.write_all(b"HTTP/1.0 201 Created\r\ncontent-length: 2\r\n\r\nok").await;
            });
        }
    });
    let gateway = TestGateway::start(config(&format!("http://{upstream}"), "memory://")).await;
    let raw =
        b"POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-key: k10\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    for _ in 0..2 {
        let reply = exchange(&gateway, raw).await;
        assert!(reply.starts_with("HTTP/1.1 201"), "{reply}");
    }
}

/// The heads hyper refuses before the gateway sees a request are answered
/// with problems like every other error, and the connection is closed.
#[tokio::test]
async fn heads_the_parser_refuses_are_problem_json() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let many_headers: String = (0..300).map(|n| format!("x-{n}: v\r\n")).collect();
    let cases: [(Vec<u8>, u16, &str); 4] = [
        (
            b"POST /charge HTTP/1.1\r\nhost: x\r\nx-a: a\x7fb\r\ncontent-length: 0\r\n\r\n".to_vec(),
            400,
            "malformed-request",
        ),
        (
            b"POST /charge HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab".to_vec(),
            400,
            "malformed-request",
        ),
        (format!("GET /charge HTTP/1.1\r\nhost: x\r\n{many_headers}\r\n").into_bytes(), 431, "headers-too-large"),
        // Pipelined behind a good request: the first answer is untouched;
        // the last response (a 4xx) is the refusal.
        (
            b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\nx-a: \x00\r\n\r\n".to_vec(),
            200,
            "malformed-request",
        ),
    ];
    for (raw, status, kind) in cases {
        let reply = exchange(&gateway, &raw).await;
        assert_eq!(status_of(&reply), status, "{reply}");
        let last = reply.rfind("HTTP/1.1 4").unwrap_or_else(|| panic!("{reply:?}"));
        let (head, body) = reply[last..].split_once("\r\n\r\n").unwrap_or_else(|| panic!("{reply:?}"));
        assert!(head.contains("content-type: application/problem+json"), "{reply}");
        assert!(head.contains(&format!("content-length: {}\r\n", body.len())), "{reply}");
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["type"], format!("urn:idemgate:problem:{kind}"), "{reply}");
    }
    assert_eq!(upstream.total(), 1, "only the good pipelined request reached the upstream");
}

/// An upstream's own bodiless `400` to a client that asked to close looks,
/// byte for byte, like the parser's refusal: it reaches the client as the
/// upstream sent it.
#[tokio::test]
async fn an_upstreams_bare_400_is_passed_through_unchanged() {
    let upstream = super::RawUpstream::start(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let reply = exchange(&gateway, b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await;
    assert_eq!(status_of(&reply), 400, "{reply}");
    assert!(!reply.contains("problem"), "{reply}");
    assert!(reply.ends_with("\r\n\r\n"), "no body: {reply}");
    assert_eq!(upstream.requests(), 1);
}
