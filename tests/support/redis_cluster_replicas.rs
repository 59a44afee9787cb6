//! A Redis Cluster of three masters with one replica each, private
//! processes on free loopback ports, killed by PID when dropped (and by a
//! watchdog if this process dies first). The nodes require
//! [`DATA_PASSWORD`]; a killed master is replaced by its replica after
//! `cluster-node-timeout` (1 s here), and a master restarted afterwards
//! rejoins as the replica of the node that replaced it.
//!
//! [`ReplicatedCluster::fall_behind`] cuts a replica off its master as
//! [`super::redis_replicas`] does, so the replica promoted next lacks the
//! writes its master acknowledged meanwhile.

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_replicas::{DATA_PASSWORD, FAILOVER_TIMEOUT, Resp, query};
use super::redis_server::{TempDir, free_port, kill, spawn_server};
use super::services::stop_when_this_process_exits;

pub struct ReplicatedCluster {
    dir: TempDir,
    nodes: Vec<Node>,
}

struct Node {
    port: u16,
    bus_port: u16,
    child: Option<std::process::Child>,
}

impl ReplicatedCluster {
    /// Six nodes joined by `redis-cli --cluster create --cluster-replicas 1`,
    /// every replica in sync.
    pub fn start() -> Self {
        let dir = TempDir::new("redis-cluster-replicas");
        let mut cluster = Self { dir, nodes: Vec::new() };
        for _ in 0..6 {
            let node = cluster.spawn(free_port(), free_port());
            cluster.nodes.push(node);
        }
        let addresses: Vec<String> = cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let log_path = cluster.dir.0.join("cluster-create.log");
        let log = File::create(&log_path).expect("create the cluster-create log");
        let status = Command::new("redis-cli")
            .args(["-a", DATA_PASSWORD, "--no-auth-warning", "--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone a file handle"))
            .stderr(log)
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "{}", std::fs::read_to_string(&log_path).unwrap_or_default());
        for index in 0..cluster.nodes.len() {
            cluster.wait_until(index, |c, i| c.info(i, "CLUSTER", "INFO").contains("cluster_state:ok"));
        }
        for replica in 0..cluster.nodes.len() {
            if cluster.master_of(replica).is_some() {
                cluster.wait_in_sync(replica);
            }
        }
        cluster
    }

    fn spawn(&self, port: u16, bus_port: u16) -> Node {
        let config = self.dir.0.join(format!("nodes-{port}.conf"));
        let bus = bus_port.to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            config.to_str().expect("UTF-8 temp path"),
            "--cluster-node-timeout",
            "1000",
            "--cluster-port",
            &bus,
            "--requirepass",
            DATA_PASSWORD,
            "--masterauth",
            DATA_PASSWORD,
        ];
        let child = spawn_server(port, &self.dir.0, &args).unwrap_or_else(|e| panic!("cluster node: {e}"));
        stop_when_this_process_exits(child.id(), "KILL", &self.dir.0);
        Node { port, bus_port, child: Some(child) }
    }

    /// `redis+cluster://:DATA@h1,h2,…,h6?…`.
    pub fn url(&self, options: &str) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://:{DATA_PASSWORD}@{}?{options}", hosts.join(","))
    }

    /// The client port of a node.
    pub fn port(&self, node: usize) -> u16 {
        self.nodes[node].port
    }

    pub fn query(&self, node: usize, args: &[&str]) -> Resp {
        query(self.nodes[node].port, Some(DATA_PASSWORD), args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn info(&self, node: usize, command: &str, section: &str) -> String {
        match query(self.nodes[node].port, Some(DATA_PASSWORD), &[command, section]) {
            Ok(Resp::Bulk(text)) => text,
            _ => String::new(),
        }
    }

    /// The index of the node `replica` replicates from, if it is a replica
    /// (as it says itself).
    pub fn master_of(&self, replica: usize) -> Option<usize> {
        let info = self.info(replica, "INFO", "replication");
        let port = info.lines().find_map(|l| l.trim().strip_prefix("master_port:")?.parse::<u16>().ok())?;
        info.contains("role:slave").then_some(())?;
        self.nodes.iter().position(|n| n.port == port)
    }

    /// The replica of `master`.
    pub fn replica_of(&self, master: usize) -> usize {
        (0..self.nodes.len())
            .find(|&n| self.nodes[n].child.is_some() && self.master_of(n) == Some(master))
            .unwrap_or_else(|| panic!("node {master} has no replica"))
    }

    /// A node that is a master now.
    pub fn a_master(&self, not: &[usize]) -> usize {
        (0..self.nodes.len())
            .find(|n| !not.contains(n) && self.info(*n, "INFO", "replication").contains("role:master"))
            .expect("a master")
    }

    pub fn fall_behind(&self, replica: usize) {
        self.query(replica, &["CONFIG", "SET", "masterauth", "wrong-on-purpose"]);
        self.query(replica, &["CLIENT", "KILL", "TYPE", "master"]);
    }

    pub fn catch_up(&self, replica: usize) {
        self.query(replica, &["CONFIG", "SET", "masterauth", DATA_PASSWORD]);
    }

    /// SIGKILLs a node.
    pub fn kill(&mut self, node: usize) {
        if let Some(child) = self.nodes[node].child.take() {
            kill(child);
        }
    }

    /// Waits until `replica` has taken over (it says it is a master and
    /// the cluster is ok again).
    pub fn wait_until_promoted(&self, replica: usize) {
        self.wait_until(replica, |c, i| {
            c.info(i, "INFO", "replication").contains("role:master")
                && c.info(i, "CLUSTER", "INFO").contains("cluster_state:ok")
        });
    }

    /// Starts a killed node again on its ports, empty; it rejoins as the
    /// replica of the node that replaced it. Waits until it is in sync.
    pub fn restart(&mut self, node: usize) {
        let (port, bus_port) = (self.nodes[node].port, self.nodes[node].bus_port);
        self.nodes[node] = self.spawn(port, bus_port);
        self.wait_until(node, |c, i| c.master_of(i).is_some());
        self.wait_in_sync(node);
    }

    fn wait_in_sync(&self, replica: usize) {
        self.wait_until(replica, |c, i| c.info(i, "INFO", "replication").contains("master_link_status:up"));
    }

    fn wait_until(&self, node: usize, ok: impl Fn(&Self, usize) -> bool) {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        while !ok(self, node) {
            assert!(Instant::now() < deadline, "cluster node {} not there in time", self.nodes[node].port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ReplicatedCluster {
    fn drop(&mut self) {
        for child in self.nodes.iter_mut().filter_map(|n| n.child.take()) {
            kill(child);
        }
    }
}
