//! Deliveries signed here as each provider documents it, independently of
//! the gateway's own code: `ring` for the HMAC, `base64` for encodings.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use idemgate::config::{Config, ConfigDuration, DEFAULT_TOLERANCE, Scheme, Secret, WebhookConfig};
use ring::hmac;

use crate::support::gateway::{Call, config};

/// A Standard Webhooks secret (`whsec_` + base64 of the key).
pub const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A secret for the schemes that use theirs as written.
pub const SECRET: &str = "whsec_gateway_test_secret";

/// The secret a scheme's tests sign with.
pub fn secret_for(scheme: Scheme) -> &'static str {
    if scheme == Scheme::StandardWebhooks { SW_SECRET } else { SECRET }
}

/// One route `/` to `upstream`, verifying `scheme` with `secrets`, on the memory store.
pub fn webhook_config(upstream: &str, scheme: Scheme, secrets: &[&str]) -> Config {
    let mut config = config(upstream, "memory://");
    config.routes[0].webhook = Some(WebhookConfig {
        scheme,
        secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
        secrets_file: None,
        tolerance: ConfigDuration(DEFAULT_TOLERANCE),
    });
    config
}

pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn mac(key: &[u8], pieces: &[&[u8]]) -> Vec<u8> {
    let mut context = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, key));
    for piece in pieces {
        context.update(piece);
    }
    context.sign().as_ref().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A Stripe-style event body: the key is its `id`.
pub fn event(id: &str, pending_webhooks: u32) -> String {
    format!(
        r#"{{"id":"{id}","object":"event","type":"payment_intent.succeeded","pending_webhooks":{pending_webhooks},"data":{{"object":{{"id":"pi_1","amount":500}}}}}}"#
    )
}

/// The headers `scheme`'s provider sends with `body` for event `id`, signed with `secret` at `t`.
pub fn signed(scheme: Scheme, secret: &str, id: &str, t: u64, body: &str) -> Vec<(&'static str, String)> {
    let body = body.as_bytes();
    match scheme {
        Scheme::StandardWebhooks => {
            let key = base64::engine::general_purpose::STANDARD.decode(secret.trim_start_matches("whsec_")).unwrap();
            let t = t.to_string();
            let signature = b64(&mac(&key, &[id.as_bytes(), b".", t.as_bytes(), b".", body]));
            vec![("webhook-id", id.into()), ("webhook-timestamp", t), ("webhook-signature", format!("v1,{signature}"))]
        }
        Scheme::Stripe => {
            let v1 = hex(&mac(secret.as_bytes(), &[t.to_string().as_bytes(), b".", body]));
            vec![("stripe-signature", format!("t={t},v1={v1}"))]
        }
        Scheme::Github => vec![
            ("x-github-delivery", id.into()),
            ("x-github-event", "push".into()),
            ("x-hub-signature-256", format!("sha256={}", hex(&mac(secret.as_bytes(), &[body])))),
        ],
        Scheme::Shopify => vec![
            ("x-shopify-webhook-id", id.into()),
            ("x-shopify-topic", "orders/create".into()),
            ("x-shopify-hmac-sha256", b64(&mac(secret.as_bytes(), &[body]))),
        ],
    }
}

/// The header that carries `scheme`'s signature.
pub fn signature_header(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::StandardWebhooks => "webhook-signature",
        Scheme::Stripe => "stripe-signature",
        Scheme::Github => "x-hub-signature-256",
        Scheme::Shopify => "x-shopify-hmac-sha256",
    }
}

/// `call` with `headers` and a JSON `body`.
pub fn deliver<'a>(call: Call<'a>, headers: &[(&'static str, String)], body: &str) -> Call<'a> {
    headers.iter().fold(call, |call, (name, value)| call.header(name, value)).json(body)
}
