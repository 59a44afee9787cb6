//! TLS to Postgres: a database URL's `sslmode` and `sslrootcert` become a
//! rustls connector (ring, TLS 1.2 and 1.3; no openssl, no aws-lc).
//!
//! The modes mean what they mean to libpq:
//!
//! | `sslmode` | encrypted | certificate checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default) | if the server offers TLS, else plaintext | no (chain, when `sslrootcert` is a file) |
//! | `require` | always | no (chain, when `sslrootcert` is a file) |
//! | `verify-ca` | always | chain up to a trusted root |
//! | `verify-full` | always | chain, and the host name (or IP) against the certificate |
//!
//! `sslrootcert=PATH` names a PEM file of trusted roots; without it
//! `verify-ca` and `verify-full` trust the Mozilla roots bundled by
//! `webpki-roots`, the same on every machine and container image (libpq
//! would read `~/.postgresql/root.crt`; idemgate reads no file it was not
//! told about). As in libpq, `require` or `prefer` with an `sslrootcert`
//! file check the chain like `verify-ca`, and `sslrootcert=system` (the
//! bundled roots) defaults to `verify-full` and refuses a weaker mode.
//!
//! Why this shape: tokio-postgres knows only `disable`, `prefer` and
//! `require` and leaves every certificate decision to the connector, so the
//! connector *is* the policy. [`TlsSettings`] is the pure part (what the URL
//! asked for, unit tested); [`connector`] reads the roots once, at start,
//! so a missing file fails there and not at the first connection. The
//! connector is `tokio-postgres-rustls`, which also gives SCRAM its
//! `tls-server-end-point` channel binding: with password authentication
//! even `require` then resists a man in the middle. It offers the ALPN
//! protocol `postgresql`, as libpq 17 does, so `sslnegotiation=direct`
//! works against PostgreSQL 17.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// Why a URL's TLS settings cannot be used. Each names the URL parameter.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// `sslmode` has a value libpq does not know.
    #[error("sslmode={0:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    UnknownMode(String),
    /// `sslrootcert=system` with a mode that does not check the host name.
    #[error("sslmode={0} may not be used with sslrootcert=system (use verify-full)")]
    WeakModeWithSystemRoots(&'static str),
    /// The `sslrootcert` file cannot be read.
    #[error("sslrootcert={}: cannot read it: {source}", .path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The `sslrootcert` file is not PEM, or holds no certificate.
    #[error("sslrootcert={}: {reason}", .path.display())]
    NotPem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A certificate in the `sslrootcert` file cannot serve as a root.
    #[error("sslrootcert={}: unusable CA certificate: {source}", .path.display())]
    UnusableRoot {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// rustls refused the client configuration (not expected with ring).
    #[error("TLS client configuration: {0}")]
    Client(String),
}

/// `sslmode`, with libpq's meanings (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS when the server offers it; libpq's default, and ours.
    #[default]
    Prefer,
    /// TLS or no connection; the certificate is not checked.
    Require,
    /// TLS, and the chain checked against the trusted roots.
    VerifyCa,
    /// TLS, the chain checked, and the host name matched.
    VerifyFull,
}

impl SslMode {
    /// Parses a libpq `sslmode` value.
    pub fn parse(value: &str) -> Result<Self, TlsError> {
        match value {
            "disable" => Ok(Self::Disable),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            other => Err(TlsError::UnknownMode(other.to_string())),
        }
    }

    /// The value as written in a URL.
    pub fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres does with the connection: the verify modes
    /// are `require` to it; the connector does the verifying.
    pub fn driver(self) -> tokio_postgres::config::SslMode {
        match self {
            Self::Disable => tokio_postgres::config::SslMode::Disable,
            Self::Prefer => tokio_postgres::config::SslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => tokio_postgres::config::SslMode::Require,
        }
    }
}

/// `sslrootcert`: where the trusted roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
    /// `system`: the bundled Mozilla roots.
    System,
}

/// What the handshake checks about the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateCheck {
    /// Nothing: the connection is encrypted, the peer unauthenticated.
    Nothing,
    /// The chain up to a trusted root; any host name.
    Chain,
    /// The chain and the host name.
    ChainAndHostName,
}

/// The TLS part of a database URL.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsSettings {
    /// `sslmode`.
    pub mode: SslMode,
    /// `sslrootcert`, if given.
    pub root_certs: Option<RootCerts>,
}

impl TlsSettings {
    /// From `sslmode` and `sslrootcert` values (`None`: not in the URL).
    pub fn from_params(sslmode: Option<&str>, sslrootcert: Option<&str>) -> Result<Self, TlsError> {
        let mode = sslmode.map(SslMode::parse).transpose()?;
        let root_certs = sslrootcert.map(|value| match value {
            "system" => RootCerts::System,
            path => RootCerts::File(PathBuf::from(path)),
        });
        let mode = match (&root_certs, mode) {
            (Some(RootCerts::System), None | Some(SslMode::VerifyFull)) => SslMode::VerifyFull,
            (Some(RootCerts::System), Some(weaker)) => return Err(TlsError::WeakModeWithSystemRoots(weaker.name())),
            (_, mode) => mode.unwrap_or_default(),
        };
        Ok(Self { mode, root_certs })
    }

    /// What a handshake under these settings checks.
    pub fn check(&self) -> CertificateCheck {
        match (self.mode, &self.root_certs) {
            (SslMode::VerifyFull, _) => CertificateCheck::ChainAndHostName,
            (SslMode::VerifyCa, _) => CertificateCheck::Chain,
            // libpq: "if a root CA file exists, require behaves like verify-ca".
            (SslMode::Prefer | SslMode::Require, Some(RootCerts::File(_))) => CertificateCheck::Chain,
            (SslMode::Disable | SslMode::Prefer | SslMode::Require, _) => CertificateCheck::Nothing,
        }
    }
}

/// The connector for `settings`; reads an `sslrootcert` file now.
pub fn connector(settings: &TlsSettings) -> Result<MakeRustlsConnect, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match settings.check() {
        CertificateCheck::Nothing => Arc::new(ChainVerifier { roots: None, algorithms }),
        CertificateCheck::Chain => Arc::new(ChainVerifier { roots: Some(roots(settings)?), algorithms }),
        CertificateCheck::ChainAndHostName => {
            WebPkiServerVerifier::builder_with_provider(roots(settings)?, provider.clone())
                .build()
                .map_err(|e| TlsError::Client(e.to_string()))?
        }
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Client(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(MakeRustlsConnect::new(config))
}

/// The trusted roots: the `sslrootcert` file, or the bundled ones.
fn roots(settings: &TlsSettings) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    match &settings.root_certs {
        Some(RootCerts::File(path)) => {
            for cert in read_pem(path)? {
                roots.add(cert).map_err(|source| TlsError::UnusableRoot { path: path.clone(), source })?;
            }
        }
        Some(RootCerts::System) | None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(Arc::new(roots))
}

fn read_pem(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Unreadable { path: path.to_path_buf(), source })?;
    let not_pem = |reason: String| TlsError::NotPem { path: path.to_path_buf(), reason };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_pem(format!("invalid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(not_pem("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// Checks the chain against `roots` (when there are any) and never the host
/// name; always checks that the server holds the certificate's key (the
/// handshake signature), so channel binding stays meaningful.
#[derive(Debug)]
struct ChainVerifier {
    roots: Option<Arc<RootCertStore>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            verify_server_cert_signed_by_trust_anchor(&cert, roots, intermediates, now, self.algorithms.all)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(mode: Option<&str>, root: Option<&str>) -> TlsSettings {
        TlsSettings::from_params(mode, root).unwrap()
    }

    #[test]
    fn every_libpq_mode_parses_and_prints_as_written() {
        for name in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            assert_eq!(SslMode::parse(name).unwrap().name(), name);
        }
    }

    #[test]
    fn an_unknown_mode_is_refused_with_the_parameter_named() {
        let error = TlsSettings::from_params(Some("verify_full"), None).unwrap_err().to_string();
        assert!(error.contains("sslmode=\"verify_full\""), "{error}");
        assert!(error.contains("verify-full"), "{error}");
    }

    #[test]
    fn the_default_is_prefer_without_a_certificate_check() {
        assert_eq!(settings(None, None).mode, SslMode::Prefer);
        assert_eq!(settings(None, None).check(), CertificateCheck::Nothing);
        assert_eq!(SslMode::Prefer.driver(), tokio_postgres::config::SslMode::Prefer);
    }

    #[test]
    fn require_checks_nothing_unless_a_root_file_is_given_as_in_libpq() {
        assert_eq!(settings(Some("require"), None).check(), CertificateCheck::Nothing);
        assert_eq!(settings(Some("require"), Some("/ca.pem")).check(), CertificateCheck::Chain);
        assert_eq!(settings(Some("prefer"), Some("/ca.pem")).check(), CertificateCheck::Chain);
    }

    #[test]
    fn verify_ca_checks_the_chain_and_verify_full_the_host_name_too() {
        assert_eq!(settings(Some("verify-ca"), None).check(), CertificateCheck::Chain);
        assert_eq!(settings(Some("verify-full"), None).check(), CertificateCheck::ChainAndHostName);
        assert_eq!(settings(Some("verify-full"), Some("/ca.pem")).check(), CertificateCheck::ChainAndHostName);
    }

    #[test]
    fn the_driver_encrypts_or_fails_in_every_mode_above_prefer() {
        for mode in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
            assert_eq!(mode.driver(), tokio_postgres::config::SslMode::Require, "{mode:?}");
        }
        assert_eq!(SslMode::Disable.driver(), tokio_postgres::config::SslMode::Disable);
    }

    #[test]
    fn system_roots_default_to_verify_full_and_refuse_a_weaker_mode() {
        assert_eq!(settings(None, Some("system")).mode, SslMode::VerifyFull);
        assert_eq!(settings(Some("verify-full"), Some("system")).root_certs, Some(RootCerts::System));
        let error = TlsSettings::from_params(Some("require"), Some("system")).unwrap_err().to_string();
        assert!(error.contains("sslmode=require") && error.contains("sslrootcert=system"), "{error}");
    }

    #[test]
    fn an_unreadable_root_file_fails_when_the_connector_is_built() {
        let error = connector(&settings(Some("verify-full"), Some("/nonexistent/ca.pem"))).err().unwrap().to_string();
        assert!(error.starts_with("sslrootcert=/nonexistent/ca.pem: cannot read it"), "{error}");
    }

    #[test]
    fn a_root_file_without_a_certificate_is_refused() {
        let path = std::env::temp_dir().join(format!("idemgate-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&path, "not a certificate\n").unwrap();
        let built = connector(&settings(Some("verify-ca"), path.to_str()));
        std::fs::remove_file(&path).unwrap();
        let error = built.err().unwrap().to_string();
        assert!(error.contains("sslrootcert=") && error.contains("no PEM certificate"), "{error}");
    }

    #[test]
    fn modes_without_a_root_file_build_without_reading_one() {
        for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            assert!(connector(&settings(Some(mode), None)).is_ok(), "{mode}");
        }
    }
}
