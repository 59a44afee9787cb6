//! Reading a config in layers: defaults, the TOML file, `IDEMGATE__…`
//! environment variables, then command-line flags.

use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

use super::gateway::{default_max_connections, default_methods, default_pool_idle_timeout, default_prefix};
use super::{Config, ConfigError, ENV_PREFIX, RouteConfig, ServiceUrl};

/// Values from command-line flags, applied last.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--admin-listen`.
    pub admin_listen: Option<SocketAddr>,
    /// `--store`.
    pub store: Option<String>,
    /// `--upstream`: one route `/` to this URL.
    pub upstream: Option<String>,
    /// `--database-url`.
    pub database_url: Option<String>,
}

impl Config {
    /// Loads file (if any), then `IDEMGATE__…` variables from `env`, then flags.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> Result<Self, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
                text.parse::<toml::Table>()
                    .map_err(|e| ConfigError::Parse(format!("{}: {}", path.display(), located(&text, &e))))?
            }
            None => toml::Table::new(),
        };
        for (name, value) in env {
            if let Some(path) = name.strip_prefix(ENV_PREFIX) {
                apply_env(&mut table, path, &value)?;
            }
        }
        let mut config =
            Config::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Parse(one_line(&e)))?;
        config.apply(flags)?;
        config.validate()?;
        Ok(config)
    }

    fn apply(&mut self, flags: &Overrides) -> Result<(), ConfigError> {
        if let Some(listen) = flags.listen {
            self.listen = listen;
        }
        if let Some(admin_listen) = flags.admin_listen {
            self.admin_listen = admin_listen;
        }
        if let Some(store) = &flags.store {
            self.store = ServiceUrl::new(store.clone());
        }
        if let Some(url) = &flags.database_url {
            self.relay.database_url = Some(ServiceUrl::new(url.clone()));
        }
        if let Some(upstream) = &flags.upstream {
            if !self.routes.is_empty() {
                return Err(ConfigError::Invalid("--upstream cannot be combined with [[routes]] in the config file; add the upstream as a route instead".into()));
            }
            self.routes.push(RouteConfig {
                name: "default".into(),
                prefix: default_prefix(),
                upstream: upstream.clone(),
                methods: default_methods(),
                require_key: false,
                keep_host: false,
                ca_file: None,
                max_connections: default_max_connections(),
                release_statuses: None,
                on_unknown: None,
                pool_idle_timeout: default_pool_idle_timeout(),
                key: None,
                webhook: None,
                key_ttl: None,
            });
        }
        Ok(())
    }
}

/// Sets `a.b.c = value` for `IDEMGATE__A__B__C=value`; the value is read as
/// a TOML value when it parses as one (`10`, `true`, `["a"]`), else as a string.
fn apply_env(table: &mut toml::Table, path: &str, raw: &str) -> Result<(), ConfigError> {
    let segments: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
    if segments.iter().any(String::is_empty) {
        return Err(ConfigError::Parse(format!("environment variable {ENV_PREFIX}{path}: empty path segment")));
    }
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let (last, parents) = segments.split_last().ok_or_else(|| ConfigError::Parse("empty environment path".into()))?;
    let error = |why: String| ConfigError::Parse(format!("environment variable {ENV_PREFIX}{path}: {why}"));
    let mut current = table;
    let mut parents = parents.iter();
    while let Some(segment) = parents.next() {
        let mut entry = current.entry(segment.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        // An array of tables (`[[routes]]`) is entered by index, and only
        // into a table the file has: `IDEMGATE__ROUTES__0__WEBHOOK__SECRETS_FILE`.
        if let toml::Value::Array(items) = entry {
            let index = parents.next().and_then(|i| i.parse::<usize>().ok());
            let len = items.len();
            entry = index
                .and_then(|i| items.get_mut(i))
                .ok_or_else(|| error(format!("{segment} is a list of {len}: name one of them by its index, from 0")))?;
        }
        current = entry.as_table_mut().ok_or_else(|| error(format!("{segment} is not a section")))?;
    }
    current.insert(last.clone(), value);
    Ok(())
}

/// A syntax error as its position and what the parser expected: toml's
/// own text quotes the line, and the line may be `database_url =
/// postgres://app:S3cret@…` missing its quotes, or a header value missing
/// its closing one. The parser's message names tokens, never the input.
fn located(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end().replace('\n', " ");
    let Some(span) = error.span() else { return message };
    let before = &text.as_bytes()[..span.start.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[line_start..]).chars().count() + 1;
    format!("line {line}, column {column}: {message}")
}

/// A deserialization error on one line, the field first, and without the
/// value it found: toml ends its message with "\nin `gateway.lease`",
/// which a log or a terminal would show as a second line, after the
/// message it belongs to; and serde's "invalid type: string \"…\"" quotes
/// what was written, which may be a secret in the wrong field.
fn one_line(error: &toml::de::Error) -> String {
    let text = error.to_string();
    let text = text.trim_end();
    match text.rsplit_once("\nin `") {
        Some((message, field)) if field.ends_with('`') => {
            format!("{}: {}", &field[..field.len() - 1], without_value(&message.trim_end().replace('\n', " ")))
        }
        _ => without_value(&text.replace('\n', " ")),
    }
}

/// serde's messages that quote the value found, with only its kind left:
/// `invalid type: string "…", expected a boolean` reads `invalid type:
/// string, expected a boolean`; `unknown variant `…`, expected …` reads
/// `unknown variant, expected …`.
fn without_value(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some((found, expected)) = message.strip_prefix(prefix).and_then(|rest| rest.rsplit_once(", expected ")) {
            let kind = found.split(['`', '"']).next().unwrap_or("").trim_end();
            return format!("{prefix}{kind}, expected {expected}");
        }
    }
    if let Some((_, expected)) =
        message.strip_prefix("unknown variant `").and_then(|rest| rest.split_once("`, expected "))
    {
        return format!("unknown variant, expected {expected}");
    }
    message.to_string()
}
