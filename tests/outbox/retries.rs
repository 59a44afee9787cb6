//! Retries: what the destination answers decides a row's fate. A `4xx` is
//! dead at once and a redrive delivers it (also through the admin API); a
//! `5xx` is retried until `max_attempts`, then dead; a `429` waits at least
//! its `Retry-After`; and the relay's metrics count every attempt.

use std::time::Duration;

use idemgate::outbox::{claim, dead};
use serde_json::json;

use crate::LEASE;
use crate::support;
use crate::support::outbox::Fixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_is_dead_at_once_and_a_redrive_delivers_it() {
    let fx = Fixture::start().await;
    let key = fx.enqueue("order:6", json!({"n": 6}), None).await;
    let relay = fx.relay(LEASE);
    fx.sink.fail_with(Some(422));
    let outcome = fx.drain(&relay).await;
    assert_eq!((outcome.claimed, outcome.dead), (1, 1), "{outcome:?}");
    let dead = dead::page(&fx.db, &dead::DeadQuery { destination: None, offset: 0, limit: 10 }).await.unwrap().rows;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].derived_key, key);
    assert!(dead[0].last_error.as_deref().is_some_and(|e| e.starts_with("HTTP 422")), "{dead:?}");
    // The operator fixes the destination and redrives.
    fx.sink.fail_with(None);
    assert_eq!(claim::redrive(&fx.db, None).await.unwrap(), 1);
    assert_eq!(fx.drain(&relay).await.delivered, 1);
    assert!(
        dead::page(&fx.db, &dead::DeadQuery { destination: None, offset: 0, limit: 10 }).await.unwrap().rows.is_empty()
    );
    assert_eq!(fx.sink.count_for(&key), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_rows_are_listed_and_redriven_through_the_admin_api() {
    const TOKEN: &str = "outbox-admin-token-0123456789";
    let fx = Fixture::start().await;
    let key = fx.enqueue("order:11", json!({"secret": "card"}), None).await;
    fx.sink.fail_with(Some(400));
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.dead, 1);
    let mut config = support::gateway::config(&fx.sink.url(), "memory://");
    config.admin.token = Some(idemgate::config::Secret::new(TOKEN));
    config.relay.database_url = Some(idemgate::config::ServiceUrl::new(fx.schema.url.clone()));
    config.relay.schema = fx.schema.name().to_string();
    let gateway = support::gateway::TestGateway::start(config).await;
    let bearer = format!("Bearer {TOKEN}");
    let admin = |method: &'static str, path: &'static str| gateway.admin(method, path).header("authorization", &bearer);

    let ready = gateway.admin("GET", "/readyz").send().await;
    assert_eq!((ready.status, ready.text().contains("\"database\":\"ok\"")), (200, true), "{}", ready.text());
    let listed = admin("GET", "/admin/outbox/dead?limit=10").send().await;
    assert_eq!(listed.status, 200);
    let rows: serde_json::Value = serde_json::from_slice(&listed.body).unwrap();
    assert_eq!(rows["rows"][0]["derived_key"], key);
    assert!(!listed.text().contains("card"), "payloads are never listed");
    let id = rows["rows"][0]["id"].as_i64().unwrap();
    assert_eq!(admin("GET", "/admin/outbox/dead?limit=0").send().await.status, 400);
    assert_eq!(admin("POST", "/admin/outbox/dead/x/redrive").send().await.status, 400);
    assert_eq!(admin("POST", "/admin/outbox/dead/999999/redrive").send().await.status, 404);
    assert_eq!(gateway.admin("POST", "/admin/outbox/redrive").send().await.status, 401, "bearer required");

    let path: &'static str = format!("/admin/outbox/dead/{id}/redrive").leak();
    let redriven = admin("POST", path).send().await;
    assert_eq!((redriven.status, redriven.text()), (200, "{\"redriven\":1}".to_string()));
    fx.sink.fail_with(None);
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    assert_eq!(admin("POST", "/admin/outbox/redrive").send().await.text(), "{\"redriven\":0}");
    assert_eq!(fx.sink.count_for(&key), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_is_retried_until_max_attempts_then_dead() {
    let fx = Fixture::start().await;
    let key = fx.enqueue("order:7", json!({"status": 503}), None).await;
    let outcome = fx.drain(&fx.relay(LEASE)).await;
    assert_eq!((outcome.retried, outcome.dead), (2, 1), "{outcome:?}");
    assert_eq!(fx.sink.count_for(&key), 3, "max_attempts = 3");
    assert_eq!(fx.count("state = 'dead' AND attempts = 3").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_reports_attempts_latencies_and_backlog_in_metrics() {
    let fx = Fixture::start().await;
    fx.enqueue("fails", json!({"status": 503}), None).await;
    fx.enqueue("works", json!({}), None).await;
    let metrics = std::sync::Arc::new(idemgate::metrics::Metrics::new());
    let relay = fx.relay(LEASE).with_metrics(metrics.clone());
    fx.drain(&relay).await;
    relay.refresh_gauges().await.unwrap();
    let text = String::from_utf8(metrics.render()).unwrap();
    for line in [
        r#"idemgate_outbox_delivery_attempts_total{destination="sink",outcome="delivered"} 1"#,
        r#"idemgate_outbox_delivery_attempts_total{destination="sink",outcome="retried"} 2"#,
        r#"idemgate_outbox_delivery_attempts_total{destination="sink",outcome="dead"} 1"#,
        r#"idemgate_outbox_publish_duration_seconds_count{destination="sink"} 4"#,
        r#"idemgate_outbox_commit_to_delivery_seconds_count{destination="sink"} 1"#,
        r#"idemgate_outbox_rows{destination="sink",state="dead"} 1"#,
        r#"idemgate_outbox_rows{destination="sink",state="ready"} 0"#,
        r#"idemgate_outbox_oldest_ready_age_seconds{destination="sink"} 0"#,
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_waits_at_least_that_long() {
    let mut fx = Fixture::start().await;
    fx.destination.backoff_max = idemgate::config::ConfigDuration(Duration::from_secs(60));
    fx.enqueue("order:8", json!({"status": 429, "retry_after": "30"}), None).await;
    let outcome = fx.relay(LEASE).try_execute_step().await.unwrap();
    assert_eq!(outcome.retried, 1);
    // By the database clock: not due for (nearly) 30 s; a jittered backoff alone would be under 10 ms.
    assert_eq!(fx.count("state = 'ready' AND available_at > now() + interval '29 seconds'").await, 1);
    assert_eq!(fx.count("available_at > now() + interval '31 seconds'").await, 0);
}
