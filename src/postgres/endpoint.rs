//! A database URL, parsed once into what a connection needs: the driver's
//! [`tokio_postgres::Config`] and the TLS connector its `sslmode` asks for.
//!
//! Every connection idemgate makes to Postgres comes from an [`Endpoint`]:
//! the relay's pool, the admin API's, the `postgres://` store's, the
//! migration connection and the LISTEN session. So they all speak TLS alike
//! (see [`super::tls`] for what each mode checks).
//!
//! tokio-postgres parses the URL itself, but it knows only three `sslmode`s
//! and no `sslrootcert`, and refuses what it does not know.
//! [`Endpoint::parse`] therefore takes both out of the query
//! (percent-decoded; the last of each wins, as in the driver), hands the
//! rest to the driver, and sets the driver's mode. A bad value, or a root
//! file that cannot be read, fails here, before any connection is tried,
//! naming the parameter and the URL (password redacted). A `key=value`
//! connection string goes to the driver whole, so there only `disable`,
//! `prefer` and `require` are understood.

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls::{self, SslMode, TlsSettings};
use super::{ErrorChain, PostgresError};
use crate::config::ServiceUrl;

/// The stream of a connection made through an [`Endpoint`].
pub type TlsStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// Where a database is and how to reach it.
#[derive(Clone)]
pub struct Endpoint {
    /// The driver's settings (host, user, timeouts, `sslmode` as the driver knows it …).
    pub config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    settings: TlsSettings,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The driver's Debug redacts the password.
        f.debug_struct("Endpoint").field("config", &self.config).field("tls", &self.settings).finish()
    }
}

impl Endpoint {
    /// Parses a `postgres://` (or `postgresql://`) URL, or a `key=value`
    /// connection string, and builds its TLS connector.
    pub fn parse(url: &str) -> Result<Self, PostgresError> {
        let redacted = || ServiceUrl::new(url).redacted();
        let tls_error = |source| PostgresError::Tls { url: redacted(), source };
        let (driver_url, settings) = if is_url(url) {
            let (driver_url, sslmode, sslrootcert) = split_tls_params(url);
            let settings = TlsSettings::from_params(sslmode.as_deref(), sslrootcert.as_deref()).map_err(tls_error)?;
            (driver_url, Some(settings))
        } else {
            (url.to_string(), None)
        };
        let mut config = driver_url
            .parse::<tokio_postgres::Config>()
            .map_err(|e| PostgresError::InvalidUrl(ErrorChain(&e).to_string()))?;
        let settings =
            settings.unwrap_or_else(|| TlsSettings { mode: from_driver(config.get_ssl_mode()), root_certs: None });
        config.ssl_mode(settings.mode.driver());
        let tls = tls::connector(&settings).map_err(tls_error)?;
        Ok(Self { config, tls, settings })
    }

    /// What the URL asked of TLS.
    pub fn tls_settings(&self) -> &TlsSettings {
        &self.settings
    }

    /// The connector, for a pool that connects on its own.
    pub fn connector(&self) -> MakeRustlsConnect {
        self.tls.clone()
    }

    /// One connection; the caller drives the returned [`Connection`].
    pub async fn connect(&self) -> Result<(Client, Connection<Socket, TlsStream>), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }
}

fn is_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

fn from_driver(mode: tokio_postgres::config::SslMode) -> SslMode {
    match mode {
        tokio_postgres::config::SslMode::Disable => SslMode::Disable,
        tokio_postgres::config::SslMode::Prefer => SslMode::Prefer,
        // Require, and whatever stricter mode a later driver adds.
        _ => SslMode::Require,
    }
}

/// `url` without its `sslmode` and `sslrootcert` parameters, and their
/// last values, percent-decoded. The query starts at the first `?` after
/// the user info, which ends at the first `@`, as the driver reads it.
fn split_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let after_user = url.find('@').map_or(0, |at| at + 1);
    let Some(question) = url[after_user..].find('?').map(|q| after_user + q) else {
        return (url.to_string(), None, None);
    };
    let (base, query) = (&url[..question], &url[question + 1..]);
    let (mut sslmode, mut sslrootcert, mut kept) = (None, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
        match decode(key).as_str() {
            "sslmode" => sslmode = Some(decode(value)),
            "sslrootcert" => sslrootcert = Some(decode(value)),
            _ => kept.push(pair),
        }
    }
    let driver_url = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
    (driver_url, sslmode, sslrootcert)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::tls::{CertificateCheck, RootCerts};

    #[test]
    fn tls_parameters_leave_the_url_and_the_rest_stays_in_order() {
        let (driver, mode, root) = split_tls_params(
            "postgres://u:p@db:5432/app?application_name=a&sslmode=verify-full&connect_timeout=3&sslrootcert=%2Fetc%2Fca%20x.pem",
        );
        assert_eq!(driver, "postgres://u:p@db:5432/app?application_name=a&connect_timeout=3");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/etc/ca x.pem"));
    }

    #[test]
    fn a_url_with_only_tls_parameters_loses_its_query() {
        let (driver, mode, root) = split_tls_params("postgresql://db/app?sslmode=require");
        assert_eq!((driver.as_str(), mode.as_deref(), root), ("postgresql://db/app", Some("require"), None));
        assert_eq!(split_tls_params("postgres://db/app").0, "postgres://db/app");
    }

    #[test]
    fn the_last_sslmode_wins_as_in_the_driver() {
        assert_eq!(split_tls_params("postgres://db/a?sslmode=disable&sslmode=require").1.as_deref(), Some("require"));
    }

    #[test]
    fn a_question_mark_in_the_password_does_not_start_the_query() {
        let (driver, mode, _) = split_tls_params("postgres://u:p?w@db/a?sslmode=require");
        assert_eq!((driver.as_str(), mode.as_deref()), ("postgres://u:p?w@db/a", Some("require")));
    }

    #[test]
    fn verify_modes_reach_the_driver_as_require() {
        let endpoint = Endpoint::parse("postgres://u@db/app?sslmode=verify-full&application_name=x").unwrap();
        assert_eq!(endpoint.config.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        assert_eq!(endpoint.config.get_application_name(), Some("x"));
        assert_eq!(endpoint.tls_settings().check(), CertificateCheck::ChainAndHostName);
    }

    #[test]
    fn a_url_without_sslmode_prefers_tls() {
        let endpoint = Endpoint::parse("postgres://u@db/app").unwrap();
        assert_eq!(endpoint.tls_settings().mode, SslMode::Prefer);
        assert_eq!(endpoint.config.get_ssl_mode(), tokio_postgres::config::SslMode::Prefer);
    }

    #[test]
    fn a_key_value_string_keeps_the_modes_the_driver_knows() {
        let endpoint = Endpoint::parse("host=db user=u sslmode=require").unwrap();
        assert_eq!(endpoint.tls_settings(), &TlsSettings { mode: SslMode::Require, root_certs: None });
        assert_eq!(Endpoint::parse("host=db user=u").unwrap().tls_settings().mode, SslMode::Prefer);
    }

    #[test]
    fn a_bad_sslmode_names_the_parameter_and_the_url_without_its_password() {
        let error = Endpoint::parse("postgres://relay:hunter2@db/app?sslmode=verify").unwrap_err().to_string();
        assert!(error.contains("sslmode=\"verify\""), "{error}");
        assert!(error.contains("postgres://relay:[redacted]@db/app"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn an_unreadable_sslrootcert_fails_before_any_connection() {
        let error = Endpoint::parse("postgres://relay:hunter2@db/app?sslmode=verify-ca&sslrootcert=/nonexistent.pem")
            .unwrap_err()
            .to_string();
        assert!(error.contains("sslrootcert=/nonexistent.pem: cannot read it"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn system_roots_in_a_url_mean_verify_full() {
        let endpoint = Endpoint::parse("postgres://u@db/app?sslrootcert=system").unwrap();
        assert_eq!(endpoint.tls_settings().root_certs, Some(RootCerts::System));
        assert_eq!(endpoint.tls_settings().mode, SslMode::VerifyFull);
    }

    #[test]
    fn an_option_the_driver_does_not_know_is_named() {
        let error = Endpoint::parse("postgres://u@db/app?sslcert=/c.pem").unwrap_err().to_string();
        assert!(error.contains("unknown option `sslcert`"), "{error}");
    }
}
