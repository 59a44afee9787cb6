//! Protocols around the gateway: TLS to upstreams with a private CA, TLS and
//! HTTP/2 from clients, h2c.

use crate::support;

use std::path::PathBuf;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::gateway::{TestGateway, config};
use support::redis_server::{RedisProcess, unique_prefix};
use support::upstream::Upstream;

/// A self-signed certificate for 127.0.0.1 and localhost, made at test time.
struct TestCert {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl TestCert {
    fn new() -> Self {
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let dir = std::env::temp_dir().join(format!("idemgate-tls-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        Self { dir, cert, key }
    }
}

impl Drop for TestCert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn an_https_upstream_with_a_private_ca_is_guarded_like_any_other() {
    let cert = TestCert::new();
    let upstream = Upstream::start_tls(&cert.cert, &cert.key).await;
    let mut config = config(&upstream.url(), "memory://");
    config.routes[0].ca_file = Some(cert.cert.clone());
    let gateway = TestGateway::start(config).await;
    let first = gateway.post("/charge").key("tls-1").json("{}").send().await;
    assert_eq!(first.status, 201, "{}", first.text());
    let retry = gateway.post("/charge").key("tls-1").json("{}").send().await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.total(), 1);
}

#[tokio::test]
async fn an_https_upstream_with_an_unknown_certificate_is_refused_and_the_key_released() {
    let cert = TestCert::new();
    let upstream = Upstream::start_tls(&cert.cert, &cert.key).await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let reply = gateway.post("/charge").key("tls-2").json("{}").send().await;
    assert_eq!(reply.status, 502);
    assert_eq!(reply.problem(), "upstream-unavailable");
    assert_eq!(upstream.total(), 0);
}

#[tokio::test]
async fn clients_may_speak_h2_over_tls_and_the_upstream_learns_the_protocol() {
    let cert = TestCert::new();
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.tls.cert_file = Some(cert.cert.clone());
    config.tls.key_file = Some(cert.key.clone());
    let gateway = TestGateway::start(config).await;

    let tls = idemgate::http::tls::client_config(Some(&cert.cert)).unwrap();
    let connector = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_only().enable_http2().build();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).http2_only(true).build(connector);
    for _ in 0..2 {
        let request = Request::post(format!("https://127.0.0.1:{}/charge", gateway.addr.port()))
            .header("idempotency-key", "h2-tls")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_2);
        assert_eq!(response.status(), 201);
        response.into_body().collect().await.unwrap();
    }
    assert_eq!(upstream.total(), 1);
    assert_eq!(upstream.last_headers()["x-forwarded-proto"], "https");
}

#[tokio::test]
async fn clients_may_speak_h2c_with_prior_knowledge() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let request = Request::post(format!("http://{}/charge", gateway.addr))
        .header("idempotency-key", "h2c")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 201);
    assert_eq!(upstream.last_headers()["x-forwarded-proto"], "http");
    let authority = gateway.addr.to_string();
    assert_eq!(upstream.last_headers()["x-forwarded-host"], authority.as_str(), "from h2's :authority");
}

#[tokio::test]
async fn the_store_may_be_redis_over_tls_with_a_private_ca() {
    let cert = TestCert::new();
    let redis = RedisProcess::start_tls(&cert.cert, &cert.key);
    let upstream = Upstream::start().await;
    let store = format!("{}?prefix={}&ca_file={}", redis.tls_url(), unique_prefix(), cert.cert.display());
    let gateway = TestGateway::start(config(&upstream.url(), &store)).await;
    let first = gateway.post("/charge").key("rediss").json("{}").send().await;
    assert_eq!(first.status, 201);
    assert!(gateway.post("/charge").key("rediss").json("{}").send().await.replayed());
    assert_eq!(upstream.total(), 1);
}

/// HTTP/2 stops counting a stream the client resets, but a guarded
/// attempt runs on until its record settles: one connection that keeps
/// resetting its streams still runs at most `max_streams_per_connection`
/// upstream calls at once, is refused beyond them, and another client is
/// served meanwhile.
#[tokio::test]
async fn a_connection_that_resets_its_streams_runs_at_most_its_stream_limit_upstream() {
    const STREAMS: u32 = 20;
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.max_streams_per_connection = STREAMS;
    let gateway = TestGateway::start(config).await;
    let h2 = Client::builder(TokioExecutor::new()).http2_only(true).build_http::<Full<Bytes>>();
    let url = format!("http://{}/slow?ms=1500", gateway.addr);
    let mut refused = 0;
    for round in 0..4 {
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..STREAMS {
            let request = Request::post(&url)
                .header("idempotency-key", format!("reset-{round}-{n}"))
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            let h2 = h2.clone();
            // Dropped after 150 ms: the client resets the stream.
            calls.spawn(async move {
                tokio::time::timeout(std::time::Duration::from_millis(150), h2.request(request))
                    .await
                    .ok()
                    .map(|r| r.map(|r| r.status()))
            });
        }
        while let Some(call) = calls.join_next().await {
            if let Some(Ok(status)) = call.unwrap() {
                assert_eq!(status, 503, "only a refusal answers within 150 ms");
                refused += 1;
            }
        }
        // Another client is served while the attempts run on.
        let other = gateway.get("/other").send().await;
        assert_eq!(other.status, 200);
    }
    upstream.wait_finished(upstream.total()).await;
    assert!(upstream.most_at_once() <= u64::from(STREAMS) + 1, "at once: {}", upstream.most_at_once());
    assert!(refused > 0, "later rounds found the connection busy");
    assert_eq!(upstream.total() - 4, 4 * u64::from(STREAMS) - refused, "every stream not refused ran once");
}

/// An h2c client that never opens its flow-control window: it gets
/// response heads, never a byte of a body.
fn stalled_client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).http2_only(true).http2_initial_stream_window_size(0).build_http()
}

/// A guarded POST under `key` whose answer is 1 MiB.
fn big_post(gateway: &TestGateway, key: &str) -> Request<Full<Bytes>> {
    let url = format!("http://{}/big?bytes={}", gateway.addr, 1 << 20);
    Request::post(url).header("idempotency-key", key).body(Full::new(Bytes::new())).unwrap()
}

/// An HTTP/2 client that never opens its flow-control window holds its
/// responses in the gateway only until `send_timeout`: then the connection
/// is dropped, and every record on it is settled all the same.
#[tokio::test]
async fn a_client_that_never_reads_is_dropped_after_the_send_timeout_and_its_records_replay() {
    const STREAMS: usize = 8;
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.send_timeout = idemgate::config::ConfigDuration(std::time::Duration::from_secs(1));
    config.gateway.max_stored_response = idemgate::config::ByteSize(2 << 20);
    let gateway = TestGateway::start(config).await;
    let stalled = stalled_client();
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..STREAMS {
        let request = big_post(&gateway, &format!("unread-{n}"));
        let stalled = stalled.clone();
        calls.spawn(async move {
            let response = stalled.request(request).await.unwrap();
            assert_eq!(response.status(), 200);
            // Never granted a window, the body cannot arrive; the gateway
            // drops the connection instead of holding it for ever.
            let read = tokio::time::timeout(std::time::Duration::from_secs(30), response.into_body().collect()).await;
            assert!(matches!(read, Ok(Err(_))), "the body read ends with the dropped connection");
        });
    }
    while let Some(call) = calls.join_next().await {
        call.unwrap();
    }
    for n in 0..STREAMS {
        let replay = gateway.post(&format!("/big?bytes={}", 1 << 20)).key(&format!("unread-{n}")).send().await;
        assert_eq!(replay.status, 200);
        assert!(replay.replayed(), "the record settled although its response was never read");
        assert_eq!(replay.body.len(), 1 << 20);
    }
    assert_eq!(upstream.total(), STREAMS as u64);
}

/// Past `connection_response_budget`, a client that does not read is
/// answered `503 connection-busy` instead of having its answers held:
/// at most the budget's worth of settled answers waits for it, and every
/// record is settled, so each retry replays.
#[tokio::test]
async fn settled_answers_past_the_connection_budget_are_refused_and_replay() {
    const STREAMS: usize = 12;
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.send_timeout = idemgate::config::ConfigDuration(std::time::Duration::from_secs(2));
    config.gateway.max_stored_response = idemgate::config::ByteSize(2 << 20);
    config.gateway.connection_response_budget = idemgate::config::ByteSize(4 << 20);
    let gateway = TestGateway::start(config).await;
    let stalled = stalled_client();
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..STREAMS {
        let request = big_post(&gateway, &format!("budget-{n}"));
        let stalled = stalled.clone();
        calls.spawn(async move {
            let response = stalled.request(request).await.unwrap();
            let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
            ((response.status().as_u16(), retry_after), response)
        });
    }
    // The responses are kept, unread: one dropped would reset its stream
    // and give its share of the budget back before the others are answered.
    let (mut statuses, mut unread) = (Vec::new(), Vec::new());
    while let Some(call) = calls.join_next().await {
        let (status, response) = call.unwrap();
        statuses.push(status);
        unread.push(response);
    }
    let held = statuses.iter().filter(|(status, _)| *status == 200).count();
    let busy = statuses.iter().filter(|(status, retry)| *status == 503 && retry.as_deref() == Some("1")).count();
    assert_eq!(held + busy, STREAMS, "{statuses:?}");
    assert!(held <= 4, "at most the budget's worth held for the client: {statuses:?}");
    assert!(busy >= STREAMS - 4, "{statuses:?}");
    drop(unread);
    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    let counted = format!(r#"idemgate_requests_total{{outcome="connection-busy",route="default"}} {busy}"#);
    assert!(metrics.contains(&counted), "the refusals are counted as such: {counted}\n{metrics}");
    for n in 0..STREAMS {
        let replay = gateway.post(&format!("/big?bytes={}", 1 << 20)).key(&format!("budget-{n}")).send().await;
        assert_eq!(replay.status, 200);
        assert!(replay.replayed(), "every record settled with its answer");
        assert_eq!(replay.body.len(), 1 << 20);
    }
    assert_eq!(upstream.total(), STREAMS as u64, "each key ran once");
}
