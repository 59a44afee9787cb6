//! Every statement the relay runs against `idemgate.outbox`.
//!
//! Each function is **one autocommit statement**: no transaction is ever
//! open while a message is published. A claim sets `state = 'leased'`,
//! a lease (`lease_until`, by the database clock) and increments
//! `attempts`; the pair `(id, attempts)` is the claim's [`ClaimFence`]. Renew,
//! complete, retry and bury change the row only while it is still leased
//! under that fence, so a relay whose lease ran out and was reaped (or
//! re-claimed by another relay) changes nothing: they report `false`.
//!
//! **Which rows can be claimed.** A row is claimable when it is `ready`,
//! due (`available_at <= now()`), bound for a destination this relay
//! serves, and — if it has an ordering key — no earlier row of that key is
//! still in the outbox in any state (waiting, backing off, leased or dead).
//! So per ordering key exactly one row, the head, is ever in play, and a
//! failing or dead head holds back only its own key; rows without an
//! ordering key are claimed in parallel. A dead head blocks its key until
//! it is redriven or deleted: delivering the next message first would break
//! the order the service asked for.
//!
//! **Completion** deletes the row and inserts it into `idemgate.delivered`
//! in the same statement, so a row is never both waiting and delivered.

use std::time::Duration;

use bytes::Bytes;

use super::{Database, OutboxError};
use crate::http::trace_context::TraceContext;

/// Identifies one claim of one row: completion and failure need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimFence {
    /// The row.
    pub id: i64,
    /// `attempts` as the claim set it.
    pub attempts: i32,
}

/// A message's JSON payload as text, shared: a clone (for a publish, a
/// retry) copies no bytes, so a claimed row is held in memory once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Payload(Bytes);

impl Payload {
    /// Its length in bytes, as the claim's byte limits count it.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty (a payload dropped after its publish).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The text's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Self {
        Self(Bytes::from(text))
    }
}

impl From<Payload> for Bytes {
    fn from(payload: Payload) -> Self {
        payload.0
    }
}

/// A claimed row: the message and the fence of this claim.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The claim.
    pub fence: ClaimFence,
    /// Attempts since the last redrive, including this one (the retry policy counts these).
    pub attempt: u32,
    /// The `Idempotency-Key` every delivery carries.
    pub derived_key: String,
    /// The destination's name.
    pub destination: String,
    /// What the message does.
    pub operation: String,
    /// Which business object it is about.
    pub business_key: String,
    /// The JSON payload, as text.
    pub payload: Payload,
    /// Extra request headers given at enqueue.
    pub headers: Vec<(String, String)>,
    /// Its ordering key, if any.
    pub ordering_key: Option<String>,
    /// The trace context it was enqueued under: every attempt is a new
    /// span of that trace.
    pub trace: Option<TraceContext>,
}

impl Claimed {
    /// The trace id of its context, or `-`, for log lines.
    pub fn trace_id(&self) -> &str {
        self.trace.as_ref().map_or("-", TraceContext::trace_id)
    }
}

// The candidates are the due heads in due order, `$2` at most; of those
// the claim takes rows while their payloads add up to `$4` bytes — and the
// first one whatever its size when `$5` says it may go alone, so a row
// larger than any budget is still delivered. A candidate not taken is only
// locked for the statement's duration. The size is the payload's text, as
// the relay holds it (`pg_column_size` would count it compressed).
const CLAIM: &str = "
WITH candidates AS (
    SELECT o.id, o.available_at, octet_length(o.payload::text) AS bytes FROM idemgate.outbox o
     WHERE o.state = 'ready' AND o.available_at <= now() AND o.destination = ANY($1::text[])
       AND (o.ordering_key IS NULL OR NOT EXISTS (
             SELECT 1 FROM idemgate.outbox e
              WHERE e.ordering_key = o.ordering_key AND e.ordering_seq < o.ordering_seq))
     ORDER BY o.available_at, o.id
     LIMIT $2
     FOR UPDATE SKIP LOCKED),
taken AS (
    SELECT c.id FROM (
        SELECT id, row_number() OVER w AS n, sum(bytes) OVER w AS running
          FROM candidates WINDOW w AS (ORDER BY available_at, id)) c
     WHERE c.running <= $4 OR (c.n = 1 AND $5))
UPDATE idemgate.outbox o
   SET state = 'leased', attempts = o.attempts + 1,
       lease_until = now() + $3::bigint * interval '1 millisecond'
  FROM taken c
 WHERE o.id = c.id
RETURNING o.id, o.attempts, o.attempts - o.attempts_at_redrive, o.derived_key, o.destination, o.operation,
          o.business_key, o.payload::text, o.headers::text, o.ordering_key, o.traceparent, o.tracestate";

const RENEW: &str = "
UPDATE idemgate.outbox SET lease_until = now() + $3::bigint * interval '1 millisecond'
 WHERE id = $1 AND attempts = $2 AND state = 'leased'";

// Many fences in one statement (one commit for a whole batch): each row
// goes only if it is still leased under its own fence.
const COMPLETE: &str = "
WITH fences AS (
    SELECT * FROM unnest($1::bigint[], $2::integer[]) AS f(id, attempts)),
done AS (
    DELETE FROM idemgate.outbox o USING fences f
     WHERE o.id = f.id AND o.attempts = f.attempts AND o.state = 'leased'
    RETURNING o.id, o.derived_key, o.destination, o.operation, o.business_key, o.ordering_key, o.ordering_seq,
              o.attempts, o.created_at)
INSERT INTO idemgate.delivered (id, derived_key, destination, operation, business_key, ordering_key,
                                ordering_seq, attempts, enqueued_at, delivered_at)
SELECT id, derived_key, destination, operation, business_key, ordering_key, ordering_seq, attempts, created_at, now()
  FROM done
RETURNING id, extract(epoch FROM delivered_at - enqueued_at)::float8";

const RETRY: &str = "
UPDATE idemgate.outbox
   SET state = 'ready', lease_until = NULL, last_error = $4,
       available_at = now() + $3::bigint * interval '1 millisecond'
 WHERE id = $1 AND attempts = $2 AND state = 'leased'";

const BURY: &str = "
UPDATE idemgate.outbox SET state = 'dead', lease_until = NULL, last_error = $3, dead_at = now()
 WHERE id = $1 AND attempts = $2 AND state = 'leased'";

// Bounded and SKIP LOCKED: a row being renewed right now keeps its lease.
const REAP: &str = "
WITH expired AS (
    SELECT id FROM idemgate.outbox
     WHERE state = 'leased' AND lease_until < now()
     LIMIT 1000
     FOR UPDATE SKIP LOCKED)
UPDATE idemgate.outbox o
   SET state = 'ready', lease_until = NULL, available_at = now(), last_error = 'lease expired'
  FROM expired e
 WHERE o.id = e.id";

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Longest `last_error` kept, in characters.
const MAX_ERROR: usize = 500;

fn truncate(reason: &str) -> String {
    reason.chars().take(MAX_ERROR).collect()
}

fn headers_from_json(text: &str) -> Vec<(String, String)> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    map.into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(s) => (name, s),
            other => (name, other.to_string()),
        })
        .collect()
}

/// How much one claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Rows, at most.
    pub rows: u32,
    /// Payload bytes (as text), at most, counting every row taken.
    pub bytes: u64,
    /// Whether the first row is taken even when it alone is over `bytes`
    /// (the claimer holds nothing else, so nothing waits behind it).
    pub alone: bool,
}

impl Limits {
    /// `rows` rows of any size.
    pub fn rows(rows: u32) -> Self {
        Self { rows, bytes: u64::MAX, alone: true }
    }
}

/// Claims up to `limit` due rows of `destinations` under a lease of `lease`.
pub async fn claim_batch(
    db: &Database,
    destinations: &[String],
    limit: u32,
    lease: Duration,
) -> Result<Vec<Claimed>, OutboxError> {
    claim_within(db, destinations, Limits::rows(limit), lease).await
}

/// Claims due rows of `destinations` within `limits`, in due order, under a lease of `lease`.
pub async fn claim_within(
    db: &Database,
    destinations: &[String],
    limits: Limits,
    lease: Duration,
) -> Result<Vec<Claimed>, OutboxError> {
    let (client, statement) = db.prepare(CLAIM).await?;
    let bytes = i64::try_from(limits.bytes).unwrap_or(i64::MAX);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
        [&destinations, &i64::from(limits.rows), &millis(lease), &bytes, &limits.alone];
    let rows = client.query(&statement, &params).await?;
    rows.iter()
        .map(|row| {
            let attempt: i32 = row.try_get(2)?;
            let payload: String = row.try_get(7)?;
            Ok(Claimed {
                fence: ClaimFence { id: row.try_get(0)?, attempts: row.try_get(1)? },
                attempt: u32::try_from(attempt).unwrap_or(0),
                derived_key: row.try_get(3)?,
                destination: row.try_get(4)?,
                operation: row.try_get(5)?,
                business_key: row.try_get(6)?,
                payload: Payload::from(payload),
                headers: headers_from_json(row.try_get(8)?),
                ordering_key: row.try_get(9)?,
                trace: TraceContext::parse(row.try_get(10)?, row.try_get(11)?),
            })
        })
        .collect()
}

async fn fenced(
    db: &Database,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<bool, OutboxError> {
    let (client, statement) = db.prepare(sql).await?;
    Ok(client.execute(&statement, params).await? == 1)
}

/// Extends the lease; `false` when the claim was lost.
pub async fn renew(db: &Database, fence: ClaimFence, lease: Duration) -> Result<bool, OutboxError> {
    fenced(db, RENEW, &[&fence.id, &fence.attempts, &millis(lease)]).await
}

/// Records the delivery (moves the row to history); `false` when the claim was lost.
pub async fn complete(db: &Database, fence: ClaimFence) -> Result<bool, OutboxError> {
    Ok(complete_measured(db, fence).await?.is_some())
}

/// [`complete`], reporting the time from enqueue to delivery by the
/// database clock; `None` when the claim was lost.
pub async fn complete_measured(db: &Database, fence: ClaimFence) -> Result<Option<Duration>, OutboxError> {
    Ok(complete_batch(db, &[fence]).await?.into_iter().next().map(|(_, waited)| waited))
}

/// Records the deliveries of many claims in one statement (one commit).
/// Returns, for each row still leased under its fence, its id and the time
/// from enqueue to delivery by the database clock; a fence missing from the
/// answer had lost its claim, and that row is unchanged.
pub async fn complete_batch(db: &Database, fences: &[ClaimFence]) -> Result<Vec<(i64, Duration)>, OutboxError> {
    if fences.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = fences.iter().map(|f| f.id).collect();
    let attempts: Vec<i32> = fences.iter().map(|f| f.attempts).collect();
    let (client, statement) = db.prepare(COMPLETE).await?;
    let rows = client.query(&statement, &[&ids, &attempts]).await?;
    rows.iter()
        .map(|r| {
            let seconds: f64 = r.try_get(1)?;
            Ok((r.try_get(0)?, Duration::try_from_secs_f64(seconds).unwrap_or(Duration::ZERO)))
        })
        .collect()
}

/// Makes the row claimable again after `delay`; `false` when the claim was lost.
pub async fn retry(db: &Database, fence: ClaimFence, delay: Duration, reason: &str) -> Result<bool, OutboxError> {
    fenced(db, RETRY, &[&fence.id, &fence.attempts, &millis(delay), &truncate(reason)]).await
}

/// Marks the row dead; `false` when the claim was lost.
pub async fn bury(db: &Database, fence: ClaimFence, reason: &str) -> Result<bool, OutboxError> {
    fenced(db, BURY, &[&fence.id, &fence.attempts, &truncate(reason)]).await
}

/// Returns rows whose lease expired to the queue; how many (at most 1000 per call).
pub async fn reap_expired(db: &Database) -> Result<u64, OutboxError> {
    let (client, statement) = db.prepare(REAP).await?;
    Ok(client.execute(&statement, &[]).await?)
}

/// Runs the history retention job (`idemgate.maintain_history`).
pub async fn maintain_history(db: &Database, retention: Duration) -> Result<(), OutboxError> {
    let (client, statement) =
        db.prepare("SELECT idemgate.maintain_history($1::bigint * interval '1 millisecond')").await?;
    client.execute(&statement, &[&millis(retention)]).await?;
    Ok(())
}

/// Returns dead rows to the queue: one by id, or all with `None`. The retry
/// policy starts counting afresh; `attempts` (the fence) keeps growing.
pub async fn redrive(db: &Database, id: Option<i64>) -> Result<i64, OutboxError> {
    let (client, statement) = db.prepare("SELECT idemgate.redrive($1)").await?;
    Ok(client.query_one(&statement, &[&id]).await?.try_get(0)?)
}
