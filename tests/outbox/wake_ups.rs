//! Wake-ups: a relay finds new rows without notifications (by polling),
//! long before its next poll with them (`NOTIFY`), and again after the
//! database drops its `LISTEN` session.

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::LEASE;
use crate::support;
use crate::support::outbox::Fixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_without_notifications_still_delivers_by_polling() {
    let fx = Fixture::start().await;
    let stop = CancellationToken::new();
    // No LISTEN at all: every notification is lost.
    let relay = tokio::spawn(fx.relay(LEASE).run(None, stop.clone()));
    let key = fx.enqueue("order:9", json!({}), None).await;
    assert!(fx.sink.wait_for(1, Duration::from_secs(10)).await, "polling delivered nothing");
    stop.cancel();
    relay.await.unwrap();
    assert_eq!(fx.sink.count_for(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_wakes_a_relay_long_before_its_next_poll() {
    let fx = Fixture::start().await;
    let mut settings = support::outbox::settings(LEASE);
    settings.poll_interval = Duration::from_secs(600);
    settings.reap_interval = Duration::from_secs(600);
    let relay = idemgate::outbox::relay::Relay::new(fx.schema.database(4), fx.publisher(), fx.policies(), settings);
    let stop = CancellationToken::new();
    let running =
        tokio::spawn(relay.run(Some(idemgate::postgres::Endpoint::parse(&fx.schema.url).unwrap()), stop.clone()));
    for n in 0..3 {
        fx.enqueue(&format!("wake:{n}"), json!({}), None).await;
        assert!(fx.sink.wait_for(n + 1, Duration::from_secs(30)).await, "no wake-up for row {n}");
    }
    stop.cancel();
    running.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_listen_connection_reconnects_and_wakes_the_relay_again() {
    let fx = Fixture::start().await;
    let mut settings = support::outbox::settings(LEASE);
    settings.poll_interval = Duration::from_secs(600);
    settings.reap_interval = Duration::from_secs(600);
    let relay = idemgate::outbox::relay::Relay::new(fx.schema.database(4), fx.publisher(), fx.policies(), settings);
    let application = format!("listen-{}", fx.schema.name());
    let mut listen = idemgate::postgres::Endpoint::parse(&fx.schema.url).unwrap();
    listen.config.application_name(&application);
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(Some(listen), stop.clone()));
    fx.enqueue("before", json!({}), None).await;
    assert!(fx.sink.wait_for(1, Duration::from_secs(30)).await, "no wake-up before the drop");
    // The database drops the LISTEN session (a restart, a proxy timeout...).
    let admin = fx.schema.connect().await;
    let kill = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1";
    let killed: i64 = admin.query_one(kill, &[&application]).await.unwrap().get(0);
    assert_eq!(killed, 1);
    fx.enqueue("after", json!({}), None).await;
    assert!(fx.sink.wait_for(2, Duration::from_secs(30)).await, "no wake-up after the drop");
    stop.cancel();
    running.await.unwrap();
}
