//! `outbox-bench`: the Postgres side of the outbox scenarios (P8, P9) of
//! `load-tests/run`, built as an example of the idemgate crate so it calls
//! the library's own code: the relay's claim,
//! `claim::claim_batch` (P9), not a copy of its SQL.
//!
//! ```text
//! outbox-bench enqueue-rate  --database-url URL --schema S --rate 1000 --duration-ms 10000 --out FILE
//! outbox-bench claim-latency --database-url URL --schemas S1,S2 --samples 200 --batch 32
//! outbox-bench enqueue-many  --database-url URL --schema S --rows 100000 [--ordering-keys 1000]
//! outbox-bench broker-setup|broker-count|broker-delete --kind nats|amqp --url URL --name N
//! ```
//!
//! - `enqueue-rate` (P8): an open-loop enqueuer. Message *i* is due at
//!   `start + i / rate`; `--connections` workers take the next due one and
//!   enqueue it by `SELECT idemgate.enqueue(...)` in autocommit, a
//!   transaction of its own. Right after it returns (committed), the worker
//!   notes the wall-clock time (µs since the Unix epoch), checks the key
//!   against the library's `derived_key`, and writes `DERIVED_KEY COMMIT_US`
//!   lines to `--out`. The harness joins them with the sink's arrival times.
//! - `claim-latency` (P9): times `claim::claim_batch` on each schema in
//!   turn (interleaved, same settings). After each timed claim, an untimed
//!   statement puts the claimed rows back (`ready`, due now, like the
//!   reaper does), so every schema keeps its number of ready rows.
//! - `enqueue-many` (E3R, E4R): E3's (or E4's) rows, built in Rust and
//!   enqueued by one `enqueue::enqueue_many_in` call on a transaction, then
//!   committed; times the call and the commit (the helper's checks, the
//!   parameters on the wire and the SQL function), not building the rows.
//!
//! - `broker-*` (B1, B2): the stream, or exchange and queue, the relay
//!   publishes to, and what they hold ([`broker`]).
//!
//! Each prints one JSON object on stdout and is bounded in count and
//! time; the database URL must point at 127.0.0.1 or a local socket.

mod broker;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemgate::outbox::claim;
use idemgate::outbox::enqueue::{Message, derived_key};
use idemgate::outbox::enqueue_many::enqueue_many_in;
use idemgate::postgres::Schema;
use tokio::sync::{Mutex, mpsc};
use tokio_postgres::NoTls;

type Failure = Box<dyn std::error::Error + Send + Sync>;

fn main() -> std::process::ExitCode {
    let mut argv = std::env::args().skip(1);
    let command = argv.next().unwrap_or_default();
    let mut flags = BTreeMap::new();
    while let (Some(flag), Some(value)) = (argv.next(), argv.next()) {
        flags.insert(flag.trim_start_matches("--").to_string(), value);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("outbox-bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        match command.as_str() {
            "enqueue-rate" => enqueue_rate(&flags).await,
            "claim-latency" => claim_latency(&flags).await,
            "enqueue-many" => enqueue_many(&flags).await,
            "broker-setup" | "broker-count" | "broker-delete" => broker::run(&command, &flags).await,
            other => Err(format!(
                "unknown command {other:?}: enqueue-rate, claim-latency, enqueue-many, broker-setup, broker-count or broker-delete"
            )
            .into()),
        }
    });
    match result {
        Ok(json) => {
            println!("{json}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("outbox-bench {command}: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn flag<'a>(flags: &'a BTreeMap<String, String>, name: &str) -> Result<&'a str, Failure> {
    flags.get(name).map(String::as_str).ok_or_else(|| format!("--{name} is required").into())
}

fn number(flags: &BTreeMap<String, String>, name: &str, default: u64) -> Result<u64, Failure> {
    flags.get(name).map_or(Ok(default), |v| v.parse().map_err(|_| format!("--{name}: {v:?} is not a number").into()))
}

/// The database URL, refused unless it is on this machine.
fn local_url(flags: &BTreeMap<String, String>) -> Result<String, Failure> {
    let url = flag(flags, "database-url")?;
    let config: tokio_postgres::Config = url.parse()?;
    let local = config.get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => name == "127.0.0.1" || name == "localhost" || name == "::1",
        tokio_postgres::config::Host::Unix(_) => true,
    });
    if !local {
        return Err("--database-url must point at 127.0.0.1 or a local socket".into());
    }
    Ok(url.to_string())
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, Failure> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

async fn enqueue_rate(flags: &BTreeMap<String, String>) -> Result<String, Failure> {
    let url = local_url(flags)?;
    let schema = Schema::new(flag(flags, "schema")?)?;
    let rate = number(flags, "rate", 1000)?.max(1);
    let duration = Duration::from_millis(number(flags, "duration-ms", 10_000)?.min(600_000));
    let connections = number(flags, "connections", 4)?.clamp(1, 32) as usize;
    let destination = flags.get("destination").cloned().unwrap_or_else(|| "bench".into());
    let prefix = flags.get("prefix").cloned().unwrap_or_else(|| "p8".into());
    let out = flag(flags, "out")?.to_string();
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let total = (duration.as_nanos() / interval.as_nanos()) as u64;

    let (tx, rx) = mpsc::channel::<(u64, Instant)>(1024);
    let rx = Arc::new(Mutex::new(rx));
    let mut workers = Vec::new();
    for _ in 0..connections {
        let client = connect(&url).await?;
        // One autocommit statement per row, prepared once: the transaction
        // is the statement, so its return is the commit's. (A service's own
        // transaction would add its BEGIN and COMMIT round trips.)
        let enqueue = client
            .prepare(&schema.sql(
                "SELECT idemgate.enqueue(destination => $1, operation => 'bench', business_key => $2, \
                 payload => '{\"amount\":500}'::jsonb)",
            ))
            .await?;
        let (rx, destination, prefix, schema) = (rx.clone(), destination.clone(), prefix.clone(), schema.clone());
        workers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut late_us = 0u64;
            loop {
                let Some((i, due)) = rx.lock().await.recv().await else { break };
                late_us = late_us.max(due.elapsed().as_micros() as u64);
                let business_key = format!("{prefix}:{i}");
                let key: String = client.query_one(&enqueue, &[&destination, &business_key]).await?.try_get(0)?;
                if key != derived_key(&schema, &destination, "bench", &business_key) {
                    return Err("the database derived another key than the library".into());
                }
                done.push((key, unix_us()));
            }
            Ok::<_, Failure>((done, late_us))
        }));
    }
    // The pacer: message i is due at start + i * interval, late or not.
    let start = Instant::now() + Duration::from_millis(20);
    for i in 0..total {
        let due = start + interval * i as u32;
        // Only sleep when early: the timer wheel has millisecond ticks, so
        // even a past deadline would cost a tick, and at 1,000/s the pacer
        // would fall further behind with every message.
        if due > Instant::now() {
            tokio::time::sleep_until(due.into()).await;
        }
        if tx.send((i, due)).await.is_err() {
            break;
        }
    }
    drop(tx);
    let mut file = std::io::BufWriter::new(std::fs::File::create(&out)?);
    let (mut sent, mut late_us) = (0usize, 0u64);
    for worker in workers {
        let (done, late) = worker.await??;
        sent += done.len();
        late_us = late_us.max(late);
        for (key, at) in done {
            writeln!(file, "{key} {at}")?;
        }
    }
    file.flush()?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(format!("{{\"sent\":{sent},\"seconds\":{seconds:.3},\"max_late_us\":{late_us}}}"))
}

async fn claim_latency(flags: &BTreeMap<String, String>) -> Result<String, Failure> {
    let url = local_url(flags)?;
    let samples = number(flags, "samples", 200)?.clamp(1, 10_000);
    let batch = number(flags, "batch", 32)?.clamp(1, 1000) as u32;
    let destination = flags.get("destination").cloned().unwrap_or_else(|| "bench".into());
    let destinations = [destination];
    let lease = Duration::from_secs(60);
    let mut subjects = Vec::new();
    for name in flag(flags, "schemas")?.split(',') {
        let schema = Schema::new(name)?;
        // The relay's own kind of pool (session settings included).
        let db = idemgate::outbox::connect_relay(&url, 2, schema.clone())?;
        let requeue = schema.sql(
            "UPDATE idemgate.outbox SET state = 'ready', lease_until = NULL, available_at = now()
              WHERE id = ANY($1::bigint[])",
        );
        subjects.push((name.to_string(), db, connect(&url).await?, requeue.into_owned(), Vec::new()));
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    // One untimed round first: pools connect and statements get prepared.
    for round in 0..=samples {
        for (_, db, client, requeue, times) in &mut subjects {
            let started = Instant::now();
            let rows = claim::claim_batch(db, &destinations, batch, lease).await?;
            let took = started.elapsed().as_micros() as u64;
            if rows.len() != batch as usize {
                return Err(format!("claimed {} rows, not {batch}: too few ready rows", rows.len()).into());
            }
            let ids: Vec<i64> = rows.iter().map(|r| r.fence.id).collect();
            client.execute(requeue.as_str(), &[&ids]).await?;
            if round > 0 {
                times.push(took);
            }
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let mut parts = Vec::new();
    for (name, _, _, _, mut times) in subjects {
        if times.is_empty() {
            return Err("no sample within the time limit".into());
        }
        times.sort_unstable();
        let at = |q: f64| times[((q * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
        parts.push(format!(
            "\"{name}\":{{\"samples\":{},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"max_us\":{}}}",
            times.len(),
            at(0.5),
            at(0.9),
            at(0.99),
            at(1.0)
        ));
    }
    Ok(format!("{{\"batch\":{batch},{}}}", parts.join(",")))
}

async fn enqueue_many(flags: &BTreeMap<String, String>) -> Result<String, Failure> {
    let url = local_url(flags)?;
    let schema = Schema::new(flag(flags, "schema")?)?;
    let rows = number(flags, "rows", 100_000)?.clamp(1, 1_000_000);
    let keys = number(flags, "ordering-keys", 0)?;
    let destination = flags.get("destination").cloned().unwrap_or_else(|| "bench".into());
    let operation = flags.get("operation").cloned().unwrap_or_else(|| "e3r".into());
    // E3's rows: business key "<operation>:i", {"amount": i, "note": 70 × "x"}.
    let business: Vec<String> = (1..=rows).map(|i| format!("{operation}:{i}")).collect();
    let payloads: Vec<serde_json::Value> =
        (1..=rows).map(|i| serde_json::json!({ "amount": i, "note": "x".repeat(70) })).collect();
    // E4's ordering keys: "customer:<i mod keys>"; none for E3.
    let ordering: Vec<String> = match keys {
        0 => Vec::new(),
        keys => (1..=rows).map(|i| format!("customer:{}", i % keys)).collect(),
    };
    let messages: Vec<Message<'_>> = (0..rows as usize)
        .map(|i| {
            let message = Message::new(&destination, &operation, &business[i], &payloads[i]);
            match ordering.get(i) {
                Some(key) => message.ordered_by(key),
                None => message,
            }
        })
        .collect();
    let mut client = connect(&url).await?;
    let started = Instant::now();
    let transaction = client.transaction().await?;
    // The helper checks that it got one key per message, each the one Rust derives.
    enqueue_many_in(&schema, &transaction, &messages).await?;
    transaction.commit().await?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(serde_json::json!({ "rows": rows, "seconds": seconds }).to_string())
}
