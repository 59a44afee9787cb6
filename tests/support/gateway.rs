//! An idemgate gateway running in the test process on port 0, and a client.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use idemgate::config::{Config, Overrides};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A default config: one route `/` to `upstream`, the given store.
pub fn config(upstream: &str, store: &str) -> Config {
    let flags = Overrides { upstream: Some(upstream.into()), store: Some(store.into()), ..Default::default() };
    Config::load(None, Vec::new(), &flags).expect("test config")
}

pub struct TestGateway {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<tokio::task::JoinHandle<Result<(), idemgate::app::StartError>>>>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl TestGateway {
    /// Serves `config` on port 0 (and its admin listener on another), with
    /// the runtime `IDEMGATE__RUNTIME` names when it is set: CI runs the
    /// gateway suites under each runtime.
    pub async fn start(mut config: Config) -> Self {
        config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        if let Some(runtime) = runtime_from_env() {
            config.runtime = runtime;
        }
        let gateway = idemgate::app::bind_gateway(&config).await.unwrap();
        let addr = gateway.local_addr().unwrap();
        let admin = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let listeners = idemgate::app::Listeners { gateway, admin };
        let (stop, stopped) = oneshot::channel::<()>();
        let gateway = idemgate::app::build(&config).await.expect("gateway builds");
        let task = tokio::spawn(async move {
            idemgate::app::serve_on(listeners, gateway, &config, async {
                let _ = stopped.await;
            })
            .await
        });
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self { addr, admin_addr, stop: Mutex::new(Some(stop)), task: Mutex::new(Some(task)), client }
    }

    /// Stops accepting, drains, and returns what `serve_on` returned.
    pub async fn stop(&self) -> Result<(), idemgate::app::StartError> {
        if let Some(stop) = self.stop.lock().unwrap().take() {
            let _ = stop.send(());
        }
        let task = self.task.lock().unwrap().take().expect("stopped once");
        task.await.unwrap()
    }

    pub fn post(&self, path: &str) -> Call<'_> {
        Call::new(self, "POST", path)
    }

    pub fn get(&self, path: &str) -> Call<'_> {
        Call::new(self, "GET", path)
    }

    /// A request to the admin listener.
    pub fn admin(&self, method: &str, path: &str) -> Call<'_> {
        let request = Request::builder().method(method).uri(format!("http://{}{path}", self.admin_addr));
        Call { gateway: self, request, body: Bytes::new() }
    }
}

/// The runtime `IDEMGATE__RUNTIME` names (as a config file would), if set.
pub fn runtime_from_env() -> Option<idemgate::config::Runtime> {
    let name = std::env::var("IDEMGATE__RUNTIME").ok()?;
    let runtime = toml::Value::String(name.clone());
    Some(runtime.try_into().unwrap_or_else(|e| panic!("IDEMGATE__RUNTIME={name:?}: {e}")))
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap().take() {
            task.abort();
        }
    }
}

/// What a client received.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers.get("idempotent-replayed").is_some_and(|v| v == "true")
    }

    /// The `type` of a problem+json body, without the URN prefix.
    pub fn problem(&self) -> String {
        assert_eq!(self.headers.get("content-type").unwrap(), "application/problem+json", "{}", self.text());
        let value: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        value["type"].as_str().unwrap().trim_start_matches("urn:idemgate:problem:").to_owned()
    }
}

pub struct Call<'a> {
    gateway: &'a TestGateway,
    request: http::request::Builder,
    body: Bytes,
}

impl<'a> Call<'a> {
    fn new(gateway: &'a TestGateway, method: &str, path: &str) -> Self {
        let request = Request::builder().method(method).uri(format!("http://{}{path}", gateway.addr));
        Self { gateway, request, body: Bytes::new() }
    }

    pub fn key(self, key: &str) -> Self {
        self.header("idempotency-key", key)
    }

    pub fn auth(self, token: &str) -> Self {
        self.header("authorization", &format!("Bearer {token}"))
    }

    pub fn json(self, body: &str) -> Self {
        let mut call = self.header("content-type", "application/json");
        call.body = Bytes::copy_from_slice(body.as_bytes());
        call
    }

    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.request = self.request.header(name, value);
        self
    }

    pub fn raw_header(mut self, name: &str, value: &[u8]) -> Self {
        self.request = self.request.header(name, HeaderValue::from_bytes(value).unwrap());
        self
    }

    pub async fn send(self) -> Reply {
        let request = self.request.body(Full::new(self.body)).unwrap();
        let response = tokio::time::timeout(Duration::from_secs(30), self.gateway.client.request(request))
            .await
            .expect("gateway answered within 30 s")
            .expect("request reached the gateway");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("whole body").to_bytes();
        Reply { status: parts.status.as_u16(), headers: parts.headers, body }
    }
}
