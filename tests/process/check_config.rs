//! `idemgate check-config` against an outbox config, as users run it: it
//! counts the true worst-case retry window, warns about a destination
//! timeout above the lease, redacts credentials in destination URLs, and
//! refuses exactly what `relay` refuses, with the same message.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support;

use support::config_file::ConfigFile;

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");

/// Runs the binary to its end, killing it after `limit`.
fn run(args: &[&str], limit: Duration) -> Output {
    let mut child =
        Command::new(BINARY).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start idemgate");
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn check_config(config: &ConfigFile) -> Output {
    run(&["check-config", "--config", config.path()], Duration::from_secs(20))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The shared server, plaintext, and an outbox schema nobody created: a
/// relay that got as far as the database would stop on that instead.
fn database_url() -> String {
    let url = support::services::postgres_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}sslmode=disable")
}

#[test]
fn a_window_of_timeouts_and_capped_waits_beyond_the_key_retention_is_warned_about() {
    // 3 attempts of 1 s and 2 waits of 50 ms + 10 ms: 3.12 s against 1 s.
    let config = ConfigFile::new(
        r#"
[relay]
poll_interval = "10ms"

[destinations.billing]
url = "http://127.0.0.1:9100/charge"
timeout = "1s"
max_attempts = 3
backoff_base = "10ms"
backoff_max = "50ms"
key_retention = "1s"
"#,
    );
    let output = check_config(&config);
    assert!(output.status.success(), "{}", stderr(&output));
    let warnings = stderr(&output);
    assert!(warnings.contains("destinations.billing: the worst-case retry window, 3120ms"), "{warnings}");
    assert!(warnings.contains("key_retention = 1s"), "{warnings}");
}

#[test]
fn a_destination_timeout_above_the_lease_is_warned_about() {
    let config = ConfigFile::new(
        r#"
[relay]
lease = "10s"

[destinations.slow]
url = "http://127.0.0.1:9100/charge"
timeout = "15s"
"#,
    );
    let output = check_config(&config);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("destinations.slow: timeout = 15s exceeds relay.lease = 10s"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_destination_url_is_printed_without_its_password_and_nothing_else_shows_it() {
    let config = ConfigFile::new(
        r#"
[destinations.billing]
url = "https://alice:s3cret@billing.example.com/v1/charge"
"#,
    );
    let output = check_config(&config);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("url = \"https://alice:[redacted]@billing.example.com/v1/charge\""), "{printed}");
    assert!(!printed.contains("s3cret") && !stderr(&output).contains("s3cret"), "{printed}");
}

#[test]
fn a_missing_ca_file_stops_check_config_and_relay_with_the_same_message() {
    let config = ConfigFile::new(&format!(
        r#"
[relay]
database_url = "{url}"
schema = "never_created_{suffix:016x}"

[destinations.billing]
url = "https://billing.example.com/v1/charge"
ca_file = "/nonexistent/billing-ca.pem"
"#,
        url = database_url(),
        suffix = rand::random::<u64>()
    ));
    let checked = check_config(&config);
    assert_eq!(checked.status.code(), Some(2), "{}", stderr(&checked));
    let message = stderr(&checked);
    assert!(
        message.contains("destinations.billing: ca_file: ") && message.contains("/nonexistent/billing-ca.pem"),
        "{message}"
    );
    let relay = run(&["relay", "--config", config.path(), "--admin-listen", "127.0.0.1:0"], Duration::from_secs(20));
    assert_eq!(relay.status.code(), Some(2), "{}", stderr(&relay));
    let line = |text: &str| text.lines().find(|l| l.starts_with("idemgate: ")).map(str::to_owned);
    assert_eq!(line(&stderr(&relay)), line(&message), "relay: {}", stderr(&relay));
}

/// A route, so a store-only config has something to serve.
const ROUTE: &str = "[[routes]]\nname = \"api\"\nprefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n";

#[test]
fn a_sentinel_store_without_wait_replicas_and_a_wait_the_timeouts_leave_no_room_for_are_warned_about() {
    let unsafe_failover = ConfigFile::new(&format!(
        "store = \"redis+sentinel://:data-pw@127.0.0.1:26379,127.0.0.1:26380/payments?sentinel_password=s-pw\"\n{ROUTE}"
    ));
    let output = check_config(&unsafe_failover);
    assert!(output.status.success(), "{}", stderr(&output));
    let warnings = stderr(&output);
    assert!(warnings.contains("add ?wait_replicas=1"), "{warnings}");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("sentinel_password=[redacted]") && !printed.contains("s-pw"), "{printed}");
    assert!(!printed.contains("data-pw"), "{printed}");

    let too_long =
        ConfigFile::new(&format!("store = \"redis://127.0.0.1:6379/0?wait_replicas=1&wait_timeout=3s\"\n{ROUTE}"));
    let warnings = stderr(&check_config(&too_long));
    assert!(warnings.contains("wait_timeout = 3s is not shorter than the store timeout"), "{warnings}");
    assert!(!warnings.contains("add ?wait_replicas=1"), "{warnings}");
}

/// A URL's `timeout=` from before `gateway.store_timeout` bounded every
/// store operation keeps loading, and says what it bounds now.
#[test]
fn a_store_url_timeout_is_accepted_and_said_to_bound_only_connecting() {
    for store in ["redis://127.0.0.1:6379/0?timeout=500ms", "postgres://app@127.0.0.1:5432/app?timeout=2s"] {
        let file = ConfigFile::new(&format!("store = \"{store}\"\n[gateway]\nstore_timeout = \"700ms\"\n{ROUTE}"));
        let output = check_config(&file);
        assert!(output.status.success(), "{store}: {}", stderr(&output));
        let warnings = stderr(&output);
        assert!(
            warnings.contains("timeout= bounds only connecting") && warnings.contains("gateway.store_timeout = 700ms"),
            "{store}: {warnings}"
        );
    }
    let without = ConfigFile::new(&format!("store = \"redis://127.0.0.1:6379/0\"\n{ROUTE}"));
    assert!(!stderr(&check_config(&without)).contains("timeout="));
}

/// A typo next to a secret: a value without its quotes, a string without
/// its closing quote. The error gives the line, the column and what was
/// expected, and neither output shows the line, so not the secret either.
#[test]
fn a_parse_error_on_a_line_holding_a_secret_names_its_position_and_never_the_value() {
    for (text, line) in [
        ("[relay]\ndatabase_url = postgres://app:S3cretPw@127.0.0.1:5432/app\n", 2),
        (
            "[destinations.billing]\nurl = \"http://127.0.0.1:9100/\"\nheaders = { authorization = \"Bearer S3cretPw }\n",
            3,
        ),
        ("[admin]\ntoken = \"S3cretPw\nauth = \"token\"\n", 2),
    ] {
        let config = ConfigFile::new(text);
        let output = check_config(&config);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        let (out, err) = (String::from_utf8_lossy(&output.stdout), stderr(&output));
        assert!(!out.contains("S3cretPw") && !err.contains("S3cretPw"), "{text}\nstdout: {out}\nstderr: {err}");
        assert!(err.contains(&format!("line {line}, column ")), "{err}");
        assert!(err.contains("expected"), "{err}");
    }
    // A secret pasted into a field of another type: the field and the kinds, not the value.
    let config = ConfigFile::new("[relay]\nlisten = \"S3cretPw\"\n");
    let output = check_config(&config);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("relay.listen: invalid type: string, expected a boolean"), "{err}");
    assert!(!err.contains("S3cretPw"), "{err}");
}

#[test]
fn a_webhook_route_is_warned_about_a_short_key_ttl_and_never_shows_its_secrets() {
    let config = ConfigFile::new(
        r#"
[[routes]]
name = "stripe-events"
prefix = "/webhooks/stripe"
upstream = "http://127.0.0.1:9"
webhook = { scheme = "stripe", secrets = ["whsec_hunter2_old", "whsec_hunter2_new"] }
key_ttl = "1d"

[[routes]]
name = "shopify-orders"
prefix = "/webhooks/shopify"
upstream = "http://127.0.0.1:9"
webhook = { scheme = "shopify", secrets = ["shpss_hunter2"] }
"#,
    );
    let output = check_config(&config);
    assert!(output.status.success(), "{}", stderr(&output));
    let (printed, warnings) = (String::from_utf8_lossy(&output.stdout), stderr(&output));
    assert!(!printed.contains("hunter2") && !warnings.contains("hunter2"), "{printed}\n{warnings}");
    assert!(printed.contains("[redacted]"), "{printed}");
    assert!(
        warnings.contains("route \"stripe-events\": key_ttl = 1d is shorter than the stripe retry window"),
        "{warnings}"
    );
    assert!(!warnings.contains("shopify-orders"), "24h covers Shopify's 4 hours: {warnings}");
}

#[test]
fn an_empty_secrets_file_stops_check_config_naming_the_file() {
    let config = ConfigFile::new("");
    let secrets = std::path::Path::new(config.path()).with_file_name("stripe-whsec");
    std::fs::write(&secrets, "# rotated: nothing yet\n\n").unwrap();
    let config = ConfigFile::new(&format!(
        "[[routes]]\nname = \"hooks\"\nupstream = \"http://127.0.0.1:9\"\nwebhook = {{ scheme = \"stripe\", secrets_file = {:?} }}\n",
        secrets.to_str().unwrap()
    ));
    let output = check_config(&config);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("holds no secret") && stderr(&output).contains("stripe-whsec"),
        "{}",
        stderr(&output)
    );
    drop(secrets);
}
