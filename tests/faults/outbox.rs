//! The outbox relay under faults, every test judged by one checker
//! (`support::outbox_check`): no committed row lost, each derived key's
//! effect applied once at an idempotent downstream, per-key order kept.
//!
//! - PostgreSQL itself — a private server — is stopped fast, stopped
//!   immediately and SIGKILLed while rows are enqueued and the `idemgate
//!   relay` binary runs; the relay must reconnect by itself.
//! - Relay processes are SIGKILLed in a loop while rows are enqueued.
//! - The destination answers `503` for a long stretch, part of it with
//!   `Retry-After`; rows of an impatient destination die meanwhile and are
//!   redriven.
//! - One poison row under load: dead with its reason, its key held, the
//!   rest delivered; redriven, its key flows.
//! - PostgreSQL frozen (accepting, never answering): a relay still stops
//!   when told, and one whose LISTEN server is silent still delivers.
//!
//! Workloads and fault schedules are seeded (`IDEMGATE_SEED` replays a
//! run). Waits are bounded and fail with what was left; nothing asserts
//! how fast anything went. The one check on time is a floor: no row is
//! tried again sooner than the `Retry-After` it was given.

use crate::support;

use idemgate::outbox::retry::RetryPolicy;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use idemgate::config::{ConfigDuration, DestinationConfig};
use idemgate::outbox::publisher::Destinations;
use idemgate::outbox::relay::Relay;
use idemgate::outbox::{claim, dead};
use idemgate::postgres::{Schema, migrate};
use rand::prelude::*;
use serde_json::json;
use support::outbox::{DESTINATION, Fixture, settings};
use support::outbox_check::{self, Ledger, Workload, check, enqueue, wait_until_settled};
use support::postgres::TestSchema;
use support::postgres_server::{PostgresProcess, Stop};
use support::relay_process::RelayProcess;
use support::sink::Sink;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// In-process relays never crash here: a long lease.
const LEASE: Duration = Duration::from_secs(10);
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// A config for the `idemgate relay` binary: a fast relay and one patient destination.
fn binary_relay_config(database_url: &str, schema: &str, sink: &Sink) -> String {
    format!(
        r#"
[relay]
database_url = "{database_url}"
schema = "{schema}"
lease = "1s"
poll_interval = "100ms"
reap_interval = "200ms"

[destinations.{DESTINATION}]
url = "{url}"
timeout = "2s"
backoff_base = "20ms"
backoff_max = "200ms"
max_attempts = 1000
"#,
        url = sink.url()
    )
}

/// Runs each relay with LISTEN on `url` until `stop`.
fn spawn_relays(relays: Vec<Relay<Destinations>>, url: &str, stop: &CancellationToken) -> Vec<JoinHandle<()>> {
    relays
        .into_iter()
        .map(|relay| {
            let listen = idemgate::postgres::Endpoint::parse(url).unwrap();
            tokio::spawn(relay.run(Some(listen), stop.clone()))
        })
        .collect()
}

async fn stop_relays(stop: CancellationToken, relays: Vec<JoinHandle<()>>) {
    stop.cancel();
    for relay in relays {
        relay.await.unwrap();
    }
}

/// A private PostgreSQL with the outbox migrated into the default schema.
async fn migrated_private_postgres() -> (PostgresProcess, String, Schema) {
    let postgres = tokio::task::spawn_blocking(PostgresProcess::start).await.unwrap();
    let url = postgres.url();
    let schema = Schema::default();
    let mut client = migrate::connect(&url).await.unwrap();
    migrate::run(&mut client, &schema).await.unwrap();
    (postgres, url, schema)
}

/// Sessions on `url` whose `application_name` is `name`.
async fn sessions(url: &str, name: &str) -> i64 {
    let Ok(client) = outbox_check::connect(url).await else { return 0 };
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
    client.query_one(sql, &[&name]).await.map_or(0, |r| r.get(0))
}

/// PostgreSQL goes away three times while rows are enqueued and the relay
/// binary runs: a fast shutdown, an immediate one (no checkpoint: crash
/// recovery at start) and a SIGKILL of every server process, in a seeded
/// order. The relay is never restarted: its pool and its LISTEN session
/// must come back by themselves, and every row must still be applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stopped_and_crashed_mid_run_loses_no_row_and_applies_each_effect_once() {
    const ROWS_BEFORE_FAULTS: [usize; 3] = [60, 150, 240];
    let seed = outbox_check::seed("postgres restarts");
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9057);
    let mut stops = [Stop::Fast, Stop::Immediate, Stop::Kill];
    stops.rotate_left((seed % 3) as usize);
    let started = Instant::now();
    let (mut postgres, url, schema) = migrated_private_postgres().await;
    let sink = Sink::start().await;
    let mut relay = RelayProcess::start(&binary_relay_config(&url, schema.name(), &sink));
    let mut workload = Workload::new(seed, &[DESTINATION], 20, 10, 100, 4);
    for row in workload.lanes.iter_mut().flatten() {
        row.payload["delay_ms"] = json!(20); // so a stop lands mid-publish
    }
    let ledger = Ledger::default();
    let enqueuing = {
        let (url, schema, workload, ledger) = (url.clone(), schema.clone(), workload.clone(), ledger.clone());
        tokio::spawn(async move { enqueue(&url, &schema, &workload, &ledger, Duration::from_millis(15)).await })
    };

    for (how, rows) in stops.into_iter().zip(ROWS_BEFORE_FAULTS) {
        ledger.wait_for(rows).await;
        let down = Duration::from_millis(rng.random_range(200..800));
        eprintln!("{:?}: stopping postgres ({how:?}) for {down:?} after {} commits", started.elapsed(), ledger.len());
        tokio::task::block_in_place(|| postgres.stop(how));
        tokio::time::sleep(down).await;
        tokio::task::block_in_place(|| postgres.start_again());
        // The relay's pool and its LISTEN session reconnect on their own.
        let deadline = Instant::now() + Duration::from_secs(30);
        while sessions(&url, "idemgate-listen").await < 1 || sessions(&url, "idemgate").await < 1 {
            assert!(Instant::now() < deadline, "the relay did not reconnect:\n{}", relay.log_tail(30));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let enqueue_retries = enqueuing.await.unwrap();
    wait_until_settled(&url, &schema, SETTLE_LIMIT).await;
    assert!(relay.running(), "the relay exited:\n{}", relay.log_tail(30));
    assert!(relay.terminate().success(), "SIGTERM exits 0");

    let client = outbox_check::connect(&url).await.unwrap();
    let report = check(&client, &schema, &ledger, &sink).await;
    assert_eq!((report.delivered, report.rows), (workload.len(), workload.len()), "{report}");
    eprintln!(
        "postgres stopped {stops:?}: {report}; {enqueue_retries} enqueue attempts retried; {:?}",
        started.elapsed()
    );
}

/// Two relay processes, one of them SIGKILLed and restarted six times
/// while the rows are still being enqueued; each delivery is a little slow
/// so kills land mid-publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relays_sigkilled_in_a_loop_while_rows_are_enqueued_lose_no_row_and_apply_each_effect_once() {
    const KILLS: usize = 6;
    let seed = outbox_check::seed("relay kills");
    let mut rng = StdRng::seed_from_u64(seed ^ 0x4111);
    let started = Instant::now();
    let schema = TestSchema::create().await;
    let sink = Sink::start().await;
    let mut workload = Workload::new(seed, &[DESTINATION], 20, 10, 100, 4);
    for row in workload.lanes.iter_mut().flatten() {
        row.payload["delay_ms"] = json!(20); // so a kill lands mid-publish
    }
    let config = binary_relay_config(&schema.url, schema.name(), &sink);
    let mut relays = [RelayProcess::start(&config), RelayProcess::start(&config)];
    let ledger = Ledger::default();
    let enqueuing = {
        let (url, name, workload, ledger) =
            (schema.url.clone(), schema.schema.clone(), workload.clone(), ledger.clone());
        tokio::spawn(async move { enqueue(&url, &name, &workload, &ledger, Duration::from_millis(20)).await })
    };
    for kill in 1..=KILLS {
        ledger.wait_for(kill * workload.len() / (KILLS + 1)).await;
        // Publishing again since the last kill, so this one lands mid-run.
        let busy = sink.count() + 10;
        assert!(sink.wait_for(busy, Duration::from_secs(30)).await, "the relays stopped publishing");
        let victim = rng.random_range(0..relays.len());
        relays[victim].start_again(); // SIGKILL, then a fresh process
    }
    enqueuing.await.unwrap();
    wait_until_settled(&schema.url, &schema.schema, SETTLE_LIMIT).await;
    for relay in relays {
        assert!(relay.terminate().success(), "SIGTERM exits 0");
    }

    let client = schema.connect().await;
    let report = check(&client, &schema.schema, &ledger, &sink).await;
    assert_eq!((report.delivered, report.rows), (workload.len(), workload.len()), "{report}");
    eprintln!("{KILLS} relay SIGKILLs: {report}; {:?}", started.elapsed());
}

/// A destination with its own retry policy, at the fixture's sink.
fn destination(sink: &Sink, max_attempts: u32, backoff_max: Duration) -> DestinationConfig {
    let mut destination = DestinationConfig::new(sink.url());
    destination.timeout = ConfigDuration(Duration::from_secs(5));
    destination.backoff_base = ConfigDuration(Duration::from_millis(5));
    destination.backoff_max = ConfigDuration(backoff_max);
    destination.max_attempts = max_attempts;
    destination
}

/// The destination answers `503` for a long stretch: first plain (the
/// relays back off exponentially, many retries per row), then with
/// `Retry-After: 1` (no row is tried again sooner), then it recovers.
/// Rows bound for `patient` (retries without end) are all delivered once
/// it recovers; rows bound for `brittle` (4 attempts) die during the
/// stretch, with the 503 as their reason, and are delivered once redriven.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_destination_answering_503_for_a_long_stretch_loses_no_row_and_applies_each_effect_once() {
    const PLAIN_FAILURES: usize = 600;
    const RETRY_AFTER_FAILURES: usize = 150;
    let seed = outbox_check::seed("503 stretch");
    let started = Instant::now();
    let fx = Fixture::start().await;
    let destinations = BTreeMap::from([
        ("patient".to_string(), destination(&fx.sink, 10_000, Duration::from_secs(1))),
        ("brittle".to_string(), destination(&fx.sink, 4, Duration::from_millis(20))),
    ]);
    let policies: BTreeMap<_, _> = destinations.iter().map(|(n, d)| (n.clone(), RetryPolicy::from(d))).collect();
    let relay = || {
        let publisher = Destinations::new(&destinations).unwrap();
        Relay::new(fx.schema.database(4), publisher, policies.clone(), settings(LEASE))
    };
    let workload = Workload::new(seed, &["patient", "brittle"], 20, 8, 80, 4);
    let patient_rows = workload.lanes.iter().flatten().filter(|r| r.destination == "patient").count();

    fx.sink.fail_with(Some(503));
    let stop = CancellationToken::new();
    let relays = spawn_relays(vec![relay(), relay()], &fx.schema.url, &stop);
    let ledger = Ledger::default();
    enqueue(&fx.schema.url, &fx.schema.schema, &workload, &ledger, Duration::from_millis(10)).await;
    let answered = Duration::from_secs(60);
    assert!(fx.sink.wait_for(PLAIN_FAILURES, answered).await, "{} answers", fx.sink.count());
    fx.sink.retry_after(Some("1"));
    let retry_after_from = fx.sink.count();
    assert!(fx.sink.wait_for(retry_after_from + RETRY_AFTER_FAILURES, answered).await, "{}", fx.sink.count());
    fx.sink.fail_with(None);
    fx.sink.retry_after(None);
    let stretch = fx.sink.count();
    eprintln!("{:?}: the destination recovers after {stretch} answers of 503", started.elapsed());

    // Patient rows all go; brittle rows that ran out of attempts are dead, the rest of their keys wait.
    wait_until_settled(&fx.schema.url, &fx.schema.schema, SETTLE_LIMIT).await;
    let client = fx.schema.connect().await;
    let during = check(&client, &fx.schema.schema, &ledger, &fx.sink).await;
    let delivered_patient = fx.schema.sql("SELECT count(*) FROM idemgate.delivered WHERE destination = 'patient'");
    let delivered_patient: i64 = client.query_one(&delivered_patient, &[]).await.unwrap().get(0);
    assert_eq!(delivered_patient as usize, patient_rows, "{during}");
    assert!(during.dead > 0, "no brittle row ran out of attempts: {during}");
    for dead in dead::page(&fx.db, &dead::DeadQuery { destination: None, offset: 0, limit: 1000 }).await.unwrap().rows {
        let reason = dead.last_error.unwrap_or_default();
        assert!(dead.destination == "brittle" && reason.starts_with("HTTP 503"), "{}: {reason}", dead.destination);
    }
    // No row was tried again sooner than the Retry-After it was given.
    let received = fx.sink.received();
    let honoured = received.iter().enumerate().filter(|(_, r)| r.retry_after.is_some()).all(|(i, r)| {
        received[i + 1..].iter().find(|next| next.key == r.key).is_none_or(|next| {
            next.at.duration_since(r.at) >= Duration::from_millis(950) // 1 s by the database clock
        })
    });
    assert!(honoured, "a row was retried before its Retry-After");

    // The operator redrives the dead rows: each is delivered once, in order.
    assert_eq!(claim::redrive(&fx.db, None).await.unwrap() as usize, during.dead);
    wait_until_settled(&fx.schema.url, &fx.schema.schema, SETTLE_LIMIT).await;
    stop_relays(stop, relays).await;
    let after = check(&client, &fx.schema.schema, &ledger, &fx.sink).await;
    assert_eq!((after.delivered, after.effects), (workload.len(), workload.len()), "{after}");
    let with_retry_after = received.iter().filter(|r| r.retry_after.is_some()).count();
    eprintln!(
        "503 stretch: {stretch} failures ({with_retry_after} with Retry-After), {} dead during it and redriven; \
         after recovery {during}; at the end {after}; {:?}",
        during.dead,
        started.elapsed()
    );
}

/// One poison row (the destination answers it `422`) among 400 over 40
/// ordering keys, enqueued while two relays run: it dies with its reason,
/// its key's later rows wait untouched, everything else is delivered in
/// order. Redriven while still rejected, it dies again; once the destination
/// accepts it, a redrive delivers it and its key's rows after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_row_under_load_dies_with_its_reason_holds_only_its_key_and_flows_after_a_redrive() {
    const KEYS: usize = 40;
    const PER_KEY: usize = 8;
    let seed = outbox_check::seed("poison row");
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9015);
    let started = Instant::now();
    let fx = Fixture::start().await;
    let mut workload = Workload::new(seed, &[DESTINATION], KEYS, PER_KEY, 80, 4);
    let poison_key = format!("k{:02}", rng.random_range(0..KEYS));
    let poison_seq = rng.random_range(0..PER_KEY - 1); // at least one row behind it
    let poison = workload.row_mut(&format!("{poison_key}:{poison_seq}"));
    poison.payload["status"] = json!(422);
    let poison = poison.clone();
    let behind: Vec<String> = (poison_seq + 1..PER_KEY)
        .map(|seq| workload.row_mut(&format!("{poison_key}:{seq}")).derived_key(&fx.schema.schema))
        .collect();

    let stop = CancellationToken::new();
    let relays = spawn_relays(vec![fx.relay(LEASE), fx.relay(LEASE)], &fx.schema.url, &stop);
    let ledger = Ledger::default();
    enqueue(&fx.schema.url, &fx.schema.schema, &workload, &ledger, Duration::ZERO).await;
    wait_until_settled(&fx.schema.url, &fx.schema.schema, SETTLE_LIMIT).await;
    let client = fx.schema.connect().await;
    let held = check(&client, &fx.schema.schema, &ledger, &fx.sink).await;
    assert_eq!((held.dead, held.blocked), (1, behind.len()), "{held}");
    assert_eq!(held.delivered, workload.len() - 1 - behind.len(), "{held}");
    let dead = dead::page(&fx.db, &dead::DeadQuery { destination: None, offset: 0, limit: 10 }).await.unwrap().rows;
    assert_eq!(dead[0].business_key, poison.business_key);
    assert!(dead[0].last_error.as_deref().is_some_and(|e| e.starts_with("HTTP 422")), "{dead:?}");
    assert!(behind.iter().all(|key| fx.sink.count_for(key) == 0), "a row behind the poison was sent");

    // Redriven while the destination still rejects it: dead again, its key still held.
    assert_eq!(claim::redrive(&fx.db, None).await.unwrap(), 1);
    wait_until_settled(&fx.schema.url, &fx.schema.schema, SETTLE_LIMIT).await;
    assert_eq!(fx.sink.count_for(&poison.derived_key(&fx.schema.schema)), 2);
    let again = check(&client, &fx.schema.schema, &ledger, &fx.sink).await;
    assert_eq!((again.dead, again.blocked), (1, behind.len()), "{again}");

    // The destination is fixed to accept it; a redrive lets the key flow.
    fx.sink.fail_with(Some(200));
    assert_eq!(claim::redrive(&fx.db, None).await.unwrap(), 1);
    wait_until_settled(&fx.schema.url, &fx.schema.schema, SETTLE_LIMIT).await;
    stop_relays(stop, relays).await;
    let after = check(&client, &fx.schema.schema, &ledger, &fx.sink).await;
    assert_eq!((after.delivered, after.dead, after.blocked), (workload.len(), 0, 0), "{after}");
    eprintln!(
        "poison {} ({} behind it): held {held}; at the end {after}; {:?}",
        poison.business_key,
        behind.len(),
        started.elapsed()
    );
}

/// SIGTERM reaches a relay while its database accepts connections but
/// never answers (the server frozen with SIGSTOP, as a host that vanished
/// without closing them): the relay exits after at most one lease instead
/// of waiting forever on a claim. Nothing is lost: once the server thaws,
/// a new relay delivers what was enqueued meanwhile. (Regression: the run
/// loop awaited its step without bound, so the relay never exited.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_stopped_while_postgres_does_not_answer_exits_instead_of_waiting_forever() {
    let seed = outbox_check::seed("frozen postgres");
    let (postgres, url, schema) = migrated_private_postgres().await;
    let sink = Sink::start().await;
    let config = binary_relay_config(&url, schema.name(), &sink);
    let workload = Workload::new(seed, &[DESTINATION], 2, 5, 10, 2);
    let (first, second) = workload.lanes.split_at(1);
    let (first, second) = (Workload { lanes: first.to_vec() }, Workload { lanes: second.to_vec() });
    let ledger = Ledger::default();

    let relay = RelayProcess::start(&config);
    enqueue(&url, &schema, &first, &ledger, Duration::ZERO).await;
    assert!(sink.wait_for_effects(first.len(), Duration::from_secs(30)).await, "{}", relay.log_tail(20));
    postgres.freeze();
    // Past a poll interval: the relay's next claim waits on the frozen server.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = tokio::task::spawn_blocking(move || relay.terminate()).await.unwrap();
    assert!(status.success(), "{status:?}");

    postgres.thaw();
    let relay = RelayProcess::start(&config);
    enqueue(&url, &schema, &second, &ledger, Duration::ZERO).await;
    wait_until_settled(&url, &schema, SETTLE_LIMIT).await;
    assert!(relay.terminate().success());
    let client = outbox_check::connect(&url).await.unwrap();
    let report = check(&client, &schema, &ledger, &sink).await;
    assert_eq!(report.delivered, workload.len(), "{report}");
}

/// The same for the LISTEN session: a relay whose LISTEN connection reaches
/// a server that accepts but never answers still delivers (by polling) and
/// still stops when told. (Regression: the listener waited for its
/// connection without watching for the stop, and the relay for the listener.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_listen_server_never_answers_still_delivers_and_stops() {
    let fx = Fixture::start().await;
    // The kernel completes connections to it; nothing ever reads or answers.
    let silent = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let listen =
        idemgate::postgres::Endpoint::parse(&format!("postgres://postgres@{}/x", silent.local_addr().unwrap()));
    let stop = CancellationToken::new();
    let running = tokio::spawn(fx.relay(LEASE).run(Some(listen.unwrap()), stop.clone()));
    let key = fx.enqueue("polled", json!({}), None).await;
    assert!(fx.sink.wait_for(1, Duration::from_secs(10)).await, "polling delivered nothing");
    stop.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(10), running).await;
    assert!(stopped.is_ok(), "the relay did not stop");
    assert_eq!(fx.sink.count_for(&key), 1);
}
