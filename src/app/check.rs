//! Everything a config is checked for before anything starts.
//!
//! [`Config::validate`] checks plain values; the rooms that use a value
//! check what only their own code can (a route's upstream and CA file as
//! the gateway builds it, a destination as the relay builds it, the store's
//! sealing keys, the listener's certificate, the admin token). [`check`]
//! runs them all, so `check-config` accepts exactly what `serve` and
//! `relay` accept, and none of them starts on a config another would
//! refuse.

use super::StartError;
use crate::admin::AdminAccess;
use crate::config::Config;
use crate::gateway::routes::RouteTable;
use crate::gateway::tenant::TenantSource;
use crate::store::AnyStore;
use crate::store::sealing::Sealer;

/// Checks `config` as every command would use it; returns the warnings
/// (allowed but risky), or the first thing wrong, naming its field.
pub fn check(config: &Config) -> Result<Vec<String>, StartError> {
    let mut warnings = config.validate()?;
    Sealer::from_config(&config.store_encryption)?;
    AnyStore::check_url(config.store.expose())
        .map_err(|source| StartError::Store { url: config.store.redacted(), source })?;
    let g = &config.gateway;
    RouteTable::try_from(config).map_err(crate::gateway::BuildError::from)?;
    TenantSource::from_config(&g.tenant).map_err(crate::gateway::BuildError::from)?;
    if config.routes.is_empty() && config.destinations.is_empty() {
        return Err(StartError::Missing(NOTHING_TO_RUN));
    }
    if let (Some(cert), Some(key)) = (&config.tls.cert_file, &config.tls.key_file) {
        crate::http::tls::acceptor(cert, key)?;
    }
    AdminAccess::from_config(&config.admin)?;
    warnings.extend(AnyStore::warnings(config.store.expose(), g.store_timeout.0, g.lease.0));
    warnings.extend(crate::outbox::check::check(config)?);
    Ok(warnings)
}

/// What `serve` and `check-config` say of a config with nothing to serve.
pub const NO_ROUTES: &str = "no upstream configured: pass --upstream URL or add [[routes]] to the config file";

/// What every command says of a config with neither.
pub const NOTHING_TO_RUN: &str = "nothing to run: pass --upstream URL or add [[routes]] for `idemgate serve`, \
     or add [destinations.<name>] for `idemgate relay`";
