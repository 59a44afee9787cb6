//! `idemgate demo` as a newcomer runs it: the real binary on free loopback
//! ports, driven with the requests its instructions print.
//!
//! Every wait is bounded; a demo still running when a test ends is killed.

use crate::support;

use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::gateway::Reply;
use support::redis_server::{TempDir, free_port};

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");
/// How long the demo may take to start, or to refuse to.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// What the demo prints last, once both listeners are bound.
const READY: &str = "Press Ctrl-C to stop.";
const TOKEN: &str = "demo-test-token-0123456789";

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// `idemgate demo --listen … --admin-listen …` with `env` (and no other
/// `IDEMGATE__` variable); stdout and stderr go to files of its own.
fn spawn(gateway: SocketAddr, admin: SocketAddr, env: &[(&str, &str)]) -> (Child, TempDir) {
    let dir = TempDir::new("demo");
    let mut command = Command::new(BINARY);
    command.args(["demo", "--listen", &gateway.to_string(), "--admin-listen", &admin.to_string()]);
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("IDEMGATE__")) {
        command.env_remove(name);
    }
    let child = command
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(File::create(dir.0.join("stdout")).expect("create stdout file"))
        .stderr(File::create(dir.0.join("stderr")).expect("create stderr file"))
        .spawn()
        .expect("start idemgate demo");
    (child, dir)
}

fn read(dir: &TempDir, stream: &str) -> String {
    fs::read_to_string(dir.0.join(stream)).unwrap_or_default()
}

/// A running `idemgate demo`; killed when dropped.
struct Demo {
    child: Child,
    dir: TempDir,
    gateway: SocketAddr,
    admin: SocketAddr,
}

impl Demo {
    /// Starts it and waits (bounded) until it has printed its instructions.
    /// The ports are free when picked, but another test's process may take
    /// one before the demo binds it: then it starts again on new ones.
    fn start(env: &[(&str, &str)]) -> Self {
        for _ in 0..5 {
            if let Some(demo) = Self::launch(env) {
                return demo;
            }
        }
        panic!("idemgate demo found no free ports in 5 tries");
    }

    /// One start on fresh ports; `None` when one of them was taken meanwhile.
    fn launch(env: &[(&str, &str)]) -> Option<Self> {
        let (gateway, admin) = (loopback(), loopback());
        let (child, dir) = spawn(gateway, admin, env);
        let mut demo = Self { child, dir, gateway, admin };
        let deadline = Instant::now() + START_TIMEOUT;
        while !demo.stdout().contains(READY) {
            if let Some(status) = demo.child.try_wait().expect("poll idemgate demo") {
                let stderr = demo.stderr();
                assert!(stderr.contains("Address already in use"), "idemgate demo exited with {status}:\n{stderr}");
                return None;
            }
            assert!(Instant::now() < deadline, "idemgate demo printed no instructions:\n{}", demo.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(demo)
    }

    fn stdout(&self) -> String {
        read(&self.dir, "stdout")
    }

    fn stderr(&self) -> String {
        read(&self.dir, "stderr")
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.gateway)
    }

    /// `POST /v1/charges{query}` with `key`, as step 1 of the instructions.
    async fn charge(&self, query: &str, key: &str) -> Reply {
        let headers = [("idempotency-key", key), ("content-type", "application/json")];
        send("POST", &self.url(&format!("/v1/charges{query}")), &headers, r#"{"amount": 500}"#).await
    }

    /// What `GET /v1/charges/count` says the toy API performed.
    async fn charges_performed(&self) -> u64 {
        let reply = send("GET", &self.url("/v1/charges/count"), &[], "").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let value: serde_json::Value = serde_json::from_slice(&reply.body).expect("count is JSON");
        value["charges_performed"].as_u64().unwrap_or_else(|| panic!("no charges_performed in {value}"))
    }

    /// `GET /admin/keys/{key}` on the admin listener, with `token` if any.
    async fn admin_key(&self, key: &str, token: Option<&str>) -> Reply {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
        send("GET", &format!("http://{}/admin/keys/{key}", self.admin), &headers, "").await
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request; the answer must come within 30 s.
async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut request = http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::copy_from_slice(body.as_bytes()))).expect("a valid request");
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
        .await
        .unwrap_or_else(|_| panic!("{method} {url}: no answer within 30 s"))
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("the whole body within 30 s")
        .expect("the whole body")
        .to_bytes();
    Reply { status: parts.status.as_u16(), headers: parts.headers, body }
}

/// Runs a demo that must refuse to start: its exit status, stdout and stderr.
fn refused(gateway: SocketAddr, admin: SocketAddr, env: &[(&str, &str)]) -> (ExitStatus, String, String) {
    let (mut child, dir) = spawn(gateway, admin, env);
    let deadline = Instant::now() + START_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll idemgate demo") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("idemgate demo did not exit: it started\nstdout:\n{}", read(&dir, "stdout"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, read(&dir, "stdout"), read(&dir, "stderr"))
}

#[tokio::test]
async fn a_repeated_key_is_replayed_and_the_toy_api_counts_one_charge() {
    let demo = Demo::start(&[]);
    let printed = demo.stdout();
    assert!(printed.contains(&format!("gateway on http://{} (embedded store)", demo.gateway)), "{printed}");
    assert!(printed.contains(&format!("curl -s http://{}/v1/charges/count", demo.gateway)), "{printed}");

    let first = demo.charge("", "order-1001").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.replayed());
    let retry = demo.charge("", "order-1001").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(retry.replayed(), "the retry is answered from the store");
    assert_eq!(retry.body, first.body, "the stored response, byte for byte");
    assert_eq!(demo.charges_performed().await, 1, "the toy API charged once");
}

#[tokio::test]
async fn a_duplicate_during_a_slow_charge_gets_409_and_the_toy_api_charges_once() {
    let demo = Demo::start(&[]);
    let printed = demo.stdout();
    assert!(printed.contains("?slow_ms=3000' -H 'Idempotency-Key: order-1003'"), "{printed}");
    assert!(printed.contains("-d '{\"amount\": 700}' &\n"), "the 409 step runs two curls in the background: {printed}");

    // Sent together: whichever reaches the gateway first is charged (for
    // 3 s), the other meets it in flight.
    let (a, b) = tokio::join!(demo.charge("?slow_ms=3000", "order-1003"), demo.charge("?slow_ms=3000", "order-1003"));
    let mut statuses = [a.status, b.status];
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 409], "{}\n{}", a.text(), b.text());
    let conflict = if a.status == 409 { &a } else { &b };
    assert_eq!(conflict.problem(), "request-in-flight");
    assert!(conflict.headers.contains_key("retry-after"), "the 409 says when to retry");
    assert_eq!(demo.charges_performed().await, 1, "the duplicate never reached the toy API");

    let later = demo.charge("?slow_ms=3000", "order-1003").await;
    assert!(later.status == 201 && later.replayed(), "after the first finishes, its result: {}", later.text());
    assert_eq!(demo.charges_performed().await, 1);
}

#[tokio::test]
async fn a_bad_slow_ms_is_a_400_with_a_json_error_and_charges_nothing() {
    let demo = Demo::start(&[]);
    for query in ["?slow_ms=10001", "?slow_ms=soon", "?slow_ms=-5"] {
        let reply = demo.charge(query, &format!("bad{query}")).await;
        assert_eq!(reply.status, 400, "{query}: {}", reply.text());
        assert_eq!(reply.headers["content-type"], "application/json");
        let value: serde_json::Value = serde_json::from_slice(&reply.body).expect("a JSON error");
        assert!(value["error"].as_str().is_some_and(|e| e.contains("slow_ms")), "{value}");
    }
    assert_eq!(demo.charges_performed().await, 0);
}

/// A taken port fails at once, exit 2, naming the address, and nothing
/// claims the demo is running: the listeners are bound before anything is
/// printed. A config `serve` refuses, `demo` refuses the same way.
#[test]
fn a_taken_port_or_a_bad_setting_exits_2_at_once_and_prints_no_instructions() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind a port to hold");
    let held = taken.local_addr().unwrap();
    let cases = [
        ("the admin port", loopback(), held, &[][..], format!("idemgate: cannot listen on {held}")),
        ("the gateway port", held, loopback(), &[][..], format!("idemgate: cannot listen on {held}")),
        ("a short token", loopback(), loopback(), &[("IDEMGATE__ADMIN__TOKEN", "short")][..], "at least 16".into()),
    ];
    for (what, gateway, admin, env, message) in cases {
        let (status, stdout, stderr) = refused(gateway, admin, env);
        assert_eq!(status.code(), Some(2), "{what}: {stderr}");
        assert!(stderr.contains(&message), "{what}: expected {message:?} in:\n{stderr}");
        assert!(stdout.is_empty(), "{what}: printed although it never ran:\n{stdout}");
    }
    drop(taken);
}

#[tokio::test]
async fn the_admin_api_takes_its_token_from_idemgate_admin_token() {
    let demo = Demo::start(&[("IDEMGATE__ADMIN__TOKEN", TOKEN)]);
    let printed = demo.stdout();
    assert!(!printed.contains(TOKEN), "the token is never printed:\n{printed}");
    let step = format!(
        r#"curl -s http://{}/admin/keys/order-1001 -H "Authorization: Bearer $IDEMGATE__ADMIN__TOKEN""#,
        demo.admin
    );
    assert!(printed.contains(&step), "{printed}");

    assert_eq!(demo.charge("", "order-1001").await.status, 201);
    let record = demo.admin_key("order-1001", Some(TOKEN)).await;
    assert_eq!(record.status, 200, "{}", record.text());
    let value: serde_json::Value = serde_json::from_slice(&record.body).expect("a JSON record");
    assert_eq!(value["state"], "completed", "{value}");
    assert_eq!(value["status"], 201, "{value}");
    for token in [None, Some("demo-test-token-wrong-000000")] {
        let refused = demo.admin_key("order-1001", token).await;
        assert_eq!(refused.status, 401, "{token:?}: {}", refused.text());
    }
    assert!(!demo.stderr().contains(TOKEN), "nor logged");
}

#[tokio::test]
async fn without_a_token_the_instructions_say_how_to_turn_the_admin_api_on() {
    let demo = Demo::start(&[]);
    let printed = demo.stdout();
    assert!(
        printed.contains(&format!("admin API on http://{} is off: no admin token is set", demo.admin)),
        "{printed}"
    );
    assert!(printed.contains("IDEMGATE__ADMIN__TOKEN=<16 or more random characters> idemgate demo"), "{printed}");
    let off = demo.admin_key("order-1001", Some(TOKEN)).await;
    assert_eq!(off.status, 403, "{}", off.text());
    let metrics = send("GET", &format!("http://{}/metrics", demo.admin), &[], "").await;
    assert_eq!(metrics.status, 200, "metrics need no token, as printed");
}

/// Steps 8 and 9 exactly as printed, pasted into bash: the lines a
/// newcomer runs (they need curl and openssl, as docs/demo.md says).
#[tokio::test]
async fn the_printed_webhook_lines_deliver_one_event_three_times_and_fulfil_it_once() {
    for tool in ["bash", "curl", "openssl"] {
        if Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().map_or(true, |o| !o.status.success())
        {
            eprintln!("skipped: {tool} is not installed");
            return;
        }
    }
    let demo = Demo::start(&[]);
    let printed = demo.stdout();
    let steps = &printed[printed.find("\n8. ").expect("step 8")..printed.find("\n\nPress").expect("the end")];
    let script: Vec<&str> =
        steps.lines().filter_map(|line| line.strip_prefix("   ")).filter(|line| !line.starts_with("secret ")).collect();
    let script = script.join("\n");
    let output = tokio::task::spawn_blocking(move || Command::new("bash").args(["-c", &script]).output())
        .await
        .unwrap()
        .expect("run bash");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 3, "{out}");
    assert_eq!(out.matches("idempotent-replayed: true").count(), 2, "{out}");
    assert!(out.contains("HTTP/1.1 401 Unauthorized") && out.contains("webhook-signature"), "{out}");
    assert!(out.trim_end().ends_with(r#"{"fulfilments_performed":1}"#), "{out}");
}
