//! The HTTP publisher against real destinations on the real PostgreSQL:
//! a `2xx` whose body breaks off or stalls is delivered once, message
//! headers that would corrupt the request never reach the wire,
//! credentials in a destination URL become Basic auth with a clean `Host`,
//! and neither a destination's body nor a server's error can forge a log
//! line. Effects are counted at the destination.

use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemgate::config::{ConfigDuration, DestinationConfig};
use idemgate::outbox::OutboxError;
use idemgate::outbox::claim::{ClaimFence, Claimed};
use idemgate::outbox::publisher::{Delivery, Destinations, Publisher};
use serde_json::json;
use support::outbox::Fixture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LEASE: Duration = Duration::from_secs(30);

/// What a [`RawDestination`] does after writing its response.
#[derive(Clone, Copy)]
enum Then {
    Close,
    /// Keep the connection open, sending nothing more.
    Hold,
}

/// A destination that reads each request whole, answers it with fixed raw
/// bytes — a response a well-behaved server would not send — and counts it.
struct RawDestination {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl RawDestination {
    async fn start(response: &'static [u8], then: Then) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    if read_request(&mut stream).await.is_none() {
                        return;
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.write_all(response).await;
                    if let Then::Hold = then {
                        // Held until the test's runtime ends.
                        std::future::pending::<()>().await;
                    }
                });
            }
        });
        Self { addr, requests }
    }

    fn url(&self) -> String {
        format!("http://{}/deliver", self.addr)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Reads one request head and its `Content-Length` body; `None` on EOF first.
async fn read_request(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut data = Vec::new();
    let mut buffer = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut buffer).await.ok().filter(|n| *n > 0)?;
        data.extend_from_slice(&buffer[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while data.len() < head_end + length {
        let n = stream.read(&mut buffer).await.ok().filter(|n| *n > 0)?;
        data.extend_from_slice(&buffer[..n]);
    }
    Some(data)
}

async fn last_error(fx: &Fixture, key: &str) -> String {
    let client = fx.db.pool.get().await.unwrap();
    let sql = fx.schema.sql("SELECT last_error FROM idemgate.outbox WHERE derived_key = $1 AND state = 'dead'");
    client.query_one(&sql, &[&key]).await.unwrap().get(0)
}

/// Gives a waiting row other headers, as a row enqueued before `enqueue`
/// refused them (or written by other means) would have.
async fn set_headers(fx: &Fixture, key: &str, headers: serde_json::Value) {
    let client = fx.db.pool.get().await.unwrap();
    let sql = fx.schema.sql("UPDATE idemgate.outbox SET headers = $2::text::jsonb WHERE derived_key = $1");
    assert_eq!(client.execute(&sql, &[&key, &headers.to_string()]).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_whose_body_breaks_off_is_delivered_once() {
    let mut fx = Fixture::start().await;
    let destination =
        RawDestination::start(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"ok\":", Then::Close).await;
    fx.destination.url = destination.url();
    fx.enqueue("order:1", json!({"amount": 1}), None).await;
    let outcome = fx.drain(&fx.relay(LEASE)).await;
    assert_eq!((outcome.delivered, outcome.retried, outcome.dead), (1, 0, 0), "{outcome:?}");
    assert_eq!(destination.requests(), 1, "the destination acted once and was not asked again");
    assert_eq!((fx.count("true").await, fx.delivered().await), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_whose_body_stalls_past_the_timeout_is_delivered_once() {
    let mut fx = Fixture::start().await;
    let destination = RawDestination::start(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{", Then::Hold).await;
    fx.destination.url = destination.url();
    fx.destination.timeout = ConfigDuration(Duration::from_millis(300));
    fx.enqueue("order:1", json!({"amount": 1}), None).await;
    let outcome = fx.drain(&fx.relay(LEASE)).await;
    assert_eq!((outcome.delivered, outcome.retried, outcome.dead), (1, 0, 0), "{outcome:?}");
    assert_eq!(destination.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_422_whose_body_breaks_off_is_still_dead_at_once_and_its_body_cannot_forge_a_log_line() {
    let mut fx = Fixture::start().await;
    let response = b"HTTP/1.1 422 Unprocessable Content\r\ncontent-length: 200\r\n\r\nno such card\n2026-01-01T00:00:00Z  INFO idemgate::outbox: delivered\x1b[2J";
    let destination = RawDestination::start(response, Then::Close).await;
    fx.destination.url = destination.url();
    let key = fx.enqueue("order:1", json!({"amount": 1}), None).await;
    let outcome = fx.drain(&fx.relay(LEASE)).await;
    assert_eq!((outcome.dead, outcome.retried), (1, 0), "the status decides, not the body: {outcome:?}");
    assert_eq!(destination.requests(), 1);
    let error = last_error(&fx, &key).await;
    assert!(error.starts_with("HTTP 422: no such card\\n2026"), "{error}");
    assert!(error.contains("\\u{1b}[2J") && error.contains("body broke off"), "{error}");
    assert!(!error.chars().any(char::is_control), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_whose_headers_would_corrupt_the_request_are_buried_unsent_and_the_rest_arrive_intact() {
    let fx = Fixture::start().await;
    let good = fx.enqueue("order:good", json!({"amount": 100, "note": "intact"}), None).await;
    let mut bad = Vec::new();
    for (n, headers) in [
        json!({"content-length": "5"}),
        json!({"Transfer-Encoding": "chunked"}),
        json!({"host": "evil.example"}),
        json!({"connection": "close"}),
        json!({"proxy-authorization": "Basic eDp5"}),
        json!({"idempotency-key": "not-the-derived-one"}),
    ]
    .into_iter()
    .enumerate()
    {
        let name = headers.as_object().unwrap().keys().next().unwrap().clone();
        let key = fx.enqueue(&format!("order:bad{n}"), json!({"amount": n}), None).await;
        set_headers(&fx, &key, headers).await;
        bad.push((key, name));
    }
    let outcome = fx.drain(&fx.relay(LEASE)).await;
    assert_eq!((outcome.delivered, outcome.dead, outcome.retried), (1, bad.len(), 0), "{outcome:?}");
    let received = fx.sink.received();
    assert_eq!(received.len(), 1, "nothing of a refused row reached the destination");
    assert_eq!(
        (received[0].key.as_str(), &received[0].payload),
        (good.as_str(), &json!({"amount": 100, "note": "intact"}))
    );
    for (key, name) in bad {
        let error = last_error(&fx, &key).await;
        assert!(error.starts_with(&format!("message header {name:?} is refused: ")), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_a_destination_url_arrive_as_basic_auth_and_the_host_is_clean() {
    let mut fx = Fixture::start().await;
    fx.destination.url = format!("http://alice:s3cr%3At@{}/deliver", fx.sink.addr);
    fx.enqueue("order:1", json!({"amount": 1}), None).await;
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    let received = fx.sink.received().remove(0);
    // base64("alice:s3cr:t")
    assert_eq!(received.headers["authorization"], "Basic YWxpY2U6czNjcjp0");
    assert_eq!(received.headers["host"], fx.sink.addr.to_string().as_str());
}

fn claimed(destination: &str, headers: &[(&str, &str)]) -> Claimed {
    Claimed {
        fence: ClaimFence { id: 1, attempts: 1 },
        attempt: 1,
        derived_key: "0".repeat(64),
        destination: destination.into(),
        operation: "notify".into(),
        business_key: "order:1".into(),
        payload: String::from("{\"amount\":1}").into(),
        headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
        ordering_key: None,
        trace: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_refuses_a_framing_header_before_opening_a_connection() {
    let destination = RawDestination::start(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Then::Close).await;
    let mut config = DestinationConfig::new(destination.url());
    config.timeout = ConfigDuration(Duration::from_secs(2));
    let publisher = Destinations::new(&BTreeMap::from([("sink".to_string(), config)])).unwrap();
    let attempt = publisher.publish(&claimed("sink", &[("Content-Length", "5")])).await;
    let Delivery::Reject { reason } = attempt else { panic!("not rejected: {attempt:?}") };
    assert!(reason.contains("\"Content-Length\" is refused"), "{reason}");
    assert_eq!(publisher.publish(&claimed("sink", &[("x-tenant", "acme")])).await, Delivery::Delivered);
    assert_eq!(destination.requests(), 1, "only the clean message was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_error_names_the_servers_message_and_sqlstate_on_one_line() {
    let fx = Fixture::start().await;
    let client = fx.schema.connect().await;
    let error = client.batch_execute("SELECT 1 FROM no_such_table").await.unwrap_err();
    let printed = OutboxError::from(error).to_string();
    assert_eq!(printed, "database error: ERROR: relation \"no_such_table\" does not exist (SQLSTATE 42P01)");
    let error =
        client.batch_execute("DO $$ BEGIN RAISE EXCEPTION 'two' USING DETAIL = E'lines\\nforged'; END $$").await;
    let printed = OutboxError::from(error.unwrap_err()).to_string();
    assert_eq!(printed, "database error: ERROR: two (SQLSTATE P0001); DETAIL: lines\\nforged");
}
