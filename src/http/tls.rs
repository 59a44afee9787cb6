//! TLS on both sides, with rustls (ring).
//!
//! - Towards upstreams: `https://` routes trust the Mozilla roots bundled by
//!   `webpki-roots` (the same everywhere, including minimal container
//!   images), plus an optional extra CA file per route for a private PKI.
//! - Towards clients: when the config names a certificate and key, the
//!   listener speaks TLS and offers `h2` and `http/1.1` by ALPN.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a certificate, key or CA file cannot serve. Each names its file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read as PEM.
    #[error("cannot read certificates from {}: {source}", path.display())]
    ReadCertificates {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A PEM block is not a certificate.
    #[error("invalid certificate in {}: {source}", path.display())]
    InvalidCertificate {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The file holds no certificate at all.
    #[error("{} holds no PEM certificate", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A CA certificate rustls cannot use as a root.
    #[error("unusable CA certificate in {}: {source}", path.display())]
    UnusableCa {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// No private key could be read.
    #[error("cannot read a private key from {}: {source}", path.display())]
    ReadKey {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate and the key are not a pair (or not usable together).
    #[error("certificate {} and key {} do not fit: {source}", cert.display(), key.display())]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// The crypto provider offers no protocol version (never, with ring).
    #[error("TLS setup: {0}")]
    Setup(#[source] rustls::Error),
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|source| TlsError::ReadCertificates { path: path.into(), source })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::InvalidCertificate { path: path.into(), source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.into() });
    }
    Ok(certs)
}

/// The client config for upstream connections.
pub fn client_config(extra_ca: Option<&Path>) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra_ca {
        for cert in read_certs(path)? {
            roots.add(cert).map_err(|source| TlsError::UnusableCa { path: path.into(), source })?;
        }
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The acceptor for a TLS listener.
pub fn acceptor(cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor, TlsError> {
    let certs = read_certs(cert_file)?;
    let key =
        PrivateKeyDer::from_pem_file(key_file).map_err(|source| TlsError::ReadKey { path: key_file.into(), source })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|source| TlsError::Mismatch { cert: cert_file.into(), key: key_file.into(), source })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
