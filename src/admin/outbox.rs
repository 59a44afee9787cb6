//! Admin routes for the outbox: list dead rows, redrive one or all, list
//! unroutable rows (waiting for a destination the config does not have).
//!
//! They work when the config names the relay's database
//! (`relay.database_url`), whether or not this process runs the relay; a
//! gateway without one answers `404`, and the unroutable listing also
//! needs the config's `[destinations]` (it is relative to them). Rows are addressed by their outbox
//! `id`. The payload and message headers are never returned: they may hold
//! a customer's data. Every database call is bounded by [`DB_TIMEOUT`].

use std::time::{Duration, UNIX_EPOCH};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::{json, query};
use crate::gateway::problem::Problem;
use crate::http::body::ResponseBody;
use crate::outbox::{OutboxError, census, claim};
use crate::postgres::Database;

/// Limit on one admin database call.
const DB_TIMEOUT: Duration = Duration::from_secs(5);
/// Rows listed when `limit` is not given, and the most that may be asked for.
const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;

async fn within_db_timeout<T>(work: impl Future<Output = Result<T, OutboxError>>) -> Result<T, Problem> {
    match tokio::time::timeout(DB_TIMEOUT, work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "admin: outbox database unavailable");
            Err(Problem::OutboxUnavailable)
        }
        Err(_) => Err(Problem::OutboxUnavailable),
    }
}

/// The `limit` parameter: absent, or 1 to [`MAX_LIMIT`].
fn limit(request: &Request<Incoming>) -> Result<i64, Problem> {
    match query::param(request.uri().query(), "limit") {
        Ok(None) => Ok(DEFAULT_LIMIT),
        Ok(Some(text)) => match text.parse::<i64>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(Problem::BadAdminRequest(format!("limit must be a number from 1 to {MAX_LIMIT}"))),
        },
        Err(why) => Err(Problem::BadAdminRequest(why)),
    }
}

/// `GET /admin/outbox/dead?limit=N`.
pub(super) async fn list_dead(db: Option<&Database>, request: &Request<Incoming>) -> Response<ResponseBody> {
    let limit = match limit(request) {
        Ok(limit) => limit,
        Err(problem) => return problem.to_response(),
    };
    let Some(db) = db else { return Problem::NotFound.to_response() };
    let rows = match within_db_timeout(claim::list_dead(db, limit)).await {
        Ok(rows) => rows,
        Err(problem) => return problem.to_response(),
    };
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            serde_json::json!({
                "id": row.id,
                "derived_key": row.derived_key,
                "destination": row.destination,
                "operation": row.operation,
                "business_key": row.business_key,
                "attempts": row.attempts,
                "last_error": row.last_error,
                "dead_at_unix_ms": row.dead_at.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_millis() as u64),
            })
        })
        .collect();
    json(StatusCode::OK, serde_json::json!({ "rows": rows }))
}

/// `GET /admin/outbox/unroutable?limit=N`: per destination the config
/// does not have, its waiting rows and the oldest one's age, oldest first;
/// `total` counts the destinations listed or not.
pub(super) async fn list_unroutable(
    db: Option<&Database>,
    configured: &[String],
    request: &Request<Incoming>,
) -> Response<ResponseBody> {
    let limit = match limit(request) {
        Ok(limit) => usize::try_from(limit).unwrap_or(0),
        Err(problem) => return problem.to_response(),
    };
    let Some(db) = db.filter(|_| !configured.is_empty()) else { return Problem::NotFound.to_response() };
    let census = match within_db_timeout(census::census(db, configured, limit)).await {
        Ok(census) => census,
        Err(problem) => return problem.to_response(),
    };
    let destinations: Vec<serde_json::Value> = census
        .unroutable
        .iter()
        .map(|b| {
            serde_json::json!({
                "destination": b.destination,
                "rows": b.ready,
                "oldest_age_seconds": b.oldest_ready_age.as_secs(),
            })
        })
        .collect();
    json(StatusCode::OK, serde_json::json!({ "destinations": destinations, "total": census.unroutable_destinations }))
}

/// `POST /admin/outbox/dead/{id}/redrive` (`id = Some`) or `POST /admin/outbox/redrive`.
pub(super) async fn redrive(db: Option<&Database>, id: Option<&str>) -> Response<ResponseBody> {
    let id = match id.map(str::parse::<i64>) {
        None => None,
        Some(Ok(id)) if id > 0 => Some(id),
        Some(_) => return Problem::BadAdminRequest("the row id must be a positive integer".into()).to_response(),
    };
    let Some(db) = db else { return Problem::NotFound.to_response() };
    match within_db_timeout(claim::redrive(db, id)).await {
        Ok(0) if id.is_some() => Problem::NotFound.to_response(),
        Ok(n) => {
            tracing::info!(rows = n, id, "admin redrove dead outbox rows");
            json(StatusCode::OK, serde_json::json!({ "redriven": n }))
        }
        Err(problem) => problem.to_response(),
    }
}

/// Whether the database answers (readiness), when one is configured.
pub(super) async fn ping(db: &Database) -> bool {
    let check = async {
        let client = db.pool.get().await?;
        client.simple_query("SELECT 1").await?;
        Ok::<_, OutboxError>(())
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), check).await, Ok(Ok(())))
}
