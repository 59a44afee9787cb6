//! Admin routes for the outbox: counts per destination, list dead rows (a
//! page at a time), redrive one or all, list unroutable rows (waiting for a
//! destination the config does not have).
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
use crate::http::body::BoxedBody;
use crate::outbox::dead::{self, DeadQuery};
use crate::outbox::{OutboxError, census, claim};
use crate::postgres::Database;

/// Limit on one admin database call.
const DB_TIMEOUT: Duration = Duration::from_secs(5);
/// Rows listed when `limit` is not given, and the most that may be asked for.
const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;
/// The furthest a dead-row page may start: paging past it is a sign the
/// dead rows want a redrive or a query of their own, not a console.
const MAX_OFFSET: i64 = 1_000_000;

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
        Err(why) => Err(Problem::BadAdminRequest(why.to_string())),
    }
}

/// The dead-row query: `limit`, `offset` (0 to [`MAX_OFFSET`]) and an optional `destination`.
fn dead_query(request: &Request<Incoming>) -> Result<DeadQuery, Problem> {
    let limit = limit(request)?;
    let query = request.uri().query();
    let offset = match query::param(query, "offset").map_err(|why| Problem::BadAdminRequest(why.to_string()))? {
        None => 0,
        Some(text) => match text.parse::<i64>() {
            Ok(n) if (0..=MAX_OFFSET).contains(&n) => n,
            _ => return Err(Problem::BadAdminRequest(format!("offset must be a number from 0 to {MAX_OFFSET}"))),
        },
    };
    let destination = query::param(query, "destination").map_err(|why| Problem::BadAdminRequest(why.to_string()))?;
    if destination.as_ref().is_some_and(|d| d.is_empty() || d.chars().count() > 255) {
        return Err(Problem::BadAdminRequest("destination must be 1 to 255 characters; leave it out for all".into()));
    }
    Ok(DeadQuery { destination, offset, limit })
}

fn unix_ms(time: std::time::SystemTime) -> Option<u64> {
    time.duration_since(UNIX_EPOCH).ok().map(|d| d.as_millis() as u64)
}

/// `GET /admin/outbox/dead?limit=N&offset=M&destination=D`: one page of
/// dead rows, oldest death first, each with the rows it holds back.
pub(super) async fn list_dead(db: Option<&Database>, request: &Request<Incoming>) -> Response<BoxedBody> {
    let query = match dead_query(request) {
        Ok(query) => query,
        Err(problem) => return problem.to_response(),
    };
    let Some(db) = db else { return Problem::NotFound.to_response() };
    let page = match within_db_timeout(dead::page(db, &query)).await {
        Ok(page) => page,
        Err(problem) => return problem.to_response(),
    };
    let rows: Vec<serde_json::Value> = page
        .rows
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
                "created_at_unix_ms": unix_ms(row.created_at),
                "dead_at_unix_ms": row.dead_at.and_then(unix_ms),
                "holds": row.holds,
                "trace_id": row.trace_id,
            })
        })
        .collect();
    json(StatusCode::OK, serde_json::json!({ "rows": rows, "total": page.total, "offset": query.offset }))
}

/// The database and `?limit=` of a census call: `404` without an outbox
/// database or without configured destinations (nothing to tell apart).
fn census_request<'a>(
    db: Option<&'a Database>,
    configured: &[String],
    request: &Request<Incoming>,
) -> Result<(&'a Database, usize), Problem> {
    let limit = limit(request)?;
    let db = db.filter(|_| !configured.is_empty()).ok_or(Problem::NotFound)?;
    Ok((db, usize::try_from(limit).unwrap_or(0)))
}

/// `GET /admin/outbox/destinations?limit=N`: every configured destination
/// with its ready, leased, dead and held rows and its oldest ready row's
/// age; then up to `limit` unroutable ones (rows waiting for a destination
/// the config does not have), oldest waiting first. Held rows (waiting
/// behind a dead row of their ordering key) are among the ready ones.
pub(super) async fn destinations(
    db: Option<&Database>,
    configured: &[String],
    request: &Request<Incoming>,
) -> Response<BoxedBody> {
    let (db, limit) = match census_request(db, configured, request) {
        Ok(found) => found,
        Err(problem) => return problem.to_response(),
    };
    let counted = async { Ok::<_, OutboxError>((census::census(db, configured, limit).await?, dead::held(db).await?)) };
    let (census, held) = match within_db_timeout(counted).await {
        Ok(counts) => counts,
        Err(problem) => return problem.to_response(),
    };
    let held_of = |name: &str| held.iter().find(|(d, _)| d == name).map_or(0, |(_, n)| *n);
    let describe = |b: &census::Backlog| {
        serde_json::json!({
            "destination": b.destination,
            "ready": b.ready,
            "leased": b.leased,
            "dead": b.dead,
            "held": held_of(&b.destination),
            "oldest_ready_age_seconds": b.oldest_ready_age.as_secs(),
        })
    };
    let empty = |name: &String| census::Backlog { destination: name.clone(), ..Default::default() };
    let listed: Vec<serde_json::Value> = configured
        .iter()
        .map(|name| match census.configured.iter().find(|b| &b.destination == name) {
            Some(backlog) => describe(backlog),
            None => describe(&empty(name)),
        })
        .collect();
    let unroutable: Vec<serde_json::Value> = census.unroutable.iter().map(describe).collect();
    json(
        StatusCode::OK,
        serde_json::json!({
            "destinations": listed,
            "unroutable": unroutable,
            "unroutable_total": census.unroutable_destinations,
        }),
    )
}

/// `GET /admin/outbox/unroutable?limit=N`: per destination the config
/// does not have, its waiting rows and the oldest one's age, oldest first;
/// `total` counts the destinations listed or not.
pub(super) async fn list_unroutable(
    db: Option<&Database>,
    configured: &[String],
    request: &Request<Incoming>,
) -> Response<BoxedBody> {
    let (db, limit) = match census_request(db, configured, request) {
        Ok(found) => found,
        Err(problem) => return problem.to_response(),
    };
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
pub(super) async fn redrive(db: Option<&Database>, id: Option<&str>) -> Response<BoxedBody> {
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
