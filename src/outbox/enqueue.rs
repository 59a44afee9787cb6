//! Enqueueing from Rust, and the derived key.
//!
//! [`enqueue`] calls the SQL function `idemgate.enqueue` inside the
//! caller's transaction, so Rust and SQL services share one implementation
//! of the dedup, ordering and notification rules; it then checks that the
//! database derived the same key as [`derived_key`] (a schema from an
//! incompatible version would not, nor one renamed after it was migrated:
//! its keys keep the outbox name it was migrated under, so that the rows
//! waiting and the delivered history keep theirs).
//!
//! **Refusals.** A message the relay could not deliver as meant is refused
//! at enqueue, so the service's transaction fails visibly instead of the
//! row failing later, unseen: an empty or whitespace-only business key or
//! ordering key, a header that is not a valid HTTP header, one the relay or the connection
//! owns (framing, hop-by-hop, `Idempotency-Key`), more than
//! [`MAX_HEADER_BYTES`] of headers, a payload over the outbox's
//! `max_payload`. The SQL function checks them all; [`Message::check`]
//! checks all but the payload's size *before* anything is sent, in the
//! same order and with the same messages, so an error reads the same
//! whichever side found it. The payload's size is the database's alone to
//! judge: the cap counts the JSON text the relay will send
//! (`payload::text`, PostgreSQL's rendering of the `jsonb`), which only the
//! database produces exactly. Either way the error is
//! [`OutboxError::Refused`], which retrying cannot cure.
//!
//! ```no_run
//! # async fn example(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use idemgate::outbox::enqueue::{Message, enqueue};
//! let tx = client.transaction().await?;
//! tx.execute("UPDATE orders SET state = 'shipped' WHERE id = $1", &[&1001_i64]).await?;
//! let payload = serde_json::json!({ "to": "a@b.c" });
//! let key = enqueue(&tx, &Message::new("email", "order-shipped", "order:1001", &payload)).await?;
//! tx.commit().await?; // the row becomes visible to the relay only now
//! # let _ = key; Ok(()) }
//! ```

use std::collections::BTreeMap;

use tokio_postgres::Transaction;
use tokio_postgres::types::Type;

use super::{OutboxError, Schema};
use crate::idempotency::hash::{hash_fields, to_hex};
use crate::postgres::PostgresError;

/// `hex(sha256(outbox ‖ destination ‖ operation ‖ business_key))` with
/// length-prefixed fields, `outbox` the schema's name: the key every
/// delivery of the message carries. Naming the outbox keeps two outboxes
/// in one database (two services sharing a destination) from ever handing
/// it the same key for different effects.
pub fn derived_key(outbox: &Schema, destination: &str, operation: &str, business_key: &str) -> String {
    let fields = [outbox.name().as_bytes(), destination.as_bytes(), operation.as_bytes(), business_key.as_bytes()];
    to_hex(&hash_fields(&fields))
}

/// Headers a message may not set: framing and hop-by-hop headers (they
/// could cut the body short or smuggle a second request, and belong to
/// the connection, not the message), and `Idempotency-Key`, which the
/// relay sets to the derived key. The SQL function refuses the same names;
/// a destination's config may set none of them but `host`.
pub const RESERVED_HEADERS: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "host",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
    "idempotency-key",
];

/// Why `name` (any case) is one of the [`RESERVED_HEADERS`], if it is.
pub fn reserved_header(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    if !RESERVED_HEADERS.contains(&name.as_str()) {
        return None;
    }
    Some(match name.as_str() {
        "content-length" | "transfer-encoding" => "it frames the body, which the relay does",
        "host" => "the destination's URL names the host",
        "idempotency-key" => "every request carries the derived key",
        _ => "it is a hop-by-hop header",
    })
}

/// The most bytes of header names and values one message may carry: 8 KiB,
/// what common servers accept in a request's header section.
pub const MAX_HEADER_BYTES: usize = 8192;

/// Why `enqueue` refused a message. The messages are those of the SQL
/// function, word for word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Empty or only whitespace: every such message would share one key.
    #[error("enqueue: business_key must not be empty or only whitespace")]
    BlankBusinessKey,
    /// Empty or only whitespace: every such message would wait in one
    /// line, behind any failing head among them (`None` means no order).
    #[error("enqueue: ordering_key must not be empty or only whitespace (NULL means no order)")]
    BlankOrderingKey,
    /// A header name that is not an HTTP token.
    #[error("enqueue: headers: \"{0}\" is not a valid header name")]
    HeaderName(String),
    /// A header in [`RESERVED_HEADERS`] (any case).
    #[error("enqueue: headers: \"{0}\" is set by the relay or the connection, not per message")]
    ReservedHeader(String),
    /// A header value with a character outside printable ASCII, space and tab.
    #[error("enqueue: headers: the value of \"{0}\" must be a string of printable ASCII")]
    HeaderValue(String),
    /// More than [`MAX_HEADER_BYTES`] of names and values.
    #[error("enqueue: headers are {0} bytes, more than 8192")]
    HeadersTooLarge(usize),
    /// Refused by the database itself, with its message: the payload over
    /// `max_payload` (which only the database measures).
    #[error("{0}")]
    Database(String),
    /// One message of a set-based enqueue
    /// ([`enqueue_many`](super::enqueue_many)), at its position in the
    /// slice (counting from 0), was refused; the whole call was. The message
    /// is `idemgate.enqueue_many`'s: `enqueue_many: row N (0-based): ` and
    /// then what `enqueue` would have said.
    #[error("enqueue_many: row {index} (0-based): {}", .refusal.to_string().trim_start_matches("enqueue: "))]
    Row {
        /// The message's index in the slice given (0 is the first).
        index: usize,
        /// Why it was refused.
        refusal: Box<Refusal>,
    },
}

fn is_blank(text: &str) -> bool {
    // The SQL function's class [ \t\n\r\v\f], not Unicode whitespace.
    text.bytes().all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c))
}

fn is_token(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn is_printable(value: &str) -> bool {
    value.bytes().all(|b| b == b'\t' || (0x20..=0x7e).contains(&b))
}

/// One message to enqueue.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    /// A destination named in the relay config.
    pub destination: &'a str,
    /// What to do (part of the derived key).
    pub operation: &'a str,
    /// Which business object (part of the derived key).
    pub business_key: &'a str,
    /// The request body the destination receives.
    pub payload: &'a serde_json::Value,
    /// Messages of one ordering key are delivered in commit order.
    pub ordering_key: Option<&'a str>,
    /// Extra request headers for this message.
    pub headers: BTreeMap<String, String>,
    /// The W3C trace context to deliver it under (`traceparent`, then
    /// `tracestate`); without one, the transaction's settings
    /// `idemgate.traceparent` and `idemgate.tracestate` are read, if set.
    /// An invalid `traceparent` is ignored, not refused.
    pub trace_context: Option<(&'a str, Option<&'a str>)>,
}

impl<'a> Message<'a> {
    /// A message without ordering key or extra headers.
    pub fn new(
        destination: &'a str,
        operation: &'a str,
        business_key: &'a str,
        payload: &'a serde_json::Value,
    ) -> Self {
        Self {
            destination,
            operation,
            business_key,
            payload,
            ordering_key: None,
            headers: BTreeMap::new(),
            trace_context: None,
        }
    }

    /// Sets the ordering key.
    pub fn ordered_by(mut self, ordering_key: &'a str) -> Self {
        self.ordering_key = Some(ordering_key);
        self
    }

    /// Sets the trace context: the caller's current `traceparent` and
    /// `tracestate`, as its tracing library would inject them into a request.
    pub fn traced(mut self, traceparent: &'a str, tracestate: Option<&'a str>) -> Self {
        self.trace_context = Some((traceparent, tracestate));
        self
    }

    /// The `trace_context` argument: `{"traceparent": …, "tracestate": …}`,
    /// or none (the function then reads the transaction's settings).
    pub(super) fn trace_context_json(&self) -> Option<String> {
        self.trace_context.map(|(traceparent, tracestate)| {
            serde_json::json!({ "traceparent": traceparent, "tracestate": tracestate }).to_string()
        })
    }

    /// What `idemgate.enqueue` would refuse in this message, but the
    /// payload's size: the first fault in the function's order (business
    /// key, ordering key, then each header by name in byte order, then
    /// their total).
    pub fn check(&self) -> Result<(), Refusal> {
        if is_blank(self.business_key) {
            return Err(Refusal::BlankBusinessKey);
        }
        if self.ordering_key.is_some_and(is_blank) {
            return Err(Refusal::BlankOrderingKey);
        }
        let mut bytes = 0;
        for (name, value) in &self.headers {
            if !is_token(name) {
                return Err(Refusal::HeaderName(name.clone()));
            }
            if reserved_header(name).is_some() {
                return Err(Refusal::ReservedHeader(name.clone()));
            }
            if !is_printable(value) {
                return Err(Refusal::HeaderValue(name.clone()));
            }
            bytes += name.len() + value.len();
        }
        if bytes > MAX_HEADER_BYTES {
            return Err(Refusal::HeadersTooLarge(bytes));
        }
        Ok(())
    }
}

const ENQUEUE: &str = "SELECT idemgate.enqueue(destination => $1, operation => $2, business_key => $3, \
     payload => $4::text::jsonb, ordering_key => $5, headers => $6::text::jsonb)";

/// [`ENQUEUE`] naming `trace_context` too: sent only for a message that
/// has one, so untraced messages still enqueue into a schema migrated
/// before migration 7 (a service upgraded before its database).
const ENQUEUE_TRACED: &str = "SELECT idemgate.enqueue(destination => $1, operation => $2, business_key => $3, \
     payload => $4::text::jsonb, ordering_key => $5, headers => $6::text::jsonb, trace_context => $7::text::jsonb)";

/// Enqueues `message` in the caller's transaction; returns the derived key.
/// Nothing is delivered unless and until the transaction commits.
pub async fn enqueue(transaction: &Transaction<'_>, message: &Message<'_>) -> Result<String, OutboxError> {
    enqueue_in(&Schema::default(), transaction, message).await
}

/// [`enqueue`] into an outbox in another schema.
pub async fn enqueue_in(
    schema: &Schema,
    transaction: &Transaction<'_>,
    message: &Message<'_>,
) -> Result<String, OutboxError> {
    message.check()?;
    let payload = message.payload.to_string();
    let headers = serde_json::to_string(&message.headers).unwrap_or_else(|_| "{}".into());
    let trace_context = message.trace_context_json();
    // Typed parameters: parse, bind and execute go in one round trip, where
    // an untyped query would first wait for the server to describe them.
    let mut params: Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> = vec![
        (&message.destination, Type::TEXT),
        (&message.operation, Type::TEXT),
        (&message.business_key, Type::TEXT),
        (&payload, Type::TEXT),
        (&message.ordering_key, Type::TEXT),
        (&headers, Type::TEXT),
    ];
    let sql = match &trace_context {
        Some(trace_context) => {
            params.push((trace_context, Type::TEXT));
            ENQUEUE_TRACED
        }
        None => ENQUEUE,
    };
    let rows = transaction.query_typed(&schema.sql(sql), &params).await.map_err(refusal_or_error)?;
    let row =
        rows.first().ok_or(OutboxError::Postgres(PostgresError::Schema("idemgate.enqueue returned no row".into())))?;
    let database: String = row.try_get(0)?;
    let rust = derived_key(schema, message.destination, message.operation, message.business_key);
    if database != rust {
        return Err(OutboxError::KeyMismatch { database, rust });
    }
    Ok(rust)
}

/// A refusal raised by `idemgate.enqueue` or `idemgate.enqueue_many` as
/// [`OutboxError::Refused`] (a row of the latter as [`Refusal::Row`]); any
/// other error as it is.
pub(super) fn refusal_or_error(error: tokio_postgres::Error) -> OutboxError {
    use tokio_postgres::error::SqlState;
    let refused = error.as_db_error().filter(|db| {
        [SqlState::INVALID_PARAMETER_VALUE, SqlState::PROGRAM_LIMIT_EXCEEDED].contains(db.code())
            && (db.message().starts_with("enqueue: ") || db.message().starts_with("enqueue_many: row "))
    });
    match refused {
        Some(db) => OutboxError::Refused(database_refusal(db.message())),
        None => OutboxError::Postgres(PostgresError::Database(error)),
    }
}

/// `message` as the database wrote it; `enqueue_many: row N (0-based): …`
/// as the [`Refusal::Row`] it names, so its index can be read.
fn database_refusal(message: &str) -> Refusal {
    let row = message.strip_prefix("enqueue_many: row ").and_then(|rest| rest.split_once(" (0-based): "));
    match row.and_then(|(index, why)| Some((index.parse().ok()?, why))) {
        Some((index, why)) => Refusal::Row { index, refusal: Box::new(Refusal::Database(format!("enqueue: {why}"))) },
        None => Refusal::Database(message.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_boundaries_are_part_of_the_key() {
        let outbox = Schema::default();
        assert_ne!(derived_key(&outbox, "ab", "c", "x"), derived_key(&outbox, "a", "bc", "x"));
        assert_ne!(derived_key(&outbox, "e", "", "x"), derived_key(&outbox, "", "e", "x"));
        assert_eq!(derived_key(&outbox, "email", "order-shipped", "order:1001").len(), 64);
    }

    #[test]
    fn two_outboxes_derive_different_keys_for_one_message() {
        let (a, b) = (Schema::default(), Schema::new("shop_b").unwrap());
        assert_ne!(
            derived_key(&a, "billing", "charge", "order:1001"),
            derived_key(&b, "billing", "charge", "order:1001")
        );
    }

    #[test]
    fn the_key_is_the_hash_of_four_length_prefixed_fields() {
        // sha256 of 00..08 "idemgate" 00..01 "e" 00..01 "o" 00..01 "b",
        // computed independently (python3 hashlib), pins the encoding.
        assert_eq!(
            derived_key(&Schema::default(), "e", "o", "b"),
            "612c862129ba6b33e38fb4b1033b754680f4370e36c07dc5de5510ac5a78e090"
        );
    }

    fn message_with_header<'a>(payload: &'a serde_json::Value, name: &str, value: &str) -> Message<'a> {
        let mut message = Message::new("email", "order-shipped", "order:1", payload);
        message.headers.insert(name.into(), value.into());
        message
    }

    #[test]
    fn an_empty_or_blank_business_key_is_refused_and_any_other_is_not() {
        let payload = serde_json::json!({});
        for blank in ["", " ", "\t\n", "\r\x0b\x0c "] {
            let message = Message::new("email", "order-shipped", blank, &payload);
            assert_eq!(message.check(), Err(Refusal::BlankBusinessKey), "{blank:?}");
        }
        for fine in ["x", " order:1 ", "\u{a0}"] {
            assert_eq!(Message::new("email", "order-shipped", fine, &payload).check(), Ok(()), "{fine:?}");
        }
    }

    #[test]
    fn an_empty_or_blank_ordering_key_is_refused_and_none_or_any_other_is_not() {
        let payload = serde_json::json!({});
        let message =
            |ordering_key| Message::new("email", "order-shipped", "order:1", &payload).ordered_by(ordering_key);
        for blank in ["", "  ", "\t", "\r\n\x0b\x0c"] {
            assert_eq!(message(blank).check(), Err(Refusal::BlankOrderingKey), "{blank:?}");
        }
        for fine in ["customer:42", " k ", "\u{a0}"] {
            assert_eq!(message(fine).check(), Ok(()), "{fine:?}");
        }
        assert_eq!(Message::new("email", "order-shipped", "order:1", &payload).check(), Ok(()), "no ordering key");
        let both = Message::new("email", "order-shipped", " ", &payload).ordered_by("");
        assert_eq!(both.check(), Err(Refusal::BlankBusinessKey), "the business key is checked first");
    }

    #[test]
    fn framing_hop_by_hop_and_the_idempotency_key_are_refused_in_any_case() {
        let payload = serde_json::json!({});
        for name in RESERVED_HEADERS.iter().copied().chain(["Content-Length", "HOST", "Idempotency-Key"]) {
            let message = message_with_header(&payload, name, "5");
            assert_eq!(message.check(), Err(Refusal::ReservedHeader(name.into())), "{name}");
        }
        for name in ["x-tenant", "authorization", "content-type", "x-a.b_c~1"] {
            assert_eq!(message_with_header(&payload, name, "v").check(), Ok(()), "{name}");
        }
    }

    #[test]
    fn header_names_must_be_tokens_and_values_printable_ascii() {
        let payload = serde_json::json!({});
        for name in ["", "x y", "x:y", "x\ny", "é", "(x)"] {
            let message = message_with_header(&payload, name, "v");
            assert_eq!(message.check(), Err(Refusal::HeaderName(name.into())), "{name:?}");
        }
        for value in ["a\r\nx-injected: 1", "a\nb", "\u{0}", "\u{7f}", "é"] {
            let message = message_with_header(&payload, "x-note", value);
            assert_eq!(message.check(), Err(Refusal::HeaderValue("x-note".into())), "{value:?}");
        }
        assert_eq!(message_with_header(&payload, "x-note", "a b\t~").check(), Ok(()));
    }

    #[test]
    fn headers_are_bounded_in_bytes() {
        let payload = serde_json::json!({});
        let fits = message_with_header(&payload, "x-big", &"v".repeat(MAX_HEADER_BYTES - 5));
        assert_eq!(fits.check(), Ok(()));
        let over = message_with_header(&payload, "x-big", &"v".repeat(MAX_HEADER_BYTES - 4));
        assert_eq!(over.check(), Err(Refusal::HeadersTooLarge(MAX_HEADER_BYTES + 1)));
    }

    #[test]
    fn a_refused_row_reads_as_the_database_writes_it_and_keeps_its_index() {
        let row = Refusal::Row { index: 3, refusal: Box::new(Refusal::BlankBusinessKey) };
        let sql = "enqueue_many: row 3 (0-based): business_key must not be empty or only whitespace";
        assert_eq!(row.to_string(), sql);
        let parsed = database_refusal(sql);
        assert!(matches!(&parsed, Refusal::Row { index: 3, .. }), "{parsed:?}");
        assert_eq!(parsed.to_string(), sql);
        let single = "enqueue: payload is 65 bytes, more than max_payload (64 bytes)";
        assert_eq!(database_refusal(single), Refusal::Database(single.into()));
    }

    #[test]
    fn the_first_fault_in_name_order_is_the_one_reported() {
        let payload = serde_json::json!({});
        let mut message = message_with_header(&payload, "x-b", "\n");
        message.headers.insert("Host".into(), "x".into());
        // Byte order: "Host" < "x-b", as the SQL function's ORDER BY key COLLATE "C".
        assert_eq!(message.check(), Err(Refusal::ReservedHeader("Host".into())));
    }
}
