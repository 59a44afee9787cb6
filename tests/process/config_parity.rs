//! `check-config` and the commands that start (`serve`, `relay`) share one
//! validation: over a table of good and bad configs, whatever `check-config`
//! accepts the command starts with, and whatever one refuses the other
//! refuses with the same `idemgate: …` line. No output of either shows a
//! secret the config holds.

use crate::support;

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::config_file::ConfigFile;
use support::postgres::TestSchema;
use support::postgres_tls::TestCa;
use support::redis_server::{free_port, shared_redis_url, unique_prefix};

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");

/// Every secret a case holds; no output may show one.
const TOKEN: &str = "s3cret-token-0123456789";
const PASSWORD: &str = "hunter2";

/// What a command did with a config.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// `check-config` exited 0, or the command listened.
    Accepted,
    /// Exit code 2 and this `idemgate: …` line (`error: …` from the
    /// command line parser).
    Refused(String),
}

/// One config, and what must become of it.
struct Case {
    name: &'static str,
    /// `serve` or `relay`: the command that starts with this config.
    starts: &'static str,
    config: String,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    /// `None`: accepted. `Some(text)`: refused, the line containing `text`.
    refused: Option<&'static str>,
}

impl Case {
    fn serve(name: &'static str, config: &str, refused: Option<&'static str>) -> Self {
        Self { name, starts: "serve", config: config.to_owned(), args: Vec::new(), env: Vec::new(), refused }
    }

    fn relay(name: &'static str, config: &str, refused: Option<&'static str>) -> Self {
        Self { starts: "relay", ..Self::serve(name, config, refused) }
    }

    fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }

    fn env(mut self, name: &'static str, value: &str) -> Self {
        self.env.push((name, value.to_owned()));
        self
    }
}

/// Runs one command with the case's config until it exits or listens on
/// its admin port (then it is stopped): what it did, and all it printed.
fn run(case: &Case, file: &ConfigFile, command: &str) -> (Verdict, String) {
    let admin = format!("127.0.0.1:{}", free_port());
    let mut process = Command::new(BINARY);
    process.arg(command).args(["--config", file.path()]);
    if command != "check-config" {
        process.args(["--admin-listen", &admin]);
    }
    if command == "serve" && !case.args.iter().any(|a| a == "--listen") {
        process.args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    }
    process.args(&case.args);
    let mut child = process
        .envs(case.env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run idemgate");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut listened = false;
    while child.try_wait().expect("wait").is_none() {
        if command != "check-config" && TcpStream::connect(&admin).is_ok() {
            listened = true;
            let _ = child.kill();
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{}: `{command}` neither exited nor listened on {admin} within 30 s", case.name);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let verdict = if listened || (command == "check-config" && output.status.success()) {
        Verdict::Accepted
    } else {
        let line = String::from_utf8_lossy(&output.stderr)
            .lines()
            .find(|l| l.starts_with("idemgate: ") || l.starts_with("error: "))
            .map(str::to_owned)
            .unwrap_or_else(|| {
                panic!("{}: `{command}` exited {} without a message:\n{printed}", case.name, output.status)
            });
        assert_eq!(output.status.code(), Some(2), "{}: `{command}`: {printed}", case.name);
        Verdict::Refused(line)
    };
    (verdict, printed)
}

#[tokio::test]
async fn check_config_accepts_exactly_what_serve_and_relay_start_with() {
    let closed = format!("http://127.0.0.1:{}", free_port());
    let redis = format!("{}?prefix={}", shared_redis_url(), unique_prefix());
    let schema = TestSchema::create().await;
    let database = schema.url.clone();
    let ca = TestCa::new("idemgate parity test CA");
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    let dir = std::env::temp_dir().join(format!("idemgate-parity-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_file, key_file, ca_file) = (dir.join("cert.pem"), dir.join("key.pem"), dir.join("ca.pem"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let (cert_file, key_file, ca_file) =
        (cert_file.display().to_string(), key_file.display().to_string(), ca_file.display().to_string());

    let route = |extra: &str| format!("[[routes]]\nname = \"api\"\nprefix = \"/\"\nupstream = \"{closed}\"\n{extra}\n");
    let destination = |extra: &str| {
        format!(
            "[relay]\ndatabase_url = \"{database}\"\nschema = \"{}\"\n\n[destinations.billing]\nurl = \"{closed}/charge\"\n{extra}\n",
            schema.name()
        )
    };
    let cases = [
        // Good configs.
        Case::serve("an upstream alone", "", None).arg("--upstream").arg(&closed),
        Case::serve(
            "two routes, a tenant header, statuses to release",
            &format!(
                "[gateway]\nrelease_statuses = [404]\n[gateway.tenant]\nheader = \"x-tenant\"\n{}\n[[routes]]\nname = \"hooks\"\nprefix = \"/hooks/\"\nupstream = \"{closed}\"\nmethods = [\"POST\"]\nrequire_key = true\n",
                route("")
            ),
            None,
        ),
        Case::serve("a 23-character admin token and JSON logs", &route(""), None)
            .env("IDEMGATE__ADMIN__TOKEN", TOKEN)
            .env("IDEMGATE__LOG__FORMAT", "json"),
        Case::serve("a Redis store", &format!("store = \"{redis}\"\n{}", route("")), None),
        Case::serve(
            "a tenant quota",
            &format!("[gateway]\ntenant_quota = {{ max_keys = 1000, max_bytes = \"64MiB\" }}\n{}", route("")),
            None,
        ),
        Case::serve("a tenant quota of 0 keys", &route(""), Some("max_keys = 0: must be at least 1"))
            .env("IDEMGATE__GATEWAY__TENANT_QUOTA__MAX_KEYS", "0"),
        Case::serve(
            "a TLS listener and a route trusting a private CA",
            &format!(
                "[tls]\ncert_file = \"{cert_file}\"\nkey_file = \"{key_file}\"\n{}",
                route(&format!("ca_file = \"{ca_file}\""))
            ),
            None,
        ),
        Case::relay("a relay with one destination", &destination("timeout = \"5s\""), None),
        Case::serve(
            "a webhook route whose secret comes from the environment",
            &route("webhook = { scheme = \"stripe\", secrets = [\"placeholder\"] }"),
            None,
        )
        .env("IDEMGATE__ROUTES__0__WEBHOOK__SECRETS", &format!("[\"whsec_{PASSWORD}\"]")),
        // Bad configs: the same refusal from both.
        Case::serve("a 5-character admin token", &route(""), Some("at least 16 characters"))
            .env("IDEMGATE__ADMIN__TOKEN", "short"),
        Case::serve("neither routes nor destinations", "", Some("nothing to run")),
        Case::relay("neither destinations nor routes", "[relay]\npool_size = 2\n", Some("nothing to run")),
        Case::serve(
            "certificate and key files that do not exist",
            &format!(
                "[tls]\ncert_file = \"/nonexistent/cert.pem\"\nkey_file = \"/nonexistent/key.pem\"\n{}",
                route("")
            ),
            Some("/nonexistent/cert.pem"),
        ),
        Case::serve("a sealing key file that does not exist", &route(""), Some("store_encryption.key_file"))
            .env("IDEMGATE__STORE_ENCRYPTION__KEY_FILE", "/nonexistent/keys"),
        Case::serve(
            "a route CA file that does not exist",
            &route("ca_file = \"/nonexistent/ca.pem\""),
            Some("/nonexistent/ca.pem"),
        ),
        Case::serve("a store URL that is not one", &format!("store = \"redis://:::::\"\n{}", route("")), Some("store")),
        Case::serve(
            "a store URL with a password and no host",
            &format!("store = \"redis://:{PASSWORD}@/0\"\n{}", route("")),
            Some("store"),
        ),
        Case::serve(
            "a webhook secrets file that does not exist",
            &route("webhook = { scheme = \"github\", secrets_file = \"/nonexistent/github-secret\" }"),
            Some("/nonexistent/github-secret"),
        ),
        Case::serve(
            "a webhook scheme nobody has",
            &route("webhook = { scheme = \"paypal\", secrets = [\"s\"] }"),
            Some("unknown variant"),
        ),
        Case::serve("a misspelt field", &format!("[gateway]\nleese = \"30s\"\n{}", route("")), Some("leese")),
        Case::serve("a duration without a unit", &format!("[gateway]\nlease = \"30\"\n{}", route("")), Some("lease")),
        Case::serve(
            "an unknown fail mode",
            &format!("[gateway]\nfail_mode = \"sometimes\"\n{}", route("")),
            Some("fail_mode"),
        ),
        Case::serve(
            "a route upstream with credentials",
            &format!(
                "[[routes]]\nname = \"api\"\nprefix = \"/\"\nupstream = \"http://alice:{PASSWORD}@127.0.0.1:9/\"\n"
            ),
            Some("api"),
        ),
        Case::serve("a method that is not one", &route("methods = [\"PO ST\"]"), Some("PO ST")),
        Case::serve(
            "a tenant header that is not a header name",
            &format!("[gateway.tenant]\nheader = \"x tenant\"\n{}", route("")),
            Some("x tenant"),
        ),
        Case::serve("a listen flag that is a host name", &route(""), Some("localhost"))
            .arg("--listen")
            .arg("localhost"),
        Case::relay(
            "a destination CA file that does not exist",
            &destination("ca_file = \"/nonexistent/billing-ca.pem\""),
            Some("/nonexistent/billing-ca.pem"),
        ),
        Case::relay(
            "a database URL with an unknown sslmode and a password",
            &format!(
                "[relay]\ndatabase_url = \"postgres://relay:{PASSWORD}@127.0.0.1:5432/app?sslmode=verify\"\n\n[destinations.billing]\nurl = \"{closed}/charge\"\n"
            ),
            Some("sslmode"),
        ),
        Case::relay(
            "a destination URL that is not HTTP",
            &destination("").replace("http://", "ftp://"),
            Some("billing"),
        ),
    ];

    let mut failures = Vec::new();
    for case in &cases {
        let file = ConfigFile::new(&case.config);
        let (checked, check_printed) = run(case, &file, "check-config");
        let (started, start_printed) = run(case, &file, case.starts);
        let expected = |verdict: &Verdict| match (&case.refused, verdict) {
            (None, Verdict::Accepted) => true,
            (Some(why), Verdict::Refused(line)) => line.contains(why),
            _ => false,
        };
        if !expected(&checked) || !expected(&started) || checked != started {
            failures.push(format!(
                "{}:\n  check-config: {checked:?}\n  {}: {started:?}\n  check-config said:\n{check_printed}\n  {} said:\n{start_printed}",
                case.name, case.starts, case.starts
            ));
        }
        for (command, printed) in [("check-config", &check_printed), (case.starts, &start_printed)] {
            if printed.contains(TOKEN) || printed.contains(PASSWORD) {
                failures.push(format!("{}: `{command}` printed a secret:\n{printed}", case.name));
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(failures.is_empty(), "{} of {} cases:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
