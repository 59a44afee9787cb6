//! The outbox as users run it: the `idemgate` binary migrating, relaying
//! through an idemgate gateway to an upstream that is not idempotent while
//! being SIGKILLed and restarted, and `serve --relay` in one process.

use crate::support;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::config_file::ConfigFile;
use support::gateway::{TestGateway, config};
use support::postgres::TestSchema;
use support::redis_server::free_port;
use support::upstream::Upstream;

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");

/// The relay section and one destination `payments` at `url`, fast timings.
fn relay_config(schema: &TestSchema, url: &str) -> String {
    format!(
        r#"
[relay]
database_url = "{db}"
schema = "{schema}"
lease = "1s"
poll_interval = "100ms"
reap_interval = "200ms"

[destinations.payments]
url = "{url}"
timeout = "3s"
backoff_base = "20ms"
backoff_max = "200ms"
max_attempts = 1000
"#,
        db = schema.url,
        schema = schema.name()
    )
}

/// A child process killed (SIGKILL) when dropped.
struct Process(Child);

impl Process {
    fn spawn(args: &[&str]) -> Self {
        Self::spawn_with_env(args, &[])
    }

    /// `idemgate relay --config FILE` with its admin listener on a free port.
    fn relay(config: &ConfigFile, env: &[(&str, &str)]) -> (Self, SocketAddr) {
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin_text = admin.to_string();
        (Self::spawn_with_env(&["relay", "--config", config.path(), "--admin-listen", &admin_text], env), admin)
    }

    fn spawn_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let child = Command::new(BINARY)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start idemgate");
        Self(child)
    }

    /// SIGTERM, then the exit status (bounded wait).
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.0.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "idemgate did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn enqueue_payments(schema: &TestSchema, count: usize) {
    let client = schema.connect().await;
    let sql = schema.sql(
        "SELECT count(idemgate.enqueue('payments', 'charge', 'order:' || i, jsonb_build_object('amount', i)))
           FROM generate_series(1, $1::int) AS i",
    );
    client.query_one(&sql, &[&(count as i32)]).await.unwrap();
}

async fn outbox_rows(schema: &TestSchema) -> i64 {
    let client = schema.connect().await;
    client.query_one(&schema.sql("SELECT count(*) FROM idemgate.outbox"), &[]).await.unwrap().get(0)
}

/// Waits (bounded) until the outbox is empty: rows leave it only when their
/// delivery is recorded, which nothing can signal to the test.
async fn wait_until_drained(schema: &TestSchema) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while outbox_rows(schema).await > 0 {
        assert!(Instant::now() < deadline, "{} rows still in the outbox", outbox_rows(schema).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_the_command_line_is_idempotent() {
    let schema = TestSchema::unmigrated().await;
    let env = [("IDEMGATE__RELAY__SCHEMA", schema.name()), ("IDEMGATE__RELAY__MAX_PAYLOAD", "2MiB")];
    let run = || Command::new(BINARY).args(["migrate", "--database-url", &schema.url]).envs(env).output().unwrap();
    let first = run();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(stdout.contains(&format!("migrated to {}", idemgate::postgres::migrate::latest_version())), "{stdout}");
    assert!(stdout.contains("payloads up to 2MiB (relay.max_payload)"), "{stdout}");
    let client = schema.connect().await;
    let settings = idemgate::postgres::migrate::settings(&client, &schema.schema).await.unwrap();
    assert_eq!(settings.max_payload, 2 << 20, "enqueue enforces the config's cap");
    let second = run();
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    assert!(String::from_utf8_lossy(&second.stdout).contains("up to date"), "{second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refuses_to_start_on_an_unmigrated_schema() {
    let schema = TestSchema::unmigrated().await;
    let file = ConfigFile::new(&relay_config(&schema, "http://127.0.0.1:9/x"));
    let admin = format!("127.0.0.1:{}", free_port());
    let output =
        Command::new(BINARY).args(["relay", "--config", file.path(), "--admin-listen", &admin]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("idemgate migrate"), "{output:?}");
    assert!(stderr.contains(&format!("schema {} is missing", schema.name())), "names the configured schema: {stderr}");
}

/// relay → gateway → an upstream that is NOT idempotent, with the relay
/// SIGKILLed and restarted four times mid-run: each derived key's effect
/// happens exactly once, because every redelivery carries the same key and
/// the gateway replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_and_restarted_mid_run_causes_each_effect_exactly_once() {
    const ROWS: usize = 300;
    const KILLS: u64 = 4;
    let schema = TestSchema::create().await;
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    // A little upstream latency, so kills land in the middle of publishes.
    let file = ConfigFile::new(&relay_config(&schema, &format!("http://{}/slow?ms=5", gateway.addr)));
    enqueue_payments(&schema, ROWS).await;

    let mut relay = Process::relay(&file, &[]).0;
    for kill in 1..=KILLS {
        upstream.wait_finished(kill * ROWS as u64 / (KILLS + 1)).await;
        drop(relay); // SIGKILL: no chance to record what it just published
        relay = Process::relay(&file, &[]).0;
    }
    wait_until_drained(&schema).await;
    assert!(relay.terminate().success(), "SIGTERM exits 0");

    let keys = upstream.keys();
    assert_eq!(keys.len(), ROWS, "every row reached the upstream");
    for key in &keys {
        assert_eq!(upstream.count_for(key), 1, "key {key} performed more than once");
    }
    assert_eq!(upstream.total(), ROWS as u64, "no effect without a key");
    let client = schema.connect().await;
    let sql = schema.sql("SELECT count(*), coalesce(sum(attempts), 0) FROM idemgate.delivered");
    let row = client.query_one(&sql, &[]).await.unwrap();
    let (delivered, attempts): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(delivered, ROWS as i64);
    eprintln!("{ROWS} rows, {KILLS} SIGKILLs: {attempts} attempts, {} beyond the first", attempts - ROWS as i64);
}

/// A plain HTTP/1.1 GET, with a bearer token or not; returns the status and body.
fn http_get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    support::raw_http::request(addr, "GET", path, &token.map(support::raw_http::bearer).unwrap_or_default(), "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_relay_serves_probes_metrics_and_dead_rows_on_its_admin_listener() {
    const TOKEN: &str = "relay-admin-token-0123456789";
    let schema = TestSchema::create().await;
    let sink = support::sink::Sink::start().await;
    let file = ConfigFile::new(&relay_config(&schema, &sink.url()));
    let (relay, admin) = Process::relay(&file, &[("IDEMGATE__ADMIN__TOKEN", TOKEN)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(admin).is_err() {
        assert!(Instant::now() < deadline, "the relay did not listen on {admin}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    enqueue_payments(&schema, 2).await;
    assert!(sink.wait_for(2, Duration::from_secs(30)).await);
    wait_until_drained(&schema).await;
    let get = move |path: &'static str, auth: bool| {
        tokio::task::spawn_blocking(move || http_get(admin, path, auth.then_some(TOKEN)))
    };
    assert_eq!(get("/healthz", false).await.unwrap().0, 200);
    let (status, body) = get("/readyz", false).await.unwrap();
    assert_eq!((status, body.contains("\"database\":\"ok\"")), (200, true), "{body}");
    let (status, metrics) = get("/metrics", false).await.unwrap();
    assert_eq!(status, 200);
    let delivered = r#"idemgate_outbox_delivery_attempts_total{destination="payments",outcome="delivered"} 2"#;
    assert!(metrics.contains(delivered), "{metrics}");
    assert_eq!(get("/admin/outbox/dead", false).await.unwrap().0, 401);
    let (status, dead) = get("/admin/outbox/dead", true).await.unwrap();
    let dead: serde_json::Value = serde_json::from_str(&dead).unwrap();
    assert_eq!((status, &dead["rows"], &dead["total"]), (200, &serde_json::json!([]), &serde_json::json!(0)));
    assert_eq!(get("/admin/keys/k", true).await.unwrap().0, 404, "no gateway routes on a relay");
    assert_eq!(get("/admin/gateway/outcomes", true).await.unwrap().0, 404, "no gateway routes on a relay");
    let (status, console) = get("/admin/ui/", false).await.unwrap();
    assert_eq!(status, 200, "the console is served on a relay too");
    assert!(console.contains("console.js"), "{console}");
    assert!(relay.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_relay_runs_the_gateway_and_the_relay_in_one_process() {
    let schema = TestSchema::create().await;
    let upstream = Upstream::start().await;
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let file = ConfigFile::new(&relay_config(&schema, &format!("http://{listen}/charge")));
    let admin = format!("127.0.0.1:{}", free_port());
    let serve = Process::spawn(&[
        "serve",
        "--relay",
        "--config",
        file.path(),
        "--listen",
        &listen.to_string(),
        "--admin-listen",
        &admin,
        "--upstream",
        &upstream.url(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(listen).is_err() {
        assert!(Instant::now() < deadline, "idemgate serve --relay did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    enqueue_payments(&schema, 3).await;
    upstream.wait_finished(3).await;
    wait_until_drained(&schema).await;
    assert_eq!(upstream.keys().len(), 3);
    assert!(serve.terminate().success(), "SIGTERM stops both and exits 0");
}

/// A destination whose `401` page echoes the request headers it got: its
/// bearer token, API key and the Basic credentials of its URL come back in
/// every body. None of them reaches the dead row's `last_error`, the admin
/// API's listing or the relay's log; `[redacted]` stands where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_echoing_its_request_headers_never_makes_the_relay_store_or_print_its_secrets() {
    use base64::Engine;
    use http_body_util::Full;
    use hyper::body::Bytes;

    const ADMIN_TOKEN: &str = "S3cret-admin-token-0123456789";
    const BEARER: &str = "S3cret-bearer-7f3a9c";
    const API_KEY: &str = "S3cret-api-key-51d0";
    const PASSWORD: &str = "S3cret-url-password-88";
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("alice:{PASSWORD}"));
    let secrets = [ADMIN_TOKEN, BEARER, API_KEY, PASSWORD, basic.as_str()];

    let echo = support::http_server::HttpServer::start(|request: http::Request<hyper::body::Incoming>| async move {
        let mut page = String::from("<h1>401 Unauthorized</h1><pre>you sent:\n");
        for (name, value) in request.headers() {
            page.push_str(&format!("{name}: {}\n", String::from_utf8_lossy(value.as_bytes())));
        }
        Ok::<_, std::convert::Infallible>(
            http::Response::builder().status(401).body(Full::new(Bytes::from(page))).unwrap(),
        )
    })
    .await;
    let schema = TestSchema::create().await;
    let relay = support::relay_process::RelayProcess::start(&format!(
        r#"
[admin]
token = "{ADMIN_TOKEN}"

[relay]
database_url = "{db}"
schema = "{schema}"
poll_interval = "100ms"

[destinations.bearer]
url = "http://{addr}/hook"
headers = {{ authorization = "Bearer {BEARER}", x-api-key = "{API_KEY}" }}

[destinations.basic]
url = "http://alice:{PASSWORD}@{addr}/hook"
"#,
        db = schema.url,
        schema = schema.name(),
        addr = echo.addr
    ));
    let mut client = schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let payload = serde_json::json!({"n": 1});
    for destination in ["bearer", "basic"] {
        let message = idemgate::outbox::enqueue::Message::new(destination, "notify", "order:1", &payload);
        idemgate::outbox::enqueue::enqueue_in(&schema.schema, &tx, &message).await.unwrap();
    }
    tx.commit().await.unwrap();

    let dead = schema.sql("SELECT last_error FROM idemgate.outbox WHERE state = 'dead' ORDER BY destination");
    let deadline = Instant::now() + Duration::from_secs(30);
    let reasons: Vec<String> = loop {
        let rows = client.query(&dead, &[]).await.unwrap();
        if rows.len() == 2 {
            break rows.iter().map(|r| r.get(0)).collect();
        }
        assert!(Instant::now() < deadline, "the rows did not die; relay log:\n{}", relay.log_tail(40));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let admin = relay.admin;
    let (status, listing) = tokio::task::spawn_blocking(move || {
        support::raw_http::request(admin, "GET", "/admin/outbox/dead", &support::raw_http::bearer(ADMIN_TOKEN), "")
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{listing}");
    // The relay's log reaches its file through the log buffer, written
    // out about ten times a second: wait for both rows' dead lines.
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = relay.log_tail(400);
        if log.matches("outbox row is dead").count() >= 2 {
            break log;
        }
        assert!(Instant::now() < deadline, "no dead-row lines in the relay's log:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for reason in &reasons {
        assert!(reason.starts_with("HTTP 401: ") && reason.contains("[redacted]"), "the echo came back: {reason}");
    }
    assert!(listing.contains("[redacted]"), "{listing}");
    for secret in secrets {
        for (what, text) in
            [("last_error", reasons.join("\n")), ("the admin API", listing.clone()), ("the log", log.clone())]
        {
            assert!(!text.contains(secret), "{secret} in {what}:\n{text}");
        }
    }
}
