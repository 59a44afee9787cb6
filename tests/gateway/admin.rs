//! The admin listener: health, readiness, metrics and the admin API, and
//! `openapi.yaml` kept in step with the routes it serves.

use crate::support;

use std::collections::BTreeSet;

use idemgate::config::{AdminAuth, Config, Secret};
use support::gateway::{TestGateway, config};
use support::redis_server::{RedisCluster, RedisProcess};
use support::upstream::Upstream;

const TOKEN: &str = "test-admin-token-0123456789";

fn with_token(mut config: Config) -> Config {
    config.admin.token = Some(Secret::new(TOKEN));
    config
}

#[tokio::test]
async fn health_and_readiness_follow_the_store() {
    let mut redis = RedisProcess::start();
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), &format!("{}?timeout=300ms", redis.url()))).await;
    assert_eq!(gateway.admin("GET", "/healthz").send().await.status, 200);
    assert_eq!(gateway.admin("GET", "/readyz").send().await.status, 200);
    redis.stop();
    let not_ready = gateway.admin("GET", "/readyz").send().await;
    assert_eq!(not_ready.status, 503);
    assert_eq!(gateway.admin("GET", "/healthz").send().await.status, 200, "alive even when not ready");
}

#[tokio::test]
async fn a_redis_cluster_with_one_master_down_is_not_ready() {
    let mut cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), &format!("{}?timeout=300ms", cluster.url()))).await;
    assert_eq!(gateway.admin("GET", "/readyz").send().await.status, 200);
    cluster.stop_node(2);
    let not_ready = gateway.admin("GET", "/readyz").send().await;
    assert_eq!(not_ready.status, 503, "{}", not_ready.text());
}

#[tokio::test]
async fn metrics_count_outcomes_without_keys_or_tenants_in_labels() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    gateway.post("/charge").auth("tenant-secret").key("key-secret-1").json("{}").send().await;
    gateway.post("/charge").auth("tenant-secret").key("key-secret-1").json("{}").send().await;
    gateway.post("/charge").auth("tenant-secret").key("key-secret-1").json("{\"x\":1}").send().await;
    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    assert!(metrics.contains(r#"idemgate_requests_total{outcome="forwarded",route="default"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"idemgate_requests_total{outcome="replayed",route="default"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"idemgate_requests_total{outcome="mismatch",route="default"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"idemgate_store_duration_seconds_count{operation="begin"} 3"#), "{metrics}");
    assert!(metrics.contains(r#"idemgate_upstream_duration_seconds_count{route="default"} 1"#), "{metrics}");
    assert!(!metrics.contains("secret"), "no key or tenant ever becomes a label");
}

#[tokio::test]
async fn without_a_token_the_admin_api_is_off_and_health_still_answers() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let refused =
        gateway.admin("GET", "/admin/keys/k1").header("authorization", "Bearer anything-at-all-x").send().await;
    assert_eq!(refused.status, 403);
    assert_eq!(refused.problem(), "admin-disabled");
    assert_eq!(gateway.admin("GET", "/healthz").send().await.status, 200);
}

#[tokio::test]
async fn the_admin_api_refuses_missing_and_wrong_tokens() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(with_token(config(&upstream.url(), "memory://"))).await;
    let missing = gateway.admin("GET", "/admin/keys/k1").send().await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.headers["www-authenticate"], "Bearer");
    let wrong = gateway
        .admin("GET", "/admin/keys/k1")
        .header("authorization", "Bearer test-admin-token-0123456788")
        .send()
        .await;
    assert_eq!(wrong.status, 401);
    let right = gateway.admin("GET", "/admin/keys/k1").header("authorization", &format!("Bearer {TOKEN}")).send().await;
    assert_eq!(right.status, 404, "authenticated; the key simply does not exist");
}

#[tokio::test]
async fn an_operator_inspects_and_purges_one_tenants_key_and_no_other() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(with_token(config(&upstream.url(), "memory://"))).await;
    let auth = format!("Bearer {TOKEN}");
    gateway.post("/charge").auth("alice").key("\"order/7 +x\"").json("{}").send().await;
    let path = "/admin/keys/order%2F7%20+x";

    let alice =
        gateway.admin("GET", &format!("{path}?tenant=Bearer%20alice")).header("authorization", &auth).send().await;
    assert_eq!(alice.status, 200, "{}", alice.text());
    let record: serde_json::Value = serde_json::from_slice(&alice.body).unwrap();
    assert_eq!(record["state"], "completed");
    assert_eq!(record["status"], 201);
    assert_eq!(record["replayable"], true);
    assert!(!alice.text().contains("effect"), "the stored body is never shown");

    // Bob's view of Alice's key is exactly that of a key nobody used.
    let bob = gateway.admin("GET", &format!("{path}?tenant=Bearer%20bob")).header("authorization", &auth).send().await;
    let nobody =
        gateway.admin("GET", "/admin/keys/unused?tenant=Bearer%20bob").header("authorization", &auth).send().await;
    assert_eq!((bob.status, bob.body.clone()), (nobody.status, nobody.body.clone()));
    let bob_purge =
        gateway.admin("DELETE", &format!("{path}?tenant=Bearer%20bob")).header("authorization", &auth).send().await;
    assert_eq!(bob_purge.status, 404);
    assert!(gateway.post("/charge").auth("alice").key("\"order/7 +x\"").json("{}").send().await.replayed());

    let purged =
        gateway.admin("DELETE", &format!("{path}?tenant=Bearer%20alice")).header("authorization", &auth).send().await;
    assert_eq!(purged.status, 204);
    let again = gateway.post("/charge").auth("alice").key("\"order/7 +x\"").json("{}").send().await;
    assert!(!again.replayed(), "after a purge the key runs again");
    assert_eq!(upstream.total(), 2);
}

#[tokio::test]
async fn a_plus_in_the_tenant_parameter_is_the_space_of_a_bearer_credential() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(with_token(config(&upstream.url(), "memory://"))).await;
    let auth = format!("Bearer {TOKEN}");
    gateway.post("/charge").auth("client-token-42").key("k+1").json("{}").send().await;

    // `+` in the path is the key's own `+`; in the query it is a space.
    let found = gateway
        .admin("GET", "/admin/keys/k+1?tenant=Bearer+client-token-42")
        .header("authorization", &auth)
        .send()
        .await;
    assert_eq!(found.status, 200, "{}", found.text());
    let record: serde_json::Value = serde_json::from_slice(&found.body).unwrap();
    assert_eq!(record["state"], "completed");
    let escaped_plus = gateway
        .admin("GET", "/admin/keys/k+1?tenant=Bearer%2Bclient-token-42")
        .header("authorization", &auth)
        .send()
        .await;
    assert_eq!(escaped_plus.status, 404, "%2B is a literal +, another tenant");
}

/// With a source that names the principal, an operator names the tenant
/// the same way: the Basic user name, or the verified claim's value.
#[tokio::test]
async fn an_operator_names_a_principals_tenant_by_its_user_name_or_claim() {
    use base64::Engine;
    use idemgate::config::{JwtClaimConfig, JwtKeys, TenantConfig};
    let upstream = Upstream::start().await;
    let auth = format!("Bearer {TOKEN}");
    let mut basic = with_token(config(&upstream.url(), "memory://"));
    basic.gateway.tenant = TenantConfig::BasicUser;
    let gateway = TestGateway::start(basic).await;
    let credential = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("alice:pw-v1"));
    gateway.post("/charge").header("authorization", &credential).key("k1").json("{}").send().await;
    let found = gateway.admin("GET", "/admin/keys/k1?tenant=alice").header("authorization", &auth).send().await;
    assert_eq!(found.status, 200, "{}", found.text());
    let bob = gateway.admin("GET", "/admin/keys/k1?tenant=bob").header("authorization", &auth).send().await;
    assert_eq!(bob.status, 404);
    let purged = gateway.admin("DELETE", "/admin/keys/k1?tenant=alice").header("authorization", &auth).send().await;
    assert_eq!(purged.status, 204);

    let dir = support::jwt::KeyDir::new();
    let issuer = support::jwt::Hs256::new(&dir);
    let mut jwt = with_token(config(&upstream.url(), "memory://"));
    jwt.gateway.tenant = TenantConfig::JwtClaim(JwtClaimConfig {
        claim: "sub".into(),
        keys: JwtKeys::Hs256SecretFile(issuer.file.clone()),
        issuer: support::jwt::ISSUER.into(),
        audience: support::jwt::AUDIENCE.into(),
    });
    let gateway = TestGateway::start(jwt).await;
    let token = issuer.sign(&support::jwt::claims("user-42"));
    gateway.post("/charge").auth(&token).key("k2").json("{}").send().await;
    let found = gateway.admin("GET", "/admin/keys/k2?tenant=user-42").header("authorization", &auth).send().await;
    assert_eq!(found.status, 200, "{}", found.text());
    let by_token = gateway
        .admin("GET", &format!("/admin/keys/k2?tenant=Bearer+{token}"))
        .header("authorization", &auth)
        .send()
        .await;
    assert_eq!(by_token.status, 404, "the claim names the tenant, not the token");
}

#[tokio::test]
async fn the_admin_token_is_accepted_with_a_lower_case_scheme() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(with_token(config(&upstream.url(), "memory://"))).await;
    let lower = gateway.admin("GET", "/admin/keys/k1").header("authorization", &format!("bearer {TOKEN}")).send().await;
    assert_eq!(lower.status, 404, "authenticated; the key simply does not exist");
    let wrong = gateway
        .admin("GET", "/admin/keys/k1")
        .header("authorization", "bearer test-admin-token-0123456788")
        .send()
        .await;
    assert_eq!(wrong.status, 401, "the scheme's case changes nothing about the token check");
}

#[tokio::test]
async fn bad_admin_parameters_get_a_clear_400() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(with_token(config(&upstream.url(), "memory://"))).await;
    let auth = format!("Bearer {TOKEN}");
    let bad_escape = gateway.admin("GET", "/admin/keys/a%zz").header("authorization", &auth).send().await;
    assert_eq!(bad_escape.status, 400);
    let long = "k".repeat(256);
    let too_long = gateway.admin("GET", &format!("/admin/keys/{long}")).header("authorization", &auth).send().await;
    assert_eq!(too_long.status, 400);
    assert!(too_long.text().contains("255"));
}

#[tokio::test]
async fn auth_disabled_is_allowed_on_loopback_only() {
    let upstream = Upstream::start().await;
    let mut open = config(&upstream.url(), "memory://");
    open.admin.auth = AdminAuth::Disabled;
    let gateway = TestGateway::start(open.clone()).await;
    assert_eq!(gateway.admin("GET", "/admin/keys/k").send().await.status, 404);
    open.admin_listen = "0.0.0.0:9090".parse().unwrap();
    let error = open.validate().unwrap_err().to_string();
    assert!(error.contains("loopback"), "{error}");
}

/// A token-less admin listener (`admin.auth = "disabled"`) and a web page
/// in the operator's browser: a page on a rebound name (DNS rebinding: a
/// foreign `Host`) and a cross-site form or fetch are refused; the
/// listener's own page and tools are served. Effects are counted at the
/// upstream: a refused purge leaves the key replaying, an allowed one lets
/// the next retry run again.
#[tokio::test]
async fn a_token_less_admin_listener_refuses_web_pages_and_serves_its_own_origin() {
    let upstream = Upstream::start().await;
    let mut open = config(&upstream.url(), "memory://");
    open.admin.auth = AdminAuth::Disabled;
    let gateway = TestGateway::start(open).await;
    let charge = || gateway.post("/charge").auth("alice").key("k").json("{}");
    assert_eq!(charge().send().await.status, 201);
    let port = gateway.admin_addr.port();
    let purge = "/admin/keys/k?tenant=Bearer+alice";
    let rebound = format!("attacker.example:{port}");

    let refused = [
        ("rebinding purge", gateway.admin("DELETE", purge).header("host", &rebound).send().await),
        ("rebinding read", gateway.admin("GET", "/metrics").header("host", &rebound).send().await),
        ("another port", gateway.admin("GET", purge).header("host", &format!("127.0.0.1:{}", port + 1)).send().await),
        (
            "cross-site form",
            gateway
                .admin("POST", "/admin/outbox/redrive")
                .header("origin", "https://attacker.example")
                .header("content-type", "text/plain")
                .send()
                .await,
        ),
        ("cross-site purge", gateway.admin("DELETE", purge).header("origin", "https://attacker.example").send().await),
        ("fetch metadata", gateway.admin("DELETE", purge).header("sec-fetch-site", "cross-site").send().await),
        ("a sibling site", gateway.admin("DELETE", purge).header("sec-fetch-site", "same-site").send().await),
    ];
    for (what, reply) in &refused {
        assert_eq!(reply.status, 403, "{what}: {}", reply.text());
        assert_eq!(reply.problem(), "foreign-request", "{what}");
    }
    assert!(charge().send().await.replayed(), "no refused purge took effect");
    assert_eq!(upstream.total(), 1);

    let healthz = gateway.admin("GET", "/healthz").header("host", &format!("localhost:{port}")).send().await;
    assert_eq!(healthz.status, 200, "the loopback name with the port is the listener's own");
    let own_page = gateway
        .admin("DELETE", purge)
        .header("origin", &format!("http://127.0.0.1:{port}"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await;
    assert_eq!(own_page.status, 204, "the console on the listener's own origin: {}", own_page.text());
    assert!(!charge().send().await.replayed(), "purged: the next request runs again");
    assert_eq!(upstream.total(), 2);
}

/// With a token, a browser cannot act (it never adds the token by itself),
/// so nothing about `Host` or `Origin` changes.
#[tokio::test]
async fn with_a_token_host_and_origin_change_nothing() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(with_token(config(&upstream.url(), "memory://"))).await;
    gateway.post("/charge").auth("alice").key("k").json("{}").send().await;
    let rebound = format!("attacker.example:{}", gateway.admin_addr.port());
    let purge = gateway
        .admin("DELETE", "/admin/keys/k?tenant=Bearer+alice")
        .header("host", &rebound)
        .header("origin", "https://attacker.example")
        .header("sec-fetch-site", "cross-site")
        .header("authorization", &format!("Bearer {TOKEN}"))
        .send()
        .await;
    assert_eq!(purge.status, 204, "{}", purge.text());
    let anonymous = gateway.admin("DELETE", "/admin/keys/k").header("host", &rebound).send().await;
    assert_eq!(anonymous.status, 401, "still the token that decides");
    assert_eq!(gateway.admin("GET", "/metrics").header("host", &rebound).send().await.status, 200);
}

/// `(method, path)` pairs in openapi.yaml, excluding the gateway's catch-all.
fn spec_routes() -> BTreeSet<(String, String)> {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap();
    let mut routes = BTreeSet::new();
    let mut in_paths = false;
    let mut path = None;
    for line in spec.lines() {
        if !line.starts_with(' ') {
            in_paths = line == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  /").and_then(|l| l.strip_suffix(':')) {
            path = Some(format!("/{p}"));
        } else if let Some(method) = line.strip_prefix("    ").and_then(|l| l.strip_suffix(':'))
            && ["get", "post", "put", "patch", "delete"].contains(&method)
            && let Some(path) = path.as_ref().filter(|p| *p != "/{path}")
        {
            routes.insert((method.to_uppercase(), path.clone()));
        }
    }
    routes
}

#[test]
fn openapi_describes_exactly_the_routes_the_admin_listener_serves() {
    let served: BTreeSet<(String, String)> =
        idemgate::admin::ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    assert_eq!(spec_routes(), served);
}

#[test]
fn openapi_lists_every_problem_type() {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap();
    use idemgate::gateway::problem::Problem;
    use idemgate::gateway::spelling::Ambiguity;
    let all = [
        Problem::MissingKey,
        Problem::InvalidKey(idemgate::idempotency::KeyError::Empty),
        Problem::KeyMismatch,
        Problem::AmbiguousTenant(idemgate::idempotency::TenantError::Repeated { header: http::header::AUTHORIZATION }),
        Problem::Unauthenticated { challenge: "Bearer", why: String::new() },
        Problem::MissingKeyIn(String::new()),
        Problem::WebhookSignature(""),
        Problem::WebhookTimestamp(""),
        Problem::RequestInFlight { retry_after: std::time::Duration::ZERO },
        Problem::StoreUnavailable,
        Problem::BodyTooLarge { limit: 0 },
        Problem::BadRequestBody,
        Problem::BodyTimeout,
        Problem::UriTooLong { limit: 0 },
        Problem::HeadersTooLarge { limit: 0 },
        Problem::UpstreamUnavailable { sent: false },
        Problem::UpstreamTimeout { still_running: true },
        Problem::OutcomeUnknown { held: true },
        Problem::ResponseIncomplete,
        Problem::ResponseNotReplayable,
        Problem::AmbiguousRequest(Ambiguity::Case),
        Problem::AmbiguousRequest(Ambiguity::MethodOverride),
        Problem::ConnectionBusy,
        Problem::TenantQuota(idemgate::store::QuotaLimit::Keys),
        Problem::NoRoute,
        Problem::Unauthorized,
        Problem::AdminDisabled,
        Problem::NotFound,
        Problem::MethodNotAllowed("GET"),
        Problem::BadAdminRequest(String::new()),
        Problem::ForeignRequest(""),
        Problem::OutboxUnavailable,
        Problem::Internal,
    ];
    for problem in all {
        let uri = format!("urn:idemgate:problem:{}", problem.slug());
        assert!(spec.contains(&uri), "{uri} missing from openapi.yaml");
    }
    // The HTTP parser's refusals, written below the gateway.
    for slug in ["malformed-request", "uri-too-long", "headers-too-large"] {
        assert!(spec.contains(&format!("urn:idemgate:problem:{slug}")), "{slug} missing from openapi.yaml");
    }
}

#[tokio::test]
async fn a_known_path_with_another_method_is_405_with_allow() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(with_token(config(&upstream.url(), "memory://"))).await;
    let reply = gateway.admin("POST", "/readyz").send().await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.headers["allow"], "GET");
    let reply = gateway.admin("PUT", "/admin/keys/k").send().await;
    assert_eq!(reply.status, 405, "checked before authentication: the method is wrong either way");
    assert_eq!(reply.headers["allow"], "GET, DELETE");
}

/// An unguarded request whose upstream is down counts as an upstream
/// error, so the alert on upstream errors sees unguarded traffic too.
#[tokio::test]
async fn an_unguarded_request_to_a_dead_upstream_counts_as_an_upstream_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed); // nothing listens there any more
    let gateway = TestGateway::start(config(&dead, "memory://")).await;
    let answer = gateway.get("/health-of-the-api").send().await;
    assert_eq!(answer.status, 502, "{}", answer.text());
    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    assert!(metrics.contains(r#"idemgate_requests_total{outcome="upstream-error",route="default"} 1"#), "{metrics}");
    assert!(!metrics.contains(r#"outcome="passthrough""#), "{metrics}");
}

#[tokio::test]
async fn the_console_is_served_without_a_token_under_a_strict_policy_and_its_data_needs_one() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(with_token(config(&upstream.url(), "memory://"))).await;
    let page = gateway.admin("GET", "/admin/ui/").send().await;
    assert_eq!(page.status, 200);
    assert_eq!(page.headers["content-type"], "text/html; charset=utf-8");
    assert_eq!(page.headers["content-security-policy"], idemgate::admin::ui::CSP);
    assert_eq!(page.headers["x-content-type-options"], "nosniff");
    assert!(page.text().contains("console.js"));
    let script = gateway.admin("GET", "/admin/ui/console.js").send().await;
    assert_eq!(script.status, 200);
    assert_eq!(script.headers["content-type"], "text/javascript; charset=utf-8");
    let bare = gateway.admin("GET", "/admin/ui").send().await;
    assert_eq!(bare.status, 308);
    assert_eq!(bare.headers["location"], "/admin/ui/");
    let missing = gateway.admin("GET", "/admin/ui/..%2F..%2FCargo.toml").send().await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.headers["content-security-policy"], idemgate::admin::ui::CSP);
    assert_eq!(gateway.admin("GET", "/admin/gateway/outcomes").send().await.status, 401, "the data needs the token");
}

#[tokio::test]
async fn recent_outcomes_count_every_request_of_the_last_minutes_by_outcome() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(with_token(config(&upstream.url(), "memory://"))).await;
    gateway.post("/charge").auth("t").key("k-1").json("{}").send().await;
    gateway.post("/charge").auth("t").key("k-1").json("{}").send().await;
    gateway.post("/charge").auth("t").key("k-1").json("{\"x\":1}").send().await;
    gateway.post("/charge").auth("t").key("k-1").json("{\"x\":1}").send().await;
    let reply = gateway
        .admin("GET", "/admin/gateway/outcomes")
        .header("authorization", &format!("Bearer {TOKEN}"))
        .send()
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let recent: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    let minutes = recent["minutes"].as_array().unwrap();
    assert_eq!(minutes.len(), 16);
    // Summed over the minutes: the requests may straddle a minute's end.
    let total = |outcome: &str| minutes.iter().filter_map(|m| m["counts"][outcome].as_u64()).sum::<u64>();
    assert_eq!((total("forwarded"), total("replayed"), total("mismatch")), (1, 1, 2));
    assert_eq!(total("conflict"), 0);
    let starts: Vec<u64> = minutes.iter().map(|m| m["start_unix_ms"].as_u64().unwrap()).collect();
    assert!(starts.windows(2).all(|w| w[1] == w[0] + 60_000), "consecutive minutes, oldest first: {starts:?}");
}
