//! The fingerprint: what makes two requests "the same request".
//!
//! `sha256` over length-prefixed fields: method, path, the query's
//! parameters sorted by name, each allow-listed header (name and values),
//! and the body — canonicalised first when it is JSON and the route asks
//! for it. Method and path are included, so one key reused on another
//! endpoint is a mismatch rather than a replay of the wrong response.
//!
//! The query sort is by name only and stable: `?b=1&a=1` is `?a=1&b=1`, but
//! `?a=1&a=2` is not `?a=2&a=1`, because many frameworks read a repeated
//! parameter as a list whose order is part of its meaning.

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
        // Stable, by name: the values of one name keep the order they came in.
        params.sort_by_key(|param| param_name(param));
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

/// The (still percent-encoded) name of a `name=value` query parameter.
fn param_name(param: &str) -> &str {
    param.split_once('=').map_or(param, |(name, _)| name)
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
    use proptest::prelude::*;

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
    fn the_order_of_names_does_not_matter_but_values_and_their_order_do() {
        assert_eq!(fp("POST", "/p?b=2&a=1", None, ""), fp("POST", "/p?a=1&b=2", None, ""));
        assert_ne!(fp("POST", "/p?a=1", None, ""), fp("POST", "/p?a=2", None, ""));
        assert_ne!(fp("POST", "/p?a=1&a=2", None, ""), fp("POST", "/p?a=2&a=1", None, ""));
        assert_eq!(fp("POST", "/p?a=1&b=9&a=2", None, ""), fp("POST", "/p?b=9&a=1&a=2", None, ""));
        assert_ne!(fp("POST", "/p?a=1&b=9&a=2", None, ""), fp("POST", "/p?a=2&b=9&a=1", None, ""));
    }

    #[test]
    fn a_parameter_without_a_value_sorts_with_its_name() {
        assert_eq!(fp("POST", "/p?b&a=1", None, ""), fp("POST", "/p?a=1&b", None, ""));
        assert_ne!(fp("POST", "/p?a&a=1", None, ""), fp("POST", "/p?a=1&a", None, ""));
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

    /// `shuffled` with each name's values put back in their original order:
    /// a reordering a framework reading lists per name cannot tell apart.
    fn keep_each_names_order(original: &[(String, u8)], shuffled: &[(String, u8)]) -> Vec<(String, u8)> {
        let mut queues: std::collections::HashMap<&str, std::collections::VecDeque<u8>> = Default::default();
        for (name, value) in original {
            queues.entry(name.as_str()).or_default().push_back(*value);
        }
        shuffled
            .iter()
            .map(|(name, _)| (name.clone(), queues.get_mut(name.as_str()).unwrap().pop_front().unwrap()))
            .collect()
    }

    fn query(params: &[(String, u8)]) -> String {
        let pairs: Vec<String> = params.iter().map(|(name, value)| format!("{name}={value}")).collect();
        format!("/p?{}", pairs.join("&"))
    }

    fn lists_by_name(params: &[(String, u8)]) -> std::collections::BTreeMap<&str, Vec<u8>> {
        let mut lists: std::collections::BTreeMap<&str, Vec<u8>> = Default::default();
        for (name, value) in params {
            lists.entry(name.as_str()).or_default().push(*value);
        }
        lists
    }

    fn params() -> impl Strategy<Value = Vec<(String, u8)>> {
        proptest::collection::vec(("[a-c]", 0u8..4), 0..8)
    }

    proptest! {
        #[test]
        fn only_the_order_of_each_names_values_counts_in_a_query(
            (original, shuffled) in params().prop_flat_map(|p| (Just(p.clone()), Just(p).prop_shuffle()))
        ) {
            let reordered = keep_each_names_order(&original, &shuffled);
            prop_assert_eq!(fp("POST", &query(&original), None, ""), fp("POST", &query(&reordered), None, ""));
            // Any shuffle: the same request exactly when every name's list is unchanged.
            let same = fp("POST", &query(&original), None, "") == fp("POST", &query(&shuffled), None, "");
            prop_assert_eq!(same, lists_by_name(&original) == lists_by_name(&shuffled));
        }
    }
}
