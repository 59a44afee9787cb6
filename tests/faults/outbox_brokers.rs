//! One relay, three kinds of destination — HTTP, NATS JetStream and
//! RabbitMQ — while relay processes are SIGKILLed, judged by the outbox
//! checker (`support::outbox_check`) over what each downstream received:
//! no committed row lost, each derived key applied once by a consumer that
//! deduplicates on it (`Idempotency-Key`, `Nats-Msg-Id`, `message_id`),
//! per-key order kept, and no more repeats on the wire than the kills can
//! explain.

use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::prelude::*;

use crate::support;
use support::amqp::{amqp_url, channel, delete, drain, exchange_with_queue, unique_name};
use support::nats::{create_stream, jetstream, messages, unique_subject};
use support::outbox_check::{self, Ledger, Workload, check_received, enqueue, wait_until_settled};
use support::postgres::TestSchema;
use support::relay_process::RelayProcess;
use support::sink::{Sink, consumed};

const KILLS: usize = 4;
/// Rows one relay claims at once, per destination: what one kill can leave published and unrecorded.
const BATCH: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relays_sigkilled_while_publishing_to_http_nats_and_rabbitmq_lose_nothing_and_apply_each_key_once() {
    let seed = outbox_check::seed("brokers");
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb40c);
    let started = Instant::now();
    let schema = TestSchema::create().await;
    let sink = Sink::start().await;
    let (nats_url, amqp_url) = (support::services::nats_url(), amqp_url());
    let js = jetstream(&nats_url).await;
    let subject = unique_subject();
    create_stream(&js, &subject, vec![format!("{subject}.>")]).await;
    let queue = unique_name();
    let (_connection, amqp) = channel(&amqp_url).await;
    exchange_with_queue(&amqp, &queue).await;
    let config = format!(
        r#"
[relay]
database_url = "{database_url}"
schema = "{schema}"
lease = "1s"
poll_interval = "100ms"
reap_interval = "200ms"
batch_size = {BATCH}

[destinations.web]
url = "{web}"
timeout = "2s"
backoff_base = "20ms"
backoff_max = "200ms"
max_attempts = 1000

[destinations.stream]
kind = "nats"
url = "{nats_url}"
subject = "{subject}.{{operation}}"
timeout = "2s"
backoff_base = "20ms"
backoff_max = "200ms"
max_attempts = 1000

[destinations.queue]
kind = "amqp"
url = "{amqp_url}"
exchange = "{queue}"
routing_key = "orders.{{operation}}"
timeout = "2s"
backoff_base = "20ms"
backoff_max = "200ms"
max_attempts = 1000
"#,
        database_url = schema.url,
        schema = schema.name(),
        web = sink.url(),
    );
    // 2,000 rows: 30 ordering keys of 40 and 800 unordered, over the three destinations.
    let workload = Workload::new(seed, &["web", "stream", "queue"], 30, 40, 800, 4);
    let mut relays = [RelayProcess::start(&config), RelayProcess::start(&config)];
    let ledger = Ledger::default();
    let enqueuing = {
        let (url, name, workload, ledger) =
            (schema.url.clone(), schema.schema.clone(), workload.clone(), ledger.clone());
        tokio::spawn(async move { enqueue(&url, &name, &workload, &ledger, Duration::from_millis(5)).await })
    };
    for kill in 1..=KILLS {
        ledger.wait_for(kill * workload.len() / (KILLS + 1)).await;
        let victim = rng.random_range(0..relays.len());
        relays[victim].start_again(); // SIGKILL, then a fresh process
    }
    enqueuing.await.unwrap();
    wait_until_settled(&schema.url, &schema.schema, Duration::from_secs(120)).await;
    for relay in relays {
        assert!(relay.terminate().success(), "SIGTERM exits 0");
    }

    let mut received = sink.received();
    let from_stream = messages(&js, &subject).await.into_iter().map(|message| {
        let key = message.headers.get("Nats-Msg-Id").map(|id| id.as_str().to_owned()).unwrap_or_default();
        (key, message.payload)
    });
    received.extend(consumed(from_stream.collect()));
    let from_queue = drain(&amqp, &queue).await.into_iter().map(|message| {
        let key = message.properties.message_id().as_ref().map(|id| id.to_string()).unwrap_or_default();
        (key, Bytes::from(message.data))
    });
    received.extend(consumed(from_queue.collect()));
    let client = schema.connect().await;
    let report = check_received(&client, &schema.schema, &ledger, received).await;
    assert_eq!((report.delivered, report.rows), (workload.len(), workload.len()), "{report}");
    // Each kill can leave at most one claim per destination published and unrecorded.
    assert!(report.repeats() <= KILLS * 3 * BATCH, "{report}");
    let _ = js.delete_stream(&subject).await;
    delete(&amqp, &queue).await;
    eprintln!("{KILLS} relay SIGKILLs over http, nats and amqp: {report}; {:?}", started.elapsed());
}
