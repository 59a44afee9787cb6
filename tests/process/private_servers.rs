//! `cargo test` on a machine where nothing runs: the test support starts a
//! private PostgreSQL and Redis for its process, and stops them when the
//! process exits.
//!
//! The parent test runs this very binary again as a child, with
//! `IDEMGATE_TEST_PRIVATE_SERVERS=1` (what happens when neither server runs
//! and neither variable is set), asking for the child test alone. The
//! child uses both servers through the support as every test does, and
//! prints their addresses; once the child has exited, nothing may listen
//! there any more.

use crate::support;

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD: &str = "IDEMGATE_TEST_PRIVATE_SERVERS_CHILD";

#[test]
fn without_running_servers_the_suite_starts_its_own_and_stops_them_when_it_exits() {
    // The child's name as the harness lists it: this module's path less the crate.
    let module = module_path!().split_once("::").map_or("", |(_, module)| module);
    let child = format!("{module}::the_child_uses_both_servers");
    let output = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", child.as_str(), "--ignored", "--nocapture", "--test-threads", "1"])
        .env("IDEMGATE_TEST_PRIVATE_SERVERS", "1")
        .env(CHILD, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    // Each report may share its line with the test harness's own output.
    let addresses: Vec<String> = stdout
        .split("private server at ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next().map(str::to_owned))
        .collect();
    assert_eq!(addresses.len(), 2, "both servers reported:\n{stdout}");
    for address in &addresses {
        assert!(!address.ends_with(":5432") && !address.ends_with(":6379"), "private, not shared: {address}");
    }
    // The watchdog polls every 0.5 s and gives each server 5 s to stop.
    let deadline = Instant::now() + Duration::from_secs(20);
    for address in &addresses {
        while TcpStream::connect(address.as_str()).is_ok() {
            assert!(Instant::now() < deadline, "{address} still listens after the child exited");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The child of the test above, which runs it with the private servers
/// forced; ignored otherwise, so it never passes without having run.
#[tokio::test]
#[ignore = "run by the test above as its child"]
async fn the_child_uses_both_servers() {
    assert!(std::env::var_os(CHILD).is_some(), "run only as the child of the test above");
    let schema = support::postgres::TestSchema::create().await;
    let client = schema.connect().await;
    let one: i32 = client.query_one("SELECT 1", &[]).await.expect("a query").get(0);
    assert_eq!(one, 1);
    let redis_url = support::redis_server::shared_redis_url();
    let client = redis::Client::open(redis_url.as_str()).expect("a Redis URL");
    let mut connection = client.get_multiplexed_async_connection().await.expect("a Redis connection");
    let pong: String = redis::cmd("PING").query_async(&mut connection).await.expect("PING");
    assert_eq!(pong, "PONG");
    for url in [support::postgres::shared_database_url(), redis_url] {
        let authority = url.split_once("://").unwrap().1.split('/').next().unwrap();
        println!("private server at {}", authority.rsplit_once('@').map_or(authority, |(_, h)| h));
    }
}
