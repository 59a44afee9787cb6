//! A private PgBouncer in transaction mode in front of the shared
//! PostgreSQL, for `tests/outbox/pgbouncer.rs`.
//!
//! The binary is `$PGBOUNCER` (the tests that need one are `#[ignore]`d,
//! because Debian 12's 1.18 lacks what the relay needs). It listens on a
//! free loopback port with trust authentication for the users it is
//! given, `ignore_startup_parameters = options` (the relay's startup
//! `options` would otherwise be refused) and a pool of 4 server
//! connections, so clients keep switching connections. It runs in the
//! foreground and is killed when dropped; as root it runs as `postgres`
//! (PgBouncer refuses root).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::postgres::shared_database_url;
use super::redis_server::{TempDir, free_port};

/// How long PgBouncer may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

pub struct PgBouncer {
    pub port: u16,
    child: Child,
    _dir: TempDir,
}

/// `$PGBOUNCER`, or a panic saying how to run these tests.
pub fn binary() -> String {
    std::env::var("PGBOUNCER")
        .unwrap_or_else(|_| panic!("set PGBOUNCER to a pgbouncer binary (1.21 or newer for the relay test)"))
}

impl PgBouncer {
    /// [`Self::start`] in front of the shared server (`DATABASE_URL`); returns the database's name too.
    pub fn in_front_of_shared(users: &[&str]) -> (Self, String) {
        let config: tokio_postgres::Config = shared_database_url().parse().expect("DATABASE_URL");
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_string(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let database = config.get_dbname().unwrap_or("postgres").to_string();
        (Self::start(&host, port, &database, users), database)
    }

    /// Transaction pooling in front of `host:port/database` for `users`.
    pub fn start(host: &str, port: u16, database: &str, users: &[&str]) -> Self {
        let dir = TempDir::new("pgbouncer");
        let listen = free_port();
        let ini = format!(
            "[databases]\n{database} = host={host} port={port} dbname={database}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {auth}\npool_mode = transaction\ndefault_pool_size = 4\n\
             max_client_conn = 200\nignore_startup_parameters = options\n",
            auth = dir.0.join("users.txt").display()
        );
        let users: String = users.iter().map(|u| format!("\"{u}\" \"\"\n")).collect();
        std::fs::write(dir.0.join("users.txt"), users).expect("users.txt");
        std::fs::write(dir.0.join("pgbouncer.ini"), ini).expect("pgbouncer.ini");
        let mut command = Command::new(binary());
        if is_root() {
            command.args(["-u", "postgres"]);
            let _ = Command::new("chmod").args(["-R", "a+rX"]).arg(&dir.0).status();
        }
        let child = command
            .arg(dir.0.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary()));
        let bouncer = Self { port: listen, child, _dir: dir };
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", listen)).is_err() {
            assert!(Instant::now() < deadline, "pgbouncer did not listen on {listen}");
            std::thread::sleep(Duration::from_millis(20));
        }
        bouncer
    }

    /// A plaintext URL through PgBouncer for `user`.
    pub fn url(&self, user: &str, database: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}?sslmode=disable", self.port)
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).map(|u| u.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
