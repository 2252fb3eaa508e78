//! A private `redis-server` child process for tests that need to stop, pause or restart Redis
//! (outages, restarts without data), which the shared test server must never suffer.
//!
//! Started on a free loopback port with no persistence (`--save "" --appendonly no`), so a
//! restart comes back empty, like a flushed or failed-over Redis, and with `DEBUG` allowed
//! from loopback (`DEBUG SLEEP` stalls it). Killed on drop.
//! The binary is `redis-server` from `PATH`, or `AGUI_TEST_REDIS_SERVER` if set.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A `redis-server` child on `127.0.0.1:<port>`.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING` (panics after 10 s).
    pub async fn start() -> RedisServer {
        let mut server = RedisServer {
            port: 0,
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn_and_wait().await {
                return server;
            }
            // Someone took the port between probing and binding: try another one.
        }
        panic!("could not start redis-server");
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and reaps it; its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty) and waits until it answers.
    pub async fn restart(&mut self) {
        self.kill();
        for _ in 0..20 {
            if self.spawn_and_wait().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("could not restart redis-server on port {}", self.port);
    }

    /// Makes this server a replica of `primary` (`REPLICAOF`) and waits up to 10 s until it
    /// has synchronised (its link up, no sync in progress). A server that was a primary drops
    /// its own data for the primary's, as an old primary rejoining after a failover does.
    pub async fn replicate(&self, primary: &RedisServer) {
        // A diskless full sync otherwise waits 5 s for more replicas to share it.
        primary
            .command(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"])
            .await;
        self.command(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()])
            .await;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = self.command(&["INFO", "replication"]).await;
            if info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0")
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replica on port {} not in sync after 10 s: {info}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Promotes a replica: it stops replicating and serves writes with what it holds
    /// (`REPLICAOF NO ONE`), as a failover does.
    pub async fn promote(&self) {
        self.command(&["REPLICAOF", "NO", "ONE"]).await;
    }

    /// Waits (at most 10 s) until `replica` holds everything this server wrote so far: its
    /// replication offset reached this server's. (`WAIT` would not do: it waits for the writes
    /// of its own connection only.)
    pub async fn replicated_to(&self, replica: &RedisServer) {
        let offset = |info: &str, field: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let info = self.command(&["INFO", "replication"]).await;
        let wrote = offset(&info, "master_repl_offset:").expect("master_repl_offset");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = replica.command(&["INFO", "replication"]).await;
            if offset(&info, "slave_repl_offset:").is_some_and(|got| got >= wrote) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replica on port {} short of offset {wrote} after 10 s: {info}",
                replica.port
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Runs one command on a fresh connection; its reply as text (integers in decimal).
    pub async fn command(&self, args: &[&str]) -> String {
        command_on(&redis::Client::open(self.url()).expect("redis URL"), args).await
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .arg(sig)
                .arg(child.id().to_string())
                .status()
                .expect("run kill");
            assert!(status.success(), "kill {sig} failed");
        }
    }

    /// Spawns the child and waits up to 10 s for `PING`; false if it exited (port taken).
    async fn spawn_and_wait(&mut self) -> bool {
        let binary =
            std::env::var("AGUI_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(binary)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it installed?)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false;
            }
            if ping(self.port).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill();
        false
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL also ends a paused (SIGSTOPped) server.
        self.kill();
    }
}

/// A port free on loopback right now (another process may take it before it is bound).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free port")
}

/// True when `127.0.0.1:port` answers `PING` with `+PONG`.
async fn ping(port: u16) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        stream.read_exact(&mut buf).await.ok()?;
        (&buf == b"+PONG\r\n").then_some(())
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), attempt).await,
        Ok(Some(()))
    )
}

/// Runs one command on a fresh connection of `client`; its reply as text (integers in decimal).
pub async fn command_on(client: &redis::Client, args: &[&str]) -> String {
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the private redis-server");
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    match cmd
        .query_async::<redis::Value>(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    {
        redis::Value::Int(n) => n.to_string(),
        other => redis::from_redis_value::<String>(other).unwrap_or_default(),
    }
}
