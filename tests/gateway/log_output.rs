//! The log output of the `idemgate` binary when nobody reads it: requests
//! never wait for stderr, every line is written by the time the process
//! exits, and a stderr that takes nothing at all does not keep it from
//! exiting.

use crate::support;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::redis_server::free_port;
use support::upstream::Upstream;

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");

/// Far more request lines (about 170 bytes each) than a pipe holds (64 KiB
/// on Linux), and far fewer than the 4 MiB the gateway buffers.
const REQUESTS: usize = 2_000;

#[tokio::test(flavor = "multi_thread")]
async fn requests_never_wait_for_a_stalled_stderr_and_every_line_is_written_at_exit() {
    let upstream = Upstream::start().await;
    // A pipe that nothing reads until the end: it fills, then stays full.
    let (mut child, addr, admin) = start_with_unread_stderr(&upstream);
    let client = client();
    post_all(&client, addr, "log").await;
    let metrics = http::Request::get(format!("http://{admin}/metrics"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let metrics = client.request(metrics).await.expect("metrics");
    let metrics = http_body_util::BodyExt::collect(metrics.into_body()).await.unwrap().to_bytes();
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(metrics.lines().any(|l| l == "idemgate_log_lines_dropped_total 0"), "{metrics}");

    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let mut stderr = child.stderr.take().unwrap();
    let logs = tokio::task::spawn_blocking(move || {
        let mut logs = String::new();
        stderr.read_to_string(&mut logs).expect("read the gateway's stderr");
        logs
    })
    .await
    .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
    let forwarded = logs.lines().filter(|l| l.contains("outcome=\"forwarded\" status=201")).count();
    assert_eq!(forwarded, REQUESTS, "one line per request, none lost");
    let last_request = logs.rfind("outcome=\"forwarded\"").unwrap();
    let draining = logs.find("shutting down: draining connections").expect("the shutdown's line is written");
    assert!(draining > last_request, "lines come out in the order they were logged");
    assert_eq!(upstream.keys().len(), REQUESTS);
}

/// A stderr that nobody ever reads: the pipe fills, the log writer blocks
/// on it for good. SIGTERM still ends the process (it waits for stderr at
/// most `log_sink::FINAL_WAIT`, and drops what is still waiting).
#[tokio::test(flavor = "multi_thread")]
async fn a_stderr_nobody_ever_reads_does_not_keep_the_process_from_exiting() {
    let upstream = Upstream::start().await;
    let (mut child, addr, _) = start_with_unread_stderr(&upstream);
    post_all(&client(), addr, "stuck").await;

    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // A bound for a process that would wait for its stderr forever.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("idemgate serve did not exit within 60 s of SIGTERM: it waits for a stderr nobody reads");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    // Only now is the pipe read: it holds what stderr took before it filled.
    let mut logs = String::new();
    child.stderr.take().unwrap().read_to_string(&mut logs).unwrap();
    assert!(logs.contains("outcome=\"forwarded\" status=201"), "{logs}");
    assert_eq!(upstream.keys().len(), REQUESTS);
}

/// `idemgate serve` on fresh ports in front of `upstream`, its stderr a
/// pipe this test reads only when it chooses to; returns once it listens.
fn start_with_unread_stderr(upstream: &Upstream) -> (Child, SocketAddr, SocketAddr) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut child = Command::new(BINARY)
        .args(["serve", "--listen", &addr.to_string(), "--admin-listen", &admin.to_string()])
        .args(["--upstream", &upstream.url(), "--store", "memory://"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start idemgate serve");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "idemgate serve exited before listening");
        assert!(Instant::now() < deadline, "idemgate serve did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, addr, admin)
}

/// [`REQUESTS`] guarded POSTs with keys `<prefix>-<n>`, each answered 201.
async fn post_all(client: &Client, addr: SocketAddr, prefix: &str) {
    for n in 0..REQUESTS {
        let request = http::Request::post(format!("http://{addr}/charge"))
            .header("idempotency-key", format!("{prefix}-{n}"))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{\"amount\":1}")))
            .unwrap();
        // A bound for a gateway blocked on its stderr, which would never answer.
        let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
            .await
            .unwrap_or_else(|_| panic!("request {n} got no answer: the gateway waits for its stderr"))
            .expect("the gateway answered");
        assert_eq!(response.status(), 201, "request {n}");
    }
}

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

fn client() -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}
