//! The console at `/console` (PROTOCOL §12):
//!
//! - its files are served from the binary with their types and a same-origin
//!   `Content-Security-Policy`; unknown files are 404 in JSON; `console.enabled = false` turns it
//!   off, and by default it is on for a loopback `listen` only;
//! - the committed bundle of the client package (`console/assets/fanout-client.js`) is what
//!   `npm run build --prefix console` makes from `clients/js` (needs `npm ci` in `console/` and
//!   a built `clients/js`, as `scripts/test.sh` does);
//! - in headless Chromium, against brokers on a private `redis-server` and the demo agent
//!   behind the gateway: `tests/node/console-browser.mjs` (loads, lists threads, a turn from the
//!   page streams into both views, a reload mid-run rejoins, an interrupt answered and a run
//!   cancelled from the page, a broker node killed and restarted mid-run loses nothing, the
//!   admin token asked for with authentication on, a coalesced delta marked). `CONSOLE_SCREENSHOT=docs/console.png`
//!   saves the screenshot the README shows, taken mid-run.

mod common;

use common::broker;
use common::demo_agent::DemoAgent;
use common::redis_server::RedisServer;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn files_are_served_from_the_binary() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = client.get(format!("{base}/console")).send().await.unwrap();
    assert_eq!(resp.status(), 308);
    assert_eq!(resp.headers()["location"], "/console/");
    for (path, file, content_type) in [
        ("/console/", "index.html", "text/html; charset=utf-8"),
        (
            "/console/console.js",
            "console.js",
            "text/javascript; charset=utf-8",
        ),
        (
            "/console/operator.js",
            "operator.js",
            "text/javascript; charset=utf-8",
        ),
        (
            "/console/customer.js",
            "customer.js",
            "text/javascript; charset=utf-8",
        ),
        (
            "/console/console.css",
            "console.css",
            "text/css; charset=utf-8",
        ),
        (
            "/console/fanout-client.js",
            "fanout-client.js",
            "text/javascript; charset=utf-8",
        ),
    ] {
        let resp = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let h = resp.headers().clone();
        assert_eq!(h["content-type"], content_type, "{path}");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
        assert_eq!(h["x-content-type-options"], "nosniff");
        let body = resp.bytes().await.unwrap();
        let on_disk = std::fs::read(repo().join("console/assets").join(file)).unwrap();
        assert_eq!(
            &body[..],
            &on_disk[..],
            "{path} is the file in console/assets"
        );
    }
    let resp = client
        .get(format!("{base}/console/secret.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    server.stop().await;

    let off = broker::start(|c| c.console.enabled = Some(false)).await;
    let resp = reqwest::get(format!("{}/console/", broker::base(off.addr)))
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "console.enabled = false");
    off.stop().await;
}

#[test]
fn on_by_default_on_loopback_only() {
    let mut c = agui_fanout::config::Config::default();
    assert!(c.console_enabled(), "127.0.0.1");
    c.listen = "[::1]:8080".parse().unwrap();
    assert!(c.console_enabled(), "::1");
    c.listen = "0.0.0.0:8080".parse().unwrap();
    assert!(!c.console_enabled(), "0.0.0.0");
    c.console.enabled = Some(true);
    assert!(c.console_enabled(), "asked for");
}

/// The committed bundle is what the build makes from the client package now.
#[tokio::test]
async fn the_bundle_is_built_from_the_client_package() {
    let esbuild = repo().join("console/node_modules/.bin/esbuild");
    assert!(
        esbuild.exists() && repo().join("clients/js/dist/index.js").exists(),
        "console/node_modules or clients/js/dist is missing: run `npm ci --prefix console` and \
         `npm ci --prefix clients/js && npm run build --prefix clients/js` (scripts/test.sh does)"
    );
    let out = tempfile::tempdir().unwrap();
    let built = out.path().join("fanout-client.js");
    // The arguments of console/package.json's build script.
    let status = tokio::process::Command::new(&esbuild)
        .current_dir(repo().join("console"))
        .args([
            "src/fanout-client.js",
            "--bundle",
            "--format=esm",
            "--target=es2022",
            "--minify",
            "--legal-comments=eof",
            "--charset=utf8",
            "--log-level=warning",
        ])
        .arg(format!("--outfile={}", built.display()))
        .status()
        .await
        .expect("run esbuild");
    assert!(status.success());
    let fresh = std::fs::read(&built).unwrap();
    let committed = std::fs::read(repo().join("console/assets/fanout-client.js")).unwrap();
    assert!(
        fresh == committed,
        "console/assets/fanout-client.js is stale: run `npm run build --prefix console` and \
         commit it"
    );
    let script = std::fs::read_to_string(repo().join("console/package.json")).unwrap();
    assert!(
        script.contains("esbuild src/fanout-client.js --bundle --format=esm --target=es2022 --minify --legal-comments=eof --charset=utf8 --outfile=assets/fanout-client.js"),
        "console/package.json's build uses the arguments this test checks"
    );
}

fn chromium() -> PathBuf {
    std::env::var_os("AGUI_TEST_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium() {
    let node_dir = repo().join("tests/node");
    assert!(
        node_dir
            .join("node_modules/playwright-core/package.json")
            .exists(),
        "tests/node/node_modules is missing: run `npm ci --prefix tests/node` first \
         (scripts/test.sh does it)"
    );
    assert!(
        chromium().exists(),
        "{} is missing: install Debian's chromium (`apt-get install chromium`; scripts/test.sh \
         does it) or set AGUI_TEST_CHROMIUM",
        chromium().display()
    );
    let redis = RedisServer::start().await;
    // Paced so that a run lasts several seconds: the page acts mid-run.
    let agent = DemoAgent::spawn(&["--pace", "12"]);
    let screenshot = std::env::var("CONSOLE_SCREENSHOT")
        .ok()
        .map(|p| repo().join(p).display().to_string());
    let args = serde_json::json!({
        "bin": env!("CARGO_BIN_EXE_agui-fanout"),
        "redisUrl": redis.url(),
        "agentUrl": agent.url,
        "screenshot": screenshot,
    });
    let child = tokio::process::Command::new("node")
        .arg(node_dir.join("console-browser.mjs"))
        .arg(args.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `node` (Node.js 20+ is needed): {e}"));
    let limit = Duration::from_secs(240);
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("console-browser.mjs did not finish within {limit:?}"))
        .expect("wait for node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "console-browser.mjs failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("summary is not JSON ({e}): {stdout}"));
    assert_eq!(summary["ok"], true, "{summary}\n{stderr}");
    eprintln!("{stderr}");
}
