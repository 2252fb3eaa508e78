//! A private Redis Cluster for tests: `masters` primaries (and `replicas` replicas each), each a
//! `redis-server --cluster-enabled yes` child on free loopback ports (the cluster bus on port +
//! 10000), joined with `redis-cli --cluster create … --cluster-yes`, every slot assigned and
//! every node agreeing before [`RedisCluster::start`] returns. No persistence. Killed on drop.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One node of the cluster.
pub struct Node {
    /// Its client port.
    pub port: u16,
    child: Option<Child>,
}

/// The cluster's nodes; the first `masters` start as primaries.
pub struct RedisCluster {
    /// Every node, primaries first (as `redis-cli --cluster create` assigned them).
    pub nodes: Vec<Node>,
    masters: usize,
    _dir: tempfile::TempDir,
}

/// A port free on loopback whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind a free port");
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

impl RedisCluster {
    /// Starts `masters` primaries with `replicas` replicas each and waits (up to 30 s) until the
    /// cluster is formed and every node sees `cluster_state:ok`.
    pub async fn start(masters: usize, replicas: usize) -> RedisCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let binary =
            std::env::var("AGUI_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let mut nodes = Vec::new();
        for i in 0..masters * (1 + replicas) {
            let port = free_cluster_port();
            let node_dir = dir.path().join(format!("n{i}"));
            std::fs::create_dir_all(&node_dir).unwrap();
            let child = Command::new(&binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--enable-debug-command", "local"])
                .arg("--dir")
                .arg(&node_dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server (is it installed?)");
            nodes.push(Node {
                port,
                child: Some(child),
            });
        }
        let cluster = RedisCluster {
            nodes,
            masters,
            _dir: dir,
        };
        for node in &cluster.nodes {
            wait_for(
                || async { cluster.try_command(node.port, &["PING"]).await.is_some() },
                "a cluster node answers PING",
            )
            .await;
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ok().await;
        cluster
    }

    /// Waits (up to 30 s) until every running node reports `cluster_state:ok` and knows every
    /// node.
    pub async fn wait_ok(&self) {
        let total = self.nodes.iter().filter(|n| n.child.is_some()).count();
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            wait_for(
                || async {
                    let info = self
                        .try_command(node.port, &["CLUSTER", "INFO"])
                        .await
                        .unwrap_or_default();
                    info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_assigned:16384")
                        && info
                            .lines()
                            .find_map(|l| l.strip_prefix("cluster_known_nodes:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .is_some_and(|n| n >= total)
                },
                "the cluster is ok on every node",
            )
            .await;
        }
    }

    /// `redis://127.0.0.1:<port>` of every node, comma-separated (a seed list).
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The ports of the primaries, as the cluster sees them now.
    pub async fn master_ports(&self) -> Vec<u16> {
        let nodes = self.command_any(&["CLUSTER", "NODES"]).await;
        nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .filter_map(|l| {
                let addr = l.split(' ').nth(1)?;
                addr.split(['@', ':']).nth(1)?.parse().ok()
            })
            .collect()
    }

    /// The port of the primary serving `slot` now.
    pub async fn owner(&self, slot: u16) -> u16 {
        let nodes = self.command_any(&["CLUSTER", "NODES"]).await;
        for line in nodes.lines().filter(|l| l.contains("master")) {
            let fields: Vec<&str> = line.split(' ').collect();
            for range in fields.iter().skip(8) {
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (lo.parse().ok(), hi.parse().ok()),
                    None => (range.parse().ok(), range.parse().ok()),
                };
                if let (Some(lo), Some(hi)) = (lo, hi)
                    && (lo..=hi).contains(&slot)
                {
                    return fields[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
                }
            }
        }
        panic!("no primary serves slot {slot}");
    }

    /// Runs a command on the node at `port`; its reply as text (an array's items joined by
    /// spaces), `None` on any error.
    pub async fn try_command(&self, port: u16, args: &[&str]) -> Option<String> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
        let attempt = async {
            let mut conn = client.get_multiplexed_async_connection().await.ok()?;
            let mut cmd = redis::cmd(args[0]);
            for arg in &args[1..] {
                cmd.arg(*arg);
            }
            Some(text(cmd.query_async::<redis::Value>(&mut conn).await.ok()?))
        };
        tokio::time::timeout(Duration::from_secs(2), attempt)
            .await
            .ok()
            .flatten()
    }

    /// Runs a command on the node at `port` (panics on error).
    pub async fn command(&self, port: u16, args: &[&str]) -> String {
        self.try_command(port, args)
            .await
            .unwrap_or_else(|| panic!("{args:?} on port {port} failed"))
    }

    /// Runs a command on the first node that answers.
    pub async fn command_any(&self, args: &[&str]) -> String {
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            if let Some(reply) = self.try_command(node.port, args).await {
                return reply;
            }
        }
        panic!("no cluster node answers {args:?}");
    }

    /// Moves `slot` from its primary to the primary at `to`, keys included (`CLUSTER
    /// SETSLOT … IMPORTING/MIGRATING`, `MIGRATE` of every key, `SETSLOT … NODE` everywhere).
    pub async fn migrate_slot(&self, slot: u16, to: u16) {
        let from = self.owner(slot).await;
        assert_ne!(from, to, "slot {slot} is already on {to}");
        let id = |port: u16| async move { self.command(port, &["CLUSTER", "MYID"]).await };
        let (from_id, to_id) = (id(from).await, id(to).await);
        let s = slot.to_string();
        self.command(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id])
            .await;
        self.command(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id])
            .await;
        loop {
            let client = redis::Client::open(format!("redis://127.0.0.1:{from}")).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query_async(&mut conn)
                .await
                .unwrap();
            if keys.is_empty() {
                break;
            }
            let mut cmd = redis::cmd("MIGRATE");
            cmd.arg("127.0.0.1")
                .arg(to)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys);
            let _: () = cmd.query_async(&mut conn).await.unwrap();
        }
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            self.command(node.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id])
                .await;
        }
    }

    /// The port of a replica of the primary at `primary`, waiting (up to 30 s) for one (an old
    /// primary becomes a replica of the new one a moment after a failover).
    pub async fn replica_of(&self, primary: u16) -> u16 {
        let id = self.command(primary, &["CLUSTER", "MYID"]).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let nodes = self.command(primary, &["CLUSTER", "NODES"]).await;
            let found = nodes
                .lines()
                .find(|l| l.contains("slave") && l.split(' ').nth(3) == Some(id.as_str()))
                .and_then(|l| l.split(' ').nth(1)?.split(['@', ':']).nth(1)?.parse().ok());
            if let Some(port) = found {
                return port;
            }
            assert!(
                Instant::now() < deadline,
                "no replica of {primary}: {nodes}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (up to 10 s) until `replica` holds everything the primary at `primary` wrote.
    pub async fn replicated(&self, primary: u16, replica: u16) {
        let offset = |info: &str, field: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let info = self.command(primary, &["INFO", "replication"]).await;
        let wrote = offset(&info, "master_repl_offset:").expect("master_repl_offset");
        wait_for(
            || async {
                let info = self
                    .try_command(replica, &["INFO", "replication"])
                    .await
                    .unwrap_or_default();
                offset(&info, "slave_repl_offset:").is_some_and(|got| got >= wrote)
            },
            "the replica caught up",
        )
        .await;
    }

    /// Kills the node at `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port)
            && let Some(mut child) = node.child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The number of primaries it was started with.
    pub fn masters(&self) -> usize {
        self.masters
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

async fn wait_for<F, Fut>(mut check: F, what: &str)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A reply as text: integers in decimal, arrays' items joined by spaces.
fn text(value: redis::Value) -> String {
    match value {
        redis::Value::Int(n) => n.to_string(),
        redis::Value::Array(items) => items.into_iter().map(text).collect::<Vec<_>>().join(" "),
        other => redis::from_redis_value::<String>(other).unwrap_or_default(),
    }
}
