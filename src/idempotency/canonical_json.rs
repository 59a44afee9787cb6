//! JSON canonicalisation for the fingerprint.
//!
//! A client that retries may re-serialise its JSON body with other key order
//! or whitespace; that must not count as a different request. The canonical
//! form sorts object keys and drops insignificant whitespace. Numbers keep
//! their exact digits (`serde_json`'s `arbitrary_precision`), so two bodies
//! that differ only in a digit past `f64` precision never look alike.
//!
//! `serde_json` hands a number to a visitor as a one-key map whose key is a
//! private token; a document that spells that map itself
//! (`{"$serde_json::private::Number":"500"}`) must not become the number
//! 500. The two differ in how the digits arrive: the number's as an owned
//! `String`, the document's string as one borrowed from (or copied out of)
//! the input. [`TokenValue`] tells them apart.
//!
//! Objects with a repeated key are not canonicalised: parsers disagree on
//! which value wins, so the gateway cannot know which one the upstream
//! acts on. [`canonicalize`] returns `None` and the raw bytes are hashed.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Returns the canonical form of `body`, or `None` if it is not JSON that
/// can be canonicalised safely (invalid, or an object with a repeated key).
///
/// One parse: the document is read into a [`Value`] exactly as
/// `serde_json` reads one, failing on the first repeated key. (It used to
/// take a checking pass and then a second parse: a third of a replay's
/// instructions outside hyper and the hashes.)
pub fn canonicalize(body: &[u8]) -> Option<Vec<u8>> {
    let Canonical(value) = serde_json::from_slice(body).ok()?;
    // `Value`'s map is a BTreeMap (no `preserve_order`): keys come out sorted.
    serde_json::to_vec(&value).ok()
}

/// A document read as `serde_json`'s own `Value` reads it, refusing objects
/// with a repeated key.
struct Canonical(Value);

/// The key `serde_json` (`arbitrary_precision`) hands a number under,
/// spelled as in its `number.rs`. Its own `Value` reads a document's map
/// with this one key as a number too; [`Canonical`] does not.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// What follows [`NUMBER_TOKEN`]: a number's digits, which `serde_json`
/// hands over as an owned `String` (serde's `StringDeserializer`), or a
/// string the document spelled, which its parser hands over borrowed or
/// copied, never owned. Any other value there fails the parse, and the
/// body is hashed raw.
enum TokenValue {
    Digits(String),
    Spelled(String),
}

impl<'de> Deserialize<'de> for TokenValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TokenValueVisitor;
        impl<'de> Visitor<'de> for TokenValueVisitor {
            type Value = TokenValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number's digits or a string")
            }
            fn visit_string<E>(self, digits: String) -> Result<TokenValue, E> {
                Ok(TokenValue::Digits(digits))
            }
            fn visit_str<E>(self, s: &str) -> Result<TokenValue, E> {
                Ok(TokenValue::Spelled(s.to_owned()))
            }
        }
        deserializer.deserialize_any(TokenValueVisitor)
    }
}

impl<'de> Deserialize<'de> for Canonical {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CanonicalVisitor).map(Canonical)
    }
}

struct CanonicalVisitor;

impl<'de> Visitor<'de> for CanonicalVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Ok(Value::Object(Map::new()));
        };
        let mut object = Map::new();
        if first == NUMBER_TOKEN {
            match map.next_value()? {
                TokenValue::Digits(digits) => {
                    return digits.parse::<Number>().map(Value::Number).map_err(de::Error::custom);
                }
                TokenValue::Spelled(text) => object.insert(first, Value::String(text)),
            };
        } else {
            object.insert(first, map.next_value::<Canonical>()?.0);
        }
        while let Some(key) = map.next_key::<String>()? {
            let Canonical(value) = map.next_value()?;
            if object.insert(key, value).is_some() {
                return Err(de::Error::custom("repeated object key"));
            }
        }
        Ok(Value::Object(object))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Canonical(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(Number::from_f64(n).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canon(s: &str) -> Option<String> {
        canonicalize(s.as_bytes()).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        assert_eq!(
            canon("{ \"b\": 1,\n \"a\": [1, 2, {\"d\":0,\"c\":null}] }").unwrap(),
            r#"{"a":[1,2,{"c":null,"d":0}],"b":1}"#
        );
        assert_eq!(canon(r#"{"a":1,"b":2}"#), canon(r#"{"b":2,  "a":1}"#));
    }

    #[test]
    fn numbers_keep_every_digit() {
        assert_ne!(canon(r#"{"amount":0.1}"#), canon(r#"{"amount":0.10000000000000001}"#));
        assert_ne!(canon("18446744073709551616123"), canon("18446744073709551616124"));
        assert_eq!(canon("1.50").unwrap(), "1.50");
    }

    #[test]
    fn repeated_keys_and_invalid_json_are_not_canonicalised() {
        assert_eq!(canon(r#"{"a":1,"a":2}"#), None);
        assert_eq!(canon(r#"[{"x":{"a":1,"a":1}}]"#), None);
        assert_eq!(canon("{not json"), None);
        assert_eq!(canon(""), None);
    }

    /// The two-pass form the one pass replaced (a checking walk, then
    /// `serde_json`'s own `Value`): the oracle it must agree with, since a
    /// fingerprint stored before the change must match one computed after.
    fn two_passes(body: &[u8]) -> Option<Vec<u8>> {
        struct Checked;
        impl<'de> Deserialize<'de> for Checked {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_any(CheckedVisitor)
            }
        }
        struct CheckedVisitor;
        impl<'de> Visitor<'de> for CheckedVisitor {
            type Value = Checked;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
                let mut seen = std::collections::HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key) {
                        return Err(de::Error::custom("repeated object key"));
                    }
                    map.next_value::<Checked>()?;
                }
                Ok(Checked)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
                while seq.next_element::<Checked>()?.is_some() {}
                Ok(Checked)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_unit<E>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
        }
        serde_json::from_slice::<Checked>(body).ok()?;
        serde_json::to_vec(&serde_json::from_slice::<Value>(body).ok()?).ok()
    }

    #[test]
    fn the_one_pass_agrees_with_the_two_passes_on_edge_cases() {
        for doc in [
            r#"{"a":1,"b":{"a":1},"c":[{"a":1},{"a":1}]}"#,
            r#"{"a":1,"b":2,"a":1}"#,
            r#"["\u00e9\ud83d\ude00", -0, 1E400, 1e-400, null, true]"#,
            "{} ",
            " [] x",
            "\"s\"",
            "[[[[[[]]]]]]",
            "1.5e+3",
        ] {
            assert_eq!(canonicalize(doc.as_bytes()), two_passes(doc.as_bytes()), "{doc}");
        }
    }

    #[test]
    fn a_document_spelling_the_parsers_number_token_is_not_that_number() {
        let token = r#"{"amount":{"$serde_json::private::Number":"500"}}"#;
        assert_ne!(canon(token), canon(r#"{"amount":500}"#));
        assert_eq!(canon(token).as_deref(), Some(token));
        let escaped = r#"{"amount":{"\u0024serde_json::private::Number":"5\u0030\u0030"}}"#;
        assert_eq!(canon(escaped).as_deref(), Some(token));
        assert_eq!(
            canon(r#"{"$serde_json::private::Number":"1","a":2}"#).as_deref(),
            Some(r#"{"$serde_json::private::Number":"1","a":2}"#)
        );
        // Not a string there: hashed raw, so it meets no other body.
        assert_eq!(canon(r#"{"$serde_json::private::Number":1}"#), None);
        // Real numbers keep every digit, as before.
        assert_eq!(canon(r#"{"amount":500.00}"#).as_deref(), Some(r#"{"amount":500.00}"#));
    }

    /// JSON-shaped text: documents, near-documents and repeated keys.
    fn jsonish() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            "-?[0-9]{1,3}(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
            "\"[a-c\\\\é]{0,3}\"",
            Just("null".to_string()),
            Just("true".to_string())
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(" , "))),
                proptest::collection::vec(("[a-c]", inner), 0..4).prop_map(|entries| {
                    let fields: Vec<String> = entries.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{ {} }}", fields.join(","))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_one_pass_agrees_with_the_two_passes(doc in jsonish(), cut in 0usize..64) {
            prop_assert_eq!(canonicalize(doc.as_bytes()), two_passes(doc.as_bytes()));
            let cut = cut.min(doc.len());
            prop_assert_eq!(canonicalize(&doc.as_bytes()[..cut]), two_passes(&doc.as_bytes()[..cut]));
        }

        #[test]
        fn canonicalisation_is_idempotent_and_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Some(once) = canonicalize(&raw) {
                prop_assert_eq!(canonicalize(&once), Some(once.clone()));
            }
        }

        #[test]
        fn reordered_objects_canonicalise_alike(entries in proptest::collection::btree_map("[a-z]{1,4}", 0i64..1000, 0..8)) {
            let forward: Vec<String> = entries.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
            let backward: Vec<String> = forward.iter().rev().cloned().collect();
            let a = format!("{{{}}}", forward.join(","));
            let b = format!("{{ {} }}", backward.join(" , "));
            prop_assert_eq!(canonicalize(a.as_bytes()), canonicalize(b.as_bytes()));
        }
    }
}
