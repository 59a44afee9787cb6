//! Webhook intake end to end: deliveries signed here as each provider
//! documents it, through the gateway on real sockets, to an upstream that
//! counts its effects. A verified delivery is forwarded once and byte for
//! byte; its redeliveries (re-signed, even with bookkeeping fields of the
//! body changed) get the stored answer; a delivery that fails verification
//! is refused with `401`, reaches nothing and occupies no key.

mod providers;

use std::sync::Arc;

use idemgate::config::{ConcurrentMode, ConfigDuration, ForwardKey, KeySource, Scheme};
use providers::{SECRET, deliver, event, now, secret_for, signature_header, signed, webhook_config};

use crate::support::gateway::TestGateway;
use crate::support::redis_server::{shared_redis_url, unique_prefix};
use crate::support::upstream::Upstream;

async fn delivered_once_and_redeliveries_replayed(scheme: Scheme) {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(webhook_config(&upstream.url(), scheme, &[secret_for(scheme)])).await;
    let id = format!("evt_{}", scheme.name());
    let body = event(&id, 1);
    let headers = signed(scheme, secret_for(scheme), &id, now(), &body);
    let first = deliver(gateway.post("/charge"), &headers, &body).send().await;
    assert_eq!((first.status, first.replayed()), (201, false), "{scheme:?}: {}", first.text());
    assert_eq!(upstream.total(), 1);
    assert_eq!(upstream.last_body(), body.as_bytes(), "{scheme:?}: the upstream gets the delivery byte for byte");
    let sent = &headers.iter().find(|(name, _)| *name == signature_header(scheme)).unwrap().1;
    assert_eq!(upstream.last_headers()[signature_header(scheme)], sent.as_str(), "and its signature to verify again");
    assert!(upstream.last_headers().get("idempotency-key").is_none(), "forward_key = original adds no key");
    for attempt in 2..=4 {
        // The provider signs each attempt anew; where the signature covers
        // the id, bookkeeping fields may change (Stripe's), and GitHub and
        // Shopify resend the same payload.
        let again = match scheme {
            Scheme::Stripe | Scheme::StandardWebhooks => event(&id, 4 - attempt),
            Scheme::Github | Scheme::Shopify => body.clone(),
        };
        let headers = signed(scheme, secret_for(scheme), &id, now(), &again);
        let redelivery = deliver(gateway.post("/charge"), &headers, &again).send().await;
        assert_eq!((redelivery.status, redelivery.replayed()), (201, true), "{scheme:?} #{attempt}");
        assert_eq!(redelivery.body, first.body, "the stored answer");
    }
    assert_eq!(upstream.total(), 1, "{scheme:?}: one effect for four deliveries");
    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    for (outcome, n) in [("verified", 1), ("replayed", 3)] {
        let line = format!("idemgate_webhook_deliveries_total{{outcome=\"{outcome}\",route=\"default\"}} {n}");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}

#[tokio::test]
async fn standard_webhooks_deliveries_are_forwarded_once_and_redeliveries_replayed() {
    delivered_once_and_redeliveries_replayed(Scheme::StandardWebhooks).await;
}

#[tokio::test]
async fn stripe_deliveries_are_forwarded_once_and_redeliveries_replayed() {
    delivered_once_and_redeliveries_replayed(Scheme::Stripe).await;
}

#[tokio::test]
async fn github_deliveries_are_forwarded_once_and_redeliveries_replayed() {
    delivered_once_and_redeliveries_replayed(Scheme::Github).await;
}

#[tokio::test]
async fn shopify_deliveries_are_forwarded_once_and_redeliveries_replayed() {
    delivered_once_and_redeliveries_replayed(Scheme::Shopify).await;
}

/// GitHub and Shopify sign the body, not the id header: a captured
/// delivery resent under a real event's id must not make that event's
/// delivery a replay (a stored `2xx`, and the provider stops retrying).
/// Their fingerprint is the request's, so the real event gets `422`.
#[tokio::test]
async fn an_unsigned_event_id_taken_by_another_signed_body_is_refused_not_replayed() {
    for scheme in [Scheme::Github, Scheme::Shopify] {
        let upstream = Upstream::start().await;
        let gateway = TestGateway::start(webhook_config(&upstream.url(), scheme, &[secret_for(scheme)])).await;
        let captured = event("evt_captured", 1);
        let resent = signed(scheme, secret_for(scheme), "evt_real", now(), &captured);
        assert_eq!(deliver(gateway.post("/charge"), &resent, &captured).send().await.status, 201);
        let real = event("evt_real", 1);
        let headers = signed(scheme, secret_for(scheme), "evt_real", now(), &real);
        let delivered = deliver(gateway.post("/charge"), &headers, &real).send().await;
        assert_eq!((delivered.status, delivered.replayed()), (422, false), "{scheme:?}: {}", delivered.text());
        assert_eq!(upstream.total(), 1, "{scheme:?}: the real event was not answered from another's record");
    }
}

#[tokio::test]
async fn the_standard_webhooks_published_vector_is_accepted_on_a_real_socket() {
    // libraries/python/tests/test_webhooks.py in standard-webhooks/standard-webhooks:
    // signed in 2021, so this route's tolerance reaches back that far.
    let upstream = Upstream::start().await;
    let mut config = webhook_config(&upstream.url(), Scheme::StandardWebhooks, &[providers::SW_SECRET]);
    config.routes[0].webhook.as_mut().unwrap().tolerance = "36500d".parse().unwrap();
    let gateway = TestGateway::start(config).await;
    let body = r#"{"test": 2432232314}"#;
    let reply = gateway
        .post("/charge")
        .header("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
        .header("webhook-timestamp", "1614265330")
        .header("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        .json(body)
        .send()
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(upstream.last_body(), body.as_bytes());
}

#[tokio::test]
async fn a_tampered_body_or_a_wrong_secret_is_refused_and_occupies_nothing() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(webhook_config(&upstream.url(), Scheme::Stripe, &[SECRET])).await;
    let body = event("evt_tampered", 1);
    let headers = signed(Scheme::Stripe, SECRET, "", now(), &body);
    let tampered = body.replace("500", "50000");
    let reply = deliver(gateway.post("/charge"), &headers, &tampered).send().await;
    assert_eq!((reply.status, reply.problem()), (401, "webhook-signature".into()), "{}", reply.text());
    let forged = signed(Scheme::Stripe, "whsec_someone_else", "", now(), &body);
    let reply = deliver(gateway.post("/charge"), &forged, &body).send().await;
    assert_eq!((reply.status, reply.problem()), (401, "webhook-signature".into()));
    assert!(!reply.text().contains("evt_tampered") && !reply.text().contains("whsec"), "{}", reply.text());
    assert_eq!(upstream.total(), 0, "nothing forwarded");
    // The event's key was not taken: the genuine delivery runs.
    let reply = deliver(gateway.post("/charge"), &headers, &body).send().await;
    assert_eq!((reply.status, reply.replayed()), (201, false), "{}", reply.text());
    assert_eq!(upstream.total(), 1);
    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    for line in [
        "idemgate_webhook_deliveries_total{outcome=\"signature_failed\",route=\"default\"} 2",
        "idemgate_webhook_refusals_total{reason=\"mismatch\",route=\"default\"} 2",
        "idemgate_requests_total{outcome=\"webhook-signature\",route=\"default\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

#[tokio::test]
async fn during_a_rotation_both_secrets_verify() {
    let upstream = Upstream::start().await;
    let config = webhook_config(&upstream.url(), Scheme::Github, &["the new secret", "the old secret"]);
    let gateway = TestGateway::start(config).await;
    for (n, secret) in ["the old secret", "the new secret"].into_iter().enumerate() {
        let id = format!("delivery-{n}");
        let body = event(&id, 1);
        let reply =
            deliver(gateway.post("/charge"), &signed(Scheme::Github, secret, &id, 0, &body), &body).send().await;
        assert_eq!(reply.status, 201, "{secret}: {}", reply.text());
    }
    assert_eq!(upstream.total(), 2);
}

#[tokio::test]
async fn stale_and_future_timestamps_are_refused_and_occupy_nothing() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(webhook_config(&upstream.url(), Scheme::Stripe, &[SECRET])).await;
    let body = event("evt_late", 1);
    for (t, reason) in [(now() - 600, "stale"), (now() + 600, "future")] {
        let reply = deliver(gateway.post("/charge"), &signed(Scheme::Stripe, SECRET, "", t, &body), &body).send().await;
        assert_eq!((reply.status, reply.problem()), (401, "webhook-timestamp".into()), "{reason}");
        let metrics = gateway.admin("GET", "/metrics").send().await.text();
        let line = format!("idemgate_webhook_refusals_total{{reason=\"{reason}\",route=\"default\"}} 1");
        assert!(metrics.contains(&line), "{line}");
    }
    assert_eq!(upstream.total(), 0);
    let reply = deliver(gateway.post("/charge"), &signed(Scheme::Stripe, SECRET, "", now(), &body), &body).send().await;
    assert_eq!((reply.status, reply.replayed()), (201, false));
}

#[tokio::test]
async fn a_missing_or_repeated_signature_header_is_refused() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(webhook_config(&upstream.url(), Scheme::Stripe, &[SECRET])).await;
    let body = event("evt_headers", 1);
    let reply = gateway.post("/charge").json(&body).send().await;
    assert_eq!((reply.status, reply.problem()), (401, "webhook-signature".into()));
    let (name, value) = signed(Scheme::Stripe, SECRET, "", now(), &body).remove(0);
    // Both fields valid: still refused, since which one counts would be a guess.
    let reply = gateway.post("/charge").header(name, &value).header(name, &value).json(&body).send().await;
    assert_eq!((reply.status, reply.problem()), (401, "webhook-signature".into()));
    let standard =
        TestGateway::start(webhook_config(&upstream.url(), Scheme::StandardWebhooks, &[providers::SW_SECRET])).await;
    let mut headers = signed(Scheme::StandardWebhooks, providers::SW_SECRET, "msg_1", now(), &body);
    headers.retain(|(name, _)| *name != "webhook-id");
    let reply = deliver(standard.post("/charge"), &headers, &body).send().await;
    assert_eq!((reply.status, reply.problem()), (401, "webhook-signature".into()));
    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    for reason in ["missing", "repeated"] {
        let line = format!("idemgate_webhook_refusals_total{{reason=\"{reason}\",route=\"default\"}} 1");
        assert!(metrics.contains(&line), "{line}");
    }
    assert_eq!(upstream.total(), 0);
}

#[tokio::test]
async fn a_verified_delivery_whose_pointer_finds_no_usable_key_is_refused() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(webhook_config(&upstream.url(), Scheme::Stripe, &[SECRET])).await;
    for (body, problem) in [
        (r#"{"object":"event"}"#, "missing-key"),
        (r#"{"id":["evt_1"],"object":"event"}"#, "invalid-key"),
        (r#"{"id":{"value":"evt_1"},"object":"event"}"#, "invalid-key"),
        (r#"{"id":null}"#, "invalid-key"),
        (&format!(r#"{{"id":"evt_1","data":{}{}}}"#, "[".repeat(200), "]".repeat(200)), "invalid-key"),
    ] {
        let reply =
            deliver(gateway.post("/charge"), &signed(Scheme::Stripe, SECRET, "", now(), body), body).send().await;
        assert_eq!((reply.status, reply.problem()), (400, problem.into()), "{body}: {}", reply.text());
        assert!(reply.text().contains("/id") && !reply.text().contains("evt_1"), "{}", reply.text());
        assert!(!reply.text().contains("Idempotency-Key"), "the route's key is not a header: {}", reply.text());
    }
    assert_eq!(upstream.total(), 0);
}

async fn concurrent_redeliveries_cause_one_effect(concurrent: ConcurrentMode) -> Vec<u16> {
    let upstream = Upstream::start().await;
    let mut config = webhook_config(&upstream.url(), Scheme::Stripe, &[SECRET]);
    config.gateway.concurrent = concurrent;
    let gateway = Arc::new(TestGateway::start(config).await);
    let calls: Vec<_> = (0..32)
        .map(|n| {
            let gateway = gateway.clone();
            tokio::spawn(async move {
                let body = event("evt_concurrent", n);
                let headers = signed(Scheme::Stripe, SECRET, "", now(), &body);
                deliver(gateway.post("/slow?ms=100"), &headers, &body).send().await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap().status);
    }
    assert_eq!(upstream.total(), 1, "one effect for 32 concurrent deliveries: {statuses:?}");
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_redeliveries_cause_one_effect_and_the_others_409() {
    let statuses = concurrent_redeliveries_cause_one_effect(ConcurrentMode::Reject).await;
    assert!(statuses.iter().all(|s| *s == 201 || *s == 409), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_redeliveries_wait_for_the_first_with_concurrent_wait() {
    let statuses = concurrent_redeliveries_cause_one_effect(ConcurrentMode::Wait).await;
    assert!(statuses.iter().all(|s| *s == 201), "every delivery gets the first one's answer: {statuses:?}");
}

#[tokio::test]
async fn a_routes_key_ttl_is_the_records_lifetime_in_the_store() {
    let upstream = Upstream::start().await;
    let prefix = unique_prefix();
    let mut config = webhook_config(&upstream.url(), Scheme::Stripe, &[SECRET]);
    config.store = idemgate::config::ServiceUrl::new(format!("{}?prefix={prefix}", shared_redis_url()));
    config.routes[0].key_ttl = Some("7d".parse().unwrap());
    let gateway = TestGateway::start(config).await;
    let body = event("evt_kept", 1);
    let reply = deliver(gateway.post("/charge"), &signed(Scheme::Stripe, SECRET, "", now(), &body), &body).send().await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    let client = redis::Client::open(shared_redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut redis).await.unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let ttl: i64 = redis::cmd("PTTL").arg(&keys[0]).query_async(&mut redis).await.unwrap();
    let day = 86_400_000;
    assert!(ttl > 6 * day && ttl <= 7 * day, "the route's 7d, not gateway.key_ttl's 24h: {ttl} ms");
}

#[tokio::test]
async fn a_derived_forward_key_is_added_and_the_signed_delivery_is_untouched() {
    let upstream = Upstream::start().await;
    let mut config = webhook_config(&upstream.url(), Scheme::Stripe, &[SECRET]);
    config.gateway.forward_key = ForwardKey::Derived;
    let gateway = TestGateway::start(config).await;
    let body = event("evt_derived", 1);
    let headers = signed(Scheme::Stripe, SECRET, "", now(), &body);
    assert_eq!(deliver(gateway.post("/charge"), &headers, &body).send().await.status, 201);
    let received = upstream.last_headers();
    assert_eq!(received["stripe-signature"], headers[0].1.as_str());
    assert_eq!(upstream.last_body(), body.as_bytes());
    let key = received["idempotency-key"].to_str().unwrap();
    assert!(key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
}

#[tokio::test]
async fn two_routes_with_the_same_event_id_do_not_share_a_record() {
    let upstream = Upstream::start().await;
    let mut config = webhook_config(&upstream.url(), Scheme::Github, &[SECRET]);
    let mut other = config.routes[0].clone();
    config.routes[0].prefix = "/a/".into();
    other.name = "other".into();
    let gateway = TestGateway::start({
        config.routes.push(other);
        config
    })
    .await;
    let body = event("same", 1);
    let headers = signed(Scheme::Github, SECRET, "same-delivery", 0, &body);
    for path in ["/a/charge", "/charge"] {
        let reply = deliver(gateway.post(path), &headers, &body).send().await;
        assert!(reply.status < 300 && !reply.replayed(), "{path}: {} {}", reply.status, reply.text());
    }
    assert_eq!(upstream.total(), 2);
}

#[tokio::test]
async fn a_key_in_the_body_guards_a_plain_route_and_its_absence_passes_through() {
    let upstream = Upstream::start().await;
    let mut config = crate::support::gateway::config(&upstream.url(), "memory://");
    config.routes[0].key = Some(KeySource::Json("/order/id".into()));
    config.routes[0].key_ttl = Some(ConfigDuration(std::time::Duration::from_secs(3600)));
    let gateway = TestGateway::start(config).await;
    let keyed = r#"{"order":{"id":1001},"amount":5}"#;
    for _ in 0..3 {
        assert_eq!(gateway.post("/charge").json(keyed).send().await.status, 201);
    }
    assert_eq!(upstream.total(), 1, "keyed by the body: once");
    let reply = gateway.post("/charge").json(r#"{"order":{"id":1001},"amount":6}"#).send().await;
    assert_eq!(reply.status, 422, "the same key with another body is a mismatch on a plain route");
    for _ in 0..2 {
        assert_eq!(gateway.post("/charge").json(r#"{"amount":5}"#).send().await.status, 201);
    }
    assert_eq!(upstream.total(), 3, "no key, no guard: each one forwarded");
    assert_eq!(upstream.last_body(), r#"{"amount":5}"#.as_bytes(), "from the body already read, unchanged");
    let reply = gateway.post("/charge").json(r#"{"order":{"id":1.5}}"#).send().await;
    assert_eq!((reply.status, reply.problem()), (400, "invalid-key".into()));
}

#[tokio::test]
async fn an_operator_inspects_and_purges_an_event_by_its_route_and_then_it_runs_again() {
    let upstream = Upstream::start().await;
    let mut config = webhook_config(&upstream.url(), Scheme::Stripe, &[SECRET]);
    let token = "webhook-admin-token-0123456789";
    config.admin.token = Some(idemgate::config::Secret::new(token));
    let gateway = TestGateway::start(config).await;
    let body = event("evt_purged", 1);
    let deliver_it = || deliver(gateway.post("/charge"), &signed(Scheme::Stripe, SECRET, "", now(), &body), &body);
    assert_eq!(deliver_it().send().await.status, 201);
    let admin =
        |method: &str, path: &str| gateway.admin(method, path).header("authorization", &format!("Bearer {token}"));
    let found = admin("GET", "/admin/keys/evt_purged?route=default").send().await;
    assert_eq!(found.status, 200, "{}", found.text());
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&found.body).unwrap()["state"], "completed");
    assert_eq!(admin("GET", "/admin/keys/evt_purged").send().await.status, 404, "not in the default scope");
    assert_eq!(admin("GET", "/admin/keys/evt_purged?route=default&tenant=x").send().await.status, 400);
    assert_eq!(admin("GET", "/admin/keys/evt_purged?route=nope").send().await.status, 400);
    assert_eq!(admin("DELETE", "/admin/keys/evt_purged?route=default").send().await.status, 204);
    let again = deliver_it().send().await;
    assert_eq!((again.status, again.replayed()), (201, false), "purged: the next delivery runs");
    assert_eq!(upstream.total(), 2);
}
