use std::time::Duration;

use super::*;

fn load(text: &str, env: &[(&str, &str)], flags: &Overrides) -> Result<Config, ConfigError> {
    let dir = std::env::temp_dir().join(format!("idemgate-config-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("idemgate.toml");
    std::fs::write(&path, text).unwrap();
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    let result = Config::load(Some(&path), env, flags);
    std::fs::remove_dir_all(&dir).unwrap();
    result
}

/// The sample from DESIGN.md must keep loading: users' files rely on these names.
const DESIGN_SAMPLE: &str = r#"
listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:9090"
store = "redis://127.0.0.1:6379/0"

[gateway]
key_ttl = "24h"
lease = "30s"
upstream_timeout = "20s"
max_request_body = "1MiB"
max_stored_response = "1MiB"
fail_mode = "closed"
concurrent = "reject"
tenant = { from = "authorization" }
forward_key = "original"

[[routes]]
name = "payments"
prefix = "/v1/"
upstream = "http://127.0.0.1:9000"
methods = ["POST", "PATCH"]
require_key = true

[relay]
database_url = "postgres://postgres@127.0.0.1:5432/app"

[destinations.email]
url = "http://127.0.0.1:9100/send"
method = "POST"
timeout = "5s"
max_attempts = 12
"#;

#[test]
fn the_design_sample_loads() {
    let config = load(DESIGN_SAMPLE, &[], &Overrides::default()).unwrap();
    assert_eq!(config.routes[0].name, "payments");
    assert!(config.routes[0].require_key);
    assert_eq!(config.gateway.lease.0, Duration::from_secs(30));
    assert_eq!(config.destinations["email"].max_attempts, 12);
}

#[test]
fn environment_overrides_the_file_and_flags_override_both() {
    let env = [
        ("IDEMGATE__GATEWAY__LEASE", "45s"),
        ("IDEMGATE__GATEWAY__FAIL_MODE", "open"),
        ("IDEMGATE__LISTEN", "127.0.0.1:1"),
        ("OTHER", "x"),
    ];
    let flags = Overrides { listen: Some("127.0.0.1:2".parse().unwrap()), ..Default::default() };
    let config = load(DESIGN_SAMPLE, &env, &flags).unwrap();
    assert_eq!(config.gateway.lease.0, Duration::from_secs(45));
    assert_eq!(config.gateway.fail_mode, FailMode::Open);
    assert_eq!(config.listen, "127.0.0.1:2".parse().unwrap());
}

#[test]
fn upstream_flag_alone_makes_one_route() {
    let flags = Overrides { upstream: Some("http://127.0.0.1:9000".into()), ..Default::default() };
    let config = Config::load(None, Vec::new(), &flags).unwrap();
    assert_eq!(config.routes.len(), 1);
    assert_eq!(config.routes[0].prefix, "/");
    assert_eq!(config.store.scheme(), "memory");
}

#[test]
fn typos_and_bad_values_are_errors_that_name_the_field() {
    let err = load("[gateway]\nleese = \"30s\"\n", &[], &Overrides::default()).unwrap_err().to_string();
    assert!(err.contains("leese"), "{err}");
    let err = load("[gateway]\nlease = \"30\"\n", &[], &Overrides::default()).unwrap_err().to_string();
    assert!(err.contains("lease") && err.contains("ms, s, m, h, d"), "{err}");
    let err = load("store = \"mongodb://x\"\n", &[], &Overrides::default()).unwrap_err().to_string();
    assert!(err.contains("scheme"), "{err}");
    let err =
        load("[[routes]]\nname = \"a\"\nupstream = \"ftp://x\"\n", &[], &Overrides::default()).unwrap_err().to_string();
    assert!(err.contains("http://"), "{err}");
    let err = load("[gateway]\ntenant = { from = \"authorization\", fixed = \"x\" }\n", &[], &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("exactly one"), "{err}");
    let err = load("[gateway]\nrelease_statuses = [503]\n", &[], &Overrides::default()).unwrap_err().to_string();
    assert!(err.contains("below 500"), "{err}");
}

#[test]
fn limits_that_contradict_each_other_are_refused() {
    let err = load("[gateway]\nupstream_timeout = \"10s\"\nupstream_deadline = \"5s\"\n", &[], &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("upstream_deadline"), "{err}");
    let err =
        load("[gateway]\nmax_request_body = \"2MiB\"\nconnection_body_budget = \"1MiB\"\n", &[], &Overrides::default())
            .unwrap_err()
            .to_string();
    assert!(err.contains("connection_body_budget"), "{err}");
    let err = load("[gateway]\nidle_timeout = \"0s\"\n", &[], &Overrides::default()).unwrap_err().to_string();
    assert!(err.contains("idle_timeout"), "{err}");
    let on_unknown = "[[routes]]\nname = \"a\"\nupstream = \"http://127.0.0.1:1\"\non_unknown = \"release\"\n";
    let config = load(on_unknown, &[], &Overrides::default()).unwrap();
    assert_eq!(config.routes[0].on_unknown, Some(crate::config::OnUnknown::Release));
}

#[test]
fn secrets_never_print() {
    let env = [("IDEMGATE__ADMIN__TOKEN", "s3cret-token")];
    let config = load("store = \"redis://:hunter2@127.0.0.1:6379/0\"\n", &env, &Overrides::default()).unwrap();
    let printed = format!("{config:?} {}", toml::to_string(&config).unwrap());
    assert!(!printed.contains("s3cret-token") && !printed.contains("hunter2"), "{printed}");
    assert_eq!(config.admin.token.as_ref().unwrap().expose(), "s3cret-token");
    assert_eq!(config.store.redacted(), "redis://:[redacted]@127.0.0.1:6379/0");
}

#[test]
fn a_password_in_the_query_is_redacted_too() {
    let url = crate::config::ServiceUrl::new("postgres://app@db/app?sslmode=require&password=hunter2&x=1");
    assert_eq!(url.redacted(), "postgres://app@db/app?sslmode=require&password=[redacted]&x=1");
    let url = crate::config::ServiceUrl::new("postgres://db/app?password=hunter2");
    assert_eq!(url.redacted(), "postgres://db/app?password=[redacted]");
    let url = crate::config::ServiceUrl::new(
        "rediss+sentinel://:data@s1:26379,s2:26379/pay/0?sentinel_password=s3&wait_replicas=1",
    );
    assert_eq!(
        url.redacted(),
        "rediss+sentinel://:[redacted]@s1:26379,s2:26379/pay/0?sentinel_password=[redacted]&wait_replicas=1"
    );
    assert_eq!(crate::config::ServiceUrl::new("memory://").redacted(), "memory://");
    // A user without a password has nothing to hide.
    let url = crate::config::ServiceUrl::new("postgres://postgres@127.0.0.1:5432/test");
    assert_eq!(url.redacted(), "postgres://postgres@127.0.0.1:5432/test");
}

/// The configuration reference in the README must stay loadable.
#[test]
fn the_readme_configuration_reference_loads() {
    let readme = include_str!("../../README.md");
    let section = &readme[readme.find("## Configuration").expect("a Configuration section")..];
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let block = &section[start..start + section[start..].find("```").expect("closed block")];
    let config = load(block, &[], &Overrides::default()).unwrap();
    assert_eq!(config.routes[0].name, "payments");
    assert_eq!(config.gateway.release_statuses, crate::idempotency::StatusPolicy::default().release);
}

#[test]
fn an_upstream_with_credentials_is_refused_and_never_printed() {
    let flags = Overrides { upstream: Some("http://alice:s3cret@127.0.0.1:9000".into()), ..Overrides::default() };
    let error = Config::load(None, Vec::new(), &flags).unwrap_err().to_string();
    assert!(error.contains("carries credentials") && !error.contains("s3cret"), "{error}");
    let mut config = Config::load(None, Vec::new(), &Overrides::default()).unwrap();
    config.routes.push(RouteConfig { upstream: "http://alice:s3cret@h:1".into(), ..default_route() });
    let printed = toml::to_string(&config).unwrap();
    assert!(!printed.contains("s3cret") && printed.contains("alice:[redacted]@h:1"), "{printed}");
}

fn default_route() -> RouteConfig {
    let flags = Overrides { upstream: Some("http://127.0.0.1:9000".into()), ..Overrides::default() };
    Config::load(None, Vec::new(), &flags).unwrap().routes.remove(0)
}

#[test]
fn errors_name_the_field_and_what_was_expected_but_not_the_value_found() {
    for (text, expected) in [
        ("[relay]\nlisten = \"hunter2-secret\"\n", "relay.listen: invalid type: string, expected a boolean"),
        (
            "[gateway]\nfail_mode = \"hunter2-secret\"\n",
            "gateway.fail_mode: unknown variant, expected `closed` or `open`",
        ),
        ("[relay]\nbatch_size = -5\n", "relay.batch_size: invalid value: integer, expected"),
    ] {
        let err = load(text, &[], &Overrides::default()).unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
        assert!(!err.contains("hunter2") && !err.contains("-5"), "{err}");
    }
}
