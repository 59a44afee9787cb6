//! What an operator sees of the outbox through the admin API (and the
//! console built on it): counts per destination, a dead head holding later
//! rows of its key as *held*, and the dead rows a page at a time.

use idemgate::config::{DestinationConfig, Secret, ServiceUrl};
use serde_json::{Value, json};

use crate::LEASE;
use crate::support::gateway::{TestGateway, config};
use crate::support::outbox::{DESTINATION, Fixture};

const TOKEN: &str = "inspection-admin-token-0123456789";

async fn get(gateway: &TestGateway, path: &str) -> (u16, Value) {
    let reply = gateway.admin("GET", path).header("authorization", &format!("Bearer {TOKEN}")).send().await;
    (reply.status, serde_json::from_slice(&reply.body).unwrap_or(Value::Null))
}

fn find<'a>(listing: &'a Value, name: &str) -> &'a Value {
    let all = listing["destinations"].as_array().expect("a destinations array");
    all.iter().find(|d| d["destination"] == name).unwrap_or_else(|| panic!("{name} not in {listing}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_shows_the_rows_it_holds_and_dead_rows_are_listed_a_page_at_a_time() {
    let fx = Fixture::start().await;
    fx.sink.fail_with(Some(400));
    fx.enqueue("head", json!({}), Some("customer:1")).await;
    fx.enqueue("behind", json!({}), Some("customer:1")).await;
    for n in 0..3 {
        fx.enqueue(&format!("loose-{n}"), json!({}), None).await;
    }
    let relay = fx.relay(LEASE);
    assert_eq!(fx.drain(&relay).await.dead, 4, "the head and the three rows without a key die; one row waits");

    let mut gateway_config = config(&fx.sink.url(), "memory://");
    gateway_config.admin.token = Some(Secret::new(TOKEN));
    gateway_config.relay.database_url = Some(ServiceUrl::new(fx.schema.url.clone()));
    gateway_config.relay.schema = fx.schema.name().to_owned();
    gateway_config.destinations.insert(DESTINATION.into(), fx.destination.clone());
    gateway_config.destinations.insert("quiet".into(), DestinationConfig::new("http://127.0.0.1:9/"));
    let gateway = TestGateway::start(gateway_config).await;

    let (status, listing) = get(&gateway, "/admin/outbox/destinations").await;
    assert_eq!(status, 200, "{listing}");
    let sink = find(&listing, DESTINATION);
    assert_eq!(
        (&sink["ready"], &sink["leased"], &sink["dead"], &sink["held"]),
        (&json!(1), &json!(0), &json!(4), &json!(1))
    );
    let quiet = find(&listing, "quiet");
    assert_eq!(
        (&quiet["ready"], &quiet["dead"], &quiet["held"]),
        (&json!(0), &json!(0), &json!(0)),
        "configured, no rows"
    );
    assert_eq!(listing["unroutable"], json!([]));

    // Three pages of two: every dead row once, the head holding one row.
    let mut seen = Vec::new();
    for offset in [0, 2, 4] {
        let (status, page) = get(&gateway, &format!("/admin/outbox/dead?limit=2&offset={offset}")).await;
        assert_eq!((status, &page["total"], &page["offset"]), (200, &json!(4), &json!(offset)), "{page}");
        seen.extend(page["rows"].as_array().unwrap().iter().cloned());
    }
    let mut keys: Vec<&str> = seen.iter().map(|r| r["business_key"].as_str().unwrap()).collect();
    keys.sort();
    assert_eq!(keys, ["head", "loose-0", "loose-1", "loose-2"]);
    for row in &seen {
        let holds = if row["business_key"] == "head" { 1 } else { 0 };
        assert_eq!(row["holds"], json!(holds), "{row}");
        assert!(row["last_error"].as_str().is_some_and(|e| e.contains("400")), "{row}");
        assert!(row["created_at_unix_ms"].as_u64().is_some_and(|t| t > 0), "{row}");
    }
    let (_, other) = get(&gateway, "/admin/outbox/dead?destination=quiet").await;
    assert_eq!((&other["total"], &other["rows"]), (&json!(0), &json!([])));
    for bad in ["offset=-1", "offset=x", "offset=1000001", "destination=", "limit=0"] {
        let (status, problem) = get(&gateway, &format!("/admin/outbox/dead?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {problem}");
    }

    // Redriving the head releases the row it held.
    let head = seen.iter().find(|r| r["business_key"] == "head").unwrap();
    let path = format!("/admin/outbox/dead/{}/redrive", head["id"]);
    let redriven = gateway.admin("POST", &path).header("authorization", &format!("Bearer {TOKEN}")).send().await;
    assert_eq!(redriven.status, 200);
    fx.sink.fail_with(None);
    assert_eq!(fx.drain(&relay).await.delivered, 2, "the head, then the row behind it");
    let (_, listing) = get(&gateway, "/admin/outbox/destinations").await;
    let sink = find(&listing, DESTINATION);
    assert_eq!((&sink["ready"], &sink["dead"], &sink["held"]), (&json!(0), &json!(3), &json!(0)));
}
