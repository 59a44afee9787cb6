//! Bounded memory by bytes: the `idemgate relay` binary, with every
//! `[relay]` knob at its shipped default, drains a backlog of 200 rows of
//! 1 MiB each while its peak resident memory (`VmHWM`) stays under
//! [`PEAK_BOUND`]. Before claims were bounded by bytes, a claim of 128 such
//! rows held them all (several copies each): 475–521 MiB.
//!
//! The bound is an assertion on memory, not on time; the figure is printed.

use crate::support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use support::http_server::HttpServer;
use support::postgres::TestSchema;
use support::relay_process::RelayProcess;

/// The documented bound on the relay's peak RSS for this backlog (docs/outbox.md, "Memory").
const PEAK_BOUND_MIB: u64 = 128;
const ROWS: i32 = 200;
/// Payload text of just under 1 MiB: `{"blob": "xx…x"}`.
const BLOB: i32 = (1 << 20) - 12;

/// A destination that reads every body, keeps nothing of it, and counts
/// distinct keys; it stops when the returned server is dropped.
async fn counting_destination() -> (SocketAddr, Arc<Mutex<HashSet<String>>>, HttpServer) {
    let keys = Arc::new(Mutex::new(HashSet::new()));
    let shared = keys.clone();
    let server = HttpServer::start(move |request: http::Request<hyper::body::Incoming>| {
        let keys = shared.clone();
        async move {
            let key = request.headers().get("idempotency-key").map(|v| v.to_str().unwrap_or("").to_owned());
            let mut body = request.into_body();
            let mut size = 0;
            while let Some(Ok(frame)) = body.frame().await {
                size += frame.data_ref().map_or(0, Bytes::len);
            }
            if size >= BLOB as usize {
                keys.lock().unwrap().extend(key);
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
        }
    })
    .await;
    (server.addr, keys, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_200_rows_of_1_mib_is_relayed_within_the_documented_memory_bound() {
    let schema = TestSchema::create().await;
    let (addr, delivered, _destination) = counting_destination().await;
    let client = schema.connect().await;
    // 20 transactions of 10 rows; the payloads compress well in the table, not in the relay.
    let sql = schema.sql(
        "SELECT count(idemgate.enqueue('blobs', 'store', 'blob:' || $1::int * 10 + i,
                                        jsonb_build_object('blob', repeat('x', $2::int))))
           FROM generate_series(1, 10) AS i",
    );
    for chunk in 0..ROWS / 10 {
        client.query_one(&sql, &[&chunk, &BLOB]).await.unwrap();
    }
    let bytes: i64 = client
        .query_one(&schema.sql("SELECT sum(octet_length(payload::text))::bigint FROM idemgate.outbox"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(bytes >= i64::from(ROWS) * i64::from(BLOB), "{bytes} bytes enqueued");

    let config = format!(
        r#"
[relay]
database_url = "{url}"
schema = "{schema}"

[destinations.blobs]
url = "http://{addr}/store"
timeout = "30s"
"#,
        url = schema.url,
        schema = schema.name()
    );
    let relay = RelayProcess::start(&config);
    let count = || async {
        client.query_one(&schema.sql("SELECT count(*) FROM idemgate.outbox"), &[]).await.unwrap().get::<_, i64>(0)
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut peak_kib = 0;
    while count().await > 0 {
        assert!(Instant::now() < deadline, "{} rows left; relay log:\n{}", count().await, relay.log_tail(20));
        peak_kib = peak_kib.max(relay.memory_kib("VmHWM").unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    peak_kib = peak_kib.max(relay.memory_kib("VmHWM").expect("the relay still runs"));
    assert_eq!(delivered.lock().unwrap().len(), ROWS as usize, "every row delivered whole");
    eprintln!("{ROWS} rows of 1 MiB relayed; relay peak RSS (VmHWM) {:.1} MiB", peak_kib as f64 / 1024.0);
    assert!(peak_kib < PEAK_BOUND_MIB * 1024, "peak RSS {peak_kib} KiB, bound {PEAK_BOUND_MIB} MiB");
    assert!(relay.terminate().success());
}
