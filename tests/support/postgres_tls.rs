//! A private PostgreSQL that speaks TLS, with certificates made at test time.
//!
//! [`TestCa`] is a certificate authority of the test's own (rcgen); the
//! server's certificate is issued by it for `localhost` and `127.0.0.1`.
//! [`TlsPostgres::start`] writes certificate and key into a fresh cluster
//! ([`super::postgres_server::Setup`]), turns `ssl` on and, with
//! [`Hba::TlsOnly`], lets only `hostssl` connections in, so a plaintext
//! client is refused by the server itself ([`Hba::TlsOnlyScram`] also asks
//! roles other than `postgres` for a password). The CA's PEM file sits beside
//! the server, for `sslrootcert=`.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use super::postgres_server::{PostgresProcess, Setup};
use super::redis_server::TempDir;

/// The names the server's certificate is valid for.
pub const SERVER_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

/// A certificate authority of the test's own.
pub struct TestCa {
    /// Its certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let pem = params.self_signed(&key).expect("self-signed CA").pem();
        Self { pem, issuer: Issuer::new(params, key) }
    }

    /// A server certificate for `names` and its key, both PEM.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("names");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed server certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// Who the server lets in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hba {
    /// `initdb`'s rules: TLS and plaintext alike.
    Any,
    /// `hostssl` only: a plaintext TCP connection finds no pg_hba.conf entry.
    TlsOnly,
    /// `hostssl` only; `postgres` is trusted, every other role needs its
    /// password (SCRAM-SHA-256).
    TlsOnlyScram,
}

impl Hba {
    fn rules(self) -> Option<&'static str> {
        match self {
            Self::Any => None,
            Self::TlsOnly => {
                Some("local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n")
            }
            Self::TlsOnlyScram => Some(
                "local all all trust\nhostssl all postgres 127.0.0.1/32 trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n",
            ),
        }
    }
}

/// A private TLS PostgreSQL and the CA that issued its certificate.
pub struct TlsPostgres {
    pub server: PostgresProcess,
    pub ca: TestCa,
    files: TempDir,
}

impl TlsPostgres {
    pub fn start(hba: Hba) -> Self {
        let ca = TestCa::new("idemgate test CA");
        let (cert, key) = ca.issue(&SERVER_NAMES);
        let setup = Setup {
            files: vec![("server.crt".into(), cert), ("server.key".into(), key)],
            conf: vec!["ssl = on".into()],
            hba: hba.rules().map(str::to_string),
        };
        let server = PostgresProcess::start_with(&setup);
        Self { server, ca, files: TempDir::new("postgres-tls-client") }
    }

    /// Writes `pem` to a file of the test's own and returns its path, for `sslrootcert=`.
    pub fn pem_file(&self, name: &str, pem: &str) -> PathBuf {
        let path = self.files.0.join(name);
        std::fs::write(&path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// The issuing CA's certificate as a file.
    pub fn ca_file(&self) -> PathBuf {
        self.pem_file("ca.pem", &self.ca.pem)
    }

    /// `postgres://postgres@<host>:<port>/postgres?<query>`; `host` is only
    /// the name TLS checks when `query` carries `hostaddr=`.
    pub fn url_for(&self, host: &str, query: &str) -> String {
        self.url_as("postgres", host, query)
    }

    /// [`Self::url_for`] with other credentials (`user` or `user:password`).
    pub fn url_as(&self, credentials: &str, host: &str, query: &str) -> String {
        format!("postgres://{credentials}@{host}:{}/postgres?{query}", self.server.port())
    }

    /// [`Self::url_for`] `127.0.0.1`.
    pub fn url(&self, query: &str) -> String {
        self.url_for("127.0.0.1", query)
    }
}
