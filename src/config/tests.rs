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

[[routes]]
name = "stripe-events"
prefix = "/webhooks/stripe"
upstream = "http://127.0.0.1:9000"
key = { json = "/id" }
webhook = { scheme = "stripe", secrets_file = "/run/secrets/stripe-whsec" }
key_ttl = "7d"

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
    assert_eq!(config.routes[1].webhook.as_ref().map(|w| w.scheme), Some(Scheme::Stripe));
    assert_eq!(config.routes[1].key_source(), KeySource::Json("/id".into()));
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

const WEBHOOK_ROUTE: &str = r#"
[[routes]]
name = "stripe-events"
prefix = "/webhooks/stripe"
upstream = "http://127.0.0.1:9000"
webhook = { scheme = "stripe", secrets = ["whsec_old-hunter2", "whsec_new-hunter3"] }
"#;

#[test]
fn a_webhook_route_takes_its_schemes_key_and_never_prints_its_secrets() {
    let config = load(&format!("{WEBHOOK_ROUTE}key_ttl = \"7d\"\n"), &[], &Overrides::default()).unwrap();
    let route = &config.routes[0];
    assert_eq!(route.key_source(), KeySource::Json("/id".into()));
    assert_eq!(route.key_ttl.unwrap().0, Duration::from_secs(7 * 86_400));
    let printed = format!("{config:?} {}", toml::to_string(&config).unwrap());
    assert!(!printed.contains("hunter") && printed.contains("[redacted]"), "{printed}");
    assert!(config.validate().unwrap().is_empty(), "7d covers Stripe's three days");
    let explicit = WEBHOOK_ROUTE.replace("webhook =", "key = { header = \"X-Event-Id\" }\nwebhook =");
    let config = load(&explicit, &[], &Overrides::default()).unwrap();
    assert_eq!(config.routes[0].key_source(), KeySource::Header(http::HeaderName::from_static("x-event-id")));
}

#[test]
fn the_environment_reaches_a_route_of_the_file_by_its_index() {
    let file =
        WEBHOOK_ROUTE.replace("secrets = [\"whsec_old-hunter2\", \"whsec_new-hunter3\"]", "secrets_file = \"/f\"");
    let env =
        [("IDEMGATE__ROUTES__0__WEBHOOK__SECRETS_FILE", "/run/secrets/stripe"), ("IDEMGATE__ROUTES__0__KEY_TTL", "4d")];
    let config = load(&file, &env, &Overrides::default()).unwrap();
    let webhook = config.routes[0].webhook.as_ref().unwrap();
    assert_eq!(webhook.secrets_file.as_deref(), Some(std::path::Path::new("/run/secrets/stripe")));
    assert_eq!(config.routes[0].key_ttl.unwrap().0, Duration::from_secs(4 * 86_400));
    let env = [("IDEMGATE__ROUTES__0__WEBHOOK__SECRETS", "[\"whsec_env-hunter4\"]")];
    let config = load(WEBHOOK_ROUTE, &env, &Overrides::default()).unwrap();
    assert_eq!(config.routes[0].webhook.as_ref().unwrap().secrets, [Secret::new("whsec_env-hunter4")]);
    assert!(!toml::to_string(&config).unwrap().contains("hunter4"));
    for missing in ["IDEMGATE__ROUTES__1__KEY_TTL", "IDEMGATE__ROUTES__KEY_TTL", "IDEMGATE__ROUTES__x__KEY_TTL"] {
        let error = load(&file, &[(missing, "4d")], &Overrides::default()).unwrap_err().to_string();
        assert!(error.contains("routes is a list of 1"), "{missing}: {error}");
    }
}

#[test]
fn a_key_ttl_shorter_than_the_providers_retry_window_is_a_warning() {
    let config = load(WEBHOOK_ROUTE, &[], &Overrides::default()).unwrap();
    let warnings = config.validate().unwrap();
    assert!(warnings.iter().any(|w| w.contains("stripe-events") && w.contains("retry window")), "{warnings:?}");
    assert!(!warnings.iter().any(|w| w.contains("hunter")), "{warnings:?}");
}

#[test]
fn bad_key_sources_and_webhooks_are_refused_naming_the_field() {
    let route = "[[routes]]\nname = \"w\"\nupstream = \"http://127.0.0.1:1\"\n";
    for (extra, expected) in [
        ("key = { json = \"id\" }", "starts with '/'"),
        ("key = { json = \"/a~2\" }", "RFC 6901"),
        ("key = { json = \"/id\", header = \"x\" }", "exactly one"),
        ("key = { header = \"bad header\" }", "not a valid header name"),
        ("webhook = { scheme = \"paypal\", secrets = [\"s\"] }", "unknown variant"),
        ("webhook = { scheme = \"github\" }", "secrets"),
        ("webhook = { scheme = \"github\", secrets = [\"s\"], secrets_file = \"/f\" }", "not both"),
        ("webhook = { scheme = \"github\", secrets = [\"s\"], tolerance = \"0s\" }", "tolerance"),
        ("methods = [\"PUT\"]\nwebhook = { scheme = \"github\", secrets = [\"s\"] }", "must guard POST"),
        ("key_ttl = \"1s\"", "key_ttl"),
    ] {
        let err = load(&format!("{route}{extra}\n"), &[], &Overrides::default()).unwrap_err().to_string();
        assert!(err.contains(expected), "{extra}: {err}");
    }
}

/// `docs/configuration.md`, the configuration reference.
const REFERENCE: &str = include_str!("../../docs/configuration.md");

/// The `toml` blocks of a Markdown page, in order.
fn toml_blocks(page: &str) -> Vec<&str> {
    page.split("```toml\n").skip(1).map(|rest| &rest[..rest.find("```").expect("a closed toml block")]).collect()
}

/// The field names a derived `Deserialize` accepts, as serde lists them
/// for its own error messages: the deserializer below is asked for a
/// struct, records the names it is given and stops there. This is the
/// list `deny_unknown_fields` checks against, so it cannot drift from
/// what the loader takes.
fn fields_of<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    match T::deserialize(FieldNames) {
        Err(FieldNamesError::Fields(fields)) => fields,
        Err(FieldNamesError::Other(why)) => panic!("{} is not read as a struct: {why}", std::any::type_name::<T>()),
        Ok(_) => unreachable!("FieldNames never yields a value"),
    }
}

struct FieldNames;

#[derive(Debug)]
enum FieldNamesError {
    Fields(&'static [&'static str]),
    Other(String),
}

impl std::fmt::Display for FieldNamesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for FieldNamesError {}

impl serde::de::Error for FieldNamesError {
    fn custom<T: std::fmt::Display>(message: T) -> Self {
        Self::Other(message.to_string())
    }
}

impl<'de> serde::Deserializer<'de> for FieldNames {
    type Error = FieldNamesError;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(FieldNamesError::Other("not a struct".into()))
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        Err(FieldNamesError::Fields(fields))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// Every table of the config file, by its path (`[]` an element of an
/// array of tables, `*` any key of a map), and the fields its type takes.
/// A table the reference shows that is not listed here fails the test, so
/// a new section or table-valued field cannot go unchecked.
fn tables() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        ("", fields_of::<Config>()),
        ("tls", fields_of::<TlsConfig>()),
        ("log", fields_of::<LogConfig>()),
        ("gateway", fields_of::<GatewayConfig>()),
        ("gateway.tenant", fields_of::<TenantConfig>()),
        ("gateway.tenant_quota", fields_of::<crate::config::TenantQuota>()),
        ("routes[]", fields_of::<RouteConfig>()),
        ("routes[].key", fields_of::<KeySource>()),
        ("routes[].webhook", fields_of::<WebhookConfig>()),
        ("admin", fields_of::<AdminConfig>()),
        ("store_encryption", fields_of::<StoreEncryptionConfig>()),
        ("relay", fields_of::<RelayConfig>()),
        ("destinations.*", fields_of::<DestinationConfig>()),
    ]
}

/// Tables whose keys are names the user picks, not fields.
const MAPS: &[(&str, &str)] = &[("destinations", "destinations.*"), ("destinations.*.headers", "")];

/// Collects `table.field` for every field written in `value`, the table at `path`.
fn written_fields(path: &str, value: &toml::Value, known: &[(&str, &[&str])], written: &mut Vec<String>) {
    let Some(table) = value.as_table() else { return };
    if let Some((_, entries)) = MAPS.iter().find(|(map, _)| *map == path) {
        if !entries.is_empty() {
            table.values().for_each(|entry| written_fields(entries, entry, known, written));
        }
        return;
    }
    assert!(known.iter().any(|(p, _)| *p == path), "the reference shows a table at `{path}`: add its type to tables()");
    for (name, value) in table {
        let field = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
        written.push(field.clone());
        match value {
            toml::Value::Array(items) if items.iter().all(toml::Value::is_table) && !items.is_empty() => {
                items.iter().for_each(|item| written_fields(&format!("{field}[]"), item, known, written))
            }
            value => written_fields(&field, value, known, written),
        }
    }
}

fn value<T: serde::Serialize>(v: &T) -> toml::Value {
    toml::Value::try_from(v).unwrap()
}

/// The reference loads, names every field the loader accepts and no other,
/// and its first block shows the defaults.
#[test]
fn the_configuration_reference_is_complete() {
    let blocks = toml_blocks(REFERENCE);
    assert!(blocks.len() >= 3, "docs/configuration.md lost its toml blocks");
    let known = tables();
    let mut written = Vec::new();
    for block in &blocks {
        // The real loader: file, schema (deny_unknown_fields), validation.
        load(block, &[], &Overrides::default()).unwrap_or_else(|e| panic!("{e}\nin this block:\n{block}"));
        written_fields("", &toml::Value::Table(block.parse().unwrap()), &known, &mut written);
    }
    let mut missing = Vec::new();
    for (path, fields) in &known {
        for field in *fields {
            let full = if path.is_empty() { field.to_string() } else { format!("{path}.{field}") };
            if !written.contains(&full) {
                missing.push(full);
            }
        }
    }
    assert!(missing.is_empty(), "docs/configuration.md does not show these fields: {missing:?}");

    // The first block: every field at its default (routes and destinations
    // have none; theirs are compared with one made of their required fields).
    let shown = load(blocks[0], &[], &Overrides::default()).unwrap();
    let defaults = Config::default();
    for (name, shown, default) in [
        ("listen", value(&shown.listen), value(&defaults.listen)),
        ("admin_listen", value(&shown.admin_listen), value(&defaults.admin_listen)),
        ("store", value(&shown.store), value(&defaults.store)),
        ("log", value(&shown.log), value(&defaults.log)),
        ("gateway", value(&shown.gateway), value(&defaults.gateway)),
        ("admin", value(&shown.admin), value(&defaults.admin)),
        ("relay", value(&shown.relay), value(&defaults.relay)),
    ] {
        assert_eq!(shown, default, "docs/configuration.md: [{name}] in the first block is not the default");
    }
    let route = &shown.routes[0];
    let minimal: Config =
        toml::from_str(&format!("[[routes]]\nname = {:?}\nupstream = {:?}\n", route.name, route.upstream)).unwrap();
    assert_eq!(value(route), value(&minimal.routes[0]), "docs/configuration.md: the route is not at its defaults");
    let (name, destination) = shown.destinations.iter().next().expect("a destination");
    assert_eq!(
        value(destination),
        value(&DestinationConfig::new(destination.url.clone())),
        "docs/configuration.md: destinations.{name} is not at its defaults"
    );
}

/// `docs/stores.md` names every scheme the one table ([`STORE_SCHEMES`])
/// accepts, as parsing, its errors and `--help` do.
#[test]
fn the_stores_page_names_every_store_scheme() {
    let page = include_str!("../../docs/stores.md");
    for (scheme, _) in super::STORE_SCHEMES {
        assert!(page.contains(&format!("`{scheme}://")), "docs/stores.md lacks {scheme}://");
    }
}
