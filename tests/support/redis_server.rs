//! Redis for tests: private `redis-server` processes, and the shared server.
//!
//! [`RedisProcess`] and [`RedisCluster`] start their own servers on free
//! loopback ports, each in its own temporary directory, with persistence off;
//! a test that stops, restarts or clusters Redis never touches the shared
//! server on 6379. Tests that only need *a* Redis use [`shared_redis_url`]
//! with a fresh [`unique_prefix`], so they can run side by side.
//!
//! Start-up waits are blocking and bounded: they poll the new server with a
//! raw RESP command until it answers, at most [`START_TIMEOUT`].

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server (or a cluster) may take to answer after it is started.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// The longest `redis-cli --cluster create` may take to see the nodes agree.
const CLUSTER_JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// A port can be taken between [`free_port`] and the server binding it.
const START_ATTEMPTS: usize = 3;

/// A loopback port that was free a moment ago, for a server a test starts
/// as a child process (which must be told its port).
///
/// Taken from [`FREE_PORTS`], below the kernel's ephemeral range (32768 and
/// up on Linux), not from `bind(0)`: a port from that range can be taken by
/// any outgoing connection of a test running beside this one between this
/// call and the server binding it (seen: a Sentinel failing with "Address
/// already in use"). Each port is handed out once per process, walking the
/// range from a random start (so two test processes rarely walk together),
/// and one that something already holds is skipped.
pub fn free_port() -> u16 {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let span = u32::from(FREE_PORTS.end - FREE_PORTS.start);
    let next = NEXT.get_or_init(|| AtomicU32::new(rand::random::<u32>() % span));
    for _ in 0..span {
        let offset = next.fetch_add(1, Ordering::Relaxed) % span;
        let port = FREE_PORTS.start + u16::try_from(offset).expect("an offset within the range");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FREE_PORTS:?}");
}

/// Where [`free_port`] looks: below the ephemeral range.
pub const FREE_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// The shared Redis for tests that only need keys of their own: `REDIS_URL`,
/// default `redis://127.0.0.1:6379/0`.
pub fn shared_redis_url() -> String {
    super::services::redis_url()
}

/// A key prefix no other test uses, e.g. `test-3f2a…:`.
pub fn unique_prefix() -> String {
    format!("test-{:016x}:", rand::random::<u64>())
}

/// `url` with one more `name=value` store option in its query.
pub fn with_option(url: &str, name: &str, value: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{name}={value}")
}

/// One private `redis-server`, killed when dropped.
pub struct RedisProcess {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    tls_port: Option<u16>,
    /// Extra server arguments, kept for restarts.
    extra: Vec<String>,
}

impl RedisProcess {
    /// Starts a server on a free port and waits until it answers `PING`.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server that keeps every write on disk before it answers (AOF,
    /// `appendfsync always`, as RELIABILITY.md asks of production), so a
    /// SIGKILL and restart loses nothing that was acknowledged.
    pub fn start_durable() -> Self {
        Self::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    }

    fn start_with(extra: &[&str]) -> Self {
        let dir = TempDir::new("redis");
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            match spawn_server(port, &dir.0, extra) {
                Ok(child) => {
                    let extra = extra.iter().map(|s| s.to_string()).collect();
                    return Self { port, dir, child: Some(child), tls_port: None, extra };
                }
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    /// Keeps the server for the rest of this test process: it is stopped
    /// (and its directory removed) once the process is gone, however it ends.
    pub fn keep_until_this_process_exits(mut self) {
        let child = self.child.take().expect("a running server");
        super::services::stop_when_this_process_exits(child.id(), "TERM", &self.dir.0);
        std::mem::forget(child);
        std::mem::forget(self);
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let pid = self.child.as_ref().expect("the server runs").id().to_string();
        let status = Command::new("kill").args([which, &pid]).status().expect("run kill");
        assert!(status.success(), "kill {which} {pid}");
    }

    /// A server that also speaks TLS (with this PEM certificate and key) on a
    /// second port; the plain port stays for the readiness check.
    pub fn start_tls(cert: &Path, key: &Path) -> Self {
        let dir = TempDir::new("redis-tls");
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let (port, tls_port) = (free_port(), free_port().to_string());
            let (cert, key) = (cert.to_str().expect("UTF-8 path"), key.to_str().expect("UTF-8 path"));
            let tls = ["--tls-port", &tls_port, "--tls-cert-file", cert, "--tls-key-file", key];
            let tls_args = [&tls[..], &["--tls-ca-cert-file", cert, "--tls-auth-clients", "no"]].concat();
            match spawn_server(port, &dir.0, &tls_args) {
                Ok(child) => {
                    let tls_port = tls_port.parse().ok();
                    return Self { port, dir, child: Some(child), tls_port, extra: Vec::new() };
                }
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server with TLS did not start: {last_error}");
    }

    /// `rediss://127.0.0.1:<tls port>/0` of a server from [`Self::start_tls`].
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/0", self.tls_port.expect("started with TLS"))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Kills the server and waits for it to exit; clients see it go down.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            kill(child);
        }
    }

    /// Kills the server and starts it again on the same port: empty, unless
    /// it was started with [`Self::start_durable`].
    pub fn start_again(&mut self) {
        self.stop();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let child = spawn_server(self.port, &self.dir.0, &extra)
            .unwrap_or_else(|e| panic!("redis-server did not restart on port {}: {e}", self.port));
        self.child = Some(child);
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A three-master Redis Cluster of private processes, killed when dropped.
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    dir: TempDir,
}

/// One node: its client and bus ports, and the process while it runs.
struct ClusterNode {
    port: u16,
    bus_port: u16,
    child: Option<Child>,
}

impl RedisCluster {
    /// Starts three nodes, joins them into one cluster with no replicas, and
    /// waits until every node reports `cluster_state:ok`.
    pub fn start() -> Self {
        const NODES: usize = 3;
        let dir = TempDir::new("redis-cluster");
        let mut cluster = Self { nodes: Vec::new(), dir };
        for _ in 0..NODES {
            let node = cluster.start_node();
            cluster.nodes.push(node);
        }
        let addresses: Vec<String> = cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let log_path = cluster.dir.0.join("cluster-create.log");
        let log = File::create(&log_path).expect("create the cluster-create log");
        let mut create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone a file handle"))
            .stderr(log)
            .spawn()
            .expect("run redis-cli --cluster create");
        // redis-cli waits for the nodes to agree; bound that wait too. The
        // join is gossip, checked once a second: under a full test run on
        // two cores it took more than 10 s once (a healthy one returns in 1–3 s).
        let deadline = Instant::now() + CLUSTER_JOIN_TIMEOUT;
        let status = loop {
            if let Some(status) = create.try_wait().expect("wait for redis-cli") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                kill(create);
                break None;
            }
            std::thread::sleep(POLL_INTERVAL);
        };
        assert!(
            status.is_some_and(|s| s.success()),
            "redis-cli --cluster create failed ({status:?}):\n{}",
            fs::read_to_string(&log_path).unwrap_or_default()
        );
        cluster.wait_until_ok();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok`. A restarted
    /// master waits a moment before it says so; the bound covers that.
    fn wait_until_ok(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        for node in &self.nodes {
            loop {
                let info = command(node.port, &["CLUSTER", "INFO"]).unwrap_or_default();
                if info.lines().any(|line| line.trim() == "cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster node {} not ok after {START_TIMEOUT:?}: {info}", node.port);
                std::thread::sleep(POLL_INTERVAL);
            }
        }
    }

    fn start_node(&self) -> ClusterNode {
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            // The bus port is named explicitly: the default (port + 10000)
            // overflows for ports the kernel hands out above 55535.
            let (port, bus_port) = (free_port(), free_port());
            match self.spawn_node(port, bus_port) {
                Ok(child) => return ClusterNode { port, bus_port, child: Some(child) },
                Err(e) => last_error = e,
            }
        }
        panic!("cluster node did not start: {last_error}");
    }

    fn spawn_node(&self, port: u16, bus_port: u16) -> Result<Child, String> {
        let config = self.dir.0.join(format!("nodes-{port}.conf"));
        let config = config.to_str().expect("temp dir path is UTF-8");
        let bus_port = bus_port.to_string();
        let cluster_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            config,
            "--cluster-node-timeout",
            "5000",
            "--cluster-port",
            &bus_port,
        ];
        spawn_server(port, &self.dir.0, &cluster_args)
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The client port of one node.
    pub fn port(&self, index: usize) -> u16 {
        self.nodes[index].port
    }

    /// Kills one master (by PID) and waits for it to exit; with no
    /// replicas, its slots stay unserved.
    pub fn stop_node(&mut self, index: usize) {
        if let Some(child) = self.nodes[index].child.take() {
            kill(child);
        }
    }

    /// Kills every node (by PID) and waits for each to exit.
    pub fn stop(&mut self) {
        for child in self.nodes.iter_mut().filter_map(|n| n.child.take()) {
            kill(child);
        }
    }

    /// Starts every stopped node again on its ports; each reloads its
    /// cluster config (slots, peers), so the same cluster forms again
    /// (empty: persistence is off). Waits until every node is ok.
    pub fn start_again(&mut self) {
        for index in 0..self.nodes.len() {
            let ClusterNode { port, bus_port, child: None } = self.nodes[index] else { continue };
            let child = self
                .spawn_node(port, bus_port)
                .unwrap_or_else(|e| panic!("cluster node did not restart on port {port}: {e}"));
            self.nodes[index].child = Some(child);
        }
        self.wait_until_ok();
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Spawns `redis-server` on `port` and waits until it answers `PING` (or
/// asks for the password it was given). Its output goes to
/// `redis-<port>.log` in `dir`, quoted when it fails.
pub fn spawn_server(port: u16, dir: &Path, extra: &[&str]) -> Result<Child, String> {
    let log_path = dir.join(format!("redis-{port}.log"));
    let log = File::create(&log_path).map_err(|e| format!("create {}: {e}", log_path.display()))?;
    let log_err = log.try_clone().map_err(|e| e.to_string())?;
    let mut child = Command::new("redis-server")
        .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => "redis-server is not installed (or not on PATH): install the \
                 redis-server package (Debian: apt-get install redis-server)"
                .to_string(),
            _ => format!("spawn redis-server: {e}"),
        })?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match command(port, &["PING"]) {
            Ok(reply) if reply == "PONG" => return Ok(child),
            Err(e) if e.to_string().contains("NOAUTH") => return Ok(child),
            _ => {}
        }
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() >= deadline {
            kill(child);
            let log = fs::read_to_string(&log_path).unwrap_or_default();
            return Err(format!("port {port}: exited {exited:?}; log:\n{log}"));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Kills a server by PID (SIGKILL) and waits for it to exit.
pub fn kill(mut child: Child) {
    // SIGKILL by PID; the error only says it had already exited.
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends one command and reads a simple, error or bulk-string reply.
fn command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end();
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    match line.split_at_checked(1) {
        Some(("+", simple)) => Ok(simple.to_string()),
        Some(("$", len)) => {
            let len: usize = len.parse().map_err(|_| invalid(format!("bad bulk length {len:?}")))?;
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            String::from_utf8(body).map_err(|_| invalid("bulk reply is not UTF-8".into()))
        }
        _ => Err(invalid(format!("unexpected reply {line:?}"))),
    }
}

/// A directory under the system temp dir, removed with its contents on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(kind: &str) -> Self {
        let path = std::env::temp_dir().join(format!("idemgate-{kind}-{:016x}", rand::random::<u64>()));
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
