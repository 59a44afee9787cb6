//! The `idemgate` command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use idemgate::config::{Config, Overrides};
use idemgate::http::listener::bind;
use idemgate::outbox::roles::{Duty, Role};

#[derive(Parser)]
#[command(
    name = "idemgate",
    version,
    about = "Makes retries safe: an idempotency gateway and an outbox relay.",
    after_help = ENVIRONMENT
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Shown under every command's `--help`.
const ENVIRONMENT: &str = "Every setting of the config file can also be set in the environment as \
IDEMGATE__SECTION__FIELD, for example IDEMGATE__GATEWAY__LEASE=10s, IDEMGATE__ADMIN__TOKEN=<16+ characters> \
or IDEMGATE__STORE=redis://127.0.0.1:6379/0. Flags win over the environment, which wins over the file. \
Store URLs: memory://, redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel://, \
rediss+sentinel://, postgres://, postgresql://. Every Redis form takes ?wait_replicas=N (see docs/stores.md).";

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    #[command(after_help = ENVIRONMENT)]
    Serve(ServeArgs),
    /// Validate a config and print the effective config (secrets redacted).
    #[command(after_help = ENVIRONMENT)]
    CheckConfig(ServeArgs),
    /// Run the gateway with the embedded store in front of a toy payments API.
    #[command(after_help = ENVIRONMENT)]
    Demo(DemoArgs),
    /// Run the outbox relay (destinations come from the config file).
    #[command(after_help = ENVIRONMENT)]
    Relay(RelayArgs),
    /// Create or upgrade the Postgres schema `idemgate` (idempotent).
    #[command(after_help = ENVIRONMENT)]
    Migrate(MigrateArgs),
}

#[derive(Args)]
struct MigrateArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Let ROLE enqueue, and nothing more (repeatable); prints the statements.
    #[arg(long, value_name = "ROLE")]
    grant_service: Vec<String>,
    /// Let ROLE run the relay without owning the schema (repeatable); prints the statements.
    #[arg(long, value_name = "ROLE")]
    grant_relay: Vec<String>,
}

impl MigrateArgs {
    /// The roles named by the flags, services first.
    fn grants(&self) -> Result<Vec<(Duty, Role)>, String> {
        let services = self.grant_service.iter().map(|r| (Duty::Service, r));
        let relays = self.grant_relay.iter().map(|r| (Duty::Relay, r));
        services.chain(relays).map(|(duty, name)| Ok((duty, Role::new(name).map_err(|e| e.to_string())?))).collect()
    }
}

#[derive(Args)]
struct DatabaseArgs {
    /// TOML config file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The service's Postgres database [default: relay.database_url].
    #[arg(long)]
    database_url: Option<String>,
}

#[derive(Args)]
struct RelayArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Admin listen address: probes, metrics, dead rows [default: 127.0.0.1:9090].
    #[arg(long, value_parser = listen_address)]
    admin_listen: Option<SocketAddr>,
}

impl DatabaseArgs {
    fn load(&self) -> Result<Config, String> {
        self.load_with(None)
    }

    fn load_with(&self, admin_listen: Option<SocketAddr>) -> Result<Config, String> {
        let flags = Overrides { database_url: self.database_url.clone(), admin_listen, ..Default::default() };
        Config::load(self.config.as_deref(), std::env::vars(), &flags).map_err(|e| e.to_string())
    }
}

#[derive(Args)]
struct DemoArgs {
    /// Gateway listen address [default: 127.0.0.1:8080].
    #[arg(long, value_parser = listen_address)]
    listen: Option<SocketAddr>,
    /// Admin listen address [default: 127.0.0.1:9090].
    #[arg(long, value_parser = listen_address)]
    admin_listen: Option<SocketAddr>,
}

impl DemoArgs {
    /// The config `serve` would load (`IDEMGATE__…` variables, then the
    /// flags), with the toy API at `toy` as the one upstream.
    fn load(&self, toy: SocketAddr) -> Result<Config, String> {
        let flags = Overrides {
            listen: self.listen,
            admin_listen: self.admin_listen,
            upstream: Some(format!("http://{toy}")),
            ..Default::default()
        };
        let mut config = Config::load(None, std::env::vars(), &flags).map_err(|e| e.to_string())?;
        // Ahead of `/`, which would take every path: first match wins.
        config.routes.insert(0, idemgate::demo::webhook_route(toy));
        Ok(config)
    }
}

#[derive(Args)]
struct ServeArgs {
    /// TOML config file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Gateway listen address [default: 127.0.0.1:8080].
    #[arg(long, value_parser = listen_address)]
    listen: Option<SocketAddr>,
    /// The upstream URL (one route for every path).
    #[arg(long)]
    upstream: Option<String>,
    /// Store URL: memory:// (default), redis://host:port/db, rediss:// (TLS),
    /// redis+cluster://h1:p1,h2:p2 (or rediss+cluster://),
    /// redis+sentinel://s1:p1,s2:p2/SERVICE (or rediss+sentinel://), postgres://user@host/db.
    #[arg(long)]
    store: Option<String>,
    /// Admin listen address [default: 127.0.0.1:9090].
    #[arg(long, value_parser = listen_address)]
    admin_listen: Option<SocketAddr>,
    /// Also run the outbox relay in this process.
    #[arg(long)]
    relay: bool,
    /// The relay's Postgres database (with --relay).
    #[arg(long)]
    database_url: Option<String>,
}

impl ServeArgs {
    fn load(&self) -> Result<Config, String> {
        let flags = Overrides {
            listen: self.listen,
            admin_listen: self.admin_listen,
            store: self.store.clone(),
            upstream: self.upstream.clone(),
            database_url: self.database_url.clone(),
        };
        Config::load(self.config.as_deref(), std::env::vars(), &flags).map_err(|e| e.to_string())
    }
}

/// A listen address, with an example when it is not one (a host name is not).
fn listen_address(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| {
        format!("{text:?} is not an IP address and port: write it like 127.0.0.1:8080, 0.0.0.0:8080 or [::1]:8080")
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("idemgate: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> Result<(), String> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    let threads = idemgate::app::worker_threads(std::env::var_os(idemgate::app::WORKER_THREADS));
    if let Some(threads) = threads.map_err(|e| e.to_string())? {
        runtime.worker_threads(threads);
    }
    let runtime = runtime.enable_all().build().map_err(|e| e.to_string())?;
    match command {
        Command::Serve(args) => {
            let config = args.load()?;
            let _flush = idemgate::app::init_logging(&config);
            for warning in idemgate::app::check::check(&config).map_err(|e| e.to_string())? {
                tracing::warn!("{warning}");
            }
            idemgate::app::open_files::raise_and_check(&config, args.relay);
            if args.relay {
                runtime
                    .block_on(idemgate::app::serve_with_relay(&config, idemgate::app::shutdown_signal()))
                    .map_err(|e| e.to_string())
            } else {
                runtime
                    .block_on(idemgate::app::serve(&config, idemgate::app::shutdown_signal()))
                    .map_err(|e| e.to_string())
            }
        }
        Command::CheckConfig(args) => {
            let config = args.load()?;
            for warning in idemgate::app::check::check(&config).map_err(|e| e.to_string())? {
                eprintln!("warning: {warning}");
            }
            if config.routes.is_empty() {
                // A relay's config: valid, but not one to serve with.
                eprintln!("warning: `idemgate serve` refuses this config ({})", idemgate::app::check::NO_ROUTES);
            }
            let printed = toml::to_string(&config).map_err(|e| e.to_string())?;
            println!("{printed}");
            Ok(())
        }
        Command::Demo(args) => runtime.block_on(async {
            let toy = idemgate::demo::start_toy_payments().await.map_err(|e| e.to_string())?;
            let config = args.load(toy)?;
            let _flush = idemgate::app::init_logging(&config);
            for warning in idemgate::app::check::check(&config).map_err(|e| e.to_string())? {
                tracing::warn!("{warning}");
            }
            idemgate::app::open_files::raise_and_check(&config, false);
            // Everything that can refuse to start does so before the
            // instructions are printed: nothing claims to run that does not.
            let gateway = idemgate::app::build(&config).await.map_err(|e| e.to_string())?;
            let listeners = idemgate::app::Listeners {
                gateway: idemgate::app::bind_gateway(&config).await.map_err(|e| e.to_string())?,
                admin: bind(config.admin_listen).await.map_err(|e| e.to_string())?,
            };
            let bound = |l: &tokio::net::TcpListener| l.local_addr().map_err(|e| e.to_string());
            let listen = listeners.gateway.local_addr().map_err(|e| e.to_string())?;
            let admin = bound(&listeners.admin)?;
            println!("{}", idemgate::demo::instructions(listen, admin, &config));
            idemgate::app::serve_on(listeners, gateway, &config, idemgate::app::shutdown_signal())
                .await
                .map_err(|e| e.to_string())
        }),
        Command::Relay(args) => {
            let config = args.database.load_with(args.admin_listen)?;
            let _flush = idemgate::app::init_logging(&config);
            for warning in idemgate::app::check::check(&config).map_err(|e| e.to_string())? {
                tracing::warn!("{warning}");
            }
            runtime
                .block_on(idemgate::app::relay::run(&config, idemgate::app::shutdown_signal()))
                .map_err(|e| e.to_string())
        }
        Command::Migrate(args) => {
            let grants = args.grants()?;
            let config = args.database.load()?;
            let url = config.relay.database_url.ok_or("migrate needs --database-url or relay.database_url")?;
            runtime.block_on(async {
                // A bad sslmode or sslrootcert is named as such, not as a failed connection.
                let endpoint = idemgate::postgres::Endpoint::parse(url.expose()).map_err(|e| e.to_string())?;
                let mut client = idemgate::postgres::migrate::connect_to(&endpoint)
                    .await
                    .map_err(|e| format!("cannot connect to {}: {e}", url.redacted()))?;
                let schema = idemgate::postgres::Schema::new(&config.relay.schema).map_err(|e| e.to_string())?;
                let applied =
                    idemgate::postgres::migrate::run(&mut client, &schema).await.map_err(|e| e.to_string())?;
                let latest = idemgate::postgres::migrate::latest_version();
                if applied.is_empty() {
                    println!("schema {} is up to date (migration {latest})", schema.name());
                } else {
                    println!("schema {} migrated to {latest} (applied {applied:?})", schema.name());
                }
                let max_payload = config.relay.max_payload;
                idemgate::postgres::migrate::configure(&client, &schema, max_payload.0)
                    .await
                    .map_err(|e| e.to_string())?;
                println!("enqueue accepts payloads up to {max_payload} (relay.max_payload)");
                for statement in
                    idemgate::outbox::roles::grant(&mut client, &schema, &grants).await.map_err(|e| e.to_string())?
                {
                    println!("{statement};");
                }
                Ok(())
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--help` names the store schemes the config accepts: one list, the
    /// config's, checked here.
    #[test]
    fn the_help_names_every_store_scheme() {
        for (scheme, _) in idemgate::config::STORE_SCHEMES {
            assert!(ENVIRONMENT.contains(&format!(" {scheme}://")), "--help lacks {scheme}://");
        }
    }
}
