//! Enqueueing many messages in one call: the set-based counterpart of
//! [`enqueue`](super::enqueue::enqueue).
//!
//! [`enqueue_many`] calls the SQL function `idemgate.enqueue_many` once,
//! with one array per field, inside the caller's transaction. Row by row it
//! means what `enqueue` means — once per derived key (a key already waiting,
//! dead or delivered, or repeated earlier in the same slice, is a no-op),
//! the same refusals, delivery in commit order per ordering key, and within
//! the call in slice order — but the database does one `INSERT … SELECT`
//! and one bookkeeping write per distinct ordering key instead of a
//! function call with its statements per row: the call a batch job, a
//! backfill or an import wants. The rows go in in the order of their
//! derived keys, after the call's ordering keys in byte order, so calls
//! that share keys wait for each other but never deadlock, whatever the
//! order of the slice.
//!
//! **Refusals.** Every message is checked ([`Message::check`]) before
//! anything is sent, and the database checks them again (and the payloads'
//! size, which only it measures). The first refused message fails the whole
//! call as [`OutboxError::Refused`] with [`Refusal::Row`]: its index in the
//! slice (counting from 0) and why, in the words of `enqueue`. Nothing of
//! the call is enqueued, and the database's refusal aborts the caller's
//! transaction, as with `enqueue`.
//!
//! ```no_run
//! # async fn example(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use idemgate::outbox::enqueue::Message;
//! use idemgate::outbox::enqueue_many::enqueue_many;
//! let tx = client.transaction().await?;
//! let payloads: Vec<serde_json::Value> = (0..1000).map(|i| serde_json::json!({ "order": i })).collect();
//! let business_keys: Vec<String> = (0..1000).map(|i| format!("order:{i}")).collect();
//! let messages: Vec<Message> = payloads
//!     .iter()
//!     .zip(&business_keys)
//!     .map(|(payload, key)| Message::new("email", "order-shipped", key, payload).ordered_by("customer:7"))
//!     .collect();
//! let keys = enqueue_many(&tx, &messages).await?; // one derived key per message, in order
//! tx.commit().await?;
//! # let _ = keys; Ok(()) }
//! ```

use tokio_postgres::Transaction;
use tokio_postgres::types::Type;

use super::enqueue::{Message, Refusal, derived_key, refusal_or_error};
use super::{OutboxError, Schema};
use crate::postgres::PostgresError;

const ENQUEUE_MANY: &str = "SELECT idemgate.enqueue_many(destination => $1, operation => $2, \
     business_key => $3, payload => $4::text[]::jsonb[], ordering_key => $5, headers => $6::text[]::jsonb[])";

/// [`ENQUEUE_MANY`] naming `trace_context` too, sent only when a message
/// has one (as `enqueue`'s, so untraced calls work before migration 7).
const ENQUEUE_MANY_TRACED: &str = "SELECT idemgate.enqueue_many(destination => $1, operation => $2, \
     business_key => $3, payload => $4::text[]::jsonb[], ordering_key => $5, headers => $6::text[]::jsonb[], \
     trace_context => $7::text[]::jsonb[])";

/// Enqueues every message in the caller's transaction, in one call; returns
/// their derived keys, one per message, in order. Nothing is delivered
/// unless and until the transaction commits.
pub async fn enqueue_many(transaction: &Transaction<'_>, messages: &[Message<'_>]) -> Result<Vec<String>, OutboxError> {
    enqueue_many_in(&Schema::default(), transaction, messages).await
}

/// [`enqueue_many`] into an outbox in another schema.
pub async fn enqueue_many_in(
    schema: &Schema,
    transaction: &Transaction<'_>,
    messages: &[Message<'_>],
) -> Result<Vec<String>, OutboxError> {
    for (index, message) in messages.iter().enumerate() {
        message.check().map_err(|refusal| Refusal::Row { index, refusal: Box::new(refusal) })?;
    }
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    let arrays = Arrays::of(messages);
    // Typed parameters: parse, bind and execute in one round trip.
    let mut params: Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> = vec![
        (&arrays.destinations, Type::TEXT_ARRAY),
        (&arrays.operations, Type::TEXT_ARRAY),
        (&arrays.business_keys, Type::TEXT_ARRAY),
        (&arrays.payloads, Type::TEXT_ARRAY),
        (&arrays.ordering_keys, Type::TEXT_ARRAY),
        (&arrays.headers, Type::TEXT_ARRAY),
    ];
    let sql = match &arrays.trace_contexts {
        Some(trace_contexts) => {
            params.push((trace_contexts, Type::TEXT_ARRAY));
            ENQUEUE_MANY_TRACED
        }
        None => ENQUEUE_MANY,
    };
    let rows = transaction.query_typed(&schema.sql(sql), &params).await.map_err(refusal_or_error)?;
    let row = rows
        .first()
        .ok_or(OutboxError::Postgres(PostgresError::Schema("idemgate.enqueue_many returned no row".into())))?;
    let database: Vec<String> = row.try_get(0)?;
    if database.len() != messages.len() {
        return Err(OutboxError::Postgres(PostgresError::Schema(format!(
            "idemgate.enqueue_many returned {} keys for {} messages",
            database.len(),
            messages.len()
        ))));
    }
    for (database, message) in database.iter().zip(messages) {
        let rust = derived_key(schema, message.destination, message.operation, message.business_key);
        if *database != rust {
            return Err(OutboxError::KeyMismatch { database: database.clone(), rust });
        }
    }
    Ok(database)
}

/// The messages as the function's arrays. `ordering_key`, `headers` and
/// `trace_context` go as NULL when no message has one (most calls): less
/// to send and parse.
struct Arrays<'a> {
    destinations: Vec<&'a str>,
    operations: Vec<&'a str>,
    business_keys: Vec<&'a str>,
    payloads: Vec<String>,
    ordering_keys: Option<Vec<Option<&'a str>>>,
    headers: Option<Vec<Option<String>>>,
    trace_contexts: Option<Vec<Option<String>>>,
}

impl<'a> Arrays<'a> {
    fn of(messages: &[Message<'a>]) -> Self {
        let ordered = messages.iter().any(|m| m.ordering_key.is_some());
        let with_headers = messages.iter().any(|m| !m.headers.is_empty());
        let traced = messages.iter().any(|m| m.trace_context.is_some());
        Self {
            destinations: messages.iter().map(|m| m.destination).collect(),
            operations: messages.iter().map(|m| m.operation).collect(),
            business_keys: messages.iter().map(|m| m.business_key).collect(),
            payloads: messages.iter().map(|m| m.payload.to_string()).collect(),
            ordering_keys: ordered.then(|| messages.iter().map(|m| m.ordering_key).collect()),
            headers: with_headers.then(|| {
                messages
                    .iter()
                    .map(|m| {
                        (!m.headers.is_empty())
                            .then(|| serde_json::to_string(&m.headers).unwrap_or_else(|_| "{}".into()))
                    })
                    .collect()
            }),
            trace_contexts: traced.then(|| messages.iter().map(Message::trace_context_json).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_keys_and_headers_are_sent_only_when_a_message_has_one() {
        let payload = serde_json::json!({"n": 1});
        let plain = [Message::new("d", "o", "a", &payload), Message::new("d", "o", "b", &payload)];
        let arrays = Arrays::of(&plain);
        assert_eq!((arrays.ordering_keys, arrays.headers), (None, None));
        assert_eq!(arrays.payloads, [r#"{"n":1}"#, r#"{"n":1}"#]);
        let mut with_header = Message::new("d", "o", "c", &payload);
        with_header.headers.insert("x-tenant".into(), "7".into());
        let mixed = [Message::new("d", "o", "a", &payload).ordered_by("k"), with_header];
        let arrays = Arrays::of(&mixed);
        assert_eq!(arrays.ordering_keys, Some(vec![Some("k"), None]));
        assert_eq!(arrays.headers, Some(vec![None, Some(r#"{"x-tenant":"7"}"#.to_string())]));
        assert_eq!(arrays.trace_contexts, None);
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced =
            [Message::new("d", "o", "a", &payload), Message::new("d", "o", "b", &payload).traced(traceparent, None)];
        let expected = format!(r#"{{"traceparent":"{traceparent}","tracestate":null}}"#);
        assert_eq!(Arrays::of(&traced).trace_contexts, Some(vec![None, Some(expected)]));
    }
}
