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

/// `hex(sha256(outbox ‖ destination ‖ operation ‖ business_key))` with
/// length-prefixed fields, `outbox` the schema's name: the key every
/// delivery of the message carries. Naming the outbox keeps two outboxes
/// in one database (two services sharing a destination) from ever handing
/// it the same key for different effects.
pub fn derived_key(outbox: &Schema, destination: &str, operation: &str, business_key: &str) -> String {
    let fields = [outbox.name().as_bytes(), destination.as_bytes(), operation.as_bytes(), business_key.as_bytes()];
    to_hex(&hash_fields(&fields))
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
}

impl<'a> Message<'a> {
    /// A message without ordering key or extra headers.
    pub fn new(
        destination: &'a str,
        operation: &'a str,
        business_key: &'a str,
        payload: &'a serde_json::Value,
    ) -> Self {
        Self { destination, operation, business_key, payload, ordering_key: None, headers: BTreeMap::new() }
    }

    /// Sets the ordering key.
    pub fn ordered_by(mut self, ordering_key: &'a str) -> Self {
        self.ordering_key = Some(ordering_key);
        self
    }
}

const ENQUEUE: &str = "SELECT idemgate.enqueue(destination => $1, operation => $2, business_key => $3, \
     payload => $4::text::jsonb, ordering_key => $5, headers => $6::text::jsonb)";

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
    let payload = message.payload.to_string();
    let headers = serde_json::to_string(&message.headers).unwrap_or_else(|_| "{}".into());
    // Typed parameters: parse, bind and execute go in one round trip, where
    // an untyped query would first wait for the server to describe them.
    let rows = transaction
        .query_typed(
            &schema.sql(ENQUEUE),
            &[
                (&message.destination, Type::TEXT),
                (&message.operation, Type::TEXT),
                (&message.business_key, Type::TEXT),
                (&payload, Type::TEXT),
                (&message.ordering_key, Type::TEXT),
                (&headers, Type::TEXT),
            ],
        )
        .await?;
    let row = rows.first().ok_or(OutboxError::Schema("idemgate.enqueue returned no row".into()))?;
    let database: String = row.try_get(0)?;
    let rust = derived_key(schema, message.destination, message.operation, message.business_key);
    if database != rust {
        return Err(OutboxError::KeyMismatch { database, rust });
    }
    Ok(rust)
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
}
