use http::{HeaderMap, HeaderValue};

use super::*;

fn json(pointer: &str) -> KeySource {
    KeySource::from_config(&config::KeySource::Json(pointer.into()))
}

fn found(source: &KeySource, headers: &HeaderMap, body: &str) -> Result<Option<String>, String> {
    source.find(headers, body.as_bytes()).map(|key| key.map(|k| k.as_str().to_owned())).map_err(|e| e.to_string())
}

#[test]
fn a_json_pointer_finds_a_string_or_an_integer() {
    let none = HeaderMap::new();
    assert_eq!(found(&json("/id"), &none, r#"{"id":"evt_1","object":"event"}"#), Ok(Some("evt_1".into())));
    assert_eq!(found(&json("/data/object/id"), &none, r#"{"data":{"object":{"id":42}}}"#), Ok(Some("42".into())));
    assert_eq!(found(&json("/a~1b"), &none, r#"{"a/b":"x"}"#), Ok(Some("x".into())));
    assert_eq!(found(&json("/id"), &none, r#"{"id":-7}"#), Ok(Some("-7".into())));
    assert_eq!(found(&json("/list/1"), &none, r#"{"list":["a","b"]}"#), Ok(Some("b".into())));
}

#[test]
fn a_json_pointer_to_nothing_is_absent_and_to_anything_else_is_refused() {
    let none = HeaderMap::new();
    assert_eq!(found(&json("/id"), &none, r#"{"other":1}"#), Ok(None));
    assert_eq!(found(&json("/id"), &none, "not json"), Ok(None));
    assert_eq!(found(&json("/id"), &none, ""), Ok(None));
    for (body, kind) in [
        (r#"{"id":{"a":1}}"#, "an object"),
        (r#"{"id":[1]}"#, "an array"),
        (r#"{"id":null}"#, "null"),
        (r#"{"id":true}"#, "a boolean"),
        (r#"{"id":1.5}"#, "not an integer"),
        (r#"{"id":1e3}"#, "not an integer"),
        (r#"{"id":""}"#, "is empty"),
        ("{\"id\":\"caf\u{e9}\"}", "printable ASCII"),
    ] {
        let error = found(&json("/id"), &none, body).unwrap_err();
        assert!(error.contains(kind) && error.contains("/id"), "{body}: {error}");
    }
    let secret = r#"{"id":{"card":"4242424242424242"}}"#;
    assert!(!found(&json("/id"), &none, secret).unwrap_err().contains("4242"), "the body is never echoed");
}

#[test]
fn another_header_gives_its_raw_value_once() {
    let source = KeySource::from_config(&config::KeySource::Header(http::HeaderName::from_static("webhook-id")));
    assert!(source.route_scoped() && !source.in_body());
    let mut headers = HeaderMap::new();
    assert_eq!(found(&source, &headers, ""), Ok(None));
    headers.insert("webhook-id", HeaderValue::from_static("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"));
    assert_eq!(found(&source, &headers, ""), Ok(Some("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W".into())));
    // Quotes and commas are part of a raw value, not syntax.
    headers.insert("webhook-id", HeaderValue::from_static("\"a,b\""));
    assert_eq!(found(&source, &headers, ""), Ok(Some("\"a,b\"".into())));
    headers.append("webhook-id", HeaderValue::from_static("b"));
    assert!(found(&source, &headers, "").unwrap_err().contains("more than once"));
    headers.insert("webhook-id", HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
    assert!(found(&source, &headers, "").unwrap_err().contains("printable ASCII"));
    headers.insert("webhook-id", HeaderValue::from_bytes(&[b'k'; 256]).unwrap());
    assert!(found(&source, &headers, "").unwrap_err().contains("longer than 255"));
}

#[test]
fn the_default_source_is_the_idempotency_key_header_scoped_by_tenant_only() {
    let source = KeySource::from_config(&config::KeySource::default());
    assert!(!source.route_scoped());
    let mut headers = HeaderMap::new();
    headers.insert("idempotency-key", HeaderValue::from_static("\"k1\""));
    assert_eq!(found(&source, &headers, ""), Ok(Some("k1".into())));
}
