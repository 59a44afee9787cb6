//! A randomized invariant test: many clients, random keys and duplicates,
//! random disconnects, an upstream that fails, resets (before or after
//! acting) and stalls past the gateway's `upstream_timeout` at random, while
//! gateway processes are SIGKILLed and restarted, Redis is SIGKILLed and
//! restarted (with AOF `appendfsync always`, as RELIABILITY.md asks), and
//! Redis freezes for a moment (SIGSTOP, shorter than the lease) so that
//! settles meet a store outage. Then a checker asserts what idemgate promises:
//!
//! 1. per (tenant, key) the upstream acted at most once — unless the one
//!    fault here that loses a record falls between two executions: a gateway
//!    killed before its attempt settled (its lease lapses and a retry takes
//!    over). Every other repeat is a violation, including one after a Redis
//!    restart or freeze;
//! 2. every `2xx` a client got is the body of one of the upstream's
//!    executions of that key, and with a single execution every `2xx` is
//!    that one body;
//! 3. no client ever got a response made for another tenant.
//!
//! Tenants rotate their credentials throughout: the gateways name the
//! tenant by the Basic user (`tenant = { basic_user = true }`) and every
//! request sends one of its user's passwords, picked at random, with the
//! scheme in either case — the client that refreshes its credential and
//! retries. So (1) holds per user across password changes: a retry with a
//! new password that ran again would be a violation, as would one that got
//! another user's response (3).
//!
//! A fourth tenant floods the gateways with new keys beside them (each key
//! sent twice), with `tenant_quota.max_keys` at twice what any other tenant
//! uses: the others never get `429`, the flooder does, and
//! its keys keep every guarantee above.
//!
//! The upstream receives the derived key (`forward_key = "derived"`), so it
//! could deduplicate the fault-caused repeats itself; the checker counts
//! them separately. Seeded: `IDEMGATE_SEED` replays the same plan (keys,
//! tenants, faults, upstream choices; thread interleavings still vary).
//! `IDEMGATE_INVARIANT_REQUESTS` sets the count (default 2400).

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idemgate::config::TenantConfig;
use idemgate::gateway::tenant::TenantSource;
use idemgate::idempotency::{IdempotencyKey, ScopedKey};
use rand::prelude::*;
use support::http_server::HttpServer;
use support::redis_server::{RedisProcess, free_port};

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");
const TENANTS: usize = 3;
/// Passwords each tenant's requests pick from at random.
const PASSWORDS: usize = 3;
/// Keys per tenant at least; larger runs use one key per 10 requests, so
/// that many keys see their first execution (where the faults bite).
const KEYS_PER_TENANT: usize = 40;
const WORKERS: usize = 16;
/// An execution starting this long after a fault may belong to a call that
/// was begun before it (the upstream acts as soon as it receives a request).
const IN_FLIGHT_AFTER_FAULT: Duration = Duration::from_secs(1);
/// A record settles right after the upstream's answer; one this close
/// before a kill may not have settled yet.
const UNSETTLED_BEFORE_KILL: Duration = Duration::from_millis(300);
/// The gateways' lease (`IDEMGATE__GATEWAY__LEASE`).
const LEASE: Duration = Duration::from_secs(3);
/// A store back this close to a lease's end leaves no time to settle: the
/// reconnect and one store operation (store timeout 500 ms) must fit.
const SETTLE_NEEDS: Duration = Duration::from_secs(1);
/// Keys each tenant draws from, for a run of `requests`.
fn keys_per_tenant(requests: usize) -> usize {
    KEYS_PER_TENANT.max(requests / 10 / TENANTS)
}

/// `tenant_quota.max_keys` of the gateways: twice the keys of a tenant.
fn quota(requests: usize) -> usize {
    2 * keys_per_tenant(requests)
}

/// The number of requests of the run (`IDEMGATE_INVARIANT_REQUESTS`).
fn requests() -> usize {
    std::env::var("IDEMGATE_INVARIANT_REQUESTS").ok().and_then(|s| s.parse().ok()).unwrap_or(2400)
}
/// Store outages closer together than this count as one.
const OUTAGE_GAP: Duration = Duration::from_secs(1);

/// One execution the upstream performed.
#[derive(Clone)]
struct Effect {
    at: Instant,
    /// When the upstream answered (or reset) after acting.
    answered: Instant,
    body: Bytes,
}

/// The chaos upstream: acts, fails or stalls at random (seeded).
struct Chaos {
    rng: Mutex<StdRng>,
    effects: Mutex<HashMap<String, Vec<Effect>>>,
}

/// Stops when the returned server is dropped.
async fn chaos_upstream(seed: u64) -> (SocketAddr, Arc<Chaos>, HttpServer) {
    let chaos = Arc::new(Chaos { rng: Mutex::new(StdRng::seed_from_u64(seed)), effects: Mutex::default() });
    let shared = chaos.clone();
    let server = HttpServer::start(move |r| act(r, shared.clone())).await;
    (server.addr, chaos, server)
}

async fn act(request: Request<Incoming>, chaos: Arc<Chaos>) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let (key, tenant) = (header("idempotency-key"), basic_user(&header("authorization")));
    let (choice, stall, late) = {
        let mut rng = chaos.rng.lock().unwrap();
        (rng.random_range(0..100u32), rng.random_range(100..600u64), rng.random_range(1000..2500u64))
    };
    match choice {
        0..5 => return Ok(reply(StatusCode::INTERNAL_SERVER_ERROR, Bytes::from_static(b"{\"failed\":true}"))),
        // Reset before acting: the gateway cannot tell, and holds the key.
        5..8 => return Err(std::io::Error::other("reset on purpose")),
        22..32 => tokio::time::sleep(Duration::from_millis(stall)).await,
        _ => {}
    }
    // 8..14 act, then reset; 14..22 act, then answer only after the
    // gateway's upstream_timeout (900 ms) has answered the client 504.
    let after = match choice {
        14..22 => Duration::from_millis(late),
        _ => Duration::ZERO,
    };
    let body = {
        let mut effects = chaos.effects.lock().unwrap();
        let list = effects.entry(key.clone()).or_default();
        let body = Bytes::from(format!(
            "{{\"tenant\":{tenant:?},\"key\":{key:?},\"execution\":{},\"nonce\":{}}}",
            list.len() + 1,
            rand::random::<u64>()
        ));
        let at = Instant::now();
        list.push(Effect { at, answered: at + after, body: body.clone() });
        body
    };
    if (8..14).contains(&choice) {
        return Err(std::io::Error::other("reset after acting"));
    }
    tokio::time::sleep(after).await;
    Ok(reply(StatusCode::CREATED, body))
}

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
}

/// A gateway process that the fault injector kills and restarts on the same port.
struct Gateway {
    addr: SocketAddr,
    child: Option<Child>,
}

impl Gateway {
    /// Starts a gateway on `addr`. A port picked by `free_port` can be
    /// taken, between its release and the gateway's bind, as the source port
    /// of some other test's outgoing connection; the gateway then exits at
    /// once, and it is started again (such a connection is short-lived).
    fn start(addr: SocketAddr, upstream: SocketAddr, store: &str) -> Child {
        let admin = self_admin(addr);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut child = Command::new(BINARY)
                .args(["serve", "--listen", &addr.to_string(), "--admin-listen", &admin.to_string()])
                .args(["--upstream", &format!("http://{upstream}"), "--store", store])
                .envs([
                    ("IDEMGATE__GATEWAY__LEASE", "3s"), // LEASE
                    ("IDEMGATE__GATEWAY__UPSTREAM_TIMEOUT", "900ms"),
                    ("IDEMGATE__GATEWAY__UPSTREAM_DEADLINE", "3s"),
                    ("IDEMGATE__GATEWAY__FORWARD_KEY", "derived"),
                    ("IDEMGATE__GATEWAY__STORE_TIMEOUT", "500ms"),
                    ("IDEMGATE__GATEWAY__TENANT__BASIC_USER", "true"),
                    ("IDEMGATE__LOG__LEVEL", "warn"),
                ])
                .env("IDEMGATE__GATEWAY__TENANT_QUOTA__MAX_KEYS", quota(requests()).to_string())
                .stdout(Stdio::null())
                .stderr(log_file(addr))
                .spawn()
                .expect("start idemgate");
            loop {
                if std::net::TcpStream::connect(addr).is_ok() {
                    return child;
                }
                let exited = child.try_wait().expect("gateway status");
                assert!(Instant::now() < deadline, "gateway on {addr} did not come up (exit: {exited:?})");
                if exited.is_some() {
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Where a gateway's log goes: `IDEMGATE_INVARIANT_LOGS=DIR` keeps them
/// (appended across restarts), for looking into a violation.
fn log_file(addr: SocketAddr) -> Stdio {
    let Some(dir) = std::env::var_os("IDEMGATE_INVARIANT_LOGS") else { return Stdio::null() };
    let path = std::path::Path::new(&dir).join(format!("gateway-{}.log", addr.port()));
    match std::fs::OpenOptions::new().create(true).append(true).open(path) {
        Ok(file) => file.into(),
        Err(_) => Stdio::null(),
    }
}

/// The admin port paired with a gateway port (kept stable across restarts).
fn self_admin(addr: SocketAddr) -> SocketAddr {
    static PAIRS: Mutex<Vec<(SocketAddr, SocketAddr)>> = Mutex::new(Vec::new());
    let mut pairs = PAIRS.lock().unwrap();
    if let Some((_, admin)) = pairs.iter().find(|(a, _)| *a == addr) {
        return *admin;
    }
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    pairs.push((addr, admin));
    admin
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[derive(Debug)]
struct Outcome {
    tenant: usize,
    key: String,
    status: Option<u16>,
    body: Bytes,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    GatewayKilled,
    /// SIGKILL of a durable Redis, down for a moment, then restarted: loses
    /// nothing acknowledged.
    RedisRestarted,
    /// Redis frozen for a moment shorter than the lease: loses nothing.
    RedisFrozen,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_under_faults_never_execute_twice_without_a_record_losing_fault() {
    let seed = std::env::var("IDEMGATE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    let requests = requests();
    println!("invariant test: IDEMGATE_SEED={seed} IDEMGATE_INVARIANT_REQUESTS={requests}");

    let began = Instant::now();
    let mut redis = RedisProcess::start_durable();
    let store = format!("{}?timeout=400ms", redis.url());
    let (upstream, chaos, _upstream_server) = chaos_upstream(seed).await;
    let addrs: Vec<SocketAddr> = (0..2).map(|_| format!("127.0.0.1:{}", free_port()).parse().unwrap()).collect();
    let gateways: Arc<Vec<Mutex<Gateway>>> = Arc::new(
        addrs
            .iter()
            .map(|&addr| Mutex::new(Gateway { addr, child: Some(Gateway::start(addr, upstream, &store)) }))
            .collect(),
    );

    let keys_per_tenant = keys_per_tenant(requests);
    // New keys the flooding tenant (`tenant-3`) sends, each twice: twice its quota.
    let flood_keys = 2 * quota(requests);
    let plan = Arc::new(Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed)));
    let remaining = Arc::new(std::sync::atomic::AtomicUsize::new(requests));
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let client: Client<_, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_millis(200)).build_http();

    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (plan, remaining, outcomes, client, addrs) =
                (plan.clone(), remaining.clone(), outcomes.clone(), client.clone(), addrs.clone());
            tokio::spawn(async move {
                while remaining
                    .fetch_update(std::sync::atomic::Ordering::SeqCst, std::sync::atomic::Ordering::SeqCst, |n| {
                        n.checked_sub(1)
                    })
                    .is_ok()
                {
                    let (tenant, credential, key, gateway, disconnect_after, pause) = {
                        let mut rng = plan.lock().unwrap();
                        let disconnect = rng.random_bool(0.1).then(|| Duration::from_millis(rng.random_range(0..300)));
                        let tenant = rng.random_range(0..TENANTS);
                        let scheme = if rng.random_bool(0.5) { "Basic" } else { "basic" };
                        (
                            tenant,
                            basic(scheme, tenant, rng.random_range(0..PASSWORDS)),
                            format!("key-{}", rng.random_range(0..keys_per_tenant)),
                            addrs[rng.random_range(0..addrs.len())],
                            disconnect,
                            Duration::from_millis(rng.random_range(0..30)),
                        )
                    };
                    tokio::time::sleep(pause).await;
                    let limit = disconnect_after.unwrap_or(Duration::from_secs(10));
                    let (status, body) = charge(&client, gateway, &credential, &key, limit).await;
                    outcomes.lock().unwrap().push(Outcome { tenant, key, status, body });
                }
            })
        })
        .collect();

    // The flooding tenant: new keys, each sent twice, one at a time. A
    // send the store could not take (503 while Redis is down, or no answer)
    // is sent again, up to 10 times 50 ms apart, so that the flooder does
    // not spend its keys in an outage.
    let flooder = {
        let (outcomes, client, addrs) = (outcomes.clone(), client.clone(), addrs.clone());
        tokio::spawn(async move {
            for n in 0..flood_keys * 2 {
                let key = format!("flood-{}", n / 2);
                for _ in 0..10 {
                    let credential = basic("Basic", TENANTS, 0);
                    let gateway = addrs[n % addrs.len()];
                    let (status, body) = charge(&client, gateway, &credential, &key, Duration::from_secs(10)).await;
                    let again = matches!(status, None | Some(503));
                    outcomes.lock().unwrap().push(Outcome { tenant: TENANTS, key: key.clone(), status, body });
                    if !again {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
    };

    // Faults while the workers run: bounded in count, spaced at random.
    let mut faults: Vec<(Instant, Fault)> = Vec::new();
    // Store outages: (went down, answered again).
    let mut outages: Vec<(Instant, Instant)> = Vec::new();
    let mut fault_rng = StdRng::seed_from_u64(seed ^ 0xfa17);
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(fault_rng.random_range(200..700))).await;
        if remaining.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            break;
        }
        let kind = fault_rng.random_range(0..10u32);
        // Store outages well inside the 3 s lease: 0.2 to 0.9 s.
        let outage = Duration::from_millis(fault_rng.random_range(200..900));
        if kind < 3 {
            let at = Instant::now();
            redis.pause();
            tokio::time::sleep(outage).await;
            redis.resume();
            faults.push((at, Fault::RedisFrozen));
            outages.push((at, Instant::now()));
        } else if kind >= 7 {
            let which = fault_rng.random_range(0..gateways.len());
            let gateways = gateways.clone();
            let store = store.clone();
            let at = Instant::now();
            tokio::task::spawn_blocking(move || {
                let mut gateway = gateways[which].lock().unwrap();
                if let Some(mut child) = gateway.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                std::thread::sleep(Duration::from_millis(100));
                gateway.child = Some(Gateway::start(gateway.addr, upstream, &store));
            })
            .await
            .unwrap();
            faults.push((at, Fault::GatewayKilled));
        } else {
            let at = Instant::now();
            redis.stop();
            tokio::time::sleep(outage).await;
            redis = tokio::task::spawn_blocking(move || {
                redis.start_again();
                redis
            })
            .await
            .unwrap();
            faults.push((at, Fault::RedisRestarted));
            outages.push((at, Instant::now()));
        }
    }
    for worker in workers {
        worker.await.unwrap();
    }
    flooder.await.unwrap();
    // Let attempts still in flight in the gateways (up to the 3 s deadline) settle before counting.
    tokio::time::sleep(Duration::from_millis(3500)).await;

    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let effects = chaos.effects.lock().unwrap().clone();
    let mut violations = Vec::new();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let mut explained_repeats = 0;
    let mut outlasting_repeats = 0;
    // Outages with less than OUTAGE_GAP of service between them are one.
    let mut merged: Vec<(Instant, Instant)> = Vec::new();
    for &(down, up) in &outages {
        match merged.last_mut() {
            Some((_, last_up)) if down.saturating_duration_since(*last_up) < OUTAGE_GAP => *last_up = up,
            _ => merged.push((down, up)),
        }
    }
    let mut by_key: BTreeMap<(usize, String), Vec<&Outcome>> = BTreeMap::new();
    for outcome in &outcomes {
        *statuses.entry(outcome.status.map_or("no answer".into(), |s| s.to_string())).or_default() += 1;
        by_key.entry((outcome.tenant, outcome.key.clone())).or_default().push(outcome);
    }
    for ((tenant, key), seen) in &by_key {
        let derived = derived_key(*tenant, key);
        let executions = effects.get(&derived).cloned().unwrap_or_default();
        // 1. A repeat needs a fault that lost this key's record between the
        //    two executions: the gateway running the first execution was
        //    killed before it settled (its upstream call may finish after
        //    the kill; a record settled well before the kill survives it).
        for pair in executions.windows(2) {
            let explained = faults.iter().any(|(at, fault)| {
                let spans = *at < pair[1].at
                    && pair[0].at.checked_duration_since(*at).is_none_or(|d| d < IN_FLIGHT_AFTER_FAULT);
                let unsettled = at.checked_duration_since(pair[0].answered).is_none_or(|d| d < UNSETTLED_BEFORE_KILL);
                match fault {
                    Fault::GatewayKilled => spans && unsettled,
                    Fault::RedisRestarted | Fault::RedisFrozen => false,
                }
            });
            // The one store fault that may explain a repeat: an outage that
            // began before the first execution could settle and lasted until
            // too little of its lease was left (RELIABILITY.md's limit).
            let outlasted = merged.iter().any(|(down, up)| {
                *down <= pair[0].answered + Duration::from_millis(500) && *up + SETTLE_NEEDS >= pair[0].at + LEASE
            });
            if explained {
                explained_repeats += 1;
            } else if outlasted {
                outlasting_repeats += 1;
            } else {
                violations.push(format!(
                    "tenant {tenant} {key}: executed again with no record-losing fault in between \
                         (executions at {:?} answered {:?} and {:?}; faults {:?}; store outages {:?})",
                    pair[0].at.duration_since(began),
                    pair[0].answered.duration_since(began),
                    pair[1].at.duration_since(began),
                    faults.iter().map(|(at, f)| (at.duration_since(began), *f)).collect::<Vec<_>>(),
                    merged.iter().map(|(d, u)| (d.duration_since(began), u.duration_since(began))).collect::<Vec<_>>()
                ));
            }
        }
        for outcome in seen.iter().filter(|o| o.status.is_some_and(|s| (200..300).contains(&s))) {
            // 2. Every 2xx is one of this key's executions.
            if !executions.iter().any(|e| e.body == outcome.body) {
                violations.push(format!("tenant {tenant} {key}: a 2xx body the upstream never produced for this key"));
            }
            // 3. Never another tenant's response.
            let own = format!("\"tenant\":\"tenant-{tenant}\"");
            if !String::from_utf8_lossy(&outcome.body).contains(&own) {
                violations.push(format!("tenant {tenant} {key}: got another tenant's response"));
            }
        }
        // 4. Only the flooder is ever over its quota.
        if *tenant != TENANTS && seen.iter().any(|o| o.status == Some(429)) {
            violations.push(format!("tenant {tenant} {key}: 429 for a tenant within its quota"));
        }
        // Unexpected answers: a mismatch cannot happen (one body per key).
        if seen.iter().any(|o| o.status == Some(422)) {
            violations.push(format!("tenant {tenant} {key}: 422 for an identical retry"));
        }
    }
    let executions: usize = effects.values().map(Vec::len).sum();
    println!(
        "invariant test: {} requests, statuses {statuses:?}, faults {:?}, {executions} executions over {} keys, \
         {explained_repeats} repeats explained by gateway kills, {outlasting_repeats} by store outages \
         outlasting the lease, {} violations",
        outcomes.len(),
        faults.iter().map(|(_, f)| *f).collect::<Vec<_>>(),
        effects.len(),
        violations.len()
    );
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
    let flood_refused = outcomes.iter().filter(|o| o.tenant == TENANTS && o.status == Some(429)).count();
    let flood_executed =
        (0..flood_keys).filter(|n| effects.contains_key(&derived_key(TENANTS, &format!("flood-{n}")))).count();
    println!(
        "invariant test: the flooder had {flood_executed} of {flood_keys} keys executed, {flood_refused} requests refused"
    );
    assert!(flood_refused > 0 && flood_executed < flood_keys, "the quota held the flooder back");
    assert!(executions > 0, "the run executed something");
    drop(gateways);
}

/// `Authorization` for one of a tenant's passwords.
/// One chaos request: `key` under `credential` to `gateway`, answered (status
/// and body) within `limit`, or `(None, empty)`: no answer, or cut off.
async fn charge(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    gateway: SocketAddr,
    credential: &str,
    key: &str,
    limit: Duration,
) -> (Option<u16>, Bytes) {
    let request = Request::post(format!("http://{gateway}/chaos"))
        .header("authorization", credential)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!("{{\"key\":{key:?}}}"))))
        .unwrap();
    let call = async {
        let response = client.request(request).await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.into_body().collect().await.ok()?.to_bytes()))
    };
    let answer = tokio::time::timeout(limit, call).await.ok().flatten();
    answer.map_or((None, Bytes::new()), |(status, body)| (Some(status), body))
}

fn basic(scheme: &str, tenant: usize, password: usize) -> String {
    format!("{scheme} {}", STANDARD.encode(format!("tenant-{tenant}:password-{password}")))
}

/// The user of a Basic credential, as the chaos upstream echoes it.
fn basic_user(credential: &str) -> String {
    let decoded = credential.split_once(' ').and_then(|(_, b64)| STANDARD.decode(b64).ok()).unwrap_or_default();
    let text = String::from_utf8_lossy(&decoded);
    text.split_once(':').map_or_else(String::new, |(user, _)| user.to_owned())
}

/// The key the upstream receives for a tenant's key, whichever password it used.
fn derived_key(tenant: usize, key: &str) -> String {
    let mut headers = HeaderMap::new();
    headers.insert("authorization", HeaderValue::from_str(&basic("Basic", tenant, 0)).unwrap());
    let source = TenantSource::from_config(&TenantConfig::BasicUser).unwrap();
    let tenant = source.tenant_of(&headers).unwrap();
    ScopedKey::new(&tenant, &IdempotencyKey::new(key).unwrap()).to_hex()
}
