//! Header names and methods as a config file writes them, parsed once, at
//! deserialisation, into `http`'s own types: a name that is not one is
//! refused while the file is read (naming the field), and nothing later
//! checks or parses the same string again.

use serde::{Deserialize, Serialize};

/// A header name (`gateway.fingerprint_headers`, `gateway.response_header_deny`),
/// lower-cased as `http` keeps every name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct ConfigHeaderName(pub http::HeaderName);

/// A configured header name that is not one.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a valid header name")]
pub struct NotAHeaderName(pub String);

impl TryFrom<String> for ConfigHeaderName {
    type Error = NotAHeaderName;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        http::HeaderName::from_bytes(name.as_bytes()).map(Self).map_err(|_| NotAHeaderName(name))
    }
}

impl From<ConfigHeaderName> for String {
    fn from(name: ConfigHeaderName) -> Self {
        name.0.as_str().to_owned()
    }
}

impl From<http::HeaderName> for ConfigHeaderName {
    fn from(name: http::HeaderName) -> Self {
        Self(name)
    }
}

/// A guarded method (`routes.methods`), upper-cased: `post` guards `POST`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct ConfigMethod(pub http::Method);

/// A configured method that is not one.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not an HTTP method")]
pub struct NotAMethod(pub String);

impl TryFrom<String> for ConfigMethod {
    type Error = NotAMethod;

    fn try_from(method: String) -> Result<Self, Self::Error> {
        http::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).map(Self).map_err(|_| NotAMethod(method))
    }
}

impl From<ConfigMethod> for String {
    fn from(method: ConfigMethod) -> Self {
        method.0.as_str().to_owned()
    }
}

impl From<http::Method> for ConfigMethod {
    fn from(method: http::Method) -> Self {
        Self(method)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_methods_are_parsed_once_and_written_back_as_http_spells_them() {
        let name = ConfigHeaderName::try_from("Content-Type".to_owned()).unwrap();
        assert_eq!(name.0, http::header::CONTENT_TYPE);
        assert_eq!(String::from(name), "content-type");
        let method = ConfigMethod::try_from("patch".to_owned()).unwrap();
        assert_eq!(method.0, http::Method::PATCH);
        assert_eq!(String::from(method), "PATCH");
        let error = ConfigHeaderName::try_from("bad header".to_owned()).unwrap_err();
        assert_eq!(error.to_string(), "\"bad header\" is not a valid header name");
        assert_eq!(
            ConfigMethod::try_from("PO ST".to_owned()).unwrap_err().to_string(),
            "\"PO ST\" is not an HTTP method"
        );
    }
}
