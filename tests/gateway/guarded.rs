//! The gateway end to end: a real upstream on port 0 that counts its side
//! effects, the gateway in front of it, and real stores.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use idemgate::config::{ConcurrentMode, ConfigDuration, FailMode, ForwardKey, JwtClaimConfig, JwtKeys, TenantConfig};
use support::gateway::{TestGateway, config};
use support::jwt;
use support::redis_server::{RedisCluster, RedisProcess, shared_redis_url, unique_prefix};
use support::upstream::Upstream;

const CHARGE: &str = r#"{"amount": 500, "currency": "eur"}"#;

fn redis_store() -> String {
    format!("{}?prefix={}", shared_redis_url(), unique_prefix())
}

async fn a_retry_after_completion_replays_the_stored_response(store: &str) {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), store)).await;
    let first = gateway.post("/charge").key("k-replay").json(CHARGE).send().await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    // A re-serialised body with other key order is the same request.
    let retry = gateway.post("/charge").key("k-replay").json(r#"{"currency":"eur","amount":500}"#).send().await;
    assert_eq!(retry.status, first.status);
    assert_eq!(retry.body, first.body, "the replay is byte-identical");
    assert_eq!(retry.headers["x-charge-id"], first.headers["x-charge-id"]);
    assert_eq!(retry.headers["content-type"], "application/json");
    assert!(retry.replayed());
    assert!(retry.headers.get("set-cookie").is_none(), "deny-listed headers are not stored");
    assert_eq!(upstream.total(), 1);
}

#[tokio::test]
async fn a_retry_after_completion_replays_the_stored_response_on_memory() {
    a_retry_after_completion_replays_the_stored_response("memory://").await;
}

#[tokio::test]
async fn a_retry_after_completion_replays_the_stored_response_on_redis() {
    a_retry_after_completion_replays_the_stored_response(&redis_store()).await;
}

/// 64 identical requests at once: one upstream call; the others get 409 or the replay.
async fn concurrent_duplicates_cause_exactly_one_upstream_call(store: &str) {
    let upstream = Upstream::start().await;
    let gateway = Arc::new(TestGateway::start(config(&upstream.url(), store)).await);
    for round in 0..3 {
        let key = format!("k-concurrent-{round}");
        let calls: Vec<_> = (0..64)
            .map(|_| {
                let gateway = gateway.clone();
                let key = key.clone();
                tokio::spawn(async move { gateway.post("/slow?ms=50").key(&key).json(CHARGE).send().await })
            })
            .collect();
        let mut statuses = Vec::new();
        for call in calls {
            statuses.push(call.await.unwrap().status);
        }
        assert!(statuses.iter().all(|s| *s == 201 || *s == 409), "{statuses:?}");
        assert!(statuses.contains(&201));
        assert_eq!(upstream.count_for(&key), 1, "round {round}: exactly one upstream call");
    }
}

#[tokio::test]
async fn concurrent_duplicates_cause_exactly_one_upstream_call_on_memory() {
    concurrent_duplicates_cause_exactly_one_upstream_call("memory://").await;
}

#[tokio::test]
async fn concurrent_duplicates_cause_exactly_one_upstream_call_on_redis() {
    concurrent_duplicates_cause_exactly_one_upstream_call(&redis_store()).await;
}

/// One cluster for both checks: starting one costs seconds.
#[tokio::test]
async fn replays_and_concurrent_duplicates_hold_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let store = format!("{}?prefix={}", cluster.url(), unique_prefix());
    a_retry_after_completion_replays_the_stored_response(&store).await;
    concurrent_duplicates_cause_exactly_one_upstream_call(&store).await;
}

#[tokio::test]
async fn the_same_key_with_another_body_is_a_mismatch() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    assert_eq!(gateway.post("/charge").key("k1").json(CHARGE).send().await.status, 201);
    let other = gateway.post("/charge").key("k1").json(r#"{"amount": 900}"#).send().await;
    assert_eq!(other.status, 422);
    assert_eq!(other.problem(), "key-mismatch");
    assert!(!other.text().contains("900"), "the body is never echoed");
    let other_path = gateway.post("/refund").key("k1").json(CHARGE).send().await;
    assert_eq!(other_path.status, 422, "the same key on another endpoint is a mismatch");
    assert_eq!(upstream.total(), 1);
}

#[tokio::test]
async fn the_same_key_from_another_tenant_is_independent_and_learns_nothing() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let alice = gateway.post("/charge").auth("alice").key("shared").json(CHARGE).send().await;
    assert_eq!(alice.status, 201);
    // Bob's identical request is executed for Bob, not replayed from Alice.
    let bob = gateway.post("/charge").auth("bob").key("shared").json(CHARGE).send().await;
    assert_eq!(bob.status, 201);
    assert!(!bob.replayed());
    assert_ne!(bob.body, alice.body);
    // Bob's different body on Alice's key is not a mismatch for Bob either.
    let bob_other = gateway.post("/charge").auth("bob").key("only-alice").json("{}").send().await;
    let _ = gateway.post("/charge").auth("alice").key("only-alice").json(CHARGE).send().await;
    assert_eq!(bob_other.status, 201);
    assert_eq!(upstream.total(), 4);
    // Each tenant still gets its own replay.
    assert_eq!(gateway.post("/charge").auth("alice").key("shared").json(CHARGE).send().await.body, alice.body);
    assert_eq!(gateway.post("/charge").auth("bob").key("shared").json(CHARGE).send().await.body, bob.body);
}

#[tokio::test]
async fn a_repeated_tenant_header_is_refused_instead_of_picking_one() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.tenant = idemgate::config::TenantConfig::Header(http::HeaderName::from_static("x-tenant-id"));
    let gateway = TestGateway::start(config).await;
    let victim = gateway.post("/charge").header("x-tenant-id", "victim").key("k").json(CHARGE).send().await;
    assert_eq!(victim.status, 201);
    // A client puts its own field ahead of the one its auth proxy appends.
    let smuggled =
        gateway.post("/charge").header("x-tenant-id", "victim").header("x-tenant-id", "mallory").key("k").json(CHARGE);
    let reply = smuggled.send().await;
    assert_eq!((reply.status, reply.problem().as_str()), (400, "ambiguous-tenant"));
    assert!(!reply.text().contains("effect"), "nothing of the victim's response leaks");
    assert_eq!(upstream.total(), 1);

    let default_mode = TestGateway::start(support::gateway::config(&upstream.url(), "memory://")).await;
    let two = default_mode.post("/charge").auth("alice").auth("bob").key("k").json(CHARGE).send().await;
    assert_eq!((two.status, two.problem().as_str()), (400, "ambiguous-tenant"));
    assert_eq!(upstream.total(), 1);
}

/// `Authorization: Basic base64(user:password)`.
fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

fn jwt_tenant(keys: JwtKeys) -> TenantConfig {
    TenantConfig::JwtClaim(JwtClaimConfig {
        claim: "sub".into(),
        keys,
        issuer: jwt::ISSUER.into(),
        audience: jwt::AUDIENCE.into(),
    })
}

/// The client of the issue: it times out, refreshes its credential and
/// retries with the new one. Under a source that names the principal the
/// retry is the same tenant and replays; another user is another tenant.
#[tokio::test]
async fn a_retry_with_a_rotated_basic_password_replays_instead_of_charging_again() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.tenant = TenantConfig::BasicUser;
    let gateway = TestGateway::start(config).await;
    let charge = |auth: String| gateway.post("/charge").header("authorization", &auth).key("k-rotate").json(CHARGE);
    let first = charge(basic("alice", "password-v1")).send().await;
    assert_eq!(first.status, 201, "{}", first.text());
    let retry = charge(basic("alice", "password-v2")).send().await;
    assert!(retry.replayed(), "a new password is the same user: {}", retry.text());
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.count_for("k-rotate"), 1, "one charge for one key");
    let bob = charge(basic("bob", "password-v1")).send().await;
    assert!(!bob.replayed() && bob.status == 201, "another user is another tenant");
    assert_eq!(upstream.count_for("k-rotate"), 2);
}

#[tokio::test]
async fn a_retry_with_a_refreshed_hs256_token_replays_instead_of_charging_again() {
    let upstream = Upstream::start().await;
    let dir = jwt::KeyDir::new();
    let issuer = jwt::Hs256::new(&dir);
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.tenant = jwt_tenant(JwtKeys::Hs256SecretFile(issuer.file.clone()));
    let gateway = TestGateway::start(config).await;
    let (v1, v2) = (issuer.sign(&jwt::claims("alice")), issuer.sign(&jwt::claims("alice")));
    assert_ne!(v1, v2, "a refreshed token is another string");
    let first = gateway.post("/charge").auth(&v1).key("k-refresh").json(CHARGE).send().await;
    assert_eq!(first.status, 201, "{}", first.text());
    let retry = gateway.post("/charge").auth(&v2).key("k-refresh").json(CHARGE).send().await;
    assert!(retry.replayed(), "{}", retry.text());
    assert_eq!(retry.body, first.body);
    let bob =
        gateway.post("/charge").auth(&issuer.sign(&jwt::claims("bob"))).key("k-refresh").json(CHARGE).send().await;
    assert!(!bob.replayed());
    assert_eq!(upstream.count_for("k-refresh"), 2, "alice once, bob once");
}

/// Tokens signed by an EC key published in a key set file; the provider
/// rotates its key (a new kid is added to the file) and the gateway
/// follows the file without a restart.
#[tokio::test]
async fn a_retry_with_a_refreshed_es256_token_replays_and_a_rotated_key_set_is_followed() {
    let upstream = Upstream::start().await;
    let dir = jwt::KeyDir::new();
    let (old_key, new_key) = (jwt::Es256::new("key-2025"), jwt::Es256::new("key-2026"));
    let jwks = dir.path("jwks.json");
    jwt::write_jwks(&jwks, &[&old_key]);
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.tenant = jwt_tenant(JwtKeys::JwksFile(jwks.clone()));
    let gateway = TestGateway::start(config).await;
    let charge = |token: String| gateway.post("/charge").auth(&token).key("k-jwks").json(CHARGE);
    let first = charge(old_key.sign(&jwt::claims("alice"))).send().await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(charge(old_key.sign(&jwt::claims("alice"))).send().await.replayed());
    let unknown = charge(new_key.sign(&jwt::claims("alice"))).send().await;
    assert_eq!((unknown.status, unknown.problem().as_str()), (401, "unauthenticated"), "a key not in the set");

    jwt::write_jwks(&jwks, &[&old_key, &new_key]);
    // The file is read again within a second of its change: ask until it is.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let retry = loop {
        let reply = charge(new_key.sign(&jwt::claims("alice"))).send().await;
        if reply.status != 401 || std::time::Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(retry.replayed(), "the new key names the same principal: {}", retry.text());
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.count_for("k-jwks"), 1);
}

/// A token that fails any check is refused before anything is recorded or
/// forwarded, and never reads the stored response of the tenant it claims.
#[tokio::test]
async fn forged_expired_and_foreign_tokens_are_401_and_never_forwarded() {
    let upstream = Upstream::start().await;
    let dir = jwt::KeyDir::new();
    let issuer = jwt::Hs256::new(&dir);
    let other_dir = jwt::KeyDir::new();
    let forger = jwt::Hs256::new(&other_dir);
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.tenant = jwt_tenant(JwtKeys::Hs256SecretFile(issuer.file.clone()));
    let gateway = TestGateway::start(config).await;
    let victim = gateway.post("/charge").auth(&issuer.sign(&jwt::claims("victim"))).key("k").json(CHARGE).send().await;
    assert_eq!(victim.status, 201);

    let with = |change: &dyn Fn(&mut serde_json::Value)| {
        let mut claims = jwt::claims("victim");
        change(&mut claims);
        claims
    };
    // (what, token, what the detail names)
    let forged = [
        ("wrong signature", forger.sign(&jwt::claims("victim")), "signature"),
        ("alg none", jwt::unsigned(&jwt::claims("victim")), "supported algorithm"),
        ("expired", issuer.sign(&with(&|c| c["exp"] = (jwt::now() - 3600).into())), "expired"),
        ("no exp", issuer.sign(&with(&|c| drop(c.as_object_mut().unwrap().remove("exp")))), "no exp claim"),
        ("wrong audience", issuer.sign(&with(&|c| c["aud"] = "another-service".into())), "audience"),
        ("wrong issuer", issuer.sign(&with(&|c| c["iss"] = "https://evil.example".into())), "issuer"),
        ("no sub", issuer.sign(&with(&|c| drop(c.as_object_mut().unwrap().remove("sub")))), "no sub claim"),
        (
            "another alg",
            issuer.sign_with_header(&serde_json::json!({ "alg": "HS512", "typ": "JWT" }), &jwt::claims("victim")),
            "algorithm",
        ),
        ("not a JWT", "victim".to_string(), "supported algorithm"),
    ];
    for (what, token, named) in &forged {
        let reply = gateway.post("/charge").auth(token).key("k").json(CHARGE).send().await;
        assert_eq!((reply.status, reply.problem().as_str()), (401, "unauthenticated"), "{what}: {}", reply.text());
        assert!(reply.text().contains(named), "{what}: the detail says which check failed: {}", reply.text());
        assert_eq!(reply.headers["www-authenticate"], "Bearer", "{what}");
        assert!(!reply.text().contains("effect"), "{what}: nothing of the victim's response");
    }
    for (what, reply) in [
        ("no credential", gateway.post("/charge").key("k").json(CHARGE).send().await),
        (
            "a Basic credential",
            gateway.post("/charge").header("authorization", &basic("victim", "x")).key("k").json(CHARGE).send().await,
        ),
    ] {
        assert_eq!((reply.status, reply.problem().as_str()), (401, "unauthenticated"), "{what}");
    }
    assert_eq!(upstream.total(), 1, "only the victim's own request was forwarded");
}

/// An EC public key is never taken as an HMAC secret: a token "signed"
/// with HS256 over the published key names the key's kid and is refused.
#[tokio::test]
async fn a_key_set_key_checks_only_its_own_algorithm() {
    let upstream = Upstream::start().await;
    let dir = jwt::KeyDir::new();
    let key = jwt::Es256::new("only");
    let jwks = dir.path("jwks.json");
    jwt::write_jwks(&jwks, &[&key]);
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.tenant = jwt_tenant(JwtKeys::JwksFile(jwks.clone()));
    let gateway = TestGateway::start(config).await;
    let published = std::fs::read(&jwks).unwrap();
    let hmac = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &published);
    use base64::Engine;
    let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let message =
        format!("{}.{}", b64(serde_json::json!({ "alg": "HS256", "kid": "only" })), b64(jwt::claims("victim")));
    let signature =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(ring::hmac::sign(&hmac, message.as_bytes()));
    let reply = gateway.post("/charge").auth(&format!("{message}.{signature}")).key("k").json(CHARGE).send().await;
    assert_eq!((reply.status, reply.problem().as_str()), (401, "unauthenticated"));
    assert_eq!(
        gateway.post("/charge").auth(&key.sign(&jwt::claims("victim"))).key("k").json(CHARGE).send().await.status,
        201
    );
    assert_eq!(upstream.total(), 1);
}

#[tokio::test]
async fn a_basic_user_source_refuses_a_request_without_a_user_instead_of_sharing_a_tenant() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.tenant = TenantConfig::BasicUser;
    let gateway = TestGateway::start(config).await;
    for auth in [None, Some("Bearer tok-v1".to_string()), Some(basic("", "password"))] {
        let call = gateway.post("/charge").key("k-anon").json(CHARGE);
        let reply = match &auth {
            Some(auth) => call.header("authorization", auth).send().await,
            None => call.send().await,
        };
        assert_eq!((reply.status, reply.problem().as_str()), (401, "unauthenticated"), "{auth:?}");
        assert_eq!(reply.headers["www-authenticate"], "Basic realm=\"idemgate\"");
    }
    let unguarded = gateway.get("/charge").send().await;
    assert_eq!(unguarded.status, 201, "requests that need no tenant pass as before");
    assert_eq!(upstream.total(), 1);
}

/// The default source hashes the credential, its scheme compared without
/// regard to case (RFC 9110): `Bearer x` and `bearer x` are one tenant.
#[tokio::test]
async fn the_default_tenant_is_one_whatever_the_case_of_the_scheme() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let charge = |auth: &str| gateway.post("/charge").header("authorization", auth).key("k-case").json(CHARGE);
    let first = charge("Bearer x").send().await;
    assert_eq!(first.status, 201);
    for spelling in ["bearer x", "BEARER x", "Bearer   x"] {
        let retry = charge(spelling).send().await;
        assert!(retry.replayed(), "{spelling}: {}", retry.text());
    }
    assert_eq!(upstream.count_for("k-case"), 1);
    assert!(!charge("Bearer X").send().await.replayed(), "the credential itself is compared exactly");
    assert_eq!(upstream.count_for("k-case"), 2);
}

#[tokio::test]
async fn an_upstream_500_releases_the_key_and_a_retry_runs_again_but_a_reset_holds_it() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let failed = gateway.post("/status?code=500").key("k500").json(CHARGE).send().await;
    assert_eq!(failed.status, 500);
    let again = gateway.post("/status?code=500").key("k500").json(CHARGE).send().await;
    assert_eq!(again.status, 500);
    assert!(!again.replayed());
    assert_eq!(upstream.count_for("k500"), 2);

    // The upstream got the request and then reset: it may have acted, so
    // the key is held and nothing is forwarded again.
    let reset = gateway.post("/reset").key("k-reset").json(CHARGE).send().await;
    assert_eq!(reset.status, 502);
    assert_eq!(reset.problem(), "outcome-unknown");
    let retry = gateway.post("/reset").key("k-reset").json(CHARGE).send().await;
    assert_eq!((retry.status, retry.problem().as_str()), (502, "outcome-unknown"));
    assert_eq!(upstream.count_for("k-reset"), 1);

    // A 422 from the upstream (validation) releases too; a 402 (it acted) is stored.
    assert_eq!(gateway.post("/status?code=422").key("k422").json(CHARGE).send().await.status, 422);
    assert_eq!(gateway.post("/status?code=422").key("k422").json(CHARGE).send().await.status, 422);
    assert_eq!(upstream.count_for("k422"), 2);
    assert_eq!(gateway.post("/status?code=402").key("k402").json(CHARGE).send().await.status, 402);
    assert!(gateway.post("/status?code=402").key("k402").json(CHARGE).send().await.replayed());
    assert_eq!(upstream.count_for("k402"), 1);
}

async fn a_slow_upstream_longer_than_the_lease_is_not_executed_twice(store: &str) {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), store);
    config.gateway.lease = ConfigDuration(Duration::from_millis(600));
    config.gateway.upstream_timeout = ConfigDuration(Duration::from_secs(10));
    let gateway = Arc::new(TestGateway::start(config).await);
    let first = {
        let gateway = gateway.clone();
        tokio::spawn(async move { gateway.post("/slow?ms=2000").key("k-slow").json(CHARGE).send().await })
    };
    // Retry every 300 ms through the whole call: three lease lengths.
    let mut conflicts = 0;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let retry = gateway.post("/slow?ms=2000").key("k-slow").json(CHARGE).send().await;
        if retry.status == 409 {
            conflicts += 1;
            assert!(retry.headers.contains_key("retry-after"));
        }
    }
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(conflicts, 5, "every retry while the call runs is refused");
    assert_eq!(upstream.count_for("k-slow"), 1);
    assert_eq!(gateway.post("/slow?ms=2000").key("k-slow").json(CHARGE).send().await.body, first.body);
}

#[tokio::test]
async fn a_slow_upstream_longer_than_the_lease_is_not_executed_twice_on_memory() {
    a_slow_upstream_longer_than_the_lease_is_not_executed_twice("memory://").await;
}

#[tokio::test]
async fn a_slow_upstream_longer_than_the_lease_is_not_executed_twice_on_redis() {
    a_slow_upstream_longer_than_the_lease_is_not_executed_twice(&redis_store()).await;
}

#[tokio::test]
async fn redis_stopped_mid_test_fails_closed_and_recovers_when_it_returns() {
    let mut redis = RedisProcess::start();
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), &format!("{}?timeout=500ms", redis.url()));
    config.gateway.store_timeout = ConfigDuration(Duration::from_millis(700));
    let gateway = TestGateway::start(config).await;
    assert_eq!(gateway.post("/charge").key("before").json(CHARGE).send().await.status, 201);

    redis.stop();
    let refused = gateway.post("/charge").key("during").json(CHARGE).send().await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.problem(), "store-unavailable");
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(upstream.count_for("during"), 0, "nothing is forwarded while the store is down");
    // Unguarded requests never touch the store.
    assert_eq!(gateway.get("/anything").send().await.status, 200);

    redis.start_again();
    let mut status = 0;
    for _ in 0..50 {
        status = gateway.post("/charge").key("during").json(CHARGE).send().await.status;
        if status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 201, "the gateway recovers when Redis returns");
    assert_eq!(upstream.count_for("during"), 1);
}

#[tokio::test]
async fn fail_open_forwards_unguarded_when_the_store_is_down() {
    let mut redis = RedisProcess::start();
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), &format!("{}?timeout=500ms", redis.url()));
    config.gateway.fail_mode = FailMode::Open;
    let gateway = TestGateway::start(config).await;
    redis.stop();
    assert_eq!(gateway.post("/charge").key("open").json(CHARGE).send().await.status, 201);
    assert_eq!(upstream.count_for("open"), 1);
}

/// A pod that restarts at the same moment as its Redis: the gateway starts
/// anyway, refuses guarded requests and reports not ready while Redis is
/// down, and serves (once per key) as soon as Redis answers.
#[tokio::test]
async fn a_gateway_started_while_redis_is_down_fails_closed_until_redis_answers() {
    let mut redis = RedisProcess::start();
    redis.stop();
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), &format!("{}?timeout=500ms", redis.url()));
    config.gateway.store_timeout = ConfigDuration(Duration::from_millis(700));
    let gateway = TestGateway::start(config).await;
    let refused = gateway.post("/charge").key("at-start").json(CHARGE).send().await;
    assert_eq!((refused.status, refused.problem().as_str()), (503, "store-unavailable"));
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(gateway.admin("GET", "/readyz").send().await.status, 503);
    assert_eq!(upstream.count_for("at-start"), 0, "nothing is forwarded while the store is down");

    redis.start_again();
    assert_eq!(gateway.admin("GET", "/readyz").send().await.status, 200, "ready as soon as Redis answers");
    let first = gateway.post("/charge").key("at-start").json(CHARGE).send().await;
    assert_eq!(first.status, 201);
    let retry = gateway.post("/charge").key("at-start").json(CHARGE).send().await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.count_for("at-start"), 1);
}

#[tokio::test]
async fn fail_open_forwards_unguarded_when_the_gateway_starts_while_redis_is_down() {
    let mut redis = RedisProcess::start();
    redis.stop();
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), &format!("{}?timeout=500ms", redis.url()));
    config.gateway.fail_mode = FailMode::Open;
    let gateway = TestGateway::start(config).await;
    assert_eq!(gateway.post("/charge").key("open-at-start").json(CHARGE).send().await.status, 201);
    assert_eq!(upstream.count_for("open-at-start"), 1);
    assert_eq!(gateway.admin("GET", "/readyz").send().await.status, 503, "forwarding unguarded is not ready");
}

#[tokio::test]
async fn malformed_keys_are_rejected_before_anything_is_forwarded() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let long = "k".repeat(256);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", b"".to_vec()),
        ("empty string", b"\"\"".to_vec()),
        ("256 characters", long.into_bytes()),
        ("non-ASCII", "cl\u{e9}".as_bytes().to_vec()),
        ("bad sf-string", b"\"unterminated".to_vec()),
        ("bad escape", b"\"a\\nb\"".to_vec()),
        ("list", b"\"a\", \"b\"".to_vec()),
    ];
    for (what, raw) in cases {
        let reply = gateway.post("/charge").raw_header("idempotency-key", &raw).json(CHARGE).send().await;
        assert_eq!(reply.status, 400, "{what}");
        assert_eq!(reply.problem(), "invalid-key", "{what}");
    }
    let twice = gateway.post("/charge").key("a").key("a").json(CHARGE).send().await;
    assert_eq!(twice.status, 400, "two header fields");
    assert_eq!(upstream.total(), 0);
}

#[tokio::test]
async fn a_required_key_that_is_missing_is_a_400_and_optional_keys_pass_through() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    let mut strict = config.routes[0].clone();
    strict.name = "strict".into();
    strict.prefix = "/charge".into();
    strict.require_key = true;
    config.routes.insert(0, strict);
    let gateway = TestGateway::start(config).await;
    let missing = gateway.post("/charge").json(CHARGE).send().await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.problem(), "missing-key");
    assert_eq!(upstream.total(), 0);
    assert_eq!(gateway.post("/other").json(CHARGE).send().await.status, 200);
    assert_eq!(gateway.post("/other").json(CHARGE).send().await.status, 200);
    assert_eq!(upstream.total(), 2, "keyless requests on optional routes pass through every time");
}

#[tokio::test]
async fn an_oversized_body_is_413_before_any_record_is_created() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.max_request_body = idemgate::config::ByteSize(1024);
    let gateway = TestGateway::start(config).await;
    let big = gateway.post("/charge").key("k-big").body(vec![b'x'; 4096]).send().await;
    assert_eq!(big.status, 413);
    assert_eq!(big.problem(), "body-too-large");
    assert_eq!(upstream.total(), 0);
    // No record was made: the same key with a valid body runs normally.
    assert_eq!(gateway.post("/charge").key("k-big").json(CHARGE).send().await.status, 201);
}

#[tokio::test]
async fn a_response_over_the_stored_cap_is_streamed_once_and_never_executed_again() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.max_stored_response = idemgate::config::ByteSize(1024);
    let gateway = TestGateway::start(config).await;
    let first = gateway.post("/big?bytes=50000").key("k-huge").json(CHARGE).send().await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body.len(), 50000, "the client gets the whole response");
    let retry = gateway.post("/big?bytes=50000").key("k-huge").json(CHARGE).send().await;
    assert_eq!(retry.status, 410);
    assert_eq!(retry.problem(), "response-not-replayable");
    assert_eq!(upstream.total(), 1);
}

#[tokio::test]
async fn the_upstream_receives_the_derived_key_and_clean_headers() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.forward_key = ForwardKey::Derived;
    let gateway = TestGateway::start(config).await;
    let reply = gateway
        .post("/charge")
        .key("client-key")
        .header("connection", "x-hop")
        .header("x-hop", "secret")
        .header("x-forwarded-host", "spoofed.example")
        .header("x-forwarded-for", "192.0.2.7")
        .json(CHARGE)
        .send()
        .await;
    assert_eq!(reply.status, 201);
    let keys = upstream.keys();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].len(), 64, "a hex sha256, not the client's key");
    assert!(keys[0].bytes().all(|b| b.is_ascii_hexdigit()));
    let seen = upstream.last_headers();
    assert!(seen.get("x-hop").is_none(), "headers named by Connection are hop-by-hop");
    assert_eq!(seen["x-forwarded-for"], "192.0.2.7, 127.0.0.1", "the client's address is appended to the chain");
    assert_eq!(seen["host"], upstream.addr.to_string());
    assert_eq!(seen["x-forwarded-host"], gateway.addr.to_string(), "the Host the gateway saw, not the client's claim");
    assert_eq!(seen["x-forwarded-proto"], "http");
}

#[tokio::test]
async fn with_wait_mode_duplicates_get_the_first_response_instead_of_409() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.gateway.concurrent = ConcurrentMode::Wait;
    let gateway = Arc::new(TestGateway::start(config).await);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let gateway = gateway.clone();
            tokio::spawn(async move { gateway.post("/slow?ms=300").key("k-wait").json(CHARGE).send().await })
        })
        .collect();
    let mut bodies = Vec::new();
    for call in calls {
        let reply = call.await.unwrap();
        assert_eq!(reply.status, 201);
        bodies.push(reply.body);
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "every duplicate sees the one response");
    assert_eq!(upstream.count_for("k-wait"), 1);
}

#[tokio::test]
async fn a_client_that_disconnects_still_gets_its_record_completed() {
    let upstream = Upstream::start().await;
    let gateway = Arc::new(TestGateway::start(config(&upstream.url(), "memory://")).await);
    let abandoned = {
        let gateway = gateway.clone();
        tokio::spawn(async move { gateway.post("/slow?ms=300").key("k-gone").json(CHARGE).send().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    abandoned.abort();
    upstream.wait_finished(1).await;
    let mut reply = gateway.post("/slow?ms=300").key("k-gone").json(CHARGE).send().await;
    for _ in 0..50 {
        if reply.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        reply = gateway.post("/slow?ms=300").key("k-gone").json(CHARGE).send().await;
    }
    assert_eq!(reply.status, 201);
    assert!(reply.replayed(), "the abandoned attempt completed its record");
    assert_eq!(upstream.count_for("k-gone"), 1);
}

#[tokio::test]
async fn unguarded_methods_and_unknown_paths_behave_plainly() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.routes[0].prefix = "/api/".into();
    let gateway = TestGateway::start(config).await;
    assert_eq!(gateway.get("/api/x").key("k").send().await.status, 200);
    assert_eq!(gateway.get("/api/x").key("k").send().await.status, 200);
    assert_eq!(upstream.total(), 2, "GET is never deduplicated");
    let none = gateway.post("/elsewhere").key("k").send().await;
    assert_eq!(none.status, 404);
    assert_eq!(none.problem(), "no-route");
}

#[tokio::test]
async fn shutdown_finishes_the_running_request_and_returns_ok() {
    let upstream = Upstream::start().await;
    let gateway = Arc::new(TestGateway::start(config(&upstream.url(), "memory://")).await);
    let running = {
        let gateway = gateway.clone();
        tokio::spawn(async move { gateway.post("/slow?ms=500").key("k-drain").json(CHARGE).send().await })
    };
    while upstream.total() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gateway.stop().await.expect("a clean shutdown");
    let reply = running.await.unwrap();
    assert_eq!(reply.status, 201, "the in-flight request was finished, not cut off");
    assert_eq!(upstream.count_for("k-drain"), 1);
}

#[tokio::test]
async fn responses_are_sealed_at_rest_in_redis_when_keys_are_configured() {
    let upstream = Upstream::start().await;
    let prefix = unique_prefix();
    let mut config = config(&upstream.url(), &format!("{}?prefix={prefix}", shared_redis_url()));
    config.store_encryption.keys =
        Some(idemgate::config::Secret::new("k1:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"));
    let gateway = TestGateway::start(config).await;
    let first = gateway.post("/charge").key("sealed").json(CHARGE).send().await;
    assert!(gateway.post("/charge").key("sealed").json(CHARGE).send().await.replayed());

    let client = redis::Client::open(shared_redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut redis).await.unwrap();
    assert_eq!(keys.len(), 1);
    let raw: Vec<u8> = redis::cmd("HGET").arg(&keys[0]).arg("resp").query_async(&mut redis).await.unwrap();
    assert!(!raw.is_empty());
    assert!(!raw.windows(first.body.len()).any(|w| w == &first.body[..]), "the body is not stored in clear");
    assert!(!raw.windows(16).any(|w| w == b"application/json"), "nor are the headers");
}

#[tokio::test]
async fn a_route_may_keep_the_clients_host_header() {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), "memory://");
    config.routes[0].keep_host = true;
    let gateway = TestGateway::start(config).await;
    gateway.get("/anything").header("host", "api.example.test").send().await;
    assert_eq!(upstream.last_headers()["host"], "api.example.test");
}
