//! One trace from the request that caused an effect to its delivery (W3C
//! Trace Context): a row enqueued under a trace context — the
//! `trace_context` argument, the transaction's `idemgate.traceparent`
//! setting, or the Rust helper — is published under a `traceparent` of the
//! same trace on every attempt, each attempt a new span, also after the
//! relay is SIGKILLed mid-publish and after a redrive; the dead-row listing
//! and the relay's log lines carry the trace id; and the whole path, from a
//! client's request through the gateway and the service that enqueues to
//! the delivery. Against the real PostgreSQL and the `idemgate relay`
//! binary.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use idemgate::outbox::enqueue::Message;
use idemgate::outbox::enqueue_many::enqueue_many_in;
use support::http_server::HttpServer;
use support::postgres::TestSchema;
use support::relay_process::RelayProcess;

const TOKEN: &str = "trace-admin-token-0123456789";
const PATIENCE: Duration = Duration::from_secs(60);
/// Given as the `trace_context` argument, with a tracestate.
const PARENT_A: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const STATE_A: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
/// Set with `SET LOCAL idemgate.traceparent` (not sampled: flags 00).
const PARENT_B: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
/// Given through the Rust helper.
const PARENT_C: &str = "00-a3ce929d0e0e47364bf92f3577b34da6-5ba902b700f067aa-01";

/// Every request a destination received for one key: `traceparent` and `tracestate` as sent.
type Seen = Arc<Mutex<BTreeMap<String, Vec<(Option<String>, Option<String>)>>>>;

/// A destination that answers each key's first attempt never (it is held
/// until the relay dies), its second `400` (dead at once), and `201` after.
async fn destination() -> (HttpServer, Seen) {
    let seen: Seen = Arc::default();
    let shared = seen.clone();
    let server = HttpServer::start(move |request: Request<Incoming>| {
        let seen = shared.clone();
        async move {
            let header = |name| request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            let key = header("idempotency-key").unwrap_or_default();
            let attempt = {
                let mut seen = seen.lock().unwrap();
                let attempts = seen.entry(key).or_default();
                attempts.push((header("traceparent"), header("tracestate")));
                attempts.len()
            };
            if attempt == 1 {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            let status = if attempt == 2 { 400 } else { 201 };
            let response = Response::builder().status(status).body(Full::new(Bytes::from_static(b"{}"))).unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    })
    .await;
    (server, seen)
}

fn config(schema: &TestSchema, destination: SocketAddr) -> String {
    format!(
        r#"
[admin]
token = "{TOKEN}"

[relay]
database_url = "{url}"
schema = "{schema}"
lease = "1s"
poll_interval = "100ms"
reap_interval = "200ms"

[destinations.payments]
url = "http://{destination}/charge"
timeout = "30s"
"#,
        url = schema.url,
        schema = schema.name()
    )
}

/// One HTTP/1.1 request to the admin listener with the token; the status and body.
fn admin(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    support::raw_http::request(addr, method, path, &support::raw_http::bearer(TOKEN), "")
}

/// Waits (bounded) until every key in `seen` has at least `attempts` requests, `keys` keys in all.
async fn wait_for_attempts(seen: &Seen, keys: usize, attempts: usize, relay: &RelayProcess) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let counts: Vec<usize> = seen.lock().unwrap().values().map(Vec::len).collect();
        if counts.len() == keys && counts.iter().all(|&n| n >= attempts) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "attempts per key {counts:?}, wanted {attempts}; log:\n{}",
            relay.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn trace_id(traceparent: &str) -> &str {
    &traceparent[3..35]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_is_a_new_span_of_the_rows_trace_across_a_sigkill_and_a_redrive() {
    let schema = TestSchema::create().await;
    let (server, seen) = destination().await;
    let mut client = schema.connect().await;

    // Rows a (argument) and b (setting) in one transaction; c (Rust helper,
    // traced) and d (no context at all) in another.
    let tx = client.transaction().await.unwrap();
    // Not through schema.sql: the setting's name is the same in every schema.
    tx.batch_execute(&format!("SET LOCAL idemgate.traceparent = '{PARENT_B}'")).await.unwrap();
    let enqueue =
        schema.sql("SELECT idemgate.enqueue('payments', 'charge', $1, '{}', trace_context => $2::text::jsonb)");
    let given = serde_json::json!({ "traceparent": PARENT_A, "tracestate": STATE_A }).to_string();
    let a: String = tx.query_one(&enqueue, &[&"order:a", &Some(given)]).await.unwrap().get(0);
    let b: String = tx.query_one(&enqueue, &[&"order:b", &None::<String>]).await.unwrap().get(0);
    tx.commit().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let payload = serde_json::json!({});
    let messages = [
        Message::new("payments", "charge", "order:c", &payload).traced(PARENT_C, None),
        Message::new("payments", "charge", "order:d", &payload),
    ];
    let keys = enqueue_many_in(&schema.schema, &tx, &messages).await.unwrap();
    tx.commit().await.unwrap();
    let (c, d) = (keys[0].clone(), keys[1].clone());

    // Every first attempt is held; the relay dies holding them all.
    let mut relay = RelayProcess::start(&config(&schema, server.addr));
    wait_for_attempts(&seen, 4, 1, &relay).await;
    relay.kill();
    relay.start_again();
    // Their leases lapse, the new relay takes them; the second attempt is refused: dead.
    let addr = relay.admin;
    let deadline = Instant::now() + PATIENCE;
    let dead = loop {
        let (status, body) =
            tokio::task::spawn_blocking(move || admin(addr, "GET", "/admin/outbox/dead")).await.unwrap();
        let page: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && page["total"] == 4 {
            break page;
        }
        assert!(Instant::now() < deadline, "dead rows: {status} {body}; log:\n{}", relay.log_tail(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let listed: BTreeMap<String, serde_json::Value> = dead["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| (row["derived_key"].as_str().unwrap().to_string(), row["trace_id"].clone()))
        .collect();
    assert_eq!(listed[&a], trace_id(PARENT_A));
    assert_eq!(listed[&b], trace_id(PARENT_B));
    assert_eq!(listed[&c], trace_id(PARENT_C));
    assert_eq!(listed[&d], serde_json::Value::Null);
    // The relay's log reaches its file within its flush interval.
    for parent in [PARENT_A, PARENT_B, PARENT_C] {
        let line = format!("trace_id=\"{}\"", trace_id(parent));
        let deadline = Instant::now() + PATIENCE;
        while !relay.log_tail(400).lines().any(|l| l.contains("outbox row is dead") && l.contains(&line)) {
            assert!(Instant::now() < deadline, "{line} in:\n{}", relay.log_tail(400));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let (status, body) =
        tokio::task::spawn_blocking(move || admin(addr, "POST", "/admin/outbox/redrive")).await.unwrap();
    assert_eq!(status, 200, "{body}");
    wait_for_attempts(&seen, 4, 3, &relay).await;
    let seen = seen.lock().unwrap().clone();
    for (key, parent, state) in [(&a, PARENT_A, Some(STATE_A)), (&b, PARENT_B, None), (&c, PARENT_C, None)] {
        let attempts = &seen[key];
        assert_eq!(attempts.len(), 3, "{attempts:?}");
        let mut spans = BTreeSet::from([parent[36..52].to_string()]);
        for (traceparent, tracestate) in attempts {
            let traceparent = traceparent.as_deref().expect("a traceparent on every attempt");
            assert_eq!(traceparent.len(), 55, "{traceparent}");
            assert!(traceparent.starts_with(&parent[..36]), "{traceparent} is of the trace of {parent}");
            assert!(traceparent.ends_with(&parent[52..]), "{traceparent} keeps the flags of {parent}");
            assert!(spans.insert(traceparent[36..52].to_string()), "a new span per attempt: {attempts:?}");
            assert_eq!(tracestate.as_deref(), state);
        }
    }
    assert!(seen[&d].iter().all(|sent| *sent == (None, None)), "no trace headers without a context: {:?}", seen[&d]);
    assert!(relay.terminate().success());
}

/// What `enqueue` makes of a trace context: stored when valid, ignored
/// when not (tracing must never fail a service's transaction), refused
/// only when the argument is not a carrier of the two strings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_context_is_stored_when_valid_ignored_when_not_and_refused_only_when_malformed() {
    let schema = TestSchema::create().await;
    let mut client = schema.connect().await;
    let enqueue =
        schema.sql("SELECT idemgate.enqueue('payments', 'charge', $1, '{}', trace_context => $2::text::jsonb)");
    let stored = schema.sql("SELECT traceparent, tracestate FROM idemgate.outbox WHERE business_key = $1");
    let cases: [(&str, serde_json::Value, Option<&str>, Option<&str>); 6] = [
        ("valid", serde_json::json!({ "traceparent": PARENT_A, "tracestate": STATE_A }), Some(PARENT_A), Some(STATE_A)),
        (
            "later-version",
            serde_json::json!({ "traceparent": format!("01{}-more", &PARENT_A[2..]) }),
            Some("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            None,
        ),
        ("upper-case", serde_json::json!({ "traceparent": PARENT_A.to_uppercase() }), None, None),
        (
            "zero-trace",
            serde_json::json!({ "traceparent": format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)), "tracestate": "a=b" }),
            None,
            None,
        ),
        (
            "long-state",
            serde_json::json!({ "traceparent": PARENT_A, "tracestate": format!("a={}", "x".repeat(511)) }),
            Some(PARENT_A),
            None,
        ),
        (
            "injected-state",
            serde_json::json!({ "traceparent": PARENT_A, "tracestate": "a=b\r\nx-injected: 1" }),
            Some(PARENT_A),
            None,
        ),
    ];
    for (name, given, traceparent, tracestate) in &cases {
        client.query_one(&enqueue, &[name, &Some(given.to_string())]).await.unwrap();
        let row = client.query_one(&stored, &[name]).await.unwrap();
        let got: (Option<String>, Option<String>) = (row.get(0), row.get(1));
        assert_eq!((got.0.as_deref(), got.1.as_deref()), (*traceparent, *tracestate), "{name}");
    }
    for malformed in ["[]", r#""00-4bf9""#, r#"{"traceparent": 1}"#, r#"{"traceparent": "x", "baggage": "k=v"}"#] {
        let error = client.query_one(&enqueue, &[&"refused", &Some(malformed.to_string())]).await.unwrap_err();
        let db = error.as_db_error().expect("a database error");
        assert_eq!(db.code().code(), "22023", "{malformed}");
        assert_eq!(
            db.message(),
            r#"enqueue: trace_context must be a JSON object with at most "traceparent" and "tracestate", each a string"#
        );
    }
    // enqueue_many: a row's own context, else the transaction's setting; a malformed one names its row.
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(&format!("SET LOCAL idemgate.traceparent = '{PARENT_B}'")).await.unwrap();
    let many = schema.sql(
        "SELECT idemgate.enqueue_many(ARRAY['payments', 'payments'], ARRAY['charge', 'charge'], ARRAY['many:1', 'many:2'], \
         ARRAY['{}', '{}']::jsonb[], trace_context => $1::text[]::jsonb[])",
    );
    let refused = tx.query_one(&many, &[&vec![None, Some("[1]".to_string())]]).await.unwrap_err();
    assert!(
        refused.as_db_error().unwrap().message().starts_with("enqueue_many: row 1 (0-based): trace_context"),
        "{refused}"
    );
    drop(tx);
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(&format!("SET LOCAL idemgate.traceparent = '{PARENT_B}'")).await.unwrap();
    tx.query_one(&many, &[&vec![Some(serde_json::json!({ "traceparent": PARENT_C }).to_string()), None]])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    for (business_key, parent) in [("many:1", PARENT_C), ("many:2", PARENT_B)] {
        let row = client.query_one(&stored, &[&business_key]).await.unwrap();
        assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some(parent), "{business_key}");
    }
    // The setting is transaction-local: the next transaction enqueues without it.
    client.query_one(&enqueue, &[&"after", &None::<String>]).await.unwrap();
    let row = client.query_one(&stored, &[&"after"]).await.unwrap();
    assert_eq!(row.get::<_, Option<String>>(0), None);
}

/// The whole path: a client's request carries a traceparent through the
/// gateway to a service, which enqueues its side effect under the trace it
/// received (`set_config('idemgate.traceparent', …, true)`, what `SET
/// LOCAL` does); the relay delivers it as a span of that same trace, and
/// the client's retry is replayed by the gateway without a second row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_trace_reaches_the_delivery_of_the_effect_its_request_caused() {
    let fx = Arc::new(support::outbox::Fixture::start().await);
    let shared = fx.clone();
    let service = HttpServer::start(move |request: Request<Incoming>| {
        let fx = shared.clone();
        async move {
            let traceparent = request.headers().get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string);
            let mut client = fx.schema.connect().await;
            let tx = client.transaction().await.unwrap();
            tx.query_one("SELECT set_config('idemgate.traceparent', $1, true)", &[&traceparent]).await.unwrap();
            let enqueue = fx.schema.sql("SELECT idemgate.enqueue($1, 'charge', 'order:7', '{}')");
            tx.query_one(&enqueue, &[&support::outbox::DESTINATION]).await.unwrap();
            tx.commit().await.unwrap();
            let response = Response::builder().status(201).body(Full::new(Bytes::from_static(b"{}"))).unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    })
    .await;
    let gateway = support::gateway::TestGateway::start(support::gateway::config(
        &format!("http://{}", service.addr),
        "memory://",
    ))
    .await;
    for _ in 0..2 {
        let reply = gateway.post("/charge").key("charge-7").json("{}").header("traceparent", PARENT_A).send().await;
        assert_eq!(reply.status, 201, "{}", reply.text());
    }
    assert_eq!(fx.count("true").await, 1, "the retry was replayed: one row");
    let relay = fx.relay(Duration::from_secs(30));
    assert_eq!(fx.drain(&relay).await.delivered, 1);
    let received = fx.sink.received();
    let sent = received[0].headers["traceparent"].to_str().unwrap();
    assert_eq!(trace_id(sent), trace_id(PARENT_A), "{sent}");
    assert_ne!(&sent[36..52], &PARENT_A[36..52], "a span of its own: {sent}");
}
