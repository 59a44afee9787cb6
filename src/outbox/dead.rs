//! Dead rows as an operator pages through them, and the rows they hold
//! back.
//!
//! A dead row that has an ordering key is the head of that key: no later
//! row of the key is claimed until it is redriven or deleted (see
//! [`claim`](super::claim)). Those later rows are still `ready`, but no
//! relay will touch them; the console shows them as *held*. Both queries
//! read only: one page of dead rows (a count, then `LIMIT`/`OFFSET` over
//! the dead-row index), and a count of held rows per destination that
//! probes the ordering index once per ready row with an ordering key —
//! time in proportion to the backlog, like the [`census`](super::census),
//! so it runs when an operator asks, never on a schedule.

use std::time::SystemTime;

use super::{Database, OutboxError};
use crate::http::trace_context::TraceContext;

/// Which dead rows to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadQuery {
    /// Only this destination's, or all.
    pub destination: Option<String>,
    /// Rows to skip (oldest first).
    pub offset: i64,
    /// Rows to list at most.
    pub limit: i64,
}

/// A dead row with what it holds back.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadEntry {
    /// Row id (for redrive).
    pub id: i64,
    /// Its derived key.
    pub derived_key: String,
    /// Its destination.
    pub destination: String,
    /// Its operation.
    pub operation: String,
    /// Its business key.
    pub business_key: String,
    /// Attempts made in all.
    pub attempts: i32,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// When it was enqueued, by the database clock.
    pub created_at: SystemTime,
    /// When it died, by the database clock.
    pub dead_at: Option<SystemTime>,
    /// Later rows of its ordering key, waiting behind it (0 without one).
    pub holds: i64,
    /// The trace id of the context it was enqueued under, if any.
    pub trace_id: Option<String>,
}

/// One page of dead rows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeadPage {
    /// The rows, oldest death first.
    pub rows: Vec<DeadEntry>,
    /// Dead rows matching the query in all, on this page or not.
    pub total: i64,
}

const PAGE: &str = "
SELECT d.id, d.derived_key, d.destination, d.operation, d.business_key, d.attempts, d.last_error,
       d.created_at, d.dead_at, d.traceparent,
       CASE WHEN d.ordering_key IS NULL THEN 0 ELSE
         (SELECT count(*) FROM idemgate.outbox b
           WHERE b.ordering_key = d.ordering_key AND b.ordering_seq > d.ordering_seq) END
  FROM idemgate.outbox d
 WHERE d.state = 'dead' AND ($1::text IS NULL OR d.destination = $1)
 ORDER BY d.dead_at, d.id
 LIMIT $2 OFFSET $3";

const TOTAL: &str =
    "SELECT count(*) FROM idemgate.outbox WHERE state = 'dead' AND ($1::text IS NULL OR destination = $1)";

const HELD: &str = "
SELECT r.destination, count(*)
  FROM idemgate.outbox r
 WHERE r.state = 'ready' AND r.ordering_key IS NOT NULL
   AND EXISTS (SELECT 1 FROM idemgate.outbox d
                WHERE d.state = 'dead' AND d.ordering_key = r.ordering_key AND d.ordering_seq < r.ordering_seq)
 GROUP BY r.destination";

/// One page of dead rows, oldest death first.
pub async fn page(db: &Database, query: &DeadQuery) -> Result<DeadPage, OutboxError> {
    let (client, total) = db.prepare(TOTAL).await?;
    let total: i64 = client.query_one(&total, &[&query.destination]).await?.try_get(0)?;
    let page = client.prepare_cached(&db.schema.sql(PAGE)).await?;
    let rows = client.query(&page, &[&query.destination, &query.limit, &query.offset]).await?;
    let rows = rows
        .iter()
        .map(|r| {
            Ok(DeadEntry {
                id: r.try_get(0)?,
                derived_key: r.try_get(1)?,
                destination: r.try_get(2)?,
                operation: r.try_get(3)?,
                business_key: r.try_get(4)?,
                attempts: r.try_get(5)?,
                last_error: r.try_get(6)?,
                created_at: r.try_get(7)?,
                dead_at: r.try_get(8)?,
                trace_id: TraceContext::parse(r.try_get(9)?, None).map(|t| t.trace_id().to_string()),
                holds: r.try_get(10)?,
            })
        })
        .collect::<Result<_, OutboxError>>()?;
    Ok(DeadPage { rows, total })
}

/// Per destination, the ready rows waiting behind a dead row of their
/// ordering key (destinations without any are absent).
pub async fn held(db: &Database) -> Result<Vec<(String, i64)>, OutboxError> {
    let (client, statement) = db.prepare(HELD).await?;
    let rows = client.query(&statement, &[]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}
