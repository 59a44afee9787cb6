//! The `idemgate` binary as users run it: config checks, a gateway killed
//! mid-request and another taking over its key, graceful termination.

use crate::support;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::gateway::Reply;
use support::redis_server::{free_port, shared_redis_url, unique_prefix};
use support::upstream::Upstream;

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");

fn idemgate(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BINARY).args(args).envs(env.iter().copied()).output().expect("run idemgate")
}

/// A gateway process on a free port; killed when dropped. Its stderr goes
/// to a file, so a gateway that exits or never listens is reported with
/// what it said.
struct GatewayProcess {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    /// Our own log file, removed on drop (`None` when the test gave one).
    own_log: Option<std::path::PathBuf>,
}

impl GatewayProcess {
    fn start(upstream: &str, store: &str, env: &[(&str, &str)]) -> Self {
        let path = std::env::temp_dir().join(format!("idemgate-stderr-{:016x}.log", rand::random::<u64>()));
        let mut process = Self::start_logging_to(upstream, store, env, &path);
        process.own_log = Some(path);
        process
    }

    fn start_logging_to(upstream: &str, store: &str, env: &[(&str, &str)], log: &std::path::Path) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let file = std::fs::File::create(log).expect("a log file");
        let mut child = Command::new(BINARY)
            .args(["serve", "--listen", &addr.to_string(), "--admin-listen", &admin.to_string()])
            .args(["--upstream", upstream, "--store", store])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start idemgate serve");
        let said = || std::fs::read_to_string(log).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("idemgate serve exited ({status}) before listening on {addr}; it said:\n{}", said());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("idemgate serve did not listen on {addr} within 10 s; it said:\n{}", said());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, addr, admin, own_log: None }
    }

    async fn metrics(&self) -> String {
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let request = http::Request::get(format!("http://{}/metrics", self.admin))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let response = client.request(request).await.expect("admin answered");
        let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    }

    async fn charge(&self, path: &str, key: &str) -> Reply {
        charge(self.addr, path, key).await.expect("gateway answered")
    }
}

async fn charge(addr: SocketAddr, path: &str, key: &str) -> Result<Reply, String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::post(format!("http://{addr}{path}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{\"amount\":1}")))
        .unwrap();
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = http_body_util::BodyExt::collect(body).await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply { status: parts.status.as_u16(), headers: parts.headers, body })
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(path) = &self.own_log {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[test]
fn check_config_prints_the_effective_config_with_secrets_redacted() {
    let output = idemgate(
        &["check-config", "--upstream", "http://127.0.0.1:9000", "--store", "redis://:hunter2@127.0.0.1:6379/0"],
        &[("IDEMGATE__ADMIN__TOKEN", "s3cret-0123456789abcdef"), ("IDEMGATE__GATEWAY__ON_UNKNOWN", "release")],
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("lease = \"30s\""), "{printed}");
    assert!(!printed.contains("hunter2") && !printed.contains("s3cret"), "{printed}");
    let warnings = String::from_utf8_lossy(&output.stderr);
    assert!(warnings.contains("on_unknown"), "releasing lost outcomes is warned about: {warnings}");
}

/// A JWT tenant source prints the path of its secret, never the secret,
/// and a secret file that cannot be read stops the check with its path.
#[test]
fn check_config_prints_a_jwt_secrets_path_never_the_secret_and_refuses_a_missing_file() {
    let dir = support::jwt::KeyDir::new();
    let secret = dir.path("jwt.secret");
    std::fs::write(&secret, "an-hs256-secret-of-enough-length-0123456789").unwrap();
    let tenant = |path: &std::path::Path| {
        format!(
            "{{ jwt_claim = \"sub\", hs256_secret_file = \"{}\", issuer = \"https://id\", audience = \"pay\" }}",
            path.display()
        )
    };
    let ok = tenant(&secret);
    let output =
        idemgate(&["check-config", "--upstream", "http://127.0.0.1:9000"], &[("IDEMGATE__GATEWAY__TENANT", &ok)]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("jwt_claim = \"sub\"") && printed.contains(&*secret.to_string_lossy()), "{printed}");
    assert!(!printed.contains("enough-length"), "the secret itself is never printed: {printed}");

    let missing = tenant(&dir.path("absent.secret"));
    let output =
        idemgate(&["check-config", "--upstream", "http://127.0.0.1:9000"], &[("IDEMGATE__GATEWAY__TENANT", &missing)]);
    assert_eq!(output.status.code(), Some(2));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("hs256_secret_file") && said.contains("absent.secret"), "{said}");
}

/// `serve` started as many service managers start it, with a soft
/// open-file limit of 1,024 (`prlimit`, util-linux), `lim` being the
/// `--nofile` value; its pid is the gateway's (prlimit execs it).
fn serve_under_prlimit(lim: &str, upstream: &str, log: &std::path::Path) -> (Child, SocketAddr) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new("prlimit")
        .args([&format!("--nofile={lim}"), "--", BINARY, "serve", "--listen", &addr.to_string()])
        .args(["--admin-listen", &admin, "--upstream", upstream])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("prlimit (util-linux) runs idemgate serve");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        let said = std::fs::read_to_string(log).unwrap_or_default();
        assert!(child.try_wait().unwrap().is_none(), "idemgate serve exited; it said:\n{said}");
        assert!(Instant::now() < deadline, "idemgate serve did not listen; it said:\n{said}");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, addr)
}

/// `(soft, hard)` "Max open files" of a running process.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_owned();
    let numbers: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (numbers[0], numbers[1])
}

#[tokio::test]
async fn started_under_a_soft_limit_of_1024_the_gateway_raises_it_to_the_hard_limit() {
    let upstream = Upstream::start().await;
    let dir = support::jwt::KeyDir::new();
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    assert!(hard > 1024, "this test needs a hard limit above 1024, not {hard}");
    let log = dir.path("serve.log");
    let (mut child, addr) = serve_under_prlimit("1024:", &upstream.url(), &log);
    assert_eq!(open_file_limits(child.id()), (hard, hard), "the soft limit is raised to the hard one");
    assert_eq!(charge(addr, "/charge", "k").await.map(|r| r.status), Ok(201));
    let _ = child.kill();
    let _ = child.wait();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("raised the open-file limit"), "{said}");
    if hard >= 10_000 + 512 + 256 + 64 {
        assert!(!said.contains("below what this config may hold open"), "{said}");
    }

    // A hard limit of 1,024 cannot be raised: the gateway says what does not fit.
    let (mut child, _) = serve_under_prlimit("1024:1024", &upstream.url(), &log);
    assert_eq!(open_file_limits(child.id()), (1024, 1024));
    let _ = child.kill();
    let _ = child.wait();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("open-file limit is 1024 (hard limit 1024)") && said.contains("gateway.max_connections 10000"),
        "{said}"
    );
}

#[test]
fn a_bad_config_exits_2_with_a_message_naming_the_problem() {
    let output = idemgate(&["check-config", "--upstream", "ftp://x"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("http://"));
    let output = idemgate(&["serve"], &[("IDEMGATE__GATEWAY__FAIL_MODE", "sometimes")]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("fail_mode"));
    let output = idemgate(&["serve"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--upstream"));
}

/// A `TOKIO_WORKER_THREADS` (the number of worker threads) that is no such
/// number is a clear error, not a panic inside Tokio; a good one is obeyed.
#[tokio::test]
async fn a_bad_worker_thread_count_exits_2_and_a_good_one_serves() {
    for bad in ["0", "two", "-1", "", "100000"] {
        let output = idemgate(&["serve", "--upstream", "http://127.0.0.1:9"], &[("TOKIO_WORKER_THREADS", bad)]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "TOKIO_WORKER_THREADS={bad:?}: {stderr}");
        assert!(stderr.contains("TOKIO_WORKER_THREADS") && stderr.contains("from 1 to 1024"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // Five: no machine here has that many CPUs, so the default would show.
    // (Tokio's blocking threads share the name; nothing here starts one:
    // the upstream is an IP address, so no DNS lookup.)
    let upstream = Upstream::start().await;
    let gateway = GatewayProcess::start(&upstream.url(), "memory://", &[("TOKIO_WORKER_THREADS", "5")]);
    let reply = charge(gateway.addr, "/v1/charges", "k-threads").await.expect("the gateway answered");
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.total(), 1);
    let workers = threads_named(gateway.child.id(), "tokio-rt-worker");
    assert_eq!(workers, 5, "one Tokio worker thread per TOKIO_WORKER_THREADS");
}

/// How many of a process's threads have a name starting with `prefix`.
fn threads_named(pid: u32, prefix: &str) -> usize {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// `runtime = "per-core"`: one thread per core, each with its own
/// listener, and one memory store between them, so that a key whose
/// retries arrive on fresh connections (spread by the kernel over the
/// cores' listeners) still reaches the upstream once.
#[tokio::test]
async fn per_core_runs_a_thread_per_core_and_a_key_is_one_key_across_cores() {
    const CALLS: usize = 48;
    let upstream = Upstream::start().await;
    let env = [("IDEMGATE__RUNTIME", "per-core"), ("TOKIO_WORKER_THREADS", "3")];
    let gateway = GatewayProcess::start(&upstream.url(), "memory://", &env);
    // The listeners are bound before the core threads start: wait for them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut cores = threads_named(gateway.child.id(), "idemgate-core");
    while cores < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        cores = threads_named(gateway.child.id(), "idemgate-core");
    }
    assert_eq!(cores, 3, "one core thread per TOKIO_WORKER_THREADS");
    // Each call on a connection of its own (a client per call).
    let calls: Vec<_> = (0..CALLS).map(|_| tokio::spawn(charge(gateway.addr, "/slow?ms=300", "k-cores"))).collect();
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap().expect("answered").status);
    }
    assert_eq!(upstream.count_for("k-cores"), 1, "one effect, whichever core each call landed on: {statuses:?}");
    assert!(statuses.iter().all(|s| *s == 201 || *s == 409), "{statuses:?}");
    for _ in 0..12 {
        assert!(gateway.charge("/slow?ms=300", "k-cores").await.replayed(), "every core replays the stored answer");
    }
    assert_eq!(upstream.total(), 1);
}

/// `SO_REUSEPORT` would let a second process join the per-core listeners
/// and share the traffic with a memory store of its own; the address is
/// claimed instead, and the second gateway refuses to start, as it would
/// on a plain listener.
#[tokio::test]
async fn a_second_per_core_gateway_on_the_same_address_refuses_to_start() {
    let upstream = Upstream::start().await;
    let env = [("IDEMGATE__RUNTIME", "per-core")];
    let first = GatewayProcess::start(&upstream.url(), "memory://", &env);
    let admin = format!("127.0.0.1:{}", free_port());
    // The port is claimed, however the address is spelt.
    let (plain, mapped) = (first.addr.to_string(), format!("[::ffff:127.0.0.1]:{}", first.addr.port()));
    for (runtime, listen) in [("per-core", &plain), ("work-stealing", &plain), ("per-core", &mapped)] {
        let args = ["serve", "--listen", listen, "--admin-listen", &admin, "--upstream", &upstream.url()];
        let mut second = Command::new(BINARY)
            .args(args)
            .env("IDEMGATE__RUNTIME", runtime)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a second gateway");
        let deadline = Instant::now() + Duration::from_secs(10);
        while second.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = second.kill();
                panic!("{runtime}: a second gateway started on {listen} and serves beside the first");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = second.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{runtime} {listen}: {stderr}");
        assert!(stderr.contains(&format!("cannot listen on {listen}")), "{runtime} {listen}: {stderr}");
    }
    assert_eq!(first.charge("/v1/charges", "k-alone").await.status, 200, "the first one still serves");
    assert_eq!(upstream.total(), 1);
}

/// A gateway SIGKILLed mid-call leaves an in-flight record; another gateway
/// refuses the key while the lease lives, then takes it over. The second
/// execution is what a lost gateway costs, and the upstream sees the same
/// key both times, so an upstream that deduplicates can catch it.
#[tokio::test]
async fn a_killed_gateways_key_is_taken_over_after_its_lease_by_another_gateway() {
    let upstream = Upstream::start().await;
    let store = format!("{}?prefix={}", shared_redis_url(), unique_prefix());
    let env = [("IDEMGATE__GATEWAY__LEASE", "1s"), ("IDEMGATE__GATEWAY__UPSTREAM_TIMEOUT", "900ms")];
    let mut first = GatewayProcess::start(&upstream.url(), &store, &env);
    let second = GatewayProcess::start(&upstream.url(), &store, &env);

    let doomed = tokio::spawn(charge(first.addr, "/slow?ms=800", "k-crash"));
    while upstream.total() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert!(doomed.await.unwrap().is_err(), "the killed gateway never answered");

    let blocked = second.charge("/slow?ms=800", "k-crash").await;
    assert_eq!(blocked.status, 409, "the dead gateway's lease still holds the key");
    let mut reply = blocked;
    let deadline = Instant::now() + Duration::from_secs(10);
    while reply.status == 409 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        reply = second.charge("/slow?ms=800", "k-crash").await;
    }
    assert_eq!(reply.status, 201, "the key is taken over once the lease ends");
    assert_eq!(upstream.count_for("k-crash"), 2, "both executions carried the same key upstream");
    assert!(second.charge("/slow?ms=800", "k-crash").await.replayed());
    assert!(second.metrics().await.contains("idemgate_lease_takeovers_total 1"), "the takeover is counted");
}

#[tokio::test]
async fn sigterm_finishes_the_running_request_and_exits_0() {
    let upstream = Upstream::start().await;
    let mut gateway = GatewayProcess::start(&upstream.url(), "memory://", &[]);
    let running = tokio::spawn(charge(gateway.addr, "/slow?ms=500", "k-term"));
    while upstream.total() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = gateway.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let reply = running.await.unwrap().expect("answered during shutdown");
    assert_eq!(reply.status, 201, "the in-flight request completed during shutdown");
    let status = tokio::task::spawn_blocking(move || gateway.child.wait().unwrap()).await.unwrap();
    assert_eq!(status.code(), Some(0));
}

/// Text logs written to a file (not a terminal) carry no colour codes.
#[tokio::test]
async fn text_logs_to_a_file_have_no_colour_codes() {
    let upstream = Upstream::start().await;
    let dir = std::env::temp_dir().join(format!("idemgate-logs-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let log_path = dir.join("gateway.log");
    let mut gateway =
        GatewayProcess::start_logging_to(&upstream.url(), "memory://", &[("RUST_LOG", "info")], &log_path);
    charge(gateway.addr, "/charge", "k-colour").await.expect("answered");
    let pid = gateway.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let _ = tokio::task::spawn_blocking(move || gateway.child.wait()).await.unwrap();
    let logs = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(logs.contains("outcome=\"forwarded\""), "{logs}");
    assert!(!logs.contains('\x1b'), "escape codes in a log file:\n{logs:?}");
}

/// Logs carry route, outcome, hashed key and latency — and never the
/// credential, the raw key or a body.
#[tokio::test]
async fn logs_never_contain_credentials_raw_keys_or_bodies() {
    let upstream = Upstream::start().await;
    let dir = std::env::temp_dir().join(format!("idemgate-logs-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let log_path = dir.join("gateway.log");
    let mut gateway =
        GatewayProcess::start_logging_to(&upstream.url(), "memory://", &[("IDEMGATE__LOG__FORMAT", "json")], &log_path);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    for body in [&b"{\"card\":\"card-number-4242\"}"[..], &b"{\"card\":\"card-number-4343\"}"[..]] {
        let request = http::Request::post(format!("http://{}/charge", gateway.addr))
            .header("authorization", "Bearer super-secret-credential")
            .header("idempotency-key", "raw-key-visible-xyz")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(body)))
            .unwrap();
        client.request(request).await.unwrap();
    }
    let pid = gateway.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let _ = tokio::task::spawn_blocking(move || gateway.child.wait()).await.unwrap();
    let logs = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    for secret in ["super-secret-credential", "raw-key-visible-xyz", "card-number"] {
        assert!(!logs.contains(secret), "{secret} leaked into the logs:\n{logs}");
    }
    let lines: Vec<serde_json::Value> = logs.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let outcomes: Vec<&str> = lines.iter().filter_map(|l| l["fields"]["outcome"].as_str()).collect();
    assert_eq!(outcomes, ["forwarded", "mismatch"], "{logs}");
    let first = lines.iter().find(|l| l["fields"]["outcome"] == "forwarded").unwrap();
    assert_eq!(first["fields"]["key"].as_str().unwrap().len(), 16, "a hash prefix, not the key");
    assert!(first["fields"]["latency_us"].is_u64());
    assert_eq!(first["fields"]["route"], "default");
}

/// `serve --help` names every store scheme and the environment form, and a
/// listen address that is a host name is refused with an example.
#[test]
fn help_and_listen_errors_say_what_to_write() {
    let help = idemgate(&["serve", "--help"], &[]);
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "memory://",
        "redis://",
        "rediss://",
        "redis+cluster://",
        "redis+sentinel://",
        "postgres://",
        "IDEMGATE__SECTION__FIELD",
    ] {
        assert!(text.contains(needle), "{needle} missing from serve --help:\n{text}");
    }
    let refused = idemgate(&["serve", "--listen", "localhost:8080"], &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("write it like 127.0.0.1:8080"), "{stderr}");
}

/// An upstream that cannot be reached at start is named in a warning with
/// its cause — a closed port, a certificate no trusted CA signed — and the
/// gateway starts anyway (`/readyz` follows the store, not upstreams; the
/// app behind a sidecar may come up later). A reachable one is not warned
/// about.
#[tokio::test]
async fn an_unreachable_upstream_is_warned_about_at_start_with_its_cause() {
    let ca = support::postgres_tls::TestCa::new("a CA the gateway does not trust");
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    let dir = std::env::temp_dir().join(format!("idemgate-probe-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cert.pem"), cert).unwrap();
    std::fs::write(dir.join("key.pem"), key).unwrap();
    let untrusted = Upstream::start_tls(&dir.join("cert.pem"), &dir.join("key.pem")).await;
    let live = Upstream::start().await;
    let closed = format!("http://127.0.0.1:{}", free_port());
    let cases =
        [(closed.as_str(), Some("Connection refused")), (&untrusted.url(), Some("certificate")), (&live.url(), None)];
    for (upstream, cause) in cases {
        let log = dir.join("gateway.log");
        let gateway = GatewayProcess::start_logging_to(upstream, "memory://", &[], &log);
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        // The probe runs beside serving; a request (answered once the probe
        // has had its turn, or 502 while the upstream is unreachable) and
        // then readiness show the gateway serving either way.
        let reply = gateway.charge("/charge", "k-probe").await;
        let ready = readyz(gateway.admin).await;
        assert_eq!(ready, 200, "{upstream}: /readyz does not follow upstreams:\n{}", said());
        let deadline = Instant::now() + Duration::from_secs(10);
        match cause {
            Some(cause) => {
                while !said().contains("upstream not reachable at start") && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let logs = said();
                let line = logs.lines().find(|l| l.contains("upstream not reachable at start"));
                let line = line.unwrap_or_else(|| panic!("{upstream}: no warning within 10 s:\n{logs}"));
                assert!(line.contains(upstream.trim_end_matches('/')) && line.contains(cause), "{upstream}: {line}");
                assert_eq!(reply.status, 502, "{upstream}");
            }
            None => {
                assert_eq!(reply.status, 201, "{upstream}");
                drop(gateway);
                assert!(!said().contains("upstream not reachable"), "{upstream}: {}", said());
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

async fn readyz(admin: SocketAddr) -> u16 {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::get(format!("http://{admin}/readyz"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    client.request(request).await.expect("admin answered").status().as_u16()
}

/// W3C Trace Context: `traceparent` and `tracestate` reach the upstream
/// unchanged, and the request's log line carries its trace id (in both log
/// formats); a request without one logs `-`.
#[tokio::test]
async fn a_request_keeps_its_trace_context_upstream_and_its_trace_id_in_the_log() {
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TRACESTATE: &str = "vendor=opaque,other=1";
    for format in ["text", "json"] {
        let upstream = Upstream::start().await;
        let dir = std::env::temp_dir().join(format!("idemgate-trace-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let log_path = dir.join("gateway.log");
        let mut gateway = GatewayProcess::start_logging_to(
            &upstream.url(),
            "memory://",
            &[("IDEMGATE__LOG__FORMAT", format)],
            &log_path,
        );
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let request = http::Request::post(format!("http://{}/charge", gateway.addr))
            .header("idempotency-key", "k-traced")
            .header("traceparent", TRACEPARENT)
            .header("tracestate", TRACESTATE)
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap();
        assert_eq!(client.request(request).await.unwrap().status(), 201);
        let seen = upstream.last_headers();
        assert_eq!(seen.get("traceparent").unwrap(), TRACEPARENT, "{format}");
        assert_eq!(seen.get("tracestate").unwrap(), TRACESTATE, "{format}");
        charge(gateway.addr, "/charge", "k-untraced").await.expect("answered");
        let pid = gateway.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let _ = tokio::task::spawn_blocking(move || gateway.child.wait()).await.unwrap();
        let logs = std::fs::read_to_string(&log_path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let requests: Vec<&str> = logs.lines().filter(|l| l.contains("forwarded")).collect();
        assert_eq!(requests.len(), 2, "{format}: {logs}");
        let (traced, untraced) = match format {
            "text" => ("trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"", "trace_id=\"-\""),
            _ => ("\"trace_id\":\"4bf92f3577b34da6a3ce929d0e0e4736\"", "\"trace_id\":\"-\""),
        };
        assert!(requests[0].contains(traced), "{format}: {}", requests[0]);
        assert!(requests[1].contains(untraced), "{format}: {}", requests[1]);
    }
}
