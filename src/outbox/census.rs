//! What waits in the outbox, per destination: the backlog gauges and the
//! listing of rows no relay will claim.
//!
//! A row is *unroutable* for a relay when its destination is not among the
//! relay's `[destinations]` (a typo, a destination removed or not yet
//! rolled out): no claim takes it, so without this census it would wait
//! forever, unseen, holding back its ordering key. It stays `ready` and
//! keeps its place; a relay configured with its destination delivers it.
//!
//! [`census`] is one statement that counts the whole table grouped by
//! destination, so it costs time in proportion to the backlog; the relay
//! runs it on a schedule of its own, never on the claim path. Destination
//! names come from enqueued data, not from the config, so the answer is
//! bounded: every configured destination that has rows, and at most
//! `limit` unroutable ones (oldest waiting row first), with the number of
//! unroutable names in all.

use std::time::Duration;

use super::{Database, OutboxError};

/// One destination's rows (`Default`: none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backlog {
    /// The destination.
    pub destination: String,
    /// Rows waiting (due or backing off).
    pub ready: i64,
    /// Rows claimed right now.
    pub leased: i64,
    /// Dead rows.
    pub dead: i64,
    /// Age of the oldest waiting row since it was enqueued, by the database clock.
    pub oldest_ready_age: Duration,
}

/// The outbox by destination, as one relay sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Census {
    /// Configured destinations that have rows (absent: none).
    pub configured: Vec<Backlog>,
    /// Unconfigured destinations with rows waiting, oldest waiting row first, at most the limit asked for.
    pub unroutable: Vec<Backlog>,
    /// How many unconfigured destinations have rows waiting, listed or not.
    pub unroutable_destinations: i64,
}

const CENSUS: &str = "
SELECT destination, ready, leased, dead, age, configured, count(*) FILTER (WHERE NOT configured) OVER ()
  FROM (SELECT destination,
               count(*) FILTER (WHERE state = 'ready') AS ready,
               count(*) FILTER (WHERE state = 'leased') AS leased,
               count(*) FILTER (WHERE state = 'dead') AS dead,
               min(created_at) FILTER (WHERE state = 'ready') AS oldest,
               coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'ready')), 0)::float8 AS age,
               destination = ANY($1::text[]) AS configured
          FROM idemgate.outbox GROUP BY destination) per
 WHERE configured OR ready > 0
 ORDER BY configured DESC, oldest, destination
 LIMIT $2";

/// Counts the outbox: every destination in `configured`, and up to `limit` others with rows waiting.
pub async fn census(db: &Database, configured: &[String], limit: usize) -> Result<Census, OutboxError> {
    let (client, statement) = db.prepare(CENSUS).await?;
    let rows_wanted = i64::try_from(configured.len().saturating_add(limit)).unwrap_or(i64::MAX);
    let rows = client.query(&statement, &[&configured, &rows_wanted]).await?;
    let mut census = Census::default();
    for row in rows {
        let age: f64 = row.try_get(4)?;
        let backlog = Backlog {
            destination: row.try_get(0)?,
            ready: row.try_get(1)?,
            leased: row.try_get(2)?,
            dead: row.try_get(3)?,
            oldest_ready_age: Duration::try_from_secs_f64(age).unwrap_or(Duration::ZERO),
        };
        census.unroutable_destinations = row.try_get(6)?;
        if row.try_get(5)? {
            census.configured.push(backlog);
        } else if census.unroutable.len() < limit {
            census.unroutable.push(backlog);
        }
    }
    Ok(census)
}
