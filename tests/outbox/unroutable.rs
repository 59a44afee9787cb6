//! Nothing waits unseen: rows for a destination the relay does not have
//! show in a gauge, in a warning naming the destination and in the admin
//! API, keep their place in their ordering key (not claimed, not dead),
//! and flow once a relay configured with the destination runs.
//!
//! Against the `idemgate relay` binary, so the log is the real one.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::postgres::TestSchema;
use support::relay_process::RelayProcess;
use support::sink::Sink;

const TOKEN: &str = "unroutable-admin-token-0123456789";
const PATIENCE: Duration = Duration::from_secs(30);

fn config(schema: &TestSchema, destinations: &[(&str, &Sink)]) -> String {
    let mut text = format!(
        r#"
[admin]
token = "{TOKEN}"

[relay]
database_url = "{url}"
schema = "{schema}"
poll_interval = "100ms"
reap_interval = "200ms"
"#,
        url = schema.url,
        schema = schema.name()
    );
    for (name, sink) in destinations {
        text.push_str(&format!("\n[destinations.{name}]\nurl = \"{}\"\ntimeout = \"5s\"\n", sink.url()));
    }
    text
}

/// A plain HTTP/1.1 GET with the admin token; the status and body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    support::raw_http::request(addr, "GET", path, &support::raw_http::bearer(TOKEN), "")
}

/// Waits (bounded) until `path` on the relay's admin listener answers a body containing `wanted`.
async fn wait_for_admin(relay: &RelayProcess, path: &'static str, wanted: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    let admin = relay.admin;
    loop {
        let (_, body) = tokio::task::spawn_blocking(move || get(admin, path)).await.unwrap();
        if body.contains(wanted) {
            return body;
        }
        assert!(Instant::now() < deadline, "{wanted} not in {path}: {body}\nlog:\n{}", relay.log_tail(20));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn state_of(schema: &TestSchema, business_key: &str, destination: &str) -> Option<(String, i32)> {
    let client = schema.connect().await;
    let sql = schema.sql("SELECT state, attempts FROM idemgate.outbox WHERE business_key = $1 AND destination = $2");
    client.query_opt(&sql, &[&business_key, &destination]).await.unwrap().map(|r| (r.get(0), r.get(1)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_for_an_unconfigured_destination_are_seen_keep_their_place_and_flow_once_it_is_configured() {
    let schema = TestSchema::create().await;
    let (email, sms) = (Sink::start().await, Sink::start().await);
    let client = schema.connect().await;
    let enqueue = schema.sql("SELECT idemgate.enqueue($1, 'notify', $2, '{}'::jsonb, $3)");
    // The sms row heads ordering key customer:7; an email row waits behind it; another goes free.
    for (destination, business_key, ordering_key) in
        [("sms", "order:1", Some("customer:7")), ("email", "order:1", Some("customer:7")), ("email", "order:2", None)]
    {
        client.query_one(&enqueue, &[&destination, &business_key, &ordering_key]).await.unwrap();
    }

    let relay = RelayProcess::start(&config(&schema, &[("email", &email)]));
    assert!(email.wait_for_effects(1, PATIENCE).await, "the free email row; log:\n{}", relay.log_tail(20));
    wait_for_admin(&relay, "/metrics", r#"idemgate_outbox_rows{destination="sms",state="unroutable"} 1"#).await;
    wait_for_admin(&relay, "/metrics", "idemgate_outbox_unroutable_destinations 1").await;
    let listing = wait_for_admin(&relay, "/admin/outbox/unroutable", r#""destination":"sms""#).await;
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    assert_eq!((listing["destinations"][0]["rows"].as_i64(), listing["total"].as_i64()), (Some(1), Some(1)));
    let deadline = Instant::now() + PATIENCE;
    while !relay.log_tail(200).lines().any(|l| l.contains("WARN") && l.contains(r#"destination="sms""#)) {
        assert!(Instant::now() < deadline, "no warning naming sms:\n{}", relay.log_tail(20));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Not claimed, not dead; the email row behind it in customer:7 waits too.
    assert_eq!(state_of(&schema, "order:1", "sms").await, Some(("ready".into(), 0)));
    assert_eq!(state_of(&schema, "order:1", "email").await, Some(("ready".into(), 0)));
    let dead: serde_json::Value =
        serde_json::from_str(&wait_for_admin(&relay, "/admin/outbox/dead", "rows").await).unwrap();
    assert_eq!((&dead["rows"], &dead["total"]), (&serde_json::json!([]), &serde_json::json!(0)));
    assert_eq!(email.count(), 1);
    let warnings = relay.log_tail(1000).lines().filter(|l| l.contains(r#"destination="sms""#)).count();
    assert_eq!(warnings, 1, "one warning per destination per period, not one per census");

    // The same config with [destinations.sms]: the head goes first, then its key flows.
    assert!(relay.terminate().success());
    let mut relay = RelayProcess::start(&config(&schema, &[("email", &email), ("sms", &sms)]));
    assert!(sms.wait_for_effects(1, PATIENCE).await, "log:\n{}", relay.log_tail(20));
    assert!(email.wait_for_effects(2, PATIENCE).await, "log:\n{}", relay.log_tail(20));
    assert!(sms.received()[0].at < email.received()[1].at, "customer:7 in commit order");
    wait_for_admin(&relay, "/metrics", "idemgate_outbox_unroutable_destinations 0").await;
    assert!(relay.running());
    assert!(relay.terminate().success());
}
