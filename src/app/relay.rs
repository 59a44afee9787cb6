//! Wiring of `idemgate relay` (and the relay half of `serve --relay`):
//! config in, relay and its admin listener out.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::StartError;
use crate::config::Config;
use crate::outbox::publisher::Destinations;
use crate::outbox::relay::{Relay, Settings};
use crate::outbox::relay_sessions;
use crate::outbox::retry::RetryPolicy;
use crate::postgres::{Database, Endpoint, Schema};

/// The HTTP relay a config describes, and the endpoint it LISTENs on.
/// Connects to nothing: see [`Relay::start`](crate::outbox::relay::Relay::start).
pub fn build(config: &Config) -> Result<(Relay<Destinations>, Option<Endpoint>), StartError> {
    let url = config
        .relay
        .database_url
        .as_ref()
        .ok_or(StartError::Missing("the relay needs relay.database_url or --database-url"))?;
    if config.destinations.is_empty() {
        return Err(StartError::Missing("the relay needs at least one [destinations.<name>] in the config file"));
    }
    let schema = Schema::new(&config.relay.schema)?;
    // Parsed once: a bad sslmode or an unreadable sslrootcert stops the start here.
    let endpoint = Endpoint::parse(url.expose())?;
    let db = Database::open(relay_sessions(endpoint.clone()), config.relay.pool_size, schema)?;
    let publisher = Destinations::new(&config.destinations)?.with_scrubber(config.scrubber());
    let policies = config.destinations.iter().map(|(name, d)| (name.clone(), RetryPolicy::from(d))).collect();
    let listen = config.relay.listen.then_some(endpoint);
    Ok((Relay::new(db, publisher, policies, Settings::from(&config.relay)), listen))
}

/// `idemgate relay`: runs the configured relay until `shutdown` resolves,
/// with its admin listener (probes, metrics, dead and unroutable rows) on
/// `admin_listen`. Fails at start on a bad config, and later only on a
/// wrong schema.
pub async fn run(config: &Config, shutdown: impl Future<Output = ()>) -> Result<(), StartError> {
    let (relay, listen) = build(config)?;
    let access = crate::admin::AdminAccess::from_config(&config.admin)?;
    let listener = crate::http::listener::bind(config.admin_listen).await?;
    let admin = crate::admin::relay::RelayAdmin::new(
        relay.database().clone(),
        relay.metrics().clone(),
        access,
        relay.readiness().clone(),
        relay.destinations().to_vec(),
        listener.local_addr().unwrap_or(config.admin_listen),
    );
    // The admin listener outlives the relay's drain, so probes answer until the end.
    let admin_stop = CancellationToken::new();
    let admin_task =
        tokio::spawn(crate::admin::relay::serve(listener, Arc::new(admin), admin_stop.clone().cancelled_owned()));
    tracing::info!(destinations = config.destinations.len(), admin = %config.admin_listen, "idemgate relay running");
    let stop = CancellationToken::new();
    let mut running = tokio::spawn(relay.start(listen, stop.clone()));
    tokio::pin!(shutdown);
    let finished = tokio::select! {
        finished = &mut running => finished,
        () = &mut shutdown => {
            tracing::info!("relay stopping: finishing what it holds");
            stop.cancel();
            running.await
        }
    };
    admin_stop.cancel();
    let _ = admin_task.await;
    match finished {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(StartError::RelayStopped(e.to_string())),
    }
}
