//! Signing secrets: read from a file, and turned into HMAC key bytes as
//! each scheme defines them. Errors name the file or the scheme, never a
//! secret.

use std::path::{Path, PathBuf};

use base64::Engine;

use super::Scheme;
use crate::config::MAX_SECRETS;

/// Why a route's secrets cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The secrets file cannot be read.
    #[error("webhook.secrets_file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The secrets file has no secret in it.
    #[error("webhook.secrets_file {0}: holds no secret (one per line)")]
    EmptyFile(PathBuf),
    /// The secrets file has more than [`MAX_SECRETS`].
    #[error("webhook.secrets_file {0}: holds more than {MAX_SECRETS} secrets")]
    TooMany(PathBuf),
    /// No secret at all.
    #[error("webhook: no secret configured")]
    None,
    /// A Standard Webhooks secret is not `whsec_` and base64.
    #[error("webhook: a standard-webhooks secret must be whsec_ followed by base64 (as the sender shows it)")]
    NotBase64,
}

/// One secret per line; blank lines and lines starting with `#` skipped,
/// surrounding whitespace (a file's final newline) trimmed.
pub(super) fn read_file(path: &Path) -> Result<Vec<String>, SecretError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::Read { path: path.into(), source })?;
    let secrets: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    match secrets.len() {
        0 => Err(SecretError::EmptyFile(path.into())),
        n if n > MAX_SECRETS => Err(SecretError::TooMany(path.into())),
        _ => Ok(secrets),
    }
}

/// The HMAC key of a secret as the provider shows it.
pub(super) fn key_bytes(scheme: Scheme, secret: &str) -> Result<Vec<u8>, SecretError> {
    let secret = secret.trim();
    match scheme {
        // The spec: base64, shown with a `whsec_` prefix (the libraries
        // accept it without the prefix too).
        Scheme::StandardWebhooks => {
            let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
            let key = base64::engine::general_purpose::STANDARD.decode(encoded).map_err(|_| SecretError::NotBase64)?;
            if key.is_empty() {
                return Err(SecretError::NotBase64);
            }
            Ok(key)
        }
        // Stripe's `whsec_…`, GitHub's and Shopify's secrets are the key as written.
        Scheme::Stripe | Scheme::Github | Scheme::Shopify => Ok(secret.as_bytes().to_vec()),
    }
}
