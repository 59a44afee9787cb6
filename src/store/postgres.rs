//! Postgres backend: one row per record in `idemgate.gateway_keys`.
//!
//! The table comes from the same versioned migrations as the outbox
//! (`src/postgres/migrations/0002_gateway_keys.sql`); [`PostgresStore::open`]
//! runs them (idempotent, under an advisory lock), so pointing a gateway at
//! a fresh database just works.
//!
//! A row holds the fingerprint, state (`i` in flight, `c` completed, `u`
//! outcome unknown), the
//! fence (the `u64` stored bit for bit in a `bigint`), the encoded response
//! ([`super::codec`]; `NULL` when it was too large to keep) and
//! `expires_at`: the lease end while in flight, the retention end once
//! completed. Time is the database's `clock_timestamp()` only. With
//! `store_encryption` keys the response is sealed ([`super::sealing`]),
//! bound to its record's key. The fields are checked, and the response
//! sealed and opened, by the record codec the Redis store uses too
//! (`record_codec`); this file only moves them in and out of rows.
//!
//! Rows do not vanish by themselves as Redis keys do, so an expired row is
//! treated as absent by every statement: `get` does not see it, renew and
//! release do not match it, `complete` overwrites it only where it would
//! have created a missing one or where it is the caller's own lapsed
//! attempt (see [`Store::complete`]), and `try_begin` overwrites it (reporting
//! `took_over` when it was an expired in-flight attempt of the same
//! request, i.e. the same fingerprint). A background task
//! deletes expired rows every [`CLEANUP_EVERY`], at most
//! [`CLEANUP_BATCH`] per statement.
//!
//! Every transition is **one statement**. `try_begin` is an
//! `INSERT … ON CONFLICT DO UPDATE … WHERE expired` that also reads the row
//! as it stood; if a concurrent attempt inserted the key after the
//! statement's snapshot was taken, the insert waits for it, updates
//! nothing, and sees no old row — the statement is then simply run again
//! (at most [`BEGIN_TRIES`] times), and the second run sees that attempt.
//!
//! **Tenant quota** ([`PostgresStore::with_quota`]). Every row carries its
//! tenant (migration 9), quota or not, so that a quota switched on counts
//! the rows already there. With a quota, `try_begin` is a transaction:
//! a transaction-level advisory lock of the tenant, then one statement
//! that counts the tenant's live rows (and sums their bytes) and inserts
//! only under the limits (a key with a live row is answered from a plain
//! read first, without the lock, so replays do not queue behind a
//! tenant's new keys). The lock is what makes it atomic: a statement's
//! snapshot, taken after the lock is granted, sees every row the previous
//! holder committed, where two statements racing without it could each
//! count the other's key as free.
//!
//! URL: `postgres://user:pass@host:port/db?pool_size=16&schema=idemgate`
//! (`postgresql://` too); `timeout=` bounds connecting (the driver's
//! `connect_timeout`, which it sets). Operations are not timed here: the
//! caller bounds each one once (`gateway.store_timeout`). Other query options go to the driver, TLS ones
//! (`sslmode`, `sslrootcert`) through [`crate::postgres::tls`]. `schema`
//! (default `idemgate`) lets tests, or several gateways with separate key
//! spaces, share one database.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::record_codec::{IN_FLIGHT, RecordCodec, StoredFields};
use super::sealing::Sealer;
use super::{Begin, QuotaLimit, Store, StoreError, url_options};
use crate::config::{ConfigDuration, TenantQuota};
use crate::idempotency::{Completion, Fence, Fingerprint, Record, ScopedKey};
use crate::postgres::{Database, Endpoint, PostgresError, Schema, migrate};

/// How often expired rows are deleted.
pub const CLEANUP_EVERY: Duration = Duration::from_secs(60);
/// Most rows one cleanup statement deletes.
pub const CLEANUP_BATCH: i64 = 10_000;
/// Most runs of the begin statement under contention.
pub const BEGIN_TRIES: usize = 3;

const BEGIN: &str = "
WITH old AS (
    SELECT state, fingerprint, fence, response, expires_at <= clock_timestamp() AS expired,
           greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint AS remaining_ms
      FROM idemgate.gateway_keys WHERE key = $1),
ins AS (
    INSERT INTO idemgate.gateway_keys AS k (key, fingerprint, state, fence, response, expires_at, tenant)
    VALUES ($1, $2, 'i', $3, NULL, clock_timestamp() + $4::bigint * interval '1 millisecond', $5)
    ON CONFLICT (key) DO UPDATE
       SET fingerprint = EXCLUDED.fingerprint, state = 'i', fence = EXCLUDED.fence, response = NULL,
           expires_at = EXCLUDED.expires_at, tenant = EXCLUDED.tenant
     WHERE k.expires_at <= clock_timestamp()
    RETURNING 1)
SELECT EXISTS (SELECT 1 FROM ins) AS acquired, old.state, old.fingerprint, old.fence, old.response,
       old.remaining_ms, old.expired, NULL::text AS over
  FROM (SELECT 1) AS one LEFT JOIN old ON true";

// As BEGIN, run under the tenant's advisory lock (`TENANT_LOCK`) in the
// same transaction: a key with no live row is inserted only while the
// tenant's live rows number fewer than $6 and their responses hold fewer
// than $7 bytes, and `over` says which limit refused it. The statement's
// snapshot is taken after the lock is granted, so it sees every row the
// tenant's previous holder of the lock committed: two first requests of
// one tenant cannot both count the same last free key. (In one statement
// without the lock, both snapshots could predate the other's insert.)
const BEGIN_IN_QUOTA: &str = "
WITH old AS (
    SELECT state, fingerprint, fence, response, expires_at <= clock_timestamp() AS expired,
           greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint AS remaining_ms
      FROM idemgate.gateway_keys WHERE key = $1),
usage AS (
    SELECT count(*) AS keys,
           -- Summed only with a byte limit: it reads every live row of the tenant.
           CASE WHEN $7 < 9223372036854775807 THEN coalesce(sum(octet_length(response)), 0) ELSE 0 END AS bytes
      FROM idemgate.gateway_keys WHERE tenant = $5 AND expires_at > clock_timestamp()),
verdict AS (
    SELECT CASE WHEN usage.keys >= $6 THEN 'keys' WHEN usage.bytes >= $7 THEN 'bytes' END AS over FROM usage),
ins AS (
    INSERT INTO idemgate.gateway_keys AS k (key, fingerprint, state, fence, response, expires_at, tenant)
    SELECT $1, $2, 'i', $3, NULL, clock_timestamp() + $4::bigint * interval '1 millisecond', $5
      FROM verdict WHERE verdict.over IS NULL
    ON CONFLICT (key) DO UPDATE
       SET fingerprint = EXCLUDED.fingerprint, state = 'i', fence = EXCLUDED.fence, response = NULL,
           expires_at = EXCLUDED.expires_at, tenant = EXCLUDED.tenant
     WHERE k.expires_at <= clock_timestamp()
    RETURNING 1)
SELECT EXISTS (SELECT 1 FROM ins) AS acquired, old.state, old.fingerprint, old.fence, old.response,
       old.remaining_ms, old.expired, verdict.over
  FROM verdict LEFT JOIN old ON true";

// A transaction-level advisory lock per tenant, in the two-key space (which
// the single-key locks of the migrations and the outbox never meet): the
// first key names this use, the second is 4 bytes of the tenant's hash.
// Two tenants that share those 4 bytes only wait for each other.
const TENANT_LOCK: &str = "SELECT pg_advisory_xact_lock(1768190049, $1)";

const GET: &str = "
SELECT state, fingerprint, fence, response,
       greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint
  FROM idemgate.gateway_keys WHERE key = $1 AND expires_at > clock_timestamp()";

const RENEW: &str = "
UPDATE idemgate.gateway_keys SET expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'
 WHERE key = $1 AND state = 'i' AND fence = $2 AND expires_at > clock_timestamp()";

// In flight under the caller's fence (lease live or lapsed): completed. No
// row, or a completion past its retention: created. Anything else (another
// fence, a live completion) is left alone and reports 0 rows.
const COMPLETE: &str = "
INSERT INTO idemgate.gateway_keys AS k (key, fingerprint, state, fence, response, expires_at, tenant)
VALUES ($1, $6, $5, $2, $3, clock_timestamp() + $4::bigint * interval '1 millisecond', $7)
ON CONFLICT (key) DO UPDATE
   SET fingerprint = EXCLUDED.fingerprint, state = EXCLUDED.state, fence = EXCLUDED.fence,
       response = EXCLUDED.response, expires_at = EXCLUDED.expires_at, tenant = EXCLUDED.tenant
 WHERE (k.state = 'i' AND k.fence = $2) OR (k.state <> 'i' AND k.expires_at <= clock_timestamp())";

const RELEASE: &str = "
DELETE FROM idemgate.gateway_keys
 WHERE key = $1 AND state = 'i' AND fence = $2 AND expires_at > clock_timestamp()";

const PURGE: &str = "
DELETE FROM idemgate.gateway_keys WHERE key = $1 RETURNING expires_at > clock_timestamp()";

const CLEANUP: &str = "
DELETE FROM idemgate.gateway_keys WHERE key IN (
    SELECT key FROM idemgate.gateway_keys WHERE expires_at < clock_timestamp() LIMIT $1)";

/// See the module docs. A clone shares the pool.
#[derive(Clone)]
pub struct PostgresStore {
    codec: RecordCodec,
    db: Arc<Database>,
    quota: Option<TenantQuota>,
}

fn unavailable(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Unavailable(Box::new(e))
}

fn from_outbox(e: PostgresError) -> StoreError {
    match e {
        PostgresError::InvalidUrl(m) => StoreError::InvalidUrl(m),
        // The store's caller prints the (redacted) URL already.
        PostgresError::Tls { source, .. } => StoreError::InvalidUrl(source.to_string()),
        other => unavailable(other),
    }
}

fn saturating(limit: u64) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// What a store URL says, read without connecting: the same reading
/// serves `open` and the config check (`AnyStore::check_url`).
struct Settings {
    pool_size: usize,
    schema: Schema,
    endpoint: Endpoint,
}

impl Settings {
    fn parse(url: &str) -> Result<Self, StoreError> {
        let (base, _) = url.split_once('?').unwrap_or((url, ""));
        let mut pool_size = 16;
        let mut connect_timeout = None;
        let mut schema = Schema::default();
        let mut passthrough = Vec::new();
        for (name, value) in url_options(url) {
            match name {
                "pool_size" => {
                    pool_size = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        StoreError::InvalidUrl(format!("pool_size={value:?} is not a positive number"))
                    })?
                }
                // Before gateway.store_timeout bounded each operation, this
                // did; it now bounds connecting, where no caller waits.
                "timeout" => {
                    let timeout = value.parse::<ConfigDuration>().map_err(|e| StoreError::InvalidUrl(e.to_string()))?;
                    connect_timeout = Some(timeout.0)
                }
                "schema" => schema = Schema::new(value).map_err(from_outbox)?,
                _ => passthrough.push(format!("{name}={value}")),
            }
        }
        let driver_url =
            if passthrough.is_empty() { base.to_string() } else { format!("{base}?{}", passthrough.join("&")) };
        let mut endpoint = Endpoint::parse(&driver_url).map_err(from_outbox)?;
        if let Some(timeout) = connect_timeout {
            endpoint.config.connect_timeout(timeout);
        }
        Ok(Self { pool_size, schema, endpoint })
    }
}

/// Checks a store URL as [`PostgresStore::open`] reads it, without connecting.
pub fn check_url(url: &str) -> Result<(), StoreError> {
    Settings::parse(url).map(drop)
}

impl PostgresStore {
    /// Connects, applies the migrations, and starts the cleanup task.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let Settings { pool_size, schema, endpoint } = Settings::parse(url)?;
        let db = Database::open(endpoint.clone(), pool_size, schema).map_err(from_outbox)?;
        let mut client = migrate::connect_to(&endpoint).await.map_err(from_outbox)?;
        migrate::run(&mut client, &db.schema).await.map_err(from_outbox)?;
        let db = Arc::new(db);
        tokio::spawn(cleanup(Arc::downgrade(&db)));
        Ok(Self { codec: RecordCodec::new("postgres record"), db, quota: None })
    }

    /// Enforces `quota` per tenant from now on (see the module docs).
    pub fn with_quota(mut self, quota: Option<TenantQuota>) -> Self {
        self.quota = quota;
        self
    }

    /// Seals stored responses with these keys from now on.
    pub fn sealed(mut self, sealer: Option<Arc<Sealer>>) -> Self {
        self.codec = self.codec.sealed(sealer);
        self
    }

    /// The record in `state, fingerprint, fence, response, remaining_ms` at `offset`.
    fn record(&self, key: &ScopedKey, row: &tokio_postgres::Row, offset: usize) -> Result<Record, StoreError> {
        let get_err = |e: tokio_postgres::Error| self.codec.corrupt(&e.to_string());
        let state: i8 = row.try_get(offset).map_err(get_err)?;
        let fields = StoredFields {
            state: vec![state as u8],
            fingerprint: row.try_get(offset + 1).map_err(get_err)?,
            // The `u64` is kept bit for bit in a `bigint`.
            fence: Some(row.try_get::<_, i64>(offset + 2).map_err(get_err)? as u64),
            response: row.try_get(offset + 3).map_err(get_err)?,
            lease_remaining_ms: Some(row.try_get(offset + 4).map_err(get_err)?),
        };
        self.codec.decode(key, fields)
    }

    /// [`BEGIN_IN_QUOTA`] in a transaction under its tenant's lock.
    async fn begin_in_quota(
        &self,
        key: &ScopedKey,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let lock_id = i32::from_be_bytes([key.tenant().0[0], key.tenant().0[1], key.tenant().0[2], key.tenant().0[3]]);
        let mut client = self.db.pool.get().await.map_err(unavailable)?;
        let transaction = client.transaction().await.map_err(unavailable)?;
        let lock = transaction.prepare_cached(&self.db.schema.sql(TENANT_LOCK)).await.map_err(unavailable)?;
        transaction.execute(&lock, &[&lock_id]).await.map_err(unavailable)?;
        let begin = transaction.prepare_cached(&self.db.schema.sql(BEGIN_IN_QUOTA)).await.map_err(unavailable)?;
        let rows = transaction.query(&begin, params).await.map_err(unavailable)?;
        transaction.commit().await.map_err(unavailable)?;
        Ok(rows)
    }

    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let (client, statement) = self.db.prepare(sql).await.map_err(from_outbox)?;
        client.execute(&statement, params).await.map_err(unavailable)
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let (client, statement) = self.db.prepare(sql).await.map_err(from_outbox)?;
        client.query(&statement, params).await.map_err(unavailable)
    }
}

/// Deletes expired rows until the store is dropped.
async fn cleanup(db: Weak<Database>) {
    loop {
        tokio::time::sleep(CLEANUP_EVERY).await;
        let Some(db) = db.upgrade() else { return };
        let result = async {
            let (client, statement) = db.prepare(CLEANUP).await.map_err(from_outbox)?;
            client.execute(&statement, &[&CLEANUP_BATCH]).await.map_err(unavailable)
        };
        match result.await {
            Ok(n) if n > 0 => tracing::debug!(rows = n, "postgres store cleanup"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "postgres store cleanup failed"),
        }
    }
}

impl Store for PostgresStore {
    async fn try_begin(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        let key_bytes = &key.as_bytes()[..];
        let tenant = &key.tenant().0[..];
        let fp = &fingerprint.0[..];
        let fence = fence.0 as i64;
        for _ in 0..BEGIN_TRIES {
            let rows = match &self.quota {
                None => self.query(BEGIN, &[&key_bytes, &fp, &fence, &millis(lease), &tenant]).await?,
                Some(quota) => {
                    // A live record (a replay, a 409) is answered without the
                    // tenant's lock: only a new key needs counting.
                    if let Some(row) = self.query(GET, &[&key_bytes]).await?.first() {
                        return self.record(key, row, 0).map(Begin::Existing);
                    }
                    let limits = (saturating(quota.max_keys), saturating(quota.max_bytes));
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                        [&key_bytes, &fp, &fence, &millis(lease), &tenant, &limits.0, &limits.1];
                    self.begin_in_quota(key, &params).await?
                }
            };
            let row = rows.first().ok_or_else(|| StoreError::Corrupt("begin returned no row".into()))?;
            let acquired: bool = row.try_get(0).map_err(unavailable)?;
            let old_state: Option<i8> = row.try_get(1).map_err(unavailable)?;
            let old_expired: Option<bool> = row.try_get(6).map_err(unavailable)?;
            if acquired {
                let old_fingerprint: Option<Vec<u8>> = row.try_get(2).map_err(unavailable)?;
                let took_over = old_state == Some(IN_FLIGHT as i8)
                    && old_expired == Some(true)
                    && old_fingerprint.as_deref() == Some(fp);
                return Ok(Begin::Acquired { took_over });
            }
            // Not acquired and no live old row: a concurrent attempt got in
            // after this statement's snapshot. Run it again to see it.
            if old_state.is_some() && old_expired == Some(false) {
                return self.record(key, row, 1).map(Begin::Existing);
            }
            match row.try_get::<_, Option<&str>>(7).map_err(unavailable)? {
                Some("keys") => return Ok(Begin::OverQuota(QuotaLimit::Keys)),
                Some(_) => return Ok(Begin::OverQuota(QuotaLimit::Bytes)),
                None => {}
            }
        }
        Err(StoreError::Unavailable("try_begin kept racing with concurrent attempts".into()))
    }

    async fn renew(&self, key: &ScopedKey, fence: Fence, lease: Duration) -> Result<bool, StoreError> {
        let key_bytes = &key.as_bytes()[..];
        Ok(self.execute(RENEW, &[&key_bytes, &(fence.0 as i64), &millis(lease)]).await? == 1)
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        completion: Completion<'_>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key_bytes = &key.as_bytes()[..];
        let written = self.codec.encode(key, completion)?;
        let (state, response, fp) = (written.state as i8, written.response, &fingerprint.0[..]);
        let tenant = &key.tenant().0[..];
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
            [&key_bytes, &(fence.0 as i64), &response, &millis(ttl), &state, &fp, &tenant];
        Ok(self.execute(COMPLETE, &params).await? == 1)
    }

    async fn release(&self, key: &ScopedKey, fence: Fence) -> Result<bool, StoreError> {
        let key_bytes = &key.as_bytes()[..];
        Ok(self.execute(RELEASE, &[&key_bytes, &(fence.0 as i64)]).await? == 1)
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        let key_bytes = &key.as_bytes()[..];
        let rows = self.query(GET, &[&key_bytes]).await?;
        rows.first().map(|row| self.record(key, row, 0)).transpose()
    }

    async fn purge(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let key_bytes = &key.as_bytes()[..];
        let rows = self.query(PURGE, &[&key_bytes]).await?;
        Ok(rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()).unwrap_or(false))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let client = self.db.pool.get().await.map_err(unavailable)?;
        client.simple_query("SELECT 1").await.map(drop).map_err(unavailable)
    }
}
