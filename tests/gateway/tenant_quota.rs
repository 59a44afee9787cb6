//! `tenant_quota`: a tenant that floods the gateway with new keys cannot
//! take the store from another tenant, on every store.
//!
//! Each test runs a flooding tenant beside a quiet one against a real
//! upstream that counts its effects: the quiet tenant's keys are all
//! served once each, the flooder gets `429 tenant-quota` beyond its
//! `max_keys` (nothing reaches the upstream for those), and its keys taken
//! within the quota still replay. The refusals are counted by limit.

use crate::support;

use std::sync::Arc;

use idemgate::config::TenantQuota;
use support::gateway::{TestGateway, config};
use support::postgres::TestSchema;
use support::redis_server::{shared_redis_url, unique_prefix};
use support::upstream::Upstream;

/// New keys each tenant may hold.
const QUOTA: u64 = 6;
/// New keys the flooder sends: three times its quota.
const FLOOD: u64 = 3 * QUOTA;
/// Requests sent at once.
const AT_ONCE: usize = 8;

async fn flood_beside_a_quiet_tenant(store: &str) {
    let upstream = Upstream::start().await;
    let mut config = config(&upstream.url(), store);
    config.gateway.tenant_quota = Some(TenantQuota::new(QUOTA, u64::MAX));
    let gateway = Arc::new(TestGateway::start(config).await);

    // Both tenants at once, interleaved, a bounded number in flight.
    let calls: Vec<(&str, String)> = (0..FLOOD)
        .flat_map(|n| {
            let quiet = (n < QUOTA).then(|| ("quiet", format!("quiet-{n}")));
            std::iter::once(("flood", format!("flood-{n}"))).chain(quiet)
        })
        .collect();
    let mut replies = Vec::new();
    for batch in calls.chunks(AT_ONCE) {
        let sent: Vec<_> = batch
            .iter()
            .map(|(tenant, key)| {
                let (gateway, tenant, key) = (gateway.clone(), *tenant, key.clone());
                tokio::spawn(async move { gateway.post("/charge").auth(tenant).key(&key).send().await })
            })
            .collect();
        for (call, reply) in batch.iter().zip(sent) {
            replies.push((call.clone(), reply.await.expect("the client task")));
        }
    }

    let mut flooder_served = Vec::new();
    for ((tenant, key), reply) in &replies {
        match (*tenant, reply.status) {
            ("quiet", status) => assert_eq!(status, 201, "the quiet tenant's {key}: {}", reply.text()),
            ("flood", 201) => flooder_served.push(key.clone()),
            ("flood", 429) => {
                assert_eq!(reply.problem(), "tenant-quota");
                assert_eq!(upstream.count_for(key), 0, "a refused key reached the upstream");
            }
            (_, status) => panic!("{tenant} {key}: {status} {}", reply.text()),
        }
    }
    assert_eq!(flooder_served.len() as u64, QUOTA, "the flooder is served up to its quota");
    for n in 0..QUOTA {
        assert_eq!(upstream.count_for(&format!("quiet-{n}")), 1, "quiet-{n} ran once");
    }
    // The flooder's keys within the quota replay, and run no second time.
    for key in &flooder_served {
        let reply = gateway.post("/charge").auth("flood").key(key).send().await;
        assert_eq!((reply.status, reply.replayed()), (201, true), "{key}: {}", reply.text());
        assert_eq!(upstream.count_for(key), 1, "{key}");
    }
    // A refused key stays refused while the tenant is full.
    let refused = replies.iter().find(|(_, r)| r.status == 429).map(|((_, key), _)| key.clone()).unwrap();
    assert_eq!(gateway.post("/charge").auth("flood").key(&refused).send().await.status, 429);
    assert_eq!(upstream.total(), 2 * QUOTA, "effects: the quiet tenant's and the flooder's quota");

    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    let refusals = FLOOD - QUOTA + 1;
    assert!(
        metrics.contains(&format!("idemgate_tenant_quota_refusals_total{{limit=\"keys\"}} {refusals}")),
        "{refusals} refusals counted:\n{}",
        metrics.lines().filter(|l| l.contains("quota")).collect::<Vec<_>>().join("\n")
    );
    assert!(metrics.contains(&format!("outcome=\"tenant-quota\",route=\"default\"}} {refusals}")), "by outcome");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_memory_a_flooding_tenant_is_held_to_its_quota_and_the_quiet_one_is_served() {
    flood_beside_a_quiet_tenant("memory://").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_flooding_tenant_is_held_to_its_quota_and_the_quiet_one_is_served() {
    flood_beside_a_quiet_tenant(&format!("{}?prefix={}", shared_redis_url(), unique_prefix())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_flooding_tenant_is_held_to_its_quota_and_the_quiet_one_is_served() {
    let schema = TestSchema::create().await;
    flood_beside_a_quiet_tenant(&schema.store_url()).await;
}

/// The measurement behind the Redis Cluster design (`docs/stores.md`, "Tenant quota on a Redis Cluster"):
/// guarded first requests (`try_begin` then `complete`, a 200-byte
/// response) per second on a private three-master cluster, [`CONCURRENCY`]
/// at once, without a quota (records spread over the masters by key) and
/// with one (a tenant's records in its own slot), for one hot tenant and
/// for 64 tenants; and the Lua time per call each master reports. Ignored:
/// it measures, it asserts nothing about time. Run it with
/// `cargo test --release --test gateway tenant_quota -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_first_requests_on_a_cluster_with_and_without_tenant_slots() {
    use idemgate::idempotency::{Completion, Fence, Fingerprint, ScopedKey, StoredResponse, TenantId};
    use idemgate::store::Store;
    use idemgate::store::redis::RedisStore;
    use std::time::{Duration, Instant};
    use support::redis_server::{RedisCluster, with_option};

    const CONCURRENCY: usize = 64;
    const REQUESTS: usize = 20_000;
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("start the cluster");
    let response = StoredResponse { status: 201, headers: http::HeaderMap::new().into(), body: vec![b'x'; 200].into() };
    let response = Arc::new(response);
    let quota = Some(TenantQuota::new(1_000_000, u64::MAX));
    for round in 0..2 {
        for (name, quota, tenants) in
            [("no quota", None, 1u8), ("quota, 1 tenant", quota, 1), ("quota, 64 tenants", quota, 64)]
        {
            let url = with_option(&cluster.url(), "prefix", &unique_prefix());
            let store = Arc::new(RedisStore::open(&url).await.expect("open").with_quota(quota));
            for port in (0..3).map(|i| cluster.port(i)) {
                let _ = std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "CONFIG", "RESETSTAT"])
                    .output();
            }
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let started = Instant::now();
            let workers: Vec<_> = (0..CONCURRENCY)
                .map(|_| {
                    let (store, next, response) = (store.clone(), next.clone(), response.clone());
                    tokio::spawn(async move {
                        loop {
                            let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if n >= REQUESTS {
                                return;
                            }
                            let tenant = TenantId([(n % usize::from(tenants)) as u8; 16]);
                            let key = ScopedKey::from_parts(tenant, rand::random());
                            let (fp, fence) = (Fingerprint(rand::random()), Fence::random());
                            let lease = Duration::from_secs(30);
                            store.try_begin(&key, &fp, fence, lease).await.expect("begin");
                            let ttl = Duration::from_secs(60);
                            store
                                .complete(&key, &fp, fence, Completion::Response(&response), ttl)
                                .await
                                .expect("complete");
                        }
                    })
                })
                .collect();
            for worker in workers {
                worker.await.unwrap();
            }
            let elapsed = started.elapsed();
            let mut per_master = Vec::new();
            for port in (0..3).map(|i| cluster.port(i)) {
                let out = std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "INFO", "commandstats"])
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let calls_usec = |line: &str| -> (u64, u64) {
                    let field = |name: &str| {
                        line.split([',', ':']).find_map(|f| f.strip_prefix(name)?.parse().ok()).unwrap_or(0)
                    };
                    (field("calls="), field("usec="))
                };
                let (calls, usec) = text
                    .lines()
                    .filter(|l| l.starts_with("cmdstat_evalsha"))
                    .map(calls_usec)
                    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                per_master.push(format!("{calls} calls, {:.1} µs/call", usec as f64 / calls.max(1) as f64));
            }
            println!(
                "round {round}, {name}: {REQUESTS} first requests in {elapsed:?} = {:.0}/s; masters: {}",
                REQUESTS as f64 / elapsed.as_secs_f64(),
                per_master.join("; ")
            );
        }
    }
}
