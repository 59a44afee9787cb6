//! A private PostgreSQL server for tests that stop, crash and restart it.
//!
//! [`PostgresProcess`] runs `initdb` into a temporary directory and starts
//! `postgres` on a free loopback port with its socket in that directory,
//! so stopping it never touches the shared server on 5432. It restarts on
//! the same port and data directory, so clients see the *same* database go
//! away and come back. The server is stopped by PID in one of three ways
//! ([`Stop`]); the last two leave no checkpoint and make the next start run
//! crash recovery. It can also be frozen (SIGSTOP) and thawed.
//!
//! PostgreSQL refuses to run as root: when the tests run as root, the
//! server runs as the `postgres` user (the directory is handed to it).
//!
//! [`PostgresProcess::start_with`] takes a [`Setup`]: files for the data
//! directory (a TLS certificate and key), lines for `postgresql.conf` and
//! a `pg_hba.conf` of its own; they are written once, after `initdb`, so
//! a restart keeps them. See [`super::postgres_tls`].
//!
//! Waits are blocking and bounded, as in [`super::redis_server`].

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::{TempDir, free_port};

/// How long a start (crash recovery included) may take before it counts as failed.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a fast or immediate shutdown may take.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(25);
const START_ATTEMPTS: usize = 3;

/// How to stop the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// `SIGINT`: fast shutdown — sessions are cut, a checkpoint is written.
    Fast,
    /// `SIGQUIT`: immediate shutdown — children quit at once, no checkpoint;
    /// the next start replays the WAL, as after a crash.
    Immediate,
    /// `SIGKILL` to the postmaster and every process it forked: a crash.
    Kill,
}

/// What a server starts with beyond `initdb`'s defaults.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// Files written into the data directory, owned by the server and
    /// readable by it alone (PostgreSQL refuses a key file others can read).
    pub files: Vec<(String, String)>,
    /// Lines appended to `postgresql.conf` (`ssl = on`, …).
    pub conf: Vec<String>,
    /// A `pg_hba.conf` replacing `initdb`'s (which trusts every local connection).
    pub hba: Option<String>,
}

/// One private `postgres`, killed when dropped.
pub struct PostgresProcess {
    port: u16,
    dir: TempDir,
    bin: PathBuf,
    owner: Option<(u32, u32)>,
    child: Option<Child>,
}

impl PostgresProcess {
    /// Creates a cluster (trust authentication, user `postgres`), starts it
    /// on a free port and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_with(&Setup::default())
    }

    /// [`Self::start`] with `setup` applied to the new cluster before it starts.
    pub fn start_with(setup: &Setup) -> Self {
        let dir = TempDir::new("postgres");
        let owner = server_owner();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir.0, Some(uid), Some(gid)).expect("hand the temp dir to postgres");
        }
        let mut server = Self { port: 0, dir, bin: bin_dir(), owner, child: None };
        server.initdb();
        server.apply(setup);
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            match server.spawn() {
                Ok(child) => {
                    server.child = Some(child);
                    return server;
                }
                Err(e) => last_error = e,
            }
        }
        panic!("postgres did not start: {last_error}");
    }

    /// The port it listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Keeps the server for the rest of this test process: it is stopped
    /// (and its directory removed) once the process is gone, however it ends.
    pub fn keep_until_this_process_exits(mut self) {
        let child = self.child.take().expect("a running server");
        super::services::stop_when_this_process_exits(child.id(), "INT", &self.dir.0);
        std::mem::forget(child);
        std::mem::forget(self);
    }

    /// Stops the server and waits until it and its children are gone.
    pub fn stop(&mut self, how: Stop) {
        let Some(mut child) = self.child.take() else { return };
        let pid = child.id();
        match how {
            Stop::Fast | Stop::Immediate => {
                signal(if how == Stop::Fast { "INT" } else { "QUIT" }, &[pid]);
                let deadline = Instant::now() + STOP_TIMEOUT;
                while child.try_wait().expect("wait for postgres").is_none() {
                    if Instant::now() >= deadline {
                        kill_tree(child);
                        panic!("postgres ignored SIG{how:?} for {STOP_TIMEOUT:?}; killed it");
                    }
                    std::thread::sleep(POLL_INTERVAL);
                }
            }
            Stop::Kill => kill_tree(child),
        }
    }

    /// Starts the server again on the same port and data directory.
    pub fn start_again(&mut self) {
        self.stop(Stop::Kill);
        let mut last_error = String::new();
        // A killed server's last children may still hold its shared memory for a moment.
        for _ in 0..START_ATTEMPTS {
            match self.spawn() {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) => last_error = e,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("postgres did not restart on port {}: {last_error}", self.port);
    }

    /// SIGSTOP to the server and its children: connections stay open and
    /// nothing answers, like a host that vanished without closing them.
    pub fn freeze(&self) {
        let pid = self.child.as_ref().expect("a running server").id();
        signal("STOP", &[pid]);
        signal("STOP", &children_of(pid));
    }

    /// SIGCONT after [`Self::freeze`].
    pub fn thaw(&self) {
        let pid = self.child.as_ref().expect("a running server").id();
        signal("CONT", &children_of(pid));
        signal("CONT", &[pid]);
    }

    fn log_path(&self) -> PathBuf {
        self.dir.0.join("postgres.log")
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.0.join("data")
    }

    /// A command run as the server's owner, in the temp dir.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.current_dir(&self.dir.0).stdin(Stdio::null());
        if let Some((uid, gid)) = self.owner {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(gid);
        }
        command
    }

    fn initdb(&self) {
        let output = self
            .command("initdb")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("run initdb");
        assert!(output.status.success(), "initdb failed: {}", String::from_utf8_lossy(&output.stderr));
    }

    fn apply(&self, setup: &Setup) {
        let data = self.data_dir();
        for (name, contents) in &setup.files {
            self.write_owned(&data.join(name), contents, 0o600);
        }
        if !setup.conf.is_empty() {
            let mut conf = fs::read_to_string(data.join("postgresql.conf")).expect("read postgresql.conf");
            conf.push('\n');
            conf.push_str(&setup.conf.join("\n"));
            conf.push('\n');
            fs::write(data.join("postgresql.conf"), conf).expect("write postgresql.conf");
        }
        if let Some(hba) = &setup.hba {
            self.write_owned(&data.join("pg_hba.conf"), hba, 0o600);
        }
    }

    /// Writes a file the server owns, with `mode`.
    fn write_owned(&self, path: &Path, contents: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("set the mode");
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("hand the file to postgres");
        }
    }

    /// Spawns `postgres` and waits until `pg_isready` says it accepts connections.
    fn spawn(&self) -> Result<Child, String> {
        let log_path = self.log_path();
        let log = OpenOptions::new().create(true).append(true).open(&log_path).map_err(|e| e.to_string())?;
        let log_err = log.try_clone().map_err(|e| e.to_string())?;
        let mut child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir.0)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=50"])
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| format!("spawn postgres: {e}"))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.ready() {
                return Ok(child);
            }
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() >= deadline {
                kill_tree(child);
                let log = fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                return Err(format!(
                    "port {}: exited {exited:?}; log tail (newest first):\n{}",
                    self.port,
                    tail.join("\n")
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn ready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-t", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for PostgresProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            kill_tree(child);
        }
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin`, or `PG_BIN`.
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return PathBuf::from(dir);
    }
    let root = Path::new("/usr/lib/postgresql");
    let newest = fs::read_dir(root)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|version| root.join(version.to_string()).join("bin/postgres").exists())
        .max();
    let version = newest.expect(
        "PostgreSQL's server binaries are not installed (looked in /usr/lib/postgresql/<version>/bin): \
         install the postgresql package (Debian: apt-get install postgresql) or set PG_BIN to their directory",
    );
    root.join(version.to_string()).join("bin")
}

/// `(uid, gid)` of the `postgres` user when running as root; `None` otherwise.
fn server_owner() -> Option<(u32, u32)> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let euid = status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().nth(1)?.to_owned();
    if euid != "0" {
        return None;
    }
    let passwd = fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let entry = passwd.lines().find(|l| l.starts_with("postgres:")).expect("a postgres user to run the server as");
    let fields: Vec<&str> = entry.split(':').collect();
    Some((fields[2].parse().expect("uid"), fields[3].parse().expect("gid")))
}

fn signal(name: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    // The error only says a process had already exited.
    let _ = Command::new("kill").arg(format!("-{name}")).args(pids.iter().map(u32::to_string)).status();
}

/// SIGKILL to a postmaster and every process it forked, and waits until they are gone.
fn kill_tree(mut child: Child) {
    let pid = child.id();
    // Stopped, it forks nothing more while its children are listed.
    signal("STOP", &[pid]);
    let children = children_of(pid);
    let _ = child.kill();
    let _ = child.wait();
    signal("KILL", &children);
    let deadline = Instant::now() + Duration::from_secs(5);
    while children.iter().any(|&c| alive(c)) && Instant::now() < deadline {
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&candidate| stat(candidate).is_some_and(|(_, parent)| parent == pid))
        .collect()
}

/// Alive: present and not a zombie (a zombie holds no shared memory).
fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// The state letter and the parent PID from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(char, u32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    let mut rest = text[text.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}
