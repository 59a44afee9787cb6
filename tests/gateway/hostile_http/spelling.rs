//! One spelling of a request: a guard that the client can spell its way
//! around is no guard. The routes are a guarded `/v1/` that requires a key
//! beside a catch-all `/`, as in the report this came from; the upstream
//! routes paths the way Tomcat and Go do (escapes decoded, backslashes and
//! `;` parameters read away, slashes merged, dots resolved, case ignored)
//! and counts a charge for every request that lands on `/v1/charges`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use super::{exchange, status_of};
use crate::support::gateway::{TestGateway, config};
use crate::support::http_server::HttpServer;
use crate::support::upstream::Upstream;

/// An upstream that reads paths as the most forgiving servers do, and
/// counts charges per `Idempotency-Key` (`-` for none).
struct LenientUpstream {
    charges: Arc<Mutex<HashMap<String, u64>>>,
    server: HttpServer,
}

impl LenientUpstream {
    async fn start() -> Self {
        let charges: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let counted = charges.clone();
        let server = HttpServer::start(move |request: Request<Incoming>| {
            let counted = counted.clone();
            async move {
                let key = request
                    .headers()
                    .get("idempotency-key")
                    .map_or("-".into(), |v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                let routed = lenient_route(request.uri().path());
                let _ = request.into_body().collect().await;
                if routed == "/v1/charges" {
                    *counted.lock().unwrap().entry(key).or_default() += 1;
                }
                Ok::<_, std::convert::Infallible>(
                    Response::builder().status(201).body(Full::new(Bytes::from(routed))).unwrap(),
                )
            }
        })
        .await;
        Self { charges, server }
    }

    fn url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    fn charges(&self) -> u64 {
        self.charges.lock().unwrap().values().sum()
    }

    fn unkeyed_charges(&self) -> u64 {
        self.charges.lock().unwrap().get("-").copied().unwrap_or(0)
    }
}

/// A path as Tomcat, Jetty, IIS and Go's `ServeMux` together would route it.
fn lenient_route(raw: &str) -> String {
    let decoded = percent_encoding::percent_decode_str(raw).decode_utf8_lossy().replace('\\', "/").to_lowercase();
    let mut kept: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment.split(';').next().unwrap_or("") {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            segment => kept.push(segment),
        }
    }
    format!("/{}", kept.join("/"))
}

async fn guarded_gateway(upstream: &str) -> TestGateway {
    let mut config = config(upstream, "memory://");
    let mut guarded = config.routes[0].clone();
    guarded.name = "v1".into();
    guarded.prefix = "/v1/".into();
    guarded.require_key = true;
    config.routes.insert(0, guarded);
    TestGateway::start(config).await
}

fn post(path: &str, key: Option<&str>) -> Vec<u8> {
    let key = key.map_or(String::new(), |k| format!("idempotency-key: {k}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\n{key}content-type: application/json\r\ncontent-length: 14\r\nconnection: close\r\n\r\n{{\"amount\":500}}"
    )
    .into_bytes()
}

const SPELLINGS: [&str; 16] = [
    "/v1/charges",
    "//v1/charges",
    "/./v1/charges",
    "/x/../v1/charges",
    "/%2e/v1/charges",
    "/%761/charges",
    "/v1%2Fcharges",
    "/v1\\charges",
    "/v1%5Ccharges",
    "/v1;jsessionid=x/charges",
    "/x/..;/v1/charges",
    "/V1/charges",
    "/v1/CHARGES",
    "/%2e%2e/v1/charges",
    "/v1/./x/../charges",
    "///v1///charges",
];

/// Every spelling of the guarded path either is guarded (no key: `400`;
/// with a key: one charge however often it is retried) or is refused: the
/// upstream is never charged without a key, and never twice for one.
#[tokio::test]
async fn no_spelling_of_a_guarded_path_reaches_it_unguarded() {
    let upstream = LenientUpstream::start().await;
    let gateway = guarded_gateway(&upstream.url()).await;
    let mut accepted = 0;
    for (n, spelling) in SPELLINGS.iter().enumerate() {
        let reply = exchange(&gateway, &post(spelling, None)).await;
        assert_eq!(status_of(&reply), 400, "{spelling} without a key: {reply}");
        assert!(
            reply.contains("missing-key") || reply.contains("ambiguous-path") || reply.contains("malformed-request"),
            "{spelling}: {reply}"
        );
        assert_eq!(upstream.unkeyed_charges(), 0, "{spelling} charged without a key");

        let key = format!("k{n}");
        let first = exchange(&gateway, &post(spelling, Some(&key))).await;
        let retry = exchange(&gateway, &post(spelling, Some(&key))).await;
        match status_of(&first) {
            201 => {
                accepted += 1;
                assert_eq!(status_of(&retry), 201, "{spelling}: {retry}");
                assert!(retry.contains("idempotent-replayed: true"), "{spelling}: {retry}");
                assert!(first.ends_with("/v1/charges"), "the upstream gets the normal path: {first}");
            }
            status => assert_eq!((status, status_of(&retry)), (400, 400), "{spelling}: {first}"),
        }
        assert_eq!(upstream.charges(), accepted, "{spelling}: charges");
    }
    // The plain spelling and the normalised ones go through; the ambiguous
    // ones are refused.
    assert_eq!(accepted, 9);
}

/// A method-override header is judged as the method it names, and a
/// guarded method in lower case is refused, not passed through.
#[tokio::test]
async fn a_method_cannot_be_spelled_around_the_guard() {
    let upstream = Upstream::start().await;
    let gateway = guarded_gateway(&upstream.url()).await;
    let request = |method: &str, extra: &str| {
        format!("{method} /v1/charge HTTP/1.1\r\nhost: x\r\n{extra}content-length: 0\r\nconnection: close\r\n\r\n")
            .into_bytes()
    };
    for (method, extra, kind) in [
        ("GET", "x-http-method-override: POST\r\n", "missing-key"),
        ("GET", "X-HTTP-Method: post\r\n", "missing-key"),
        ("PUT", "x-method-override: PATCH\r\n", "missing-key"),
        ("post", "", "ambiguous-method"),
        ("Patch", "", "ambiguous-method"),
        ("GET", "x-http-method-override: POST\r\nx-method-override: GET\r\n", "ambiguous-method"),
        ("GET", "x-http-method-override: \r\n", "ambiguous-method"),
    ] {
        let reply = exchange(&gateway, &request(method, extra)).await;
        assert_eq!(status_of(&reply), 400, "{method} {extra}: {reply}");
        assert!(reply.contains(kind), "{method} {extra}: {reply}");
    }
    assert_eq!(upstream.total(), 0);

    // With a key, an overridden GET is guarded: one effect, then a replay.
    let keyed = request("GET", "x-http-method-override: POST\r\nidempotency-key: ov\r\n");
    assert_eq!(status_of(&exchange(&gateway, &keyed).await), 200);
    assert!(exchange(&gateway, &keyed).await.contains("idempotent-replayed: true"));
    assert_eq!(upstream.total(), 1);
    // A plain POST under the same key is another request.
    let plain = request("POST", "idempotency-key: ov\r\n");
    assert_eq!(status_of(&exchange(&gateway, &plain).await), 422);
    // An unguarded method with no override still passes through.
    assert_eq!(status_of(&exchange(&gateway, &request("GET", "")).await), 200);
    assert_eq!(upstream.total(), 2);
}

/// Two requests the upstream reads differently never share a fingerprint:
/// the retry with the other one is `422`, not a replay of the first.
#[tokio::test]
async fn requests_the_upstream_reads_differently_are_not_replays_of_each_other() {
    let upstream = Upstream::start().await;
    let gateway = TestGateway::start(config(&upstream.url(), "memory://")).await;
    let pairs = [
        (("/charge", r#"{"amount":500}"#), ("/charge", r#"{"amount":{"$serde_json::private::Number":"500"}}"#)),
        (("/charge?a=1&%61=2", "{}"), ("/charge?%61=2&a=1", "{}")),
        (("/charge?note=a+b", "{}"), ("/charge?note=a%2Bb", "{}")),
    ];
    for (n, ((path_a, body_a), (path_b, body_b))) in pairs.into_iter().enumerate() {
        let key = format!("pair{n}");
        let first = gateway.post(path_a).key(&key).json(body_a).send().await;
        assert_eq!(first.status, 201, "{path_a} {body_a}");
        let second = gateway.post(path_b).key(&key).json(body_b).send().await;
        assert_eq!(second.status, 422, "{path_b} {body_b}: {}", second.text());
    }
    // And spellings the upstream reads alike are one request.
    let first = gateway.post("/charge?%61=1").key("same").json(r#"{"b":1,"a":2}"#).send().await;
    let again = gateway.post("/charge?a=%31").key("same").json(r#"{ "a": 2, "b": 1 }"#).send().await;
    assert_eq!((first.status, again.status), (201, 201));
    assert!(again.replayed());
    assert_eq!(upstream.total(), 4);
}
