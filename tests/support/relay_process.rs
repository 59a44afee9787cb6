//! The `idemgate relay` binary as a child process, for tests that kill it
//! or take its database away.
//!
//! Its config file and its log (stdout and stderr) live in a temporary
//! directory of its own; a failing test quotes the log's tail.

use std::fs::{self, File};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::{TempDir, free_port};

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");

/// One `idemgate relay`, SIGKILLed when dropped.
pub struct RelayProcess {
    child: Option<Child>,
    dir: TempDir,
    /// Its admin listener (probes, metrics).
    pub admin: SocketAddr,
    starts: usize,
}

impl RelayProcess {
    /// Writes `config` (TOML) and starts `idemgate relay --config …`.
    pub fn start(config: &str) -> Self {
        let dir = TempDir::new("relay");
        fs::write(dir.0.join("idemgate.toml"), config).expect("write the relay config");
        let admin = format!("127.0.0.1:{}", free_port()).parse().expect("a socket address");
        let mut relay = Self { child: None, dir, admin, starts: 0 };
        relay.start_again();
        relay
    }

    /// Starts it again (after [`Self::kill`]) with the same config and admin port.
    pub fn start_again(&mut self) {
        self.kill();
        self.starts += 1;
        let log = File::create(self.dir.0.join(format!("relay-{}.log", self.starts))).expect("create the relay log");
        let child = Command::new(BINARY)
            .args(["relay", "--config"])
            .arg(self.dir.0.join("idemgate.toml"))
            .args(["--admin-listen", &self.admin.to_string()])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone a file handle"))
            .stderr(log)
            .spawn()
            .expect("start idemgate relay");
        self.child = Some(child);
    }

    /// SIGKILL: no chance to record what it just published or to release its leases.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A field of `/proc/<pid>/status` in KiB (`VmHWM`: peak resident
    /// memory; `VmRSS`: now), while it runs.
    pub fn memory_kib(&self, field: &str) -> Option<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
        line[field.len() + 1..].trim().trim_end_matches("kB").trim().parse().ok()
    }

    /// `true` while the process runs.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// SIGTERM, then its exit status (bounded wait).
    pub fn terminate(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("a running relay");
        let pid = child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("run kill").success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().expect("wait for the relay") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("idemgate relay did not exit after SIGTERM; log:\n{}", self.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `lines` lines of the current run's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.0.join(format!("relay-{}.log", self.starts))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
