//! The fingerprint: what makes two requests "the same request".
//!
//! `sha256` over length-prefixed fields: method, path, the query's
//! parameters in sorted order, each allow-listed header (name and values),
//! and the body — canonicalised first when it is JSON and the route asks
//! for it. Method and path are included, so one key reused on another
//! endpoint is a mismatch rather than a replay of the wrong response.

use http::{HeaderMap, Method, Uri, header::HeaderName};

use super::canonical_json::canonicalize;
use super::hash::FieldHasher;

/// The digest that identifies a request's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

/// What the fingerprint covers beyond method, path, query and body.
#[derive(Debug, Clone)]
pub struct FingerprintPolicy {
    /// Request headers included in the fingerprint (lower-case names).
    pub headers: Vec<HeaderName>,
    /// Canonicalise JSON bodies (`content-type` `application/json` or `+json`).
    pub canonical_json: bool,
}

impl Default for FingerprintPolicy {
    fn default() -> Self {
        Self { headers: vec![http::header::CONTENT_TYPE], canonical_json: true }
    }
}

impl FingerprintPolicy {
    /// Fingerprints a request whose body has been read in full.
    pub fn fingerprint(&self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Fingerprint {
        let mut hasher = FieldHasher::new();
        hasher.field(method.as_str().as_bytes()).field(uri.path().as_bytes());

        let mut params: Vec<&str> = uri.query().unwrap_or("").split('&').filter(|p| !p.is_empty()).collect();
        params.sort_unstable();
        hasher.field(&(params.len() as u64).to_be_bytes());
        for param in params {
            hasher.field(param.as_bytes());
        }

        hasher.field(&(self.headers.len() as u64).to_be_bytes());
        for name in &self.headers {
            hasher.field(name.as_str().as_bytes());
            let values: Vec<&[u8]> = headers.get_all(name).iter().map(|v| v.as_bytes()).collect();
            hasher.field(&(values.len() as u64).to_be_bytes());
            for value in values {
                hasher.field(value);
            }
        }

        let canonical = if self.canonical_json && is_json(headers) { canonicalize(body) } else { None };
        // The marker keeps a canonicalised body from colliding with a raw one.
        match canonical {
            Some(canonical) => hasher.field(b"json").field(&canonical),
            None => hasher.field(b"raw").field(body),
        };
        Fingerprint(hasher.finish())
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn fp(method: &str, uri: &str, content_type: Option<&'static str>, body: &str) -> Fingerprint {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        FingerprintPolicy::default().fingerprint(&method, &uri.parse().unwrap(), &headers, body.as_bytes())
    }

    const JSON: Option<&str> = Some("application/json");

    #[test]
    fn a_reserialised_json_body_is_the_same_request() {
        assert_eq!(
            fp("POST", "/v1/charges", JSON, r#"{"amount":100,"currency":"eur"}"#),
            fp("POST", "/v1/charges", JSON, "{ \"currency\": \"eur\", \"amount\": 100 }")
        );
        assert_eq!(
            fp("POST", "/v1/c", Some("application/vnd.api+json; charset=utf-8"), r#"{"a":1,"b":2}"#),
            fp("POST", "/v1/c", Some("application/vnd.api+json; charset=utf-8"), r#"{"b":2,"a":1}"#)
        );
    }

    #[test]
    fn query_order_does_not_matter_but_values_do() {
        assert_eq!(fp("POST", "/p?b=2&a=1", None, ""), fp("POST", "/p?a=1&b=2", None, ""));
        assert_ne!(fp("POST", "/p?a=1", None, ""), fp("POST", "/p?a=2", None, ""));
    }

    #[test]
    fn method_path_body_and_content_type_all_count() {
        let base = fp("POST", "/v1/charges", JSON, r#"{"amount":100}"#);
        assert_ne!(base, fp("PATCH", "/v1/charges", JSON, r#"{"amount":100}"#));
        assert_ne!(base, fp("POST", "/v1/refunds", JSON, r#"{"amount":100}"#));
        assert_ne!(base, fp("POST", "/v1/charges", JSON, r#"{"amount":101}"#));
        assert_ne!(base, fp("POST", "/v1/charges", Some("text/plain"), r#"{"amount":100}"#));
    }

    #[test]
    fn non_json_bodies_are_compared_byte_for_byte() {
        assert_ne!(
            fp("POST", "/p", Some("text/plain"), r#"{"a":1,"b":2}"#),
            fp("POST", "/p", Some("text/plain"), r#"{"b":2,"a":1}"#)
        );
    }
}
