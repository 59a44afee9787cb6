//! The operators' console in a real browser: Debian's `chromium` driven by
//! `playwright-core` (`tests/browser/console.mjs`), against a gateway (in
//! this process, Redis store), an `idemgate relay` process, Postgres and a
//! recording destination.
//!
//! The script drives the page; this side owns the servers and answers the
//! script's questions on its stdin (`ask upstream-count`, `ask delivered`,
//! `ask sink-accept`), so every effect is counted where it happens: at the
//! upstream and in the outbox's delivered history. Screenshots of each page
//! at 1280 px and 375 px land in `target/tmp/console-screenshots/`.
//!
//! Without `node`, `/usr/bin/chromium` or `tests/browser/node_modules`
//! (`npm ci --prefix tests/browser`) the test says so loudly and passes,
//! unless `IDEMGATE_REQUIRE_BROWSER=1` (as `.ci/run` sets), where it fails.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idemgate::config::{DestinationConfig, Secret, ServiceUrl};
use idemgate::outbox::enqueue::Message;
use support::gateway::{TestGateway, config};
use support::outbox::{DESTINATION, Fixture};
use support::redis_server::{shared_redis_url, unique_prefix};
use support::relay_process::RelayProcess;
use support::upstream::Upstream;

const TOKEN: &str = "console-admin-token-0123456789";
const CHROMIUM: &str = "/usr/bin/chromium";

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// Why the browser test cannot run here, if it cannot.
fn missing_tools() -> Option<String> {
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if !node {
        return Some("node is not installed (apt-get install nodejs)".into());
    }
    if !Path::new(CHROMIUM).exists() {
        return Some(format!("{CHROMIUM} is missing (apt-get install chromium)"));
    }
    if !browser_dir().join("node_modules/playwright-core").exists() {
        return Some(
            "playwright-core is not installed (PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix tests/browser)"
                .into(),
        );
    }
    None
}

fn relay_toml(fixture: &Fixture) -> String {
    format!(
        r#"
[admin]
token = "{TOKEN}"

[relay]
database_url = "{db}"
schema = "{schema}"
lease = "2s"
poll_interval = "100ms"
reap_interval = "200ms"

[destinations.{DESTINATION}]
url = "{url}"
timeout = "3s"
backoff_base = "20ms"
backoff_max = "100ms"
max_attempts = 3
"#,
        db = fixture.schema.url,
        schema = fixture.schema.name(),
        url = fixture.sink.url(),
    )
}

/// Waits (bounded) until `condition` holds, checking every 50 ms.
async fn eventually<F: Future<Output = bool>>(what: &str, mut condition: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_redrives_a_dead_row_and_purges_a_key_in_a_real_browser() {
    if let Some(why) = missing_tools() {
        assert!(std::env::var_os("IDEMGATE_REQUIRE_BROWSER").is_none(), "IDEMGATE_REQUIRE_BROWSER is set but {why}");
        eprintln!(
            "\n!!! SKIPPED the console browser test: {why}.\n!!! Set IDEMGATE_REQUIRE_BROWSER=1 to make this a failure.\n"
        );
        return;
    }
    let fixture = Fixture::start().await;
    let upstream = Upstream::start().await;
    let mut gateway_config = config(&upstream.url(), &format!("{}?prefix={}", shared_redis_url(), unique_prefix()));
    gateway_config.admin.token = Some(Secret::new(TOKEN));
    gateway_config.relay.database_url = Some(ServiceUrl::new(fixture.schema.url.clone()));
    gateway_config.relay.schema = fixture.schema.name().to_owned();
    gateway_config.destinations.insert(DESTINATION.into(), DestinationConfig::new(fixture.sink.url()));
    let gateway = TestGateway::start(gateway_config).await;

    // A head that dies (the destination refuses it), and a later row of its ordering key held behind it.
    fixture.sink.fail_with(Some(400));
    // The head carries a trace context: the console shows its trace id.
    let payload = serde_json::json!({ "n": 1 });
    let head = Message::new(DESTINATION, "notify", "<b>order-9</b>", &payload)
        .ordered_by("customer:9")
        .traced("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
    fixture.enqueue_message(&head).await;
    fixture.enqueue("order-10", serde_json::json!({ "n": 2 }), Some("customer:9")).await;
    let relay = RelayProcess::start(&relay_toml(&fixture));
    let outbox = &fixture;
    eventually("the head to die", || async move { outbox.count("state = 'dead'").await == 1 }).await;

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&shots).expect("create the screenshot directory");
    let mut node = Command::new("node")
        .arg(browser_dir().join("console.mjs"))
        .current_dir(browser_dir())
        .env("GATEWAY_URL", format!("http://{}", gateway.addr))
        .env("GATEWAY_ADMIN_URL", format!("http://{}", gateway.admin_addr))
        .env("RELAY_ADMIN_URL", format!("http://{}", relay.admin))
        .env("ADMIN_TOKEN", TOKEN)
        .env("SHOTS_DIR", &shots)
        .env("CHROMIUM", CHROMIUM)
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start node");
    let mut answers = node.stdin.take().expect("node's stdin");
    let questions = BufReader::new(node.stdout.take().expect("node's stdout"));
    // The script's questions, read on a thread of their own (the pipe blocks) and answered
    // here one at a time until it ends (its stdout closes).
    let (lines, mut incoming) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in questions.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut asked = Vec::new();
    while let Some(line) = incoming.recv().await {
        let Some(question) = line.strip_prefix("ask ") else {
            eprintln!("console.mjs: {line}");
            continue;
        };
        let answer = match question {
            "upstream-count" => upstream.total().to_string(),
            "delivered" => fixture.delivered().await.to_string(),
            "sink-accept" => {
                fixture.sink.fail_with(None);
                "ok".to_owned()
            }
            other => panic!("console.mjs asked something unknown: {other:?}"),
        };
        asked.push(question.to_owned());
        writeln!(answers, "{answer}").expect("answer node");
        answers.flush().expect("answer node");
    }
    let status = node.wait().expect("wait for node");
    assert!(status.success(), "console.mjs failed ({status}); relay log:\n{}", relay.log_tail(30));

    // What the page did, counted where it happened.
    assert!(asked.contains(&"sink-accept".to_owned()), "the script redrove: {asked:?}");
    assert_eq!(fixture.count("true").await, 0, "both rows delivered, none left");
    assert_eq!(fixture.delivered().await, 2);
    assert_eq!(upstream.total(), 2, "one first request, one run again after the purge");
    for shot in ["sign-in-refused", "gateway", "key", "purge-confirm", "outbox", "redrive-confirm", "relay-outbox"] {
        for width in ["desktop", "phone"] {
            let file = shots.join(format!("{shot}-{width}.png"));
            assert!(file.exists(), "{} was not written", file.display());
        }
    }
}
