//! Building and running a relay from the config (`idemgate relay`,
//! `serve --relay`): the schema version is checked before anything runs.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Relay, Settings};
use crate::config::Config;
use crate::outbox::publisher::HttpPublisher;
use crate::outbox::{Database, Endpoint, ErrorChain, Schema, migrate, relay_sessions};

/// Builds the HTTP relay a config describes: checks the schema version first.
pub async fn from_config(config: &Config) -> Result<(Relay<HttpPublisher>, Option<Endpoint>), String> {
    let url = config.relay.database_url.as_ref().ok_or("the relay needs relay.database_url or --database-url")?;
    if config.destinations.is_empty() {
        return Err("the relay needs at least one [destinations.<name>] in the config file".into());
    }
    let schema = Schema::new(&config.relay.schema).map_err(|e| e.to_string())?;
    // Parsed once: a bad sslmode or an unreadable sslrootcert stops the start here.
    let endpoint = Endpoint::parse(url.expose()).map_err(|e| e.to_string())?;
    let db =
        Database::open(relay_sessions(endpoint.clone()), config.relay.pool_size, schema).map_err(|e| e.to_string())?;
    let client =
        db.pool.get().await.map_err(|e| format!("cannot connect to {}: {}", url.redacted(), ErrorChain(&e)))?;
    migrate::require_current(&client, &db.schema).await.map_err(|e| e.to_string())?;
    drop(client);
    let publisher = HttpPublisher::new(&config.destinations).map_err(|e| e.to_string())?;
    let policies = config.destinations.iter().map(|(name, d)| (name.clone(), d.retry_policy())).collect();
    let listen = config.relay.listen.then_some(endpoint);
    Ok((Relay::new(db, publisher, policies, Settings::from(&config.relay)), listen))
}

/// `idemgate relay`: runs the configured relay until `shutdown` resolves,
/// with its admin listener (probes, metrics, dead and unroutable rows) on
/// `admin_listen`.
pub async fn run_from_config(config: &Config, shutdown: impl Future<Output = ()>) -> Result<(), String> {
    let (relay, listen) = from_config(config).await?;
    let access = crate::admin::AdminAccess::from_config(&config.admin)?;
    let listener = crate::gateway::server::bind(config.admin_listen).await?;
    let admin = crate::admin::relay::RelayAdmin::new(
        relay.database().clone(),
        relay.metrics().clone(),
        access,
        relay.destinations().to_vec(),
    );
    // The admin listener outlives the relay's drain, so probes answer until the end.
    let admin_stop = CancellationToken::new();
    let admin_task =
        tokio::spawn(crate::admin::relay::serve(listener, Arc::new(admin), admin_stop.clone().cancelled_owned()));
    tracing::info!(destinations = config.destinations.len(), admin = %config.admin_listen, "idemgate relay running");
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(listen, stop.clone()));
    shutdown.await;
    tracing::info!("relay stopping: finishing what it holds");
    stop.cancel();
    let finished = running.await.map_err(|e| e.to_string());
    admin_stop.cancel();
    let _ = admin_task.await;
    finished
}
