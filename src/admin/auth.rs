//! Bearer-token check for `/admin/`, in constant time.
//!
//! Both the configured token and the presented one are hashed with SHA-256
//! and the digests compared with `subtle`, so neither the comparison's time
//! nor an early exit on length reveals how much of a guess was right.
//! The scheme is matched without regard to case (`Bearer`, `bearer`,
//! `BEARER`), as RFC 9110 §11.1 requires, and may be followed by more than
//! one space.

use http::HeaderMap;
use http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{AdminAuth, AdminConfig};

/// How `/admin/` requests are authenticated.
pub enum AdminAccess {
    /// Requests must carry `Authorization: Bearer <token>` with this token's digest.
    Token([u8; 32]),
    /// No token configured: `/admin/` answers `403 admin-disabled`.
    Off,
    /// `auth = "disabled"` on a loopback listener: no check.
    Open,
}

/// Why the configured admin token cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// `admin.token_file` cannot be read.
    #[error("cannot read admin.token_file {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Shorter than 16 characters: guessable.
    #[error("the admin token must be at least 16 characters; use a random value")]
    TooShort,
}

impl AdminAccess {
    /// Reads the token from the config or its file.
    pub fn from_config(config: &AdminConfig) -> Result<Self, TokenError> {
        if config.auth == AdminAuth::Disabled {
            return Ok(Self::Open);
        }
        let token = match (&config.token, &config.token_file) {
            (Some(token), _) => Some(token.expose().to_owned()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|source| TokenError::Read { path: path.clone(), source })?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        match token {
            Some(token) if token.len() < 16 => Err(TokenError::TooShort),
            Some(token) => Ok(Self::Token(Sha256::digest(token.as_bytes()).into())),
            None => Ok(Self::Off),
        }
    }

    /// `Ok` when the request may use `/admin/`.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), AccessDenied> {
        let expected = match self {
            Self::Open => return Ok(()),
            Self::Off => return Err(AccessDenied::Disabled),
            Self::Token(digest) => digest,
        };
        let presented = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .ok_or(AccessDenied::Unauthorized)?;
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        if bool::from(digest.ct_eq(expected)) { Ok(()) } else { Err(AccessDenied::Unauthorized) }
    }
}

/// The token of a `Bearer` credential: the scheme in any case, then one or
/// more spaces (`1*SP` in RFC 9110 §11.4), then a non-empty token.
fn bearer_token(credentials: &str) -> Option<&str> {
    let (scheme, rest) = credentials.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    Some(rest.trim()).filter(|token| !token.is_empty())
}

/// Why an admin request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessDenied {
    /// Missing or wrong token.
    Unauthorized,
    /// No token configured.
    Disabled,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, auth.parse().unwrap());
        h
    }

    #[test]
    fn only_the_configured_token_is_accepted() {
        let config = AdminConfig { token: Some(Secret::new("0123456789abcdef-token")), ..Default::default() };
        let access = AdminAccess::from_config(&config).unwrap();
        assert_eq!(access.check(&headers("Bearer 0123456789abcdef-token")), Ok(()));
        assert_eq!(access.check(&headers("Bearer 0123456789abcdef-tokeN")), Err(AccessDenied::Unauthorized));
        assert_eq!(access.check(&headers("0123456789abcdef-token")), Err(AccessDenied::Unauthorized));
        assert_eq!(access.check(&HeaderMap::new()), Err(AccessDenied::Unauthorized));
    }

    #[test]
    fn the_scheme_is_matched_in_any_case_and_may_be_followed_by_several_spaces() {
        let config = AdminConfig { token: Some(Secret::new("0123456789abcdef-token")), ..Default::default() };
        let access = AdminAccess::from_config(&config).unwrap();
        for credentials in
            ["bearer 0123456789abcdef-token", "BEARER 0123456789abcdef-token", "BeArEr   0123456789abcdef-token"]
        {
            assert_eq!(access.check(&headers(credentials)), Ok(()), "{credentials}");
        }
        assert_eq!(access.check(&headers("Basic 0123456789abcdef-token")), Err(AccessDenied::Unauthorized));
        assert_eq!(access.check(&headers("Bearer0123456789abcdef-token")), Err(AccessDenied::Unauthorized));
    }

    #[test]
    fn a_bearer_credential_needs_a_scheme_a_space_and_a_token() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer   "), None);
        assert_eq!(bearer_token("Bearerx abc"), None);
        assert_eq!(bearer_token("Token abc"), None);
    }

    #[test]
    fn no_token_means_off_and_short_tokens_are_refused() {
        let access = AdminAccess::from_config(&AdminConfig::default()).unwrap();
        assert_eq!(access.check(&headers("Bearer anything")), Err(AccessDenied::Disabled));
        let short = AdminConfig { token: Some(Secret::new("short")), ..Default::default() };
        assert!(AdminAccess::from_config(&short).is_err());
    }
}
