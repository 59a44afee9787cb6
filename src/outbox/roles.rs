//! The two roles besides the owner, and exactly what each may do.
//!
//! The schema belongs to the role that runs `idemgate migrate` (the
//! *owner*); nobody else needs to be it, or a superuser:
//!
//! - a **service** role enqueues and nothing more. `enqueue` (and
//!   `enqueue_many`) run with the owner's rights (`SECURITY DEFINER`, `search_path` pinned to
//!   `pg_catalog, pg_temp`, every name in it schema-qualified), so the
//!   service needs no privilege on any table: it cannot read, change or
//!   delete a row, its own or another service's;
//! - a **relay** role claims, renews, completes, retries, buries, reaps,
//!   lists and redrives rows (plain statements on the outbox and the
//!   history), and runs retention through `maintain_history`, which creates
//!   and drops history partitions with the owner's rights. It may not
//!   insert into the outbox, nor touch the ordering sequences.
//!
//! [`statements`] is the exact list for a role, pure, so docs/outbox.md, the
//! `migrate --grant-…` flags and the tests share one truth; [`grant`] runs
//! them in one transaction, under the migrations' advisory lock. The roles themselves (login, password) are the
//! DBA's: `grant` refuses a role that does not exist rather than create one.

use tokio_postgres::Client;

use crate::postgres::Schema;

/// Why a grant failed.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// Not a role name `grant` will use.
    #[error("role name {0:?}: {1}")]
    InvalidName(String, &'static str),
    /// The role does not exist (in this cluster).
    #[error("role {0:?} does not exist: create it first (CREATE ROLE … LOGIN PASSWORD …)")]
    Missing(String),
    /// The transaction around the grants failed.
    #[error("granting: {}", crate::postgres::ErrorChain(.0))]
    Transaction(#[source] tokio_postgres::Error),
    /// A statement failed.
    #[error("granting to {role:?}: {}", crate::postgres::ErrorChain(.source))]
    Database {
        /// The role.
        role: String,
        /// What the server said.
        #[source]
        source: tokio_postgres::Error,
    },
}

/// A role's name, exactly as the server stores it (case included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role(String);

impl Role {
    /// At most 63 bytes (the server would truncate a longer name), no NUL,
    /// and not `public` or `none` (which `GRANT` reads as keywords: every
    /// role, or nobody), nor a predefined `pg_` role.
    pub fn new(name: &str) -> Result<Self, RoleError> {
        let invalid = |why| Err(RoleError::InvalidName(name.to_string(), why));
        if name.is_empty() || name.len() > 63 {
            return invalid("must be 1 to 63 bytes");
        }
        if name.contains('\0') {
            return invalid("must not contain NUL");
        }
        if matches!(name.to_ascii_lowercase().as_str(), "public" | "none") || name.starts_with("pg_") {
            return invalid("is reserved");
        }
        Ok(Self(name.to_string()))
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The name as a quoted SQL identifier.
    fn quoted(&self) -> String {
        format!("\"{}\"", self.0.replace('"', "\"\""))
    }
}

/// Which of the two roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duty {
    /// Enqueues, nothing more.
    Service,
    /// Runs the relay (and the admin API's dead-row routes).
    Relay,
}

const SERVICE: &[&str] = &[
    "GRANT USAGE ON SCHEMA {schema} TO {role}",
    "GRANT EXECUTE ON FUNCTION idemgate.enqueue(text, text, text, jsonb, text, jsonb, jsonb) TO {role}",
    "GRANT EXECUTE ON FUNCTION idemgate.enqueue_many(text[], text[], text[], jsonb[], text[], jsonb[], jsonb[]) TO {role}",
];

const RELAY: &[&str] = &[
    "GRANT USAGE ON SCHEMA {schema} TO {role}",
    // claim, renew, retry, bury, reap, redrive; complete deletes.
    "GRANT SELECT, UPDATE, DELETE ON idemgate.outbox TO {role}",
    // complete inserts (and reads back what it inserted).
    "GRANT SELECT, INSERT ON idemgate.delivered TO {role}",
    // the version check at start; the cap and the outbox's name.
    "GRANT SELECT ON idemgate.schema_migrations, idemgate.settings TO {role}",
    "GRANT EXECUTE ON FUNCTION idemgate.redrive(bigint), idemgate.maintain_history(interval) TO {role}",
];

/// The statements that give `role` its `duty` on the outbox in `schema`.
pub fn statements(schema: &Schema, duty: Duty, role: &Role) -> Vec<String> {
    let list = match duty {
        Duty::Service => SERVICE,
        Duty::Relay => RELAY,
    };
    list.iter().map(|s| schema.sql(s).replace("{schema}", schema.name()).replace("{role}", &role.quoted())).collect()
}

/// Runs the statements of every `(duty, role)` in one transaction, under
/// the schema's migration lock ([`crate::postgres::migrate::lock`]), so
/// grants from several `migrate` processes at once queue instead of failing;
/// returns them, in order. Granting twice changes nothing.
pub async fn grant(client: &mut Client, schema: &Schema, grants: &[(Duty, Role)]) -> Result<Vec<String>, RoleError> {
    let failed = |role: &Role| {
        let role = role.name().to_string();
        move |source: tokio_postgres::Error| {
            if source.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_OBJECT) {
                RoleError::Missing(role)
            } else {
                RoleError::Database { role, source }
            }
        }
    };
    let mut done = Vec::new();
    let transaction = client.transaction().await.map_err(RoleError::Transaction)?;
    // Under the migrations' lock: another `migrate --grant-…` granting on
    // the same objects at once made one of them fail.
    crate::postgres::migrate::lock(&transaction, schema).await.map_err(RoleError::Transaction)?;
    for (duty, role) in grants {
        for statement in statements(schema, *duty, role) {
            transaction.batch_execute(&statement).await.map_err(failed(role))?;
            done.push(statement);
        }
    }
    transaction.commit().await.map_err(RoleError::Transaction)?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_role_gets_the_schema_and_enqueue_and_nothing_else() {
        let role = Role::new("shop").unwrap();
        let granted = statements(&Schema::new("shop_b").unwrap(), Duty::Service, &role);
        assert_eq!(
            granted,
            [
                "GRANT USAGE ON SCHEMA shop_b TO \"shop\"",
                "GRANT EXECUTE ON FUNCTION shop_b.enqueue(text, text, text, jsonb, text, jsonb, jsonb) TO \"shop\"",
                "GRANT EXECUTE ON FUNCTION shop_b.enqueue_many(text[], text[], text[], jsonb[], text[], jsonb[], jsonb[]) TO \"shop\"",
            ]
        );
    }

    #[test]
    fn role_names_are_quoted_so_any_name_is_one_identifier() {
        let role = Role::new("Shop\"; DROP TABLE x; --").unwrap();
        let granted = statements(&Schema::default(), Duty::Relay, &role);
        assert!(granted.iter().all(|s| s.ends_with("TO \"Shop\"\"; DROP TABLE x; --\"")), "{granted:?}");
    }

    #[test]
    fn the_outbox_page_states_exactly_these_statements() {
        let page = include_str!("../../docs/outbox.md");
        for (duty, role) in [(Duty::Service, "shop"), (Duty::Relay, "relay")] {
            for statement in statements(&Schema::default(), duty, &Role::new(role).unwrap()) {
                assert!(page.contains(&format!("{statement};\n")), "docs/outbox.md lacks {statement}");
            }
        }
    }

    #[test]
    fn public_none_predefined_and_overlong_names_are_refused() {
        for bad in ["", "public", "PUBLIC", "none", "pg_read_all_data", &"r".repeat(64), "a\0b"] {
            assert!(Role::new(bad).is_err(), "{bad:?}");
        }
        assert!(Role::new(&"r".repeat(63)).is_ok());
    }
}
