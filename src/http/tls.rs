//! TLS on both sides, with rustls (ring).
//!
//! - Towards upstreams: `https://` routes trust the Mozilla roots bundled by
//!   `webpki-roots` (the same everywhere, including minimal container
//!   images), plus an optional extra CA file per route for a private PKI.
//! - Towards clients: when the config names a certificate and key, the
//!   listener speaks TLS and offers `h2` and `http/1.1` by ALPN.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("invalid certificate in {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The client config for upstream connections.
pub fn client_config(extra_ca: Option<&Path>) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra_ca {
        for cert in read_certs(path)? {
            roots.add(cert).map_err(|e| format!("unusable CA certificate in {}: {e}", path.display()))?;
        }
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The acceptor for a TLS listener.
pub fn acceptor(cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor, String> {
    let certs = read_certs(cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("cannot read a private key from {}: {e}", key_file.display()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate {} and key {} do not fit: {e}", cert_file.display(), key_file.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
