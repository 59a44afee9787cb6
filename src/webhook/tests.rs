//! Each scheme against signatures made here from the providers'
//! documented algorithms, and the published vectors where there are some.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use http::{HeaderMap, HeaderValue};
use ring::hmac;

use super::*;

const TOLERANCE: Duration = Duration::from_secs(300);

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

fn mac(key: &[u8], content: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), content).as_ref().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    crate::idempotency::hash::to_hex(bytes)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn reason(result: Result<(), Failure>) -> (FailureKind, Reason) {
    let failure = result.unwrap_err();
    (failure.kind, failure.reason)
}

// --- Standard Webhooks ---------------------------------------------------

/// The vector of the spec's reference libraries
/// (libraries/python/tests/test_webhooks.py, `test_sign_function`).
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TIMESTAMP: u64 = 1614265330;
const SW_BODY: &str = r#"{"test": 2432232314}"#;
const SW_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn standard(signature: &str) -> HeaderMap {
    headers(&[
        ("webhook-id", SW_ID),
        ("webhook-timestamp", &SW_TIMESTAMP.to_string()),
        ("webhook-signature", signature),
    ])
}

fn sw_verifier(secrets: &[&str]) -> Verifier {
    Verifier::new(Scheme::StandardWebhooks, secrets, TOLERANCE).unwrap()
}

#[test]
fn standard_webhooks_accepts_the_published_vector() {
    let verifier = sw_verifier(&[SW_SECRET]);
    assert_eq!(verifier.verify(&standard(SW_SIGNATURE), SW_BODY.as_bytes(), at(SW_TIMESTAMP)), Ok(()));
    // Also among other versions and signatures, space-separated.
    let list = format!("v1a,aGVsbG8= v1,{} {SW_SIGNATURE}", b64(&[0; 32]));
    assert_eq!(verifier.verify(&standard(&list), SW_BODY.as_bytes(), at(SW_TIMESTAMP + 299)), Ok(()));
}

#[test]
fn standard_webhooks_refuses_a_tampered_body_a_wrong_secret_and_an_old_timestamp() {
    let verifier = sw_verifier(&[SW_SECRET]);
    let tampered = reason(verifier.verify(&standard(SW_SIGNATURE), br#"{"test": 2432232315}"#, at(SW_TIMESTAMP)));
    assert_eq!(tampered, (FailureKind::Signature, Reason::Mismatch));
    let other = sw_verifier(&["whsec_dGhlIG90aGVyIHNlY3JldA=="]);
    let wrong = reason(other.verify(&standard(SW_SIGNATURE), SW_BODY.as_bytes(), at(SW_TIMESTAMP)));
    assert_eq!(wrong, (FailureKind::Signature, Reason::Mismatch));
    let stale = reason(verifier.verify(&standard(SW_SIGNATURE), SW_BODY.as_bytes(), at(SW_TIMESTAMP + 301)));
    assert_eq!(stale, (FailureKind::Timestamp, Reason::Stale));
    let future = reason(verifier.verify(&standard(SW_SIGNATURE), SW_BODY.as_bytes(), at(SW_TIMESTAMP - 301)));
    assert_eq!(future, (FailureKind::Timestamp, Reason::Future));
}

#[test]
fn standard_webhooks_accepts_any_of_several_secrets() {
    let rotated = sw_verifier(&["whsec_b2xkIHNlY3JldA==", SW_SECRET]);
    assert_eq!(rotated.verify(&standard(SW_SIGNATURE), SW_BODY.as_bytes(), at(SW_TIMESTAMP)), Ok(()));
    // The prefix is optional, as in the reference libraries.
    let bare = sw_verifier(&["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
    assert_eq!(bare.verify(&standard(SW_SIGNATURE), SW_BODY.as_bytes(), at(SW_TIMESTAMP)), Ok(()));
    assert!(matches!(Verifier::new(Scheme::StandardWebhooks, &["whsec_!!"], TOLERANCE), Err(SecretError::NotBase64)));
}

#[test]
fn standard_webhooks_needs_each_header_once() {
    let verifier = sw_verifier(&[SW_SECRET]);
    let body = SW_BODY.as_bytes();
    let mut missing = standard(SW_SIGNATURE);
    missing.remove("webhook-id");
    assert_eq!(reason(verifier.verify(&missing, body, at(SW_TIMESTAMP))), (FailureKind::Signature, Reason::Missing));
    let mut twice = standard(SW_SIGNATURE);
    twice.append("webhook-signature", HeaderValue::from_static(SW_SIGNATURE));
    assert_eq!(reason(verifier.verify(&twice, body, at(SW_TIMESTAMP))), (FailureKind::Signature, Reason::Repeated));
    let mut dotted = standard(SW_SIGNATURE);
    dotted.insert("webhook-id", HeaderValue::from_static("msg.1"));
    assert_eq!(reason(verifier.verify(&dotted, body, at(SW_TIMESTAMP))), (FailureKind::Signature, Reason::Malformed));
    for bad in ["", "v1a,abc", "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", "v1,short"] {
        assert_eq!(
            reason(verifier.verify(&standard(bad), body, at(SW_TIMESTAMP))),
            (FailureKind::Signature, Reason::Malformed),
            "{bad:?}"
        );
    }
}

#[test]
fn only_the_first_candidates_are_decoded() {
    let verifier = sw_verifier(&[SW_SECRET]);
    let decoys = vec![format!("v1,{}", b64(&[7; 32])); MAX_CANDIDATES];
    let late = format!("{} {SW_SIGNATURE}", decoys.join(" "));
    let failed = reason(verifier.verify(&standard(&late), SW_BODY.as_bytes(), at(SW_TIMESTAMP)));
    assert_eq!(failed, (FailureKind::Signature, Reason::Mismatch));
    assert_eq!(standard::parse_signatures(late.as_bytes()).len(), MAX_CANDIDATES);
}

// --- Stripe --------------------------------------------------------------

const STRIPE_SECRET: &str = "whsec_test_secret";

fn stripe_header(secret: &str, t: u64, body: &str) -> String {
    format!("t={t},v1={}", hex(&mac(secret.as_bytes(), format!("{t}.{body}").as_bytes())))
}

#[test]
fn stripe_signs_the_timestamp_and_the_body_in_hex() {
    let verifier = Verifier::new(Scheme::Stripe, &[STRIPE_SECRET], TOLERANCE).unwrap();
    let body = r#"{"id":"evt_1","object":"event"}"#;
    let t = 1_700_000_000;
    let signed = headers(&[("stripe-signature", &stripe_header(STRIPE_SECRET, t, body))]);
    assert_eq!(verifier.verify(&signed, body.as_bytes(), at(t)), Ok(()));
    // Several v1 (a secret being rolled), v0 and unknown keys ignored, spaces tolerated.
    let v1 = stripe_header(STRIPE_SECRET, t, body).split_once(",v1=").unwrap().1.to_owned();
    let many = format!("t={t}, v1={}, v0={v1},v1={v1},scheme=x", "0".repeat(64));
    let many = headers(&[("stripe-signature", &many)]);
    assert_eq!(verifier.verify(&many, body.as_bytes(), at(t)), Ok(()));
    let tampered = reason(verifier.verify(&signed, br#"{"id":"evt_2","object":"event"}"#, at(t)));
    assert_eq!(tampered, (FailureKind::Signature, Reason::Mismatch));
    assert_eq!(reason(verifier.verify(&signed, body.as_bytes(), at(t + 301))), (FailureKind::Timestamp, Reason::Stale));
    assert_eq!(
        reason(verifier.verify(&signed, body.as_bytes(), at(t - 301))),
        (FailureKind::Timestamp, Reason::Future)
    );
}

#[test]
fn a_stripe_header_without_t_or_v1_is_malformed() {
    for bad in ["v1=00", &format!("t=1,v0={}", "0".repeat(64)), "t=abc,v1=00", "t=1,t=2,v1=00", "garbage", ""] {
        let parsed = stripe::parse_value(bad.as_bytes()).map(|_| ());
        assert_eq!(parsed.unwrap_err().reason, Reason::Malformed, "{bad:?}");
    }
}

#[test]
fn a_stripe_item_that_is_not_key_value_is_skipped_as_stripes_libraries_skip_it() {
    let v1 = "0".repeat(64);
    for header in [format!("t=1,v1={v1},"), format!(",t=1,,v1={v1}"), format!("t=1,junk,v1={v1}")] {
        let ((_, seconds), candidates) = stripe::parse_value(header.as_bytes()).unwrap();
        assert_eq!((seconds, candidates.len()), (1, 1), "{header:?}");
    }
}

// --- GitHub --------------------------------------------------------------

#[test]
fn github_accepts_its_documented_example() {
    // docs.github.com, "Validating webhook deliveries", "Testing the webhook payload validation".
    let verifier = Verifier::new(Scheme::Github, &["It's a Secret to Everybody"], TOLERANCE).unwrap();
    let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let signed = headers(&[("x-hub-signature-256", signature)]);
    // No timestamp is signed: any clock will do.
    assert_eq!(verifier.verify(&signed, b"Hello, World!", at(0)), Ok(()));
    assert_eq!(reason(verifier.verify(&signed, b"Hello, World?", at(0))), (FailureKind::Signature, Reason::Mismatch));
    let sha1 = headers(&[("x-hub-signature-256", "sha1=757107ea0eb2509fc211221cce984b8a37570b6d")]);
    assert_eq!(reason(verifier.verify(&sha1, b"Hello, World!", at(0))).1, Reason::Malformed);
    assert_eq!(reason(verifier.verify(&HeaderMap::new(), b"", at(0))).1, Reason::Missing);
}

// --- Shopify -------------------------------------------------------------

#[test]
fn shopify_signs_the_body_in_base64() {
    let secret = "shpss_client_secret";
    let verifier = Verifier::new(Scheme::Shopify, &["old-secret", secret], TOLERANCE).unwrap();
    let body = br#"{"id":820982911946154508}"#;
    let signed = headers(&[("x-shopify-hmac-sha256", &b64(&mac(secret.as_bytes(), body)))]);
    assert_eq!(verifier.verify(&signed, body, at(0)), Ok(()));
    let wrong = headers(&[("x-shopify-hmac-sha256", &b64(&mac(b"another", body)))]);
    assert_eq!(reason(verifier.verify(&wrong, body, at(0))), (FailureKind::Signature, Reason::Mismatch));
    let hexed = headers(&[("x-shopify-hmac-sha256", &hex(&mac(secret.as_bytes(), body)))]);
    assert_eq!(reason(verifier.verify(&hexed, body, at(0))).1, Reason::Malformed);
}

// --- Secrets -------------------------------------------------------------

#[test]
fn a_secrets_file_holds_one_secret_a_line() {
    let dir = std::env::temp_dir().join(format!("idemgate-webhook-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("secrets");
    std::fs::write(&path, format!("# rotated 2026-01-01\nold\n\n{STRIPE_SECRET}\n")).unwrap();
    assert_eq!(secrets::read_file(&path).unwrap(), ["old", STRIPE_SECRET]);
    std::fs::write(&path, "# nothing yet\n\n").unwrap();
    assert!(matches!(secrets::read_file(&path), Err(SecretError::EmptyFile(_))));
    let error = secrets::read_file(&dir.join("absent")).unwrap_err().to_string();
    assert!(error.contains("absent"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn nothing_a_client_sends_panics_or_verifies() {
    let verifiers: Vec<Verifier> = Scheme::ALL
        .into_iter()
        .map(|scheme| {
            let secret = if scheme == Scheme::StandardWebhooks { SW_SECRET } else { STRIPE_SECRET };
            Verifier::new(scheme, &[secret], TOLERANCE).unwrap()
        })
        .collect();
    let values = ["", ",", "=", "t=", "v1=", "t=99999999999999999999,v1=", "v1,", "sha256=", "   ", "t=1,v1=zz"];
    for verifier in &verifiers {
        for value in values {
            let map = headers(&[
                ("stripe-signature", value),
                ("webhook-signature", value),
                ("webhook-id", "msg_1"),
                ("webhook-timestamp", "1"),
                ("x-hub-signature-256", value),
                ("x-shopify-hmac-sha256", value),
            ]);
            assert!(verifier.verify(&map, b"{}", at(1)).is_err(), "{:?} {value:?}", verifier.scheme());
        }
    }
}

proptest::proptest! {
    /// What the fuzz target checks, in the ordinary suite: any header
    /// value, for every scheme, is parsed without a panic and verifies
    /// nothing (also values built from the headers' own vocabulary).
    #[test]
    fn any_signature_header_parses_without_panic_and_verifies_nothing(
        raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
        made in "(t=[0-9]{0,12}|v1=[0-9a-f]{0,70}|v0=|v1,[A-Za-z0-9+/=]{0,50}|sha256=[0-9a-f]{0,64}|[ ,=]){0,20}",
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
    ) {
        for value in [raw.as_slice(), made.as_bytes()] {
            let Ok(value) = HeaderValue::from_bytes(value) else { continue };
            let mut map = HeaderMap::new();
            for name in ["stripe-signature", "webhook-signature", "x-hub-signature-256", "x-shopify-hmac-sha256"] {
                map.insert(name, value.clone());
            }
            map.insert("webhook-id", HeaderValue::from_static("msg_1"));
            map.insert("webhook-timestamp", HeaderValue::from_static("1700000000"));
            for scheme in Scheme::ALL {
                let secret = if scheme == Scheme::StandardWebhooks { SW_SECRET } else { STRIPE_SECRET };
                let verifier = Verifier::new(scheme, &[secret], TOLERANCE).unwrap();
                proptest::prop_assert!(verifier.verify(&map, &body, at(1_700_000_000)).is_err());
            }
        }
    }
}
