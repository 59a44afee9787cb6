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
//! parameter as a list whose order is part of its meaning. Names and values
//! are compared as the upstream reads them, after percent-decoding:
//! `?%61=1` is `?a=1`, so `?a=1&%61=2` and `?%61=2&a=1` (a list `[1, 2]`
//! against `[2, 1]`) differ. Each is hashed in one canonical spelling —
//! unreserved characters plain, every other byte an upper-case escape —
//! except that a literal `+` stays `+`: form decoders read it as a space
//! and `%2B` as a plus, so the two must not meet.

use std::borrow::Cow;

use http::{HeaderMap, Method, Uri, header::HeaderName};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, percent_encode};

use super::canonical_json::canonicalize;
use super::hash::FieldHasher;

/// The method-override headers: frameworks that honour one run the method
/// it names instead of the request's own. A request that carries one is
/// fingerprinted with both methods, so it never shares a fingerprint with
/// a request that names another method, or none.
pub static METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

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

impl Fingerprint {
    /// A verified webhook delivery's fingerprint: its event id alone. A
    /// provider's redelivery may change bookkeeping fields of the body
    /// (Stripe's `pending_webhooks`) and its signature already says who
    /// sent it, so a redelivery is the same request whatever its body.
    pub fn of_event(event_id: &super::IdempotencyKey) -> Self {
        Self(super::hash::hash_fields(&[b"webhook-event", event_id.as_str().as_bytes()]))
    }
}

impl FingerprintPolicy {
    /// Fingerprints a request whose body has been read in full.
    pub fn fingerprint(&self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Fingerprint {
        let mut hasher = FieldHasher::new();
        // One pass over the request's few names, not three hashed lookups.
        match headers.keys().any(|name| METHOD_OVERRIDES.contains(name)) {
            false => hasher.field(method.as_str().as_bytes()),
            // Never a method: a token has no space.
            true => hasher.field(&overridden_method(method, headers)),
        };
        hasher.field(uri.path().as_bytes());

        let mut params: Vec<Cow<'_, str>> =
            uri.query().unwrap_or("").split('&').filter(|p| !p.is_empty()).map(canonical_param).collect();
        // Stable, by name: the values of one name keep the order they came in.
        params.sort_by(|a, b| param_name(a).cmp(param_name(b)));
        hasher.field(&(params.len() as u64).to_be_bytes());
        for param in &params {
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

/// `METHOD NAMED…`: the request's method and, upper-cased, what each
/// override header names.
fn overridden_method(method: &Method, headers: &HeaderMap) -> Vec<u8> {
    let mut field = method.as_str().as_bytes().to_vec();
    for value in METHOD_OVERRIDES.iter().flat_map(|name| headers.get_all(name)) {
        field.push(b' ');
        field.extend(value.as_bytes().trim_ascii().iter().map(u8::to_ascii_uppercase));
    }
    field
}

/// The name of a canonical `name=value` query parameter.
fn param_name(param: &str) -> &str {
    param.split_once('=').map_or(param, |(name, _)| name)
}

/// Every byte but the unreserved ones (RFC 3986 §2.3) is escaped.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// A raw `name=value` (or `name`) parameter in its canonical spelling
/// (module doc); borrowed when it is canonical already, as most are.
fn canonical_param(raw: &str) -> Cow<'_, str> {
    let plain = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+');
    match raw.split_once('=') {
        Some((name, value)) if name.bytes().all(|b| plain(&b)) && value.bytes().all(|b| plain(&b)) => {
            Cow::Borrowed(raw)
        }
        None if raw.bytes().all(|b| plain(&b)) => Cow::Borrowed(raw),
        Some((name, value)) => Cow::Owned(format!("{}={}", canonical_component(name), canonical_component(value))),
        None => Cow::Owned(canonical_component(raw)),
    }
}

/// One name or value: decoded, then escaped again canonically, piece by
/// piece between literal `+`s.
fn canonical_component(raw: &str) -> String {
    let pieces: Vec<String> = raw
        .split('+')
        .map(|piece| {
            let decoded: Cow<'_, [u8]> = percent_decode_str(piece).into();
            percent_encode(&decoded, ESCAPED).to_string()
        })
        .collect();
    pieces.join("+")
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
    fn names_and_values_are_compared_as_the_upstream_decodes_them() {
        assert_eq!(fp("POST", "/p?%61=1", None, ""), fp("POST", "/p?a=1", None, ""));
        assert_eq!(fp("POST", "/p?a=%31", None, ""), fp("POST", "/p?a=1", None, ""));
        assert_eq!(fp("POST", "/p?a=%c3%a9", None, ""), fp("POST", "/p?a=%C3%A9", None, ""));
        assert_eq!(fp("POST", "/p?a=x:y", None, ""), fp("POST", "/p?a=x%3Ay", None, ""));
        // The upstream reads a=[1,2] against a=[2,1].
        assert_ne!(fp("POST", "/p?a=1&%61=2", None, ""), fp("POST", "/p?%61=2&a=1", None, ""));
        assert_eq!(fp("POST", "/p?a=1&%61=2", None, ""), fp("POST", "/p?a=1&a=2", None, ""));
        // A form decoder reads `+` as a space and `%2B` as a plus.
        assert_ne!(fp("POST", "/p?a=1+2", None, ""), fp("POST", "/p?a=1%2B2", None, ""));
        assert_ne!(fp("POST", "/p?a=%252B", None, ""), fp("POST", "/p?a=%2B", None, ""));
        // An `=` or `&` inside a value is not a separator.
        assert_ne!(fp("POST", "/p?a=1%26b=2", None, ""), fp("POST", "/p?a=1&b=2", None, ""));
        assert_eq!(fp("POST", "/p?a=x=y", None, ""), fp("POST", "/p?a=x%3Dy", None, ""));
    }

    #[test]
    fn a_method_override_counts_as_a_method_of_its_own() {
        let with = |name: &'static str, value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(HeaderName::from_static(name), HeaderValue::from_static(value));
            FingerprintPolicy::default().fingerprint(&Method::GET, &"/p".parse().unwrap(), &headers, b"")
        };
        let plain_get = fp("GET", "/p", None, "");
        let as_post = with("x-http-method-override", "POST");
        assert_ne!(as_post, plain_get);
        assert_ne!(as_post, fp("POST", "/p", None, ""));
        assert_ne!(as_post, with("x-http-method-override", "DELETE"));
        assert_eq!(as_post, with("x-http-method", " post"));
    }

    #[test]
    fn a_canonical_parameter_is_hashed_as_it_came() {
        for raw in ["a=1", "b", "a=1+2", "x_y.z~=-"] {
            assert!(matches!(canonical_param(raw), Cow::Borrowed(_)), "{raw}");
        }
        assert_eq!(canonical_param("%61=%7e"), "a=~");
        assert_eq!(canonical_param("a=%2b+%20"), "a=%2B+%20");
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
