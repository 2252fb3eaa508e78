//! Starting brokers for tests: in-process (`app::start` on 127.0.0.1:0) or as a child
//! process of the real binary (for restarts and two-node tests).

use agui_fanout::app::{self, Server};
use agui_fanout::config::Config;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Redis URL of the test server (`.ci/run` starts one on 127.0.0.1:6379).
pub fn redis_url() -> String {
    std::env::var("AGUI_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A config for tests: port 0, quick `retry:`, short drain.
pub fn test_config() -> Config {
    let mut c = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Config::default()
    };
    c.sse.retry_ms = 100;
    c.shutdown.drain = Duration::from_millis(200);
    c
}

/// Starts an in-process broker with `test_config()` changed by `f`.
pub async fn start(f: impl FnOnce(&mut Config)) -> Server {
    let mut c = test_config();
    f(&mut c);
    app::start(c).await.expect("broker starts")
}

/// Starts an in-process broker on the memory backend.
pub async fn start_memory() -> Server {
    start(|_| {}).await
}

/// Starts an in-process broker on the redis backend (the test Redis).
pub async fn start_redis() -> Server {
    start(|c| c.redis_url = redis_url()).await
}

/// Base URL of a broker, e.g. `http://127.0.0.1:41234`.
pub fn base(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// A random thread id unique to one test run.
pub fn thread_id(tag: &str) -> String {
    format!("t-{tag}-{:016x}", rand::random::<u64>())
}

/// A broker running as a child process of the real binary; killed on drop.
pub struct BrokerProcess {
    /// The child.
    pub child: Child,
    /// Its address.
    pub addr: SocketAddr,
}

impl BrokerProcess {
    /// Spawns `agui-fanout serve` on a free port with extra environment, and waits until
    /// `/healthz` answers (up to 10 s). Its log (`AGUI_LOG=warn`, to stdout) is dropped unless
    /// `TEST_AGUI_LOG` is set: its value is then the broker's log filter and the log is shown.
    pub async fn spawn(env: &[(&str, String)]) -> BrokerProcess {
        let log = std::env::var("TEST_AGUI_LOG").ok();
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agui-fanout"));
        cmd.arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .env("AGUI_SSE__RETRY_MS", "100")
            .env("AGUI_SHUTDOWN__DRAIN", "300ms")
            .env("AGUI_LOG", log.as_deref().unwrap_or("warn"))
            .stdout(if log.is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn broker binary");
        let proc = BrokerProcess { child, addr };
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(r) = client.get(format!("{}/healthz", base(addr))).send().await
                && r.status().is_success()
            {
                return proc;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("broker process did not come up on {addr}");
    }

    /// Base URL.
    pub fn base(&self) -> String {
        base(self.addr)
    }

    /// Sends SIGTERM and waits for the process to exit (up to 15 s); returns its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..300 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("broker did not exit within 15 s of SIGTERM");
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET /v1/threads/{thread}/snapshot` on the broker at `base`, as JSON.
pub async fn snapshot(base: &str, thread: &str) -> serde_json::Value {
    reqwest::get(format!("{base}/v1/threads/{thread}/snapshot"))
        .await
        .expect("snapshot request")
        .json()
        .await
        .expect("snapshot JSON")
}

/// `GET {url}` (with `token` as a bearer token): status and JSON body (`null` when not JSON).
pub async fn get_json(url: &str, token: Option<&str>) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

/// Every page of the admin list `GET /v1/threads?prefix=…&limit=…` (authentication off): the
/// thread ids in page order, and the pages' sizes. Panics on a non-200 page or past 1,000
/// pages.
pub async fn walk(base: &str, prefix: &str, limit: usize) -> (Vec<String>, Vec<usize>) {
    let mut ids = Vec::new();
    let mut sizes = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let mut url = format!("{base}/v1/threads?prefix={prefix}&limit={limit}");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = get_json(&url, None).await;
        assert_eq!(status, 200, "{page}");
        let threads = page["threads"].as_array().expect("threads");
        sizes.push(threads.len());
        ids.extend(
            threads
                .iter()
                .map(|t| t["threadId"].as_str().unwrap().to_string()),
        );
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return (ids, sizes),
        }
    }
    panic!("more than 1000 pages");
}
