//! `idemgate demo`: a toy payments API behind the gateway, for a first look.
//!
//! The toy API is deliberately *not* idempotent: every `POST /v1/charges`
//! performs a new charge and says how many it has performed so far. Sending
//! the same request twice through the gateway with one `Idempotency-Key`
//! shows the second answered from the store, with the count unchanged.
//!
//! - `POST /v1/charges?slow_ms=N` waits N ms (at most [`MAX_SLOW_MS`])
//!   before charging, so a duplicate sent meanwhile meets the `409`;
//! - `GET /v1/charges/count` says how many charges were performed, so a
//!   newcomer can see what reached the API and what did not;
//! - `POST /webhooks/stripe` fulfils an order for every event it receives
//!   (again, not idempotent), behind a second route of the gateway that
//!   verifies Stripe-style signatures with [`WEBHOOK_SECRET`] and takes the
//!   event's `id` as the key: one event delivered three times is one
//!   fulfilment. `GET /v1/fulfilments/count` says how many.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::net::TcpListener;

use crate::config::{AdminAuth, Config, ConfigDuration, RouteConfig, Scheme, Secret, StoreKind, WebhookConfig};
use crate::http::body::{BoxedBody, full};
use crate::http::listener::serve_internal;

/// The longest wait `slow_ms` may ask for.
pub const MAX_SLOW_MS: u64 = 10_000;

/// The demo webhook route's signing secret: printed, so never one to use.
pub const WEBHOOK_SECRET: &str = "whsec_demo_not_a_secret";

/// What the toy API has done.
#[derive(Default)]
struct Counts {
    charges: AtomicU64,
    fulfilments: AtomicU64,
}

/// Starts the toy payments API on a free loopback port and returns its address.
pub async fn start_toy_payments() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    let counts = Arc::new(Counts::default());
    let handle = move |request| answer(request, counts.clone());
    tokio::spawn(serve_internal(listener, "toy payments", handle, std::future::pending()));
    Ok(address)
}

/// The demo's webhook route to the toy API at `toy`: Stripe's scheme,
/// [`WEBHOOK_SECRET`], the event's `id` as the key, kept for Stripe's
/// three days of redeliveries. It goes ahead of the route `/`.
pub fn webhook_route(toy: SocketAddr) -> RouteConfig {
    RouteConfig {
        name: "stripe-demo".into(),
        prefix: "/webhooks/stripe".into(),
        upstream: format!("http://{toy}"),
        methods: vec![Method::POST.into()],
        require_key: true,
        keep_host: false,
        ca_file: None,
        max_connections: crate::config::DEFAULT_MAX_CONNECTIONS,
        release_statuses: None,
        on_unknown: None,
        pool_idle_timeout: ConfigDuration(crate::config::DEFAULT_POOL_IDLE_TIMEOUT),
        key: None,
        webhook: Some(WebhookConfig {
            scheme: Scheme::Stripe,
            secrets: vec![Secret::new(WEBHOOK_SECRET)],
            secrets_file: None,
            tolerance: ConfigDuration(crate::config::DEFAULT_TOLERANCE),
        }),
        key_ttl: Some(ConfigDuration(Scheme::Stripe.retry_window())),
    }
}

async fn answer(request: Request<Incoming>, counts: Arc<Counts>) -> Response<BoxedBody> {
    let charges = &counts.charges;
    let (parts, body) = request.into_parts();
    let Ok(body) = body.collect().await.map(|collected| collected.to_bytes()) else {
        return json(StatusCode::BAD_REQUEST, &serde_json::json!({ "error": "the request body broke off" }));
    };
    match (&parts.method, parts.uri.path()) {
        (&Method::POST, "/v1/charges") => match slow_ms(parts.uri.query()) {
            Ok(wait) => charge(&body, wait, charges).await,
            Err(why) => json(StatusCode::BAD_REQUEST, &serde_json::json!({ "error": why.to_string() })),
        },
        (&Method::GET, "/v1/charges/count") => {
            json(StatusCode::OK, &serde_json::json!({ "charges_performed": charges.load(Ordering::SeqCst) }))
        }
        (&Method::POST, "/webhooks/stripe") => {
            let performed = counts.fulfilments.fetch_add(1, Ordering::SeqCst) + 1;
            json(StatusCode::OK, &serde_json::json!({ "received": true, "fulfilments_performed": performed }))
        }
        (&Method::GET, "/v1/fulfilments/count") => json(
            StatusCode::OK,
            &serde_json::json!({ "fulfilments_performed": counts.fulfilments.load(Ordering::SeqCst) }),
        ),
        _ => json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({ "error": "try POST /v1/charges, GET /v1/charges/count or GET /v1/fulfilments/count" }),
        ),
    }
}

async fn charge(body: &[u8], wait: Duration, charges: &AtomicU64) -> Response<BoxedBody> {
    tokio::time::sleep(wait).await;
    let amount = serde_json::from_slice::<serde_json::Value>(body).ok().and_then(|v| v.get("amount").cloned());
    let performed = charges.fetch_add(1, Ordering::SeqCst) + 1;
    json(
        StatusCode::CREATED,
        &serde_json::json!({ "id": format!("ch_{performed}"), "amount": amount, "charges_performed": performed }),
    )
}

/// Why a `?slow_ms=` query is refused (a `400`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum SlowMsError {
    /// Given twice.
    #[error("slow_ms is given more than once")]
    Repeated,
    /// Not a number, or above [`MAX_SLOW_MS`].
    #[error("slow_ms must be a whole number of milliseconds from 0 to {MAX_SLOW_MS}, not {0:?}")]
    Range(String),
}

/// The wait a `?slow_ms=N` query asks for: none without it, at most [`MAX_SLOW_MS`].
fn slow_ms(query: Option<&str>) -> Result<Duration, SlowMsError> {
    let mut asked = None;
    for pair in query.unwrap_or("").split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name == "slow_ms" {
            if asked.is_some() {
                return Err(SlowMsError::Repeated);
            }
            asked = Some(value);
        }
    }
    let Some(value) = asked else { return Ok(Duration::ZERO) };
    match value.parse::<u64>() {
        Ok(ms) if ms <= MAX_SLOW_MS => Ok(Duration::from_millis(ms)),
        _ => Err(SlowMsError::Range(value.to_owned())),
    }
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<BoxedBody> {
    let mut response = Response::new(full(Bytes::from(format!("{value}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

/// The commands printed for the newcomer, for a gateway and an admin
/// listener bound at `gateway` and `admin` with `config`. The admin token
/// itself is never printed: the commands name the variable that holds it.
pub fn instructions(gateway: SocketAddr, admin: SocketAddr, config: &Config) -> String {
    let scheme = if config.tls.cert_file.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{gateway}");
    let store = match config.store.store_kind() {
        Some(StoreKind::Memory) => "embedded store".to_owned(),
        _ => format!("store {}", config.store.redacted()),
    };
    // A URL with a query is quoted: `?` is a glob character in zsh.
    let curl = |query: &str, key: &str, amount: u32| {
        let target = if query.is_empty() {
            format!("curl -si {url}/v1/charges")
        } else {
            // Two answers in a row: the newline keeps them apart.
            format!("curl -si -w '\\n' '{url}/v1/charges{query}'")
        };
        format!(
            "{target} -H 'Idempotency-Key: {key}' -H 'Content-Type: application/json' -d '{{\"amount\": {amount}}}'"
        )
    };
    let slow = curl("?slow_ms=3000", "order-1003", 700);
    let admin_step = admin_step(admin, config);
    let webhook_steps = webhook_steps(&url);
    format!(
        r#"idemgate demo: gateway on {url} ({store}) in front of a toy payments API that is NOT idempotent.

1. Charge once:
   {one}
2. Retry the same request: the stored response comes back (Idempotent-Replayed: true), charges_performed is unchanged:
   {one}
3. Reuse the key for a different request: 422 key-mismatch, nothing charged:
   {mismatch}
4. A new key is a new charge:
   {new}
5. Send a duplicate while the first is still running (slow_ms=3000 makes the charge take 3 s): one 201, one 409 request-in-flight:
   {slow} &
   {slow} &
   wait
6. Count what the toy API really charged: 3 (steps 1, 4 and 5):
   curl -s {url}/v1/charges/count
{admin_step}
{webhook_steps}

Press Ctrl-C to stop."#,
        one = curl("", "order-1001", 500),
        mismatch = curl("", "order-1001", 900),
        new = curl("", "order-1002", 500),
    )
}

/// Steps 8 and 9: a signed Stripe-style event delivered three times, one
/// fulfilment. curl cannot sign, so openssl computes the HMAC as Stripe
/// does (`t.body`, hex) at the moment the lines are pasted: a signature
/// printed at start would be stale five minutes later.
fn webhook_steps(url: &str) -> String {
    let sign = |secret: &str| {
        format!(r#"$(printf '%s.%s' "$T" "$BODY" | openssl dgst -sha256 -hmac '{secret}' | sed 's/^.* //')"#)
    };
    let deliver = |signature: &str| {
        format!(
            r#"curl -si -w '\n' {url}/webhooks/stripe -H "Stripe-Signature: t=$T,v1={signature}" -H 'Content-Type: application/json' -d "$BODY""#
        )
    };
    format!(
        r#"8. Receive a signed Stripe-style webhook event three times, as a provider redelivers it (route /webhooks/stripe,
   secret {WEBHOOK_SECRET}): the first is fulfilled, the others get the stored answer (Idempotent-Replayed: true):
   BODY='{{"id":"evt_demo_1","object":"event","type":"checkout.session.completed","pending_webhooks":1}}'
   T=$(date +%s); SIG={sig}
   for i in 1 2 3; do {delivery}; done
9. A delivery signed with another secret gets 401 webhook-signature and reaches nothing; the toy API fulfilled 1:
   {forged}
   curl -s {url}/v1/fulfilments/count"#,
        sig = sign(WEBHOOK_SECRET),
        delivery = deliver("$SIG"),
        forged = deliver(&sign("not-the-secret")),
    )
}

/// Step 7: the admin API, as far as the config lets it answer.
fn admin_step(admin: SocketAddr, config: &Config) -> String {
    let lookup = format!("curl -s http://{admin}/admin/keys/order-1001");
    let header = match (&config.admin.auth, &config.admin.token, &config.admin.token_file) {
        (AdminAuth::Disabled, _, _) => Some(String::new()),
        (AdminAuth::Token, Some(_), _) => Some(r#" -H "Authorization: Bearer $IDEMGATE__ADMIN__TOKEN""#.to_owned()),
        (AdminAuth::Token, None, Some(file)) => {
            Some(format!(r#" -H "Authorization: Bearer $(cat '{}')""#, file.display()))
        }
        (AdminAuth::Token, None, None) => None,
    };
    match header {
        Some(header) => format!(
            "7. Ask the admin API on http://{admin} what the gateway stored for a key (never the body):\n   {lookup}{header}"
        ),
        None => format!(
            "7. The admin API on http://{admin} is off: no admin token is set. To look keys up, restart with\n   \
             IDEMGATE__ADMIN__TOKEN=<16 or more random characters> idemgate demo\n   \
             Metrics need no token:\n   curl -s http://{admin}/metrics"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Overrides, Secret};

    fn config(env: &[(&str, &str)]) -> Config {
        let flags = Overrides { upstream: Some("http://127.0.0.1:1".into()), ..Default::default() };
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        Config::load(None, env, &flags).unwrap()
    }

    #[test]
    fn slow_ms_is_bounded_and_a_bad_value_is_refused() {
        assert_eq!(slow_ms(None), Ok(Duration::ZERO));
        assert_eq!(slow_ms(Some("other=1")), Ok(Duration::ZERO));
        assert_eq!(slow_ms(Some("slow_ms=250")), Ok(Duration::from_millis(250)));
        assert_eq!(slow_ms(Some("a=b&slow_ms=10000")), Ok(Duration::from_millis(MAX_SLOW_MS)));
        for bad in ["slow_ms=10001", "slow_ms=-1", "slow_ms=", "slow_ms", "slow_ms=1.5", "slow_ms=1&slow_ms=2"] {
            assert!(slow_ms(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_instructions_never_print_the_admin_token() {
        let mut with_token = config(&[]);
        with_token.admin.token = Some(Secret::new("do-not-print-me-0123456789"));
        let gateway: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let admin: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        let printed = instructions(gateway, admin, &with_token);
        assert!(!printed.contains("do-not-print-me"), "{printed}");
        assert!(printed.contains("Bearer $IDEMGATE__ADMIN__TOKEN"), "{printed}");
        let printed = instructions(gateway, admin, &config(&[]));
        assert!(printed.contains("is off: no admin token is set"), "{printed}");
        let printed = instructions(gateway, admin, &config(&[("IDEMGATE__ADMIN__AUTH", "disabled")]));
        assert!(printed.contains("curl -s http://127.0.0.1:9090/admin/keys/order-1001\n"), "{printed}");
    }

    /// docs/demo.md shows, verbatim, what `demo` prints with the default
    /// addresses, with and without an admin token.
    #[test]
    fn the_demo_page_shows_what_demo_prints() {
        let page = include_str!("../docs/demo.md");
        let gateway: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let admin: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        let mut with_token = config(&[]);
        with_token.admin.token = Some(Secret::new("0123456789abcdef"));
        let printed = instructions(gateway, admin, &with_token);
        assert!(page.contains(&printed), "docs/demo.md does not show, verbatim:\n{printed}");
        let off = admin_step(admin, &config(&[]));
        assert!(page.contains(&off), "docs/demo.md does not show, verbatim:\n{off}");
    }
}
