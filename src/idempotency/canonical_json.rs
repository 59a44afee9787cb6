//! JSON canonicalisation for the fingerprint.
//!
//! A client that retries may re-serialise its JSON body with other key order
//! or whitespace; that must not count as a different request. The canonical
//! form sorts object keys and drops insignificant whitespace. Numbers keep
//! their exact digits (`serde_json`'s `arbitrary_precision`), so two bodies
//! that differ only in a digit past `f64` precision never look alike.
//!
//! Objects with a repeated key are not canonicalised: parsers disagree on
//! which value wins, so the gateway cannot know which one the upstream
//! acts on. [`canonicalize`] returns `None` and the raw bytes are hashed.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Returns the canonical form of `body`, or `None` if it is not JSON that
/// can be canonicalised safely (invalid, or an object with a repeated key).
pub fn canonicalize(body: &[u8]) -> Option<Vec<u8>> {
    serde_json::from_slice::<NoRepeatedKeys>(body).ok()?;
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    // `Value`'s map is a BTreeMap (no `preserve_order`): keys come out sorted.
    serde_json::to_vec(&value).ok()
}

/// Walks a document and fails on the first object with a repeated key.
struct NoRepeatedKeys;

impl<'de> Deserialize<'de> for NoRepeatedKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NoRepeatedKeysVisitor)
    }
}

struct NoRepeatedKeysVisitor;

impl<'de> Visitor<'de> for NoRepeatedKeysVisitor {
    type Value = NoRepeatedKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key) {
                return Err(de::Error::custom("repeated object key"));
            }
            map.next_value::<NoRepeatedKeys>()?;
        }
        Ok(NoRepeatedKeys)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<NoRepeatedKeys>()?.is_some() {}
        Ok(NoRepeatedKeys)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(NoRepeatedKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(NoRepeatedKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(NoRepeatedKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(NoRepeatedKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(NoRepeatedKeys)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(NoRepeatedKeys)
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

    proptest! {
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
