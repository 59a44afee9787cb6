//! Database outages heal by themselves: `idemgate serve --relay` and
//! `idemgate relay` started while their PostgreSQL (a private server,
//! never the shared one) is down. The gateway serves meanwhile, readiness
//! says not ready and the log says why; once the server is started, the
//! relay connects, checks the schema and delivers — with no restart.

use crate::support;

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idemgate::postgres::{Schema, migrate};
use support::postgres_server::{PostgresProcess, Stop};
use support::redis_server::{TempDir, free_port};
use support::relay_process::RelayProcess;
use support::sink::Sink;
use support::upstream::Upstream;

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");
const PATIENCE: Duration = Duration::from_secs(30);

/// A private PostgreSQL with the outbox migrated, then stopped.
async fn migrated_and_stopped() -> PostgresProcess {
    let mut postgres = tokio::task::spawn_blocking(PostgresProcess::start).await.unwrap();
    let mut client = migrate::connect(&postgres.url()).await.unwrap();
    migrate::run(&mut client, &Schema::default()).await.unwrap();
    drop(client);
    tokio::task::spawn_blocking(move || {
        postgres.stop(Stop::Fast);
        postgres
    })
    .await
    .unwrap()
}

async fn start_again(mut postgres: PostgresProcess) -> PostgresProcess {
    tokio::task::spawn_blocking(move || {
        postgres.start_again();
        postgres
    })
    .await
    .unwrap()
}

fn relay_section(url: &str, destination: &str) -> String {
    format!(
        r#"
[relay]
database_url = "{url}"
lease = "2s"
poll_interval = "100ms"
reap_interval = "200ms"

[destinations.payments]
url = "{destination}"
timeout = "3s"
backoff_base = "20ms"
backoff_max = "200ms"
"#
    )
}

async fn request(addr: SocketAddr, method: &'static str, path: &'static str, headers: String) -> (u16, String) {
    tokio::task::spawn_blocking(move || support::raw_http::request(addr, method, path, &headers, "{}")).await.unwrap()
}

/// Waits (bounded) until `check` holds, quoting `log` if it never does.
async fn wait_until<F: Future<Output = bool>>(what: &str, log: impl Fn() -> String, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + PATIENCE;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}; log:\n{}", log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn enqueue(url: &str, count: i32) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let sql = "SELECT count(idemgate.enqueue('payments', 'charge', 'order:' || i, jsonb_build_object('amount', i)))
                 FROM generate_series(1, $1::int) AS i";
    client.query_one(sql, &[&count]).await.unwrap();
}

async fn outbox_rows(url: &str) -> i64 {
    let Ok((client, connection)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await else { return -1 };
    tokio::spawn(connection);
    client.query_one("SELECT count(*) FROM idemgate.outbox", &[]).await.map_or(-1, |r| r.get(0))
}

/// `idemgate serve --relay`, its log in a file, SIGKILLed when dropped.
struct Serve {
    child: Child,
    dir: TempDir,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Serve {
    fn start(config: &str, upstream: &Upstream, listen: SocketAddr) -> Self {
        let dir = TempDir::new("serve-relay");
        let path = dir.0.join("idemgate.toml");
        std::fs::write(&path, config).unwrap();
        let log = File::create(dir.0.join("serve.log")).unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new(BINARY)
            .args(["serve", "--relay", "--config"])
            .arg(&path)
            .args(["--listen", &listen.to_string(), "--admin-listen", &admin.to_string()])
            .args(["--upstream", &upstream.url()])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Self { child, dir, listen, admin }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("serve.log")).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "serve --relay did not exit; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_with_relay_started_while_its_database_is_down_serves_the_gateway_and_relays_once_it_is_back() {
    let postgres = migrated_and_stopped().await;
    let url = postgres.url();
    let upstream = Upstream::start().await;
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    // The relay publishes through this very gateway to the counting upstream.
    let mut serve = Serve::start(&relay_section(&url, &format!("http://{listen}/charge")), &upstream, listen);
    let (gateway, admin) = (serve.listen, serve.admin);
    wait_until("the gateway does not listen", || serve.log(), || async move { TcpStream::connect(gateway).is_ok() })
        .await;

    // Gateway traffic while the outbox database is down: guarded, and replayed.
    let key = "Idempotency-Key: while-the-database-is-down\r\nContent-Type: application/json\r\n".to_string();
    assert_eq!(request(gateway, "POST", "/charge", key.clone()).await.0, 201);
    let (status, _) = request(gateway, "POST", "/charge", key).await;
    assert_eq!((status, upstream.total()), (201, 1), "one effect, the retry replayed");
    let (status, body) = request(admin, "GET", "/readyz", String::new()).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(r#""database":"unavailable""#), "{body}");
    wait_until(
        "the log does not say why",
        || serve.log(),
        || async { serve.log().contains("outbox database unavailable") },
    )
    .await;
    assert!(serve.running(), "still serving");

    let postgres = start_again(postgres).await;
    enqueue(&url, 3).await;
    upstream.wait_finished(4).await;
    wait_until("the outbox is not drained", || serve.log(), || async { outbox_rows(&url).await == 0 }).await;
    assert_eq!((upstream.keys().len(), upstream.total()), (4, 4), "three relayed rows, each once");
    let (status, body) = request(admin, "GET", "/readyz", String::new()).await;
    assert_eq!(status, 200, "{body}");
    assert!(serve.terminate().success(), "SIGTERM stops both and exits 0");
    drop(postgres);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_started_while_its_database_is_down_is_not_ready_says_why_and_relays_once_it_is_back() {
    let postgres = migrated_and_stopped().await;
    let url = postgres.url();
    let sink = Sink::start().await;
    let relay = RelayProcess::start(&relay_section(&url, &sink.url()));
    let admin = relay.admin;
    wait_until(
        "the relay does not answer /readyz",
        || relay.log_tail(20),
        || async move { request(admin, "GET", "/readyz", String::new()).await.0 == 503 },
    )
    .await;
    let (_, body) = request(admin, "GET", "/readyz", String::new()).await;
    assert!(body.contains(r#""database":"unavailable""#) && body.contains(r#""relay":"starting""#), "{body}");
    wait_until(
        "the log does not say why",
        || relay.log_tail(20),
        || async { relay.log_tail(50).contains("outbox database unavailable") },
    )
    .await;

    let postgres = start_again(postgres).await;
    enqueue(&url, 3).await;
    assert!(sink.wait_for_effects(3, PATIENCE).await, "log:\n{}", relay.log_tail(20));
    wait_until(
        "not ready after the database came back",
        || relay.log_tail(20),
        || async move { request(admin, "GET", "/readyz", String::new()).await.0 == 200 },
    )
    .await;
    assert!(relay.terminate().success());
    drop(postgres);
}

/// What no retry can fix is not waited for: a database that does not exist
/// (SQLSTATE 3D000) stops the relay at once, with the server's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_pointed_at_a_database_that_does_not_exist_stops_with_the_servers_reason() {
    let shared = support::postgres::shared_database_url();
    let (base, query) = shared.split_once('?').map_or((shared.as_str(), ""), |(b, q)| (b, q));
    let missing = format!("idemgate_no_such_database_{}", std::process::id());
    let url = format!(
        "{}/{missing}{}",
        &base[..base.rfind('/').unwrap()],
        if query.is_empty() { String::new() } else { format!("?{query}") }
    );
    let sink = Sink::start().await;
    let mut relay = RelayProcess::start(&relay_section(&url, &sink.url()));
    let deadline = Instant::now() + PATIENCE;
    while relay.running() {
        assert!(Instant::now() < deadline, "still waiting for a database that does not exist:\n{}", relay.log_tail(20));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = relay.log_tail(20);
    assert!(log.contains("idemgate: ") && log.contains(&format!("\"{missing}\" does not exist")), "{log}");
}
