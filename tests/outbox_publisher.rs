//! What reaches a log line from outside, on the real PostgreSQL: a
//! server's error names its message and SQLSTATE on one line.

mod support;

use idemgate::outbox::OutboxError;
use support::outbox::Fixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_error_names_the_servers_message_and_sqlstate_on_one_line() {
    let fx = Fixture::start().await;
    let client = fx.schema.connect().await;
    let error = client.batch_execute("SELECT 1 FROM no_such_table").await.unwrap_err();
    let printed = OutboxError::from(error).to_string();
    assert_eq!(printed, "database error: ERROR: relation \"no_such_table\" does not exist (SQLSTATE 42P01)");
    let error =
        client.batch_execute("DO $$ BEGIN RAISE EXCEPTION 'two' USING DETAIL = E'lines\\nforged'; END $$").await;
    let printed = OutboxError::from(error.unwrap_err()).to_string();
    assert_eq!(printed, "database error: ERROR: two (SQLSTATE P0001); DETAIL: lines\\nforged");
}
