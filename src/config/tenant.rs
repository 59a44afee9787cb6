//! `gateway.tenant`: where a request's tenant comes from, one kind per
//! variant of [`TenantConfig`].
//!
//! The file names the kind by the one field only it has:
//!
//! ```toml
//! tenant = { from = "authorization" }        # the default
//! tenant = { header = "x-tenant-id" }
//! tenant = { fixed = "default" }
//! tenant = { basic_user = true }
//! tenant = { jwt_claim = "sub", jwks_file = "/run/jwks.json", issuer = "https://id.example", audience = "payments" }
//! tenant = { jwt_claim = "sub", hs256_secret_file = "/run/secrets/jwt", issuer = "…", audience = "…" }
//! ```
//!
//! That table is read once, here, into the enum (its wire shape,
//! [`TenantFields`], is private to this file): a table naming no kind or
//! two, or carrying a field its kind does not take, is an error that names
//! it, and nothing later checks optional fields again. Adding a kind is a
//! variant here, its arm in [`TenantConfig::try_from`], and one file in
//! `gateway::tenant`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where the tenant of a request comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(try_from = "TenantFields", into = "TenantFields")]
pub enum TenantConfig {
    /// `{ from = "authorization" }`: a hash of the `Authorization` header,
    /// its scheme compared without regard to case. A rotated credential is
    /// another tenant.
    #[default]
    Authorization,
    /// `{ header = "x-tenant-id" }`: the value of a header that a trusted
    /// auth proxy sets (parsed once, as the config is read).
    Header(http::HeaderName),
    /// `{ fixed = "default" }`: one tenant for every request.
    Fixed(String),
    /// `{ basic_user = true }`: the user name of a `Basic` credential, not
    /// its password.
    BasicUser,
    /// `{ jwt_claim = "sub", … }`: a claim of a bearer JWT whose signature,
    /// issuer, audience and expiry the gateway checks.
    JwtClaim(JwtClaimConfig),
}

/// A tenant read from a verified JWT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtClaimConfig {
    /// The claim that names the tenant (`sub`, `client_id`, `org_id`…).
    pub claim: String,
    /// The keys a token must be signed with.
    pub keys: JwtKeys,
    /// The `iss` a token must carry.
    pub issuer: String,
    /// A value the token's `aud` must carry.
    pub audience: String,
}

/// Where the keys that verify a JWT are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtKeys {
    /// `jwks_file`: a JSON Web Key Set (RSA and EC public keys), read again
    /// when it changes on disk.
    JwksFile(PathBuf),
    /// `hs256_secret_file`: the shared secret of HS256 tokens. Only the path
    /// is ever printed.
    Hs256SecretFile(PathBuf),
}

/// The table as written: every field of every kind, each optional.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct TenantFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fixed: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    basic_user: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jwt_claim: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jwks_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hs256_secret_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    audience: Option<String>,
}

/// The fields that name a kind, as the error messages list them.
const KINDS: &str =
    "from = \"authorization\", header = \"<name>\", fixed = \"<tenant>\", basic_user = true or jwt_claim = \"<claim>\"";

/// Why a `gateway.tenant` table is refused; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantConfigError {
    /// No kind is named, or more than one.
    #[error("gateway.tenant must set exactly one of {KINDS}")]
    Kinds,
    /// `from` names another source than `"authorization"`.
    #[error("gateway.tenant.from = {0:?}: the only source is \"authorization\"")]
    From(String),
    /// `header` is not a header name.
    #[error("gateway.tenant.header = {0:?} is not a valid header name")]
    Header(String),
    /// `basic_user = false`.
    #[error("gateway.tenant.basic_user = false names no source: set one of {KINDS}")]
    BasicUserFalse,
    /// A field of `jwt_claim` on another kind.
    #[error("gateway.tenant.{0} belongs to jwt_claim, not to this tenant source")]
    Foreign(&'static str),
    /// `jwt_claim = ""`.
    #[error("gateway.tenant.jwt_claim must name a claim, such as \"sub\"")]
    NoClaim,
    /// `jwt_claim` with no key source, or two.
    #[error(
        "gateway.tenant with jwt_claim needs exactly one of jwks_file = \"<path>\" or hs256_secret_file = \"<path>\""
    )]
    JwtKeys,
    /// `jwt_claim` without `issuer` or `audience`.
    #[error("gateway.tenant with jwt_claim needs {field} = \"…\": the value a token's {claim} claim must carry")]
    JwtRequired {
        /// `issuer` or `audience`.
        field: &'static str,
        /// `iss` or `aud`.
        claim: &'static str,
    },
}

impl TryFrom<TenantFields> for TenantConfig {
    type Error = TenantConfigError;

    fn try_from(mut fields: TenantFields) -> Result<Self, TenantConfigError> {
        let named = [
            fields.from.is_some(),
            fields.header.is_some(),
            fields.fixed.is_some(),
            fields.basic_user.is_some(),
            fields.jwt_claim.is_some(),
        ];
        if named.iter().filter(|named| **named).count() != 1 {
            return Err(TenantConfigError::Kinds);
        }
        let config = if let Some(from) = fields.from.take() {
            if from != "authorization" {
                return Err(TenantConfigError::From(from));
            }
            Self::Authorization
        } else if let Some(header) = fields.header.take() {
            match super::ConfigHeaderName::try_from(header) {
                Ok(name) => Self::Header(name.0),
                Err(bad) => return Err(TenantConfigError::Header(bad.0)),
            }
        } else if let Some(fixed) = fields.fixed.take() {
            Self::Fixed(fixed)
        } else if let Some(basic_user) = fields.basic_user.take() {
            if !basic_user {
                return Err(TenantConfigError::BasicUserFalse);
            }
            Self::BasicUser
        } else if let Some(claim) = fields.jwt_claim.take() {
            Self::JwtClaim(jwt_claim(claim, &mut fields)?)
        } else {
            unreachable!("exactly one kind is named")
        };
        // What is left belongs to another kind.
        let foreign = [
            ("jwks_file", fields.jwks_file.is_some()),
            ("hs256_secret_file", fields.hs256_secret_file.is_some()),
            ("issuer", fields.issuer.is_some()),
            ("audience", fields.audience.is_some()),
        ];
        if let Some((name, _)) = foreign.iter().find(|(_, set)| *set) {
            return Err(TenantConfigError::Foreign(name));
        }
        Ok(config)
    }
}

/// The `jwt_claim` kind: exactly one key source, an issuer and an audience.
fn jwt_claim(claim: String, fields: &mut TenantFields) -> Result<JwtClaimConfig, TenantConfigError> {
    if claim.is_empty() {
        return Err(TenantConfigError::NoClaim);
    }
    let keys = match (fields.jwks_file.take(), fields.hs256_secret_file.take()) {
        (Some(path), None) => JwtKeys::JwksFile(path),
        (None, Some(path)) => JwtKeys::Hs256SecretFile(path),
        _ => return Err(TenantConfigError::JwtKeys),
    };
    // A key set often signs tokens for more than one service: without both
    // checks, a token made for another service would name a tenant here.
    let required = |value: Option<String>, field: &'static str, claim: &'static str| {
        value.filter(|v| !v.is_empty()).ok_or(TenantConfigError::JwtRequired { field, claim })
    };
    let issuer = required(fields.issuer.take(), "issuer", "iss")?;
    let audience = required(fields.audience.take(), "audience", "aud")?;
    Ok(JwtClaimConfig { claim, keys, issuer, audience })
}

impl From<TenantConfig> for TenantFields {
    fn from(config: TenantConfig) -> Self {
        match config {
            TenantConfig::Authorization => Self { from: Some("authorization".into()), ..Self::default() },
            TenantConfig::Header(header) => Self { header: Some(header.as_str().to_owned()), ..Self::default() },
            TenantConfig::Fixed(fixed) => Self { fixed: Some(fixed), ..Self::default() },
            TenantConfig::BasicUser => Self { basic_user: Some(true), ..Self::default() },
            TenantConfig::JwtClaim(jwt) => {
                let (jwks_file, hs256_secret_file) = match jwt.keys {
                    JwtKeys::JwksFile(path) => (Some(path), None),
                    JwtKeys::Hs256SecretFile(path) => (None, Some(path)),
                };
                Self {
                    jwt_claim: Some(jwt.claim),
                    jwks_file,
                    hs256_secret_file,
                    issuer: Some(jwt.issuer),
                    audience: Some(jwt.audience),
                    ..Self::default()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TenantConfig, String> {
        #[derive(Deserialize)]
        struct Wrapper {
            tenant: TenantConfig,
        }
        toml::from_str::<Wrapper>(text).map(|w| w.tenant).map_err(|e| e.to_string())
    }

    #[test]
    fn each_kind_is_named_by_its_own_field() {
        assert_eq!(parse("tenant = { from = \"authorization\" }"), Ok(TenantConfig::Authorization));
        assert_eq!(
            parse("tenant = { header = \"x-tenant\" }"),
            Ok(TenantConfig::Header(http::HeaderName::from_static("x-tenant")))
        );
        assert_eq!(parse("tenant = { fixed = \"d\" }"), Ok(TenantConfig::Fixed("d".into())));
        assert_eq!(parse("tenant = { basic_user = true }"), Ok(TenantConfig::BasicUser));
        let jwt = parse(
            "tenant = { jwt_claim = \"sub\", hs256_secret_file = \"/s\", issuer = \"https://id\", audience = \"pay\" }",
        );
        assert_eq!(
            jwt,
            Ok(TenantConfig::JwtClaim(JwtClaimConfig {
                claim: "sub".into(),
                keys: JwtKeys::Hs256SecretFile("/s".into()),
                issuer: "https://id".into(),
                audience: "pay".into(),
            }))
        );
    }

    #[test]
    fn a_table_naming_no_kind_two_kinds_or_a_foreign_field_is_refused_by_name() {
        for (text, says) in [
            ("tenant = {}", "exactly one"),
            ("tenant = { from = \"authorization\", fixed = \"x\" }", "exactly one"),
            ("tenant = { from = \"cookie\" }", "the only source"),
            ("tenant = { header = \"x tenant\" }", "not a valid header name"),
            ("tenant = { basic_user = false }", "names no source"),
            ("tenant = { basic_user = true, issuer = \"i\" }", "issuer belongs to jwt_claim"),
            ("tenant = { jwt_claim = \"sub\", issuer = \"i\", audience = \"a\" }", "exactly one of jwks_file"),
            (
                "tenant = { jwt_claim = \"sub\", jwks_file = \"/j\", hs256_secret_file = \"/s\", issuer = \"i\", audience = \"a\" }",
                "exactly one of jwks_file",
            ),
            ("tenant = { jwt_claim = \"sub\", jwks_file = \"/j\", audience = \"a\" }", "issuer = "),
            ("tenant = { jwt_claim = \"sub\", jwks_file = \"/j\", issuer = \"i\" }", "audience = "),
            ("tenant = { jwt_claim = \"\", jwks_file = \"/j\", issuer = \"i\", audience = \"a\" }", "name a claim"),
            ("tenant = { jwt_claim = \"sub\", secret = \"x\" }", "unknown field"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn every_kind_prints_as_it_is_written_and_reads_back_the_same() {
        let kinds = [
            TenantConfig::Authorization,
            TenantConfig::Header(http::HeaderName::from_static("x-tenant")),
            TenantConfig::Fixed("d".into()),
            TenantConfig::BasicUser,
            TenantConfig::JwtClaim(JwtClaimConfig {
                claim: "sub".into(),
                keys: JwtKeys::JwksFile("/run/jwks.json".into()),
                issuer: "https://id".into(),
                audience: "pay".into(),
            }),
        ];
        for kind in kinds {
            #[derive(Serialize)]
            struct Wrapper<'a> {
                tenant: &'a TenantConfig,
            }
            let printed = toml::to_string(&Wrapper { tenant: &kind }).unwrap();
            assert_eq!(parse(&printed), Ok(kind.clone()), "{printed}");
        }
    }
}
