//! Redis with replicas for tests: a primary and a replica of private
//! processes, with three Sentinels watching them if asked, all on free
//! loopback ports, killed by PID when dropped (and by a watchdog if this
//! process dies first).
//!
//! The data nodes require a password ([`DATA_PASSWORD`]) and the Sentinels
//! another ([`SENTINEL_PASSWORD`]), so the tests also check that each
//! reaches the right place. Failovers are the test's to cause:
//! [`Replicated::fall_behind`] cuts a replica off its primary (a wrong
//! `masterauth`, then its link killed), so writes the primary acknowledges
//! from then on never reach it; [`Replicated::kill`] SIGKILLs a node; the
//! Sentinels then promote the replica that fell behind, losing those
//! writes, as a real failover after a lagging replica does.
//!
//! [`Replicated::start_tls_with_sentinels`] starts the same set TLS-only
//! (`port 0`, `tls-port`, `tls-replication yes`, certificates from a CA of
//! the test's own), so a plaintext client reaches nothing; the harness's
//! own queries then go over TLS too.
//!
//! A node is restarted empty (its RDB file removed first: a replica writes
//! the snapshot of each full sync to disk), and no failover may start
//! until it is in sync. Sentinel would otherwise promote a replica that
//! has not finished its first sync (it reports no link-down time, so
//! Sentinel does not skip it): a primary that stops answering for longer
//! than `down-after-milliseconds` during that window, as a loaded machine
//! can make it (seen at 500 ms with three sets side by side on two
//! cores), is failed over to the empty node, and the old primary then
//! resyncs from it and loses every record. The operator's remedy,
//! `replica-priority 0` until in sync, does not suit a test that kills
//! the primary a moment later: a Sentinel reads a replica's priority only
//! every 10 s, and one that still sees 0 gives the failover up. So the
//! harness raises `down-after-milliseconds` on every Sentinel for the
//! window instead (`SENTINEL SET`, in force at once).

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};

use super::postgres_tls::{SERVER_NAMES, TestCa};
use super::redis_server::{START_TIMEOUT, TempDir, free_port, kill};
use super::services::stop_when_this_process_exits;

/// The data nodes' password.
pub const DATA_PASSWORD: &str = "data-secret";
/// The Sentinels' password.
pub const SENTINEL_PASSWORD: &str = "sentinel-secret";
/// The service the Sentinels watch.
pub const SERVICE: &str = "payments";
/// How long a failover (or a resync) may take before a test gives up.
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the Sentinels wait for a primary that does not answer.
const DOWN_AFTER_MS: u64 = 1000;

/// A primary, a replica, and maybe three Sentinels.
pub struct Replicated {
    dir: TempDir,
    nodes: Vec<Node>,
    sentinels: Vec<Node>,
    tls: Option<Tls>,
}

/// TLS for every node and Sentinel: one certificate for 127.0.0.1 issued
/// by a CA of the test's own, and the harness's client config.
struct Tls {
    ca_file: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
    client: Arc<rustls::ClientConfig>,
}

impl Tls {
    fn new(dir: &TempDir) -> Self {
        let ca = TestCa::new("idemgate redis test CA");
        let (cert, key) = ca.issue(&SERVER_NAMES);
        let write = |name: &str, pem: &str| {
            let path = dir.0.join(name);
            fs::write(&path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            path
        };
        let (ca_file, cert_file, key_file) =
            (write("ca.pem", &ca.pem), write("node.crt", &cert), write("node.key", &key));
        let client = idemgate::http::tls::client_config(Some(&ca_file)).expect("a client config trusting the test CA");
        Self { ca_file, cert_file, key_file, client: Arc::new(client) }
    }

    /// The server side of a node's or a Sentinel's TLS, as config lines.
    fn server_lines(&self, port: u16) -> Vec<String> {
        vec![
            "port 0".into(),
            format!("tls-port {port}"),
            format!("tls-cert-file {}", self.cert_file.display()),
            format!("tls-key-file {}", self.key_file.display()),
            format!("tls-ca-cert-file {}", self.ca_file.display()),
            "tls-auth-clients no".into(),
            // Replicas to their primary, Sentinels to everyone: TLS too.
            "tls-replication yes".into(),
        ]
    }
}

struct Node {
    port: u16,
    child: Option<Child>,
}

impl Replicated {
    /// A primary (node 0) and its replica (node 1), in sync.
    pub fn start() -> Self {
        Self::start_nodes(false)
    }

    fn start_nodes(tls: bool) -> Self {
        let dir = TempDir::new("redis-replicated");
        let tls = tls.then(|| Tls::new(&dir));
        let mut this = Self { dir, nodes: Vec::new(), sentinels: Vec::new(), tls };
        let primary = this.spawn_data(free_port(), None);
        this.nodes.push(primary);
        let replica = this.spawn_data(free_port(), Some(this.nodes[0].port));
        this.nodes.push(replica);
        this.wait_in_sync(1);
        this
    }

    /// The same, with three Sentinels watching the primary as [`SERVICE`]
    /// (quorum 2, down after 1 s). A failover that found no replica to
    /// promote is tried again after twice `failover-timeout`, 8 s, within
    /// [`FAILOVER_TIMEOUT`].
    pub fn start_with_sentinels() -> Self {
        Self::start_sentinels(Self::start_nodes(false))
    }

    /// The same, TLS-only: data nodes, replication and Sentinels.
    pub fn start_tls_with_sentinels() -> Self {
        Self::start_sentinels(Self::start_nodes(true))
    }

    /// The CA that issued every node's certificate (TLS sets only).
    pub fn ca_file(&self) -> PathBuf {
        self.tls.as_ref().expect("started with TLS").ca_file.clone()
    }

    fn start_sentinels(mut this: Self) -> Self {
        for _ in 0..3 {
            let sentinel = this.spawn_sentinel(free_port());
            this.sentinels.push(sentinel);
        }
        this.wait_until_sentinels_name(0);
        this.wait_until_sentinels_know_everyone(1);
        this
    }

    /// Waits until every Sentinel knows the other two, and sees the primary
    /// and `replica` answer its pings, the replica replicating from the
    /// primary: only then can they agree that the primary is down, and
    /// promote the replica.
    pub fn wait_until_sentinels_know_everyone(&self, replica: usize) {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        let replica_port = self.nodes[replica].port.to_string();
        for sentinel in &self.sentinels {
            loop {
                let ask = |args: &[&str]| self.ask(sentinel.port, Some(SENTINEL_PASSWORD), args);
                let master = ask(&["SENTINEL", "MASTER", SERVICE]);
                let replicas = ask(&["SENTINEL", "REPLICAS", SERVICE]);
                // Pinged and answered within the last half of down-after.
                let fresh = |f: &[Resp]| {
                    field(f, "last-ok-ping-reply")
                        .and_then(|ms| ms.parse::<u64>().ok())
                        .is_some_and(|ms| ms < DOWN_AFTER_MS / 2)
                };
                let others = matches!(&master, Ok(Resp::Array(f)) if field(f, "num-other-sentinels") == Some("2".into())
                    && field(f, "flags") == Some("master".into()) && fresh(f));
                let healthy = matches!(&replicas, Ok(Resp::Array(all)) if all.iter().any(|r| matches!(r,
                    Resp::Array(f) if field(f, "port") == Some(replica_port.clone())
                        && field(f, "flags") == Some("slave".into())
                        && field(f, "master-link-status") == Some("ok".into())
                        && fresh(f))));
                if others && healthy {
                    break;
                }
                if Instant::now() >= deadline {
                    let log = fs::read_to_string(self.dir.0.join(format!("sentinel-{}.log", sentinel.port)));
                    panic!(
                        "sentinel {}: {master:?} {replicas:?}; its log:\n{}",
                        sentinel.port,
                        log.unwrap_or_default()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Starts a data node, empty: persistence off, and the RDB file a full
    /// sync of an earlier run on this port left removed.
    fn spawn_data(&self, port: u16, replica_of: Option<u16>) -> Node {
        let rdb = format!("dump-{port}.rdb");
        let _ = fs::remove_file(self.dir.0.join(&rdb));
        let mut lines = vec![
            "bind 127.0.0.1".to_string(),
            format!("port {port}"),
            format!("dir {}", self.dir.0.display()),
            format!("dbfilename {rdb}"),
            "save \"\"".into(),
            "appendonly no".into(),
            format!("requirepass {DATA_PASSWORD}"),
            format!("masterauth {DATA_PASSWORD}"),
            // A full sync starts at once, not after the default 5 s.
            "repl-diskless-sync-delay 0".into(),
        ];
        if let Some(primary) = replica_of {
            lines.push(format!("replicaof 127.0.0.1 {primary}"));
        }
        lines.extend(self.tls.iter().flat_map(|tls| tls.server_lines(port)));
        let config = self.dir.0.join(format!("redis-{port}.conf"));
        fs::write(&config, lines.join("\n") + "\n").expect("write a redis config");
        let child = self.spawn(port, &config, &[], DATA_PASSWORD, &format!("redis-{port}.log"));
        Node { port, child: Some(child) }
    }

    /// Runs `redis-server CONFIG ARGS…` and waits until it answers `PING`
    /// (over TLS for a TLS set).
    fn spawn(&self, port: u16, config: &std::path::Path, args: &[&str], password: &str, log: &str) -> Child {
        let log_path = self.dir.0.join(log);
        let log = fs::File::create(&log_path).expect("create a server log");
        let mut child = Command::new("redis-server")
            .arg(config)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone a file handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start redis-server (Debian: apt-get install redis-server): {e}"));
        stop_when_this_process_exits(child.id(), "KILL", &self.dir.0);
        let deadline = Instant::now() + START_TIMEOUT;
        while self.ask(port, Some(password), &["PING"]).ok() != Some(Resp::Simple("PONG".into())) {
            if child.try_wait().ok().flatten().is_some() || Instant::now() >= deadline {
                kill(child);
                panic!("redis-server on {port} did not start:\n{}", fs::read_to_string(&log_path).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    fn spawn_sentinel(&self, port: u16) -> Node {
        let config = self.dir.0.join(format!("sentinel-{port}.conf"));
        let primary = self.nodes[0].port;
        let mut text = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nrequirepass {SENTINEL_PASSWORD}\n\
             sentinel sentinel-pass {SENTINEL_PASSWORD}\n\
             sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
             sentinel auth-pass {SERVICE} {DATA_PASSWORD}\n\
             sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {SERVICE} 4000\n",
            dir = self.dir.0.display()
        );
        for line in self.tls.iter().flat_map(|tls| tls.server_lines(port)) {
            text.push_str(&line);
            text.push('\n');
        }
        fs::write(&config, text).expect("write a sentinel config");
        let child = self.spawn(port, &config, &["--sentinel"], SENTINEL_PASSWORD, &format!("sentinel-{port}.log"));
        Node { port, child: Some(child) }
    }

    /// The store URL: `redis+sentinel://:DATA@s1,s2,s3/SERVICE/0?sentinel_password=…&…`.
    /// A TLS set's is `rediss+sentinel://…&ca_file=<the test CA>&…`.
    pub fn sentinel_url(&self, options: &str) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        let hosts = hosts.join(",");
        let (scheme, ca) = match &self.tls {
            Some(tls) => ("rediss", format!("&ca_file={}", tls.ca_file.display())),
            None => ("redis", String::new()),
        };
        format!(
            "{scheme}+sentinel://:{DATA_PASSWORD}@{hosts}/{SERVICE}/0?sentinel_password={SENTINEL_PASSWORD}{ca}&{options}"
        )
    }

    /// The port of a data node.
    pub fn port(&self, node: usize) -> u16 {
        self.nodes[node].port
    }

    /// The port of a Sentinel.
    pub fn sentinel_port(&self, sentinel: usize) -> u16 {
        self.sentinels[sentinel].port
    }

    /// `redis://:DATA@127.0.0.1:<port of node>/0?…`.
    pub fn url(&self, node: usize, options: &str) -> String {
        format!("redis://:{DATA_PASSWORD}@127.0.0.1:{}/0?{options}", self.nodes[node].port)
    }

    /// Sends one command to a data node.
    pub fn query(&self, node: usize, args: &[&str]) -> Resp {
        self.ask(self.nodes[node].port, Some(DATA_PASSWORD), args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// One command to any port of this set, over TLS when the set speaks it.
    fn ask(&self, port: u16, password: Option<&str>, args: &[&str]) -> std::io::Result<Resp> {
        self.ask_all(port, password, &[args])
    }

    /// Commands on one connection; the last one's reply.
    fn ask_all(&self, port: u16, password: Option<&str>, commands: &[&[&str]]) -> std::io::Result<Resp> {
        let stream = connect(port)?;
        match &self.tls {
            None => exchange_all(stream, password, commands),
            Some(tls) => {
                let name = ServerName::try_from("127.0.0.1").map_err(std::io::Error::other)?;
                let tls = ClientConnection::new(tls.client.clone(), name).map_err(std::io::Error::other)?;
                exchange_all(StreamOwned::new(tls, stream), password, commands)
            }
        }
    }

    /// Cuts the replica off its primary: writes from now on do not reach
    /// it until [`Self::catch_up`] (or a failover promotes it as it is).
    pub fn fall_behind(&self, replica: usize) {
        self.query(replica, &["CONFIG", "SET", "masterauth", "wrong-on-purpose"]);
        self.query(replica, &["CLIENT", "KILL", "TYPE", "master"]);
    }

    /// Lets a replica that fell behind reconnect.
    pub fn catch_up(&self, replica: usize) {
        self.query(replica, &["CONFIG", "SET", "masterauth", DATA_PASSWORD]);
    }

    /// Freezes a node (SIGSTOP): its sockets stay open, nothing answers.
    pub fn pause(&self, node: usize) {
        self.signal(node, "-STOP");
    }

    /// Lets a frozen node go on (SIGCONT).
    pub fn resume(&self, node: usize) {
        self.signal(node, "-CONT");
    }

    fn signal(&self, node: usize, which: &str) {
        let pid = self.nodes[node].child.as_ref().expect("the node runs").id().to_string();
        assert!(Command::new("kill").args([which, &pid]).status().expect("run kill").success());
    }

    /// SIGKILLs a data node.
    pub fn kill(&mut self, node: usize) {
        if let Some(child) = self.nodes[node].child.take() {
            kill(child);
        }
    }

    /// Starts a killed node again, empty, as a replica of `primary`, and
    /// waits until it is in sync (as an operator restarts a failed node),
    /// with no failover possible until then (see the module docs).
    pub fn restart_as_replica(&mut self, node: usize, primary: usize) {
        self.set_down_after(60_000);
        let restarted = self.spawn_data(self.nodes[node].port, Some(self.nodes[primary].port));
        self.nodes[node] = restarted;
        self.wait_in_sync(node);
        // Only once every Sentinel has fresh ping replies from both nodes:
        // a Sentinel whose links to a just-promoted primary were not yet
        // answered took it (and the replica) for down within a second of
        // the short down-after, started a failover with no good replica to
        // promote, and waited 2 × failover-timeout before the next one —
        // longer than a lease (seen under load).
        self.wait_until_sentinels_know_everyone(node);
        self.set_down_after(DOWN_AFTER_MS);
    }

    /// `down-after-milliseconds` on every Sentinel, in force at once.
    fn set_down_after(&self, ms: u64) {
        let ms = ms.to_string();
        for sentinel in &self.sentinels {
            let args = ["SENTINEL", "SET", SERVICE, "down-after-milliseconds", &ms];
            let set = self.ask(sentinel.port, Some(SENTINEL_PASSWORD), &args);
            assert!(matches!(&set, Ok(Resp::Simple(ok)) if ok == "OK"), "sentinel {}: {set:?}", sentinel.port);
        }
    }

    /// Waits until a replica's link to its primary is up, and the primary
    /// counts it in a `WAIT` (after a full sync, a replica acknowledges
    /// only with its first `REPLCONF ACK`).
    pub fn wait_in_sync(&self, replica: usize) {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        let primary = loop {
            let info = self.query(replica, &["INFO", "replication"]).text();
            let port = info.lines().find_map(|l| l.trim().strip_prefix("master_port:")?.parse::<u16>().ok());
            if let Some(port) = port.filter(|_| info.lines().any(|l| l.trim() == "master_link_status:up")) {
                break port;
            }
            assert!(Instant::now() < deadline, "replica {replica} not in sync: {info}");
            std::thread::sleep(Duration::from_millis(20));
        };
        // A write and its WAIT on one connection; the key goes again.
        let (set, del) = (["SET", "harness:sync", "x"], ["DEL", "harness:sync"]);
        let commands: [&[&str]; 3] = [&set, &del, &["WAIT", "1", "1000"]];
        loop {
            let acknowledged = self.ask_all(primary, Some(DATA_PASSWORD), &commands);
            if matches!(acknowledged, Ok(Resp::Int(n)) if n >= 1) {
                return;
            }
            assert!(Instant::now() < deadline, "replica {replica} never acknowledged: {acknowledged:?}");
        }
    }

    /// Waits until every Sentinel names `node` as the primary.
    pub fn wait_until_sentinels_name(&self, node: usize) {
        let want = self.nodes[node].port.to_string();
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        for sentinel in &self.sentinels {
            loop {
                let named =
                    self.ask(sentinel.port, Some(SENTINEL_PASSWORD), &["SENTINEL", "get-master-addr-by-name", SERVICE]);
                if let Ok(Resp::Array(address)) = &named
                    && address.get(1) == Some(&Resp::Bulk(want.clone()))
                {
                    break;
                }
                if Instant::now() >= deadline {
                    let log = fs::read_to_string(self.dir.0.join(format!("sentinel-{}.log", sentinel.port)));
                    panic!(
                        "sentinel {} still names {named:?}, not port {want}; its log:\n{}",
                        sentinel.port,
                        log.unwrap_or_default()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// How many keys a data node holds.
    pub fn keys(&self, node: usize) -> i64 {
        match self.query(node, &["DBSIZE"]) {
            Resp::Int(n) => n,
            other => panic!("DBSIZE answered {other:?}"),
        }
    }
}

impl Drop for Replicated {
    fn drop(&mut self) {
        for node in self.nodes.iter_mut().chain(self.sentinels.iter_mut()) {
            if let Some(child) = node.child.take() {
                kill(child);
            }
        }
    }
}

/// The value after `name` in a flat `[name, value, …]` reply.
fn field(fields: &[Resp], name: &str) -> Option<String> {
    let at = fields.iter().position(|f| *f == Resp::Bulk(name.into()))?;
    fields.get(at + 1).map(Resp::text)
}

/// A RESP reply, as much of it as the tests read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(String),
    Nil,
    Array(Vec<Resp>),
}

impl Resp {
    /// A string reply's text.
    pub fn text(&self) -> String {
        match self {
            Self::Simple(s) | Self::Bulk(s) => s.clone(),
            other => panic!("not a string reply: {other:?}"),
        }
    }
}

/// Sends one command (after `AUTH`, with a password) on a new connection.
pub fn query(port: u16, password: Option<&str>, args: &[&str]) -> std::io::Result<Resp> {
    exchange(connect(port)?, password, args)
}

fn connect(port: u16) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(stream)
}

fn exchange(stream: impl Read + Write, password: Option<&str>, args: &[&str]) -> std::io::Result<Resp> {
    exchange_all(stream, password, &[args])
}

/// Sends commands on one connection; the last one's reply.
fn exchange_all(mut stream: impl Read + Write, password: Option<&str>, commands: &[&[&str]]) -> std::io::Result<Resp> {
    let mut request = Vec::new();
    let mut pack = |args: &[&str]| {
        request.extend(format!("*{}\r\n", args.len()).bytes());
        for arg in args {
            request.extend(format!("${}\r\n{arg}\r\n", arg.len()).bytes());
        }
    };
    if let Some(password) = password {
        pack(&["AUTH", password]);
    }
    for args in commands {
        pack(args);
    }
    stream.write_all(&request)?;
    stream.flush()?;
    let mut reader = BufReader::new(stream);
    if password.is_some() {
        match read(&mut reader)? {
            Resp::Simple(ok) if ok == "OK" => {}
            other => return Err(std::io::Error::other(format!("AUTH answered {other:?}"))),
        }
    }
    for _ in 1..commands.len() {
        read(&mut reader)?;
    }
    read(&mut reader)
}

fn read(reader: &mut impl BufRead) -> std::io::Result<Resp> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end();
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("unexpected reply {line:?}"));
    let (kind, rest) = line.split_at_checked(1).ok_or_else(invalid)?;
    let number = || rest.parse::<i64>().map_err(|_| invalid());
    Ok(match kind {
        "+" => Resp::Simple(rest.to_string()),
        "-" => Resp::Error(rest.to_string()),
        ":" => Resp::Int(number()?),
        "$" if rest == "-1" => Resp::Nil,
        "$" => {
            let mut body = vec![0; usize::try_from(number()?).map_err(|_| invalid())? + 2];
            reader.read_exact(&mut body)?;
            body.truncate(body.len() - 2);
            Resp::Bulk(String::from_utf8_lossy(&body).into_owned())
        }
        "*" if rest == "-1" => Resp::Nil,
        "*" => (0..number()?).map(|_| read(reader)).collect::<std::io::Result<_>>().map(Resp::Array)?,
        _ => return Err(invalid()),
    })
}
