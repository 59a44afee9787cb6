//! The enqueue side of the outbox against the real PostgreSQL: the derived
//! key (SQL and Rust byte for byte, one per outbox) and what `enqueue` and
//! `enqueue_many` refuse. Each test migrates schemas of its own.

use crate::support;

use std::time::Duration;

use idemgate::outbox::OutboxError;
use idemgate::outbox::enqueue::{Message, Refusal, derived_key, enqueue_in};
use idemgate::outbox::enqueue_many::enqueue_many_in;
use idemgate::outbox::relay::Relay;
use serde_json::json;
use support::outbox::{DESTINATION, Fixture, settings};
use support::postgres::TestSchema;

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_and_rust_derive_byte_identical_keys_in_every_outbox() {
    let (a, b) = (TestSchema::create().await, TestSchema::create().await);
    let tuples = [
        ("ab", "c", "x"),
        ("a", "bc", "x"),
        ("", "", ""),
        ("email", "order-shipped", "order:1001"),
        ("é", "日本", "😀"),
    ];
    let mut seen = Vec::new();
    for schema in [&a, &b] {
        let client = schema.connect().await;
        let own = schema.sql("SELECT idemgate.derived_key($1, $2, $3)");
        let named = schema.sql("SELECT idemgate.derived_key($1, $2, $3, $4)");
        for (d, o, k) in tuples {
            let rust = derived_key(&schema.schema, d, o, k);
            let from_sql: String = client.query_one(&own, &[&d, &o, &k]).await.unwrap().get(0);
            assert_eq!(from_sql, rust, "{} {d:?} {o:?} {k:?}", schema.name());
            let from_name: String = client.query_one(&named, &[&schema.name(), &d, &o, &k]).await.unwrap().get(0);
            assert_eq!(from_name, rust, "the four-field form, given the outbox's name");
            seen.push(rust);
        }
    }
    assert_ne!(seen[0], seen[1], "(\"ab\",\"c\") and (\"a\",\"bc\") must differ");
    let distinct: std::collections::HashSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), seen.len(), "no two tuples, in one outbox or across two, share a key");
}

/// The issue's collision: two outboxes in one database bill the same
/// order through one deduplicating destination. Both charges must apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_outboxes_enqueueing_the_same_message_both_take_effect_at_one_destination() {
    let fx = Fixture::start().await;
    let other = TestSchema::create().await;
    let (shop_a, shop_b) = (json!({"amount": 500, "shop": "a"}), json!({"amount": 700, "shop": "b"}));
    let mut keys = Vec::new();
    for (schema, payload) in [(&fx.schema, &shop_a), (&other, &shop_b)] {
        let mut client = schema.connect().await;
        let tx = client.transaction().await.unwrap();
        let message = Message::new(DESTINATION, "charge", "order:1001", payload);
        keys.push(enqueue_in(&schema.schema, &tx, &message).await.expect("enqueue"));
        tx.commit().await.unwrap();
    }
    assert_ne!(keys[0], keys[1], "each outbox derives its own key");
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    let relay_b = Relay::new(other.database(4), fx.publisher(), fx.policies(), settings(LEASE));
    assert_eq!(relay_b.try_execute_step().await.unwrap().delivered, 1);
    assert_eq!(fx.sink.effects(), 2, "both charges applied: {:?}", fx.sink.received());
    let statuses: Vec<u16> = fx.sink.received().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200], "neither was refused as a replay of the other");
}

/// A message `idemgate.enqueue` refuses, called from SQL as a service would.
async fn refused_by_sql(schema: &TestSchema, business_key: &str, headers: &str, payload: &str) -> (String, String) {
    let mut client = schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let sql = schema.sql("SELECT idemgate.enqueue('sink', 'notify', $1, $3::text::jsonb, NULL, $2::text::jsonb)");
    let error = tx.query_one(&sql, &[&business_key, &headers, &payload]).await.expect_err("refused");
    let db = error.as_db_error().expect("a database error");
    // The service's transaction fails visibly: nothing more runs in it.
    let after = tx.query_one("SELECT 1", &[]).await.expect_err("the transaction is aborted");
    assert_eq!(after.code(), Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION));
    (db.code().code().to_string(), db.message().to_string())
}

/// Two messages `idemgate.enqueue_many` refuses, called from SQL as a service would.
async fn refused_by_sql_many(
    schema: &TestSchema,
    business_keys: [&str; 2],
    headers: [Option<&str>; 2],
) -> (String, String) {
    let mut client = schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let sql = schema.sql(
        "SELECT idemgate.enqueue_many('{sink,sink}', '{notify,notify}', $1, '{\"{}\",\"{}\"}', NULL, $2::text[]::jsonb[])",
    );
    let error = tx.query_one(&sql, &[&business_keys.as_slice(), &headers.as_slice()]).await.expect_err("refused");
    let db = error.as_db_error().expect("a database error");
    let after = tx.query_one("SELECT 1", &[]).await.expect_err("the transaction is aborted");
    assert_eq!(after.code(), Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION));
    (db.code().code().to_string(), db.message().to_string())
}

fn headers(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_and_rust_refuse_the_same_messages_with_the_same_words() {
    let fx = Fixture::start().await;
    let big = "v".repeat(8200);
    let cases: Vec<(&str, std::collections::BTreeMap<String, String>, &str)> = vec![
        ("", headers(&[]), "22023"),
        (" \t\n", headers(&[]), "22023"),
        // The issue's case: a framing header would have cut the body to 5 bytes.
        ("order:1", headers(&[("content-length", "5")]), "22023"),
        ("order:1", headers(&[("Transfer-Encoding", "chunked")]), "22023"),
        ("order:1", headers(&[("host", "evil.example")]), "22023"),
        ("order:1", headers(&[("Idempotency-Key", "mine")]), "22023"),
        ("order:1", headers(&[("connection", "close"), ("x-a", "1")]), "22023"),
        ("order:1", headers(&[("x y", "1")]), "22023"),
        ("order:1", headers(&[("", "1")]), "22023"),
        ("order:1", headers(&[("x-note", "a\r\nx-injected: 1")]), "22023"),
        ("order:1", headers(&[("x-note", "é")]), "22023"),
        ("order:1", headers(&[("x-b", "\n"), ("Host", "x")]), "22023"),
        ("order:1", headers(&[("x-big", &big)]), "54000"),
    ];
    let payload = json!({"n": 1});
    for (business_key, headers, code) in cases {
        let mut message = Message::new(DESTINATION, "notify", business_key, &payload);
        message.headers = headers.clone();
        let rust = message.check().expect_err("the helper refuses it too");
        let json = serde_json::to_string(&headers).unwrap();
        let (sql_code, sql_message) = refused_by_sql(&fx.schema, business_key, &json, "{}").await;
        assert_eq!(sql_message, rust.to_string(), "{business_key:?} {headers:?}");
        assert_eq!(sql_code, code, "{sql_message}");
        // The helper refuses before sending anything.
        let mut client = fx.schema.connect().await;
        let tx = client.transaction().await.unwrap();
        let error = enqueue_in(&fx.schema.schema, &tx, &message).await.expect_err("refused");
        assert!(matches!(&error, idemgate::outbox::OutboxError::Refused(r) if *r == rust), "{error}");
        // The set-based forms, with the message second: the same words, after its index.
        let fine = Message::new(DESTINATION, "notify", "fine", &payload);
        let row = Refusal::Row { index: 1, refusal: Box::new(rust) };
        let error = enqueue_many_in(&fx.schema.schema, &tx, &[fine, message]).await.expect_err("refused");
        assert!(matches!(&error, OutboxError::Refused(r) if *r == row), "{error}");
        let (sql_code, sql_message) =
            refused_by_sql_many(&fx.schema, ["fine", business_key], [None, Some(json.as_str())]).await;
        assert_eq!((sql_code.as_str(), sql_message), (code, row.to_string()));
    }
    assert_eq!(fx.count("true").await, 0, "nothing was enqueued");
    // What only SQL can send: values that are not strings, headers that are not an object.
    let (code, message) = refused_by_sql(&fx.schema, "order:1", r#"{"x-n": 5}"#, "{}").await;
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("22023", "enqueue: headers: the value of \"x-n\" must be a string of printable ASCII")
    );
    let (code, message) = refused_by_sql(&fx.schema, "order:1", r#"["x"]"#, "{}").await;
    assert_eq!((code.as_str(), message.as_str()), ("22023", "enqueue: headers must be a JSON object of strings"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_over_max_payload_is_refused_by_the_database_and_one_at_the_cap_is_not() {
    let fx = Fixture::start().await;
    let admin = fx.schema.connect().await;
    let settings = idemgate::postgres::migrate::configure(&admin, &fx.schema.schema, 64).await.unwrap();
    assert_eq!((settings.outbox.as_str(), settings.max_payload), (fx.schema.name(), 64));
    // The cap counts the JSON text the relay sends: PostgreSQL's rendering.
    let at_cap = json!({"note": "x".repeat(52)});
    let rendered = "SELECT octet_length($1::text::jsonb::text)::int8";
    let size: i64 = admin.query_one(rendered, &[&at_cap.to_string()]).await.unwrap().get(0);
    assert_eq!(size, 64, "{{\"note\": \"…\"}}: 12 bytes and the note");
    let over = json!({"note": "x".repeat(53)});
    let (code, message) = refused_by_sql(&fx.schema, "order:1", "{}", &over.to_string()).await;
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("54000", "enqueue: payload is 65 bytes, more than max_payload (64 bytes)")
    );
    let mut client = fx.schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let error = enqueue_in(&fx.schema.schema, &tx, &Message::new(DESTINATION, "notify", "order:1", &over))
        .await
        .expect_err("refused");
    assert_eq!(error.to_string(), message, "the helper returns the database's words");
    assert!(matches!(error, idemgate::outbox::OutboxError::Refused(_)), "{error:?}");
    drop(tx);
    fx.enqueue("order:2", at_cap, None).await;
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1, "a payload at the cap is delivered");
}

/// An empty business key used to collapse every such message into one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_messages_leave_the_outbox_and_the_destination_untouched() {
    let fx = Fixture::start().await;
    let payload = json!({"n": 1});
    let mut client = fx.schema.connect().await;
    for business_key in ["", "  "] {
        let tx = client.transaction().await.unwrap();
        let message = Message::new(DESTINATION, "notify", business_key, &payload);
        assert!(enqueue_in(&fx.schema.schema, &tx, &message).await.is_err());
    }
    let kept = fx.enqueue("order:1", json!({}), None).await;
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    assert_eq!((fx.sink.count(), fx.sink.count_for(&kept)), (1, 1));
}

/// Runs `sql` in a transaction; returns its SQLSTATE and message, having
/// checked that the transaction is aborted.
async fn refused_statement(schema: &TestSchema, sql: &str) -> (String, String) {
    let mut client = schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let error = tx.batch_execute(&schema.sql(sql)).await.expect_err(sql);
    let after = tx.query_one("SELECT 1", &[]).await.expect_err("the transaction is aborted");
    assert_eq!(after.code(), Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION));
    let db = error.as_db_error().expect("a database error");
    (db.code().code().to_string(), db.message().to_string())
}

/// The first refused row of a call is named by its index (counting from 0),
/// the whole call fails, and so does the service's transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_names_its_index_and_fails_the_whole_call_and_transaction() {
    let fx = Fixture::start().await;
    let admin = fx.schema.connect().await;
    idemgate::postgres::migrate::configure(&admin, &fx.schema.schema, 64).await.unwrap();
    let over = json!({"note": "x".repeat(53)}).to_string();
    let sql = format!(
        "SELECT idemgate.enqueue_many('{{sink,sink,sink,sink}}', '{{n,n,n,n}}', '{{a,b,c,\" \"}}',
                                      ARRAY['{{}}', '{{}}', '{over}', '{{}}']::jsonb[])"
    );
    let (code, message) = refused_statement(&fx.schema, &sql).await;
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("54000", "enqueue_many: row 2 (0-based): payload is 65 bytes, more than max_payload (64 bytes)"),
        "row 3 is refused too, but row 2 comes first"
    );
    let nulls = "SELECT idemgate.enqueue_many('{sink,sink}', ARRAY['n', NULL], '{a,b}', '{\"{}\",\"{}\"}')";
    let (code, message) = refused_statement(&fx.schema, nulls).await;
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("22004", "enqueue_many: row 1 (0-based): destination, operation, business_key and payload are required")
    );
    let uneven = "SELECT idemgate.enqueue_many('{sink,sink}', '{n}', '{a,b}', '{\"{}\",\"{}\"}')";
    let (code, message) = refused_statement(&fx.schema, uneven).await;
    assert_eq!(code, "22023");
    assert!(message.starts_with("enqueue_many: every array must hold one element per message"), "{message}");
    assert_eq!(fx.count("true").await, 0, "nothing was enqueued");

    // The helper: the payload is the database's to measure, and the call
    // fails with the row's index all the same.
    let payloads = [json!({}), json!({"note": "x".repeat(53)})];
    let messages = [
        Message::new(DESTINATION, "notify", "a", &payloads[0]),
        Message::new(DESTINATION, "notify", "b", &payloads[1]),
    ];
    let mut client = fx.schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let error = enqueue_many_in(&fx.schema.schema, &tx, &messages).await.expect_err("refused");
    assert!(matches!(&error, OutboxError::Refused(Refusal::Row { index: 1, .. })), "{error:?}");
    assert_eq!(
        error.to_string(),
        "enqueue_many: row 1 (0-based): payload is 65 bytes, more than max_payload (64 bytes)"
    );
    let after = tx.query_one("SELECT 1", &[]).await.expect_err("the transaction is aborted");
    assert_eq!(after.code(), Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION));
    drop(tx);
    assert_eq!(fx.count("true").await, 0);
}

/// A blank ordering key would put every message given one in a single
/// global line, behind any failing head among them: `enqueue` and every
/// row of `enqueue_many` refuse it, naming the argument, in the words of
/// the Rust helper, which refuses it before sending anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_blank_ordering_key_is_refused_by_both_functions_and_the_helper() {
    let fx = Fixture::start().await;
    let payload = json!({});
    for blank in ["", "  ", "\t"] {
        let message = Message::new(DESTINATION, "notify", "order:1", &payload).ordered_by(blank);
        let rust = message.check().expect_err("the helper refuses it");
        assert_eq!(rust, Refusal::BlankOrderingKey, "{blank:?}");
        let words = "ordering_key must not be empty or only whitespace (NULL means no order)";

        let mut client = fx.schema.connect().await;
        let tx = client.transaction().await.unwrap();
        let single = fx.schema.sql("SELECT idemgate.enqueue('sink', 'notify', 'order:1', '{}', ordering_key => $1)");
        let error = tx.query_one(&single, &[&blank]).await.expect_err("enqueue refuses it");
        let db = error.as_db_error().expect("a database error");
        assert_eq!((db.code().code(), db.message()), ("22023", format!("enqueue: {words}").as_str()), "{blank:?}");
        assert_eq!(db.message(), rust.to_string());
        drop(tx);

        let tx = client.transaction().await.unwrap();
        let many = fx.schema.sql(
            "SELECT idemgate.enqueue_many('{sink,sink}', '{notify,notify}', '{a,b}', '{\"{}\",\"{}\"}',
                                          ordering_key => ARRAY['customer:1', $1])",
        );
        let error = tx.query_one(&many, &[&blank]).await.expect_err("enqueue_many refuses the row");
        let db = error.as_db_error().expect("a database error");
        let row = format!("enqueue_many: row 1 (0-based): {words}");
        assert_eq!((db.code().code(), db.message()), ("22023", row.as_str()), "{blank:?}");
        drop(tx);

        let tx = client.transaction().await.unwrap();
        let error = enqueue_in(&fx.schema.schema, &tx, &message).await.expect_err("refused");
        assert!(matches!(&error, OutboxError::Refused(Refusal::BlankOrderingKey)), "{error}");
        let fine = Message::new(DESTINATION, "notify", "fine", &payload).ordered_by("customer:1");
        let error = enqueue_many_in(&fx.schema.schema, &tx, &[fine, message]).await.expect_err("refused");
        assert_eq!(error.to_string(), row);
    }
    // NULL is no order, and a key with text around spaces is a key.
    let mut client = fx.schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let fine = fx.schema.sql(
        "SELECT idemgate.enqueue_many('{sink,sink}', '{notify,notify}', '{c,d}', '{\"{}\",\"{}\"}',
                                      ordering_key => ARRAY[NULL, ' k '])",
    );
    tx.query_one(&fine, &[]).await.expect("NULL and ' k ' are accepted");
    tx.commit().await.unwrap();
    assert_eq!(fx.count("true").await, 2, "only the accepted call enqueued anything");
}
