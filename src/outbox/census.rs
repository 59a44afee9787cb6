//! What waits in the outbox, per destination: the backlog gauges.
//!
//! [`census`] is one statement that counts the whole table grouped by
//! destination, so it costs time in proportion to the backlog; the relay
//! runs it on a schedule of its own, never on the claim path.

use std::time::Duration;

use super::{Database, OutboxError};

/// One destination's rows.
#[derive(Debug, Clone, PartialEq)]
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
}

const CENSUS: &str = "
SELECT destination,
       count(*) FILTER (WHERE state = 'ready'),
       count(*) FILTER (WHERE state = 'leased'),
       count(*) FILTER (WHERE state = 'dead'),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'ready')), 0)::float8
  FROM idemgate.outbox
 WHERE destination = ANY($1::text[])
 GROUP BY destination";

/// Counts the outbox rows of every destination in `configured`.
pub async fn census(db: &Database, configured: &[String]) -> Result<Census, OutboxError> {
    let (client, statement) = db.prepare(CENSUS).await?;
    let rows = client.query(&statement, &[&configured]).await?;
    let mut census = Census::default();
    for row in rows {
        let age: f64 = row.try_get(4)?;
        census.configured.push(Backlog {
            destination: row.try_get(0)?,
            ready: row.try_get(1)?,
            leased: row.try_get(2)?,
            dead: row.try_get(3)?,
            oldest_ready_age: Duration::try_from_secs_f64(age).unwrap_or(Duration::ZERO),
        });
    }
    Ok(census)
}
