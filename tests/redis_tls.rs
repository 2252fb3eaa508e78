//! TLS to Redis (`rediss://`, `redis_tls_ca`, mutual TLS with `redis_tls_cert`/`_key`) against
//! a private TLS-only `redis-server` (`--port 0 --tls-port …`) with certificates generated
//! here (`common/redis_tls.rs`):
//!
//! - publish, live delivery (the tail's reads and its subscription to the append notes) and
//!   resume all work over TLS, and the thread's keys are in that server;
//! - a server whose certificate the configured CA did not sign is refused at start, with a
//!   message naming the TLS failure and the setting to check (in-process and by the binary);
//! - a server that asks for a client certificate gets the configured one; without one, start
//!   is refused the same way;
//! - an unreadable CA file, and TLS files with a `redis://` URL, are refused at start.

mod common;

use agui_fanout::app;
use common::broker;
use common::redis_tls::{Pki, TlsRedis};
use common::sse_client;
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn run(thread: &str) -> Vec<Value> {
    vec![
        json!({"type":"RUN_STARTED","threadId":thread,"runId":"r1"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"over TLS"}),
        json!({"type":"TEXT_MESSAGE_END","messageId":"m1"}),
        json!({"type":"RUN_FINISHED","threadId":thread,"runId":"r1"}),
    ]
}

fn path(p: &std::path::Path) -> String {
    p.to_str().expect("UTF-8 temp path").to_string()
}

/// The error `app::start` refuses to start with.
async fn start_error(f: impl FnOnce(&mut agui_fanout::config::Config)) -> String {
    let mut config = broker::test_config();
    f(&mut config);
    match app::start(config).await {
        Ok(server) => {
            server.stop().await;
            panic!("the broker started");
        }
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_subscribe_and_resume_over_tls() {
    let pki = Pki::generate();
    let redis = TlsRedis::start(&pki, false).await;
    let server = broker::start(|c| {
        c.redis_url = redis.url();
        c.redis_tls_ca = path(&pki.ca);
    })
    .await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("tls");
    let mut live = sse_client::subscribe(&base, &thread, "", None).await;
    let events = run(&thread);
    // One event per publish, so the tail carries several appends.
    for event in &events {
        sse_client::publish_ok(&base, &thread, std::slice::from_ref(event)).await;
    }
    let got = live.take(events.len(), WAIT).await;
    assert_eq!(
        got.iter().map(|r| r.data.clone()).collect::<Vec<_>>(),
        events
    );
    sse_client::assert_strictly_increasing(&got);

    let mut resumed = sse_client::subscribe(&base, &thread, "", Some(&got[1].id)).await;
    assert_eq!(resumed.take(3, WAIT).await, got[2..].to_vec());

    // The log is in the TLS server.
    let len = redis
        .command(&pki, &["XLEN", &format!("agui:{{{thread}}}:log")])
        .await;
    assert_eq!(len, "5");
    let ready = reqwest::get(format!("{base}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_the_ca_did_not_sign_is_refused_at_start() {
    let pki = Pki::generate();
    let redis = TlsRedis::start(&pki, false).await;
    let e = start_error(|c| {
        c.redis_url = redis.url();
        c.redis_tls_ca = path(&pki.other_ca);
    })
    .await;
    assert!(e.contains("redis TLS handshake failed"), "{e}");
    assert!(e.contains("invalid peer certificate"), "{e}");
    assert!(e.contains("redis_tls_ca"), "{e}");

    // The system's trust store does not know the test CA either.
    let e = start_error(|c| c.redis_url = redis.url()).await;
    assert!(e.contains("redis TLS handshake failed"), "{e}");

    // The binary exits with that message.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agui-fanout"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--redis-url",
            &redis.url(),
        ])
        .arg("--redis-tls-ca")
        .arg(&pki.other_ca)
        .env("AGUI_LOG", "error")
        .output();
    let out = tokio::time::timeout(WAIT, out)
        .await
        .expect("the binary exits")
        .expect("run the binary");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("redis TLS handshake failed"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_uses_the_client_certificate() {
    let pki = Pki::generate();
    let redis = TlsRedis::start(&pki, true).await;
    let e = start_error(|c| {
        c.redis_url = redis.url();
        c.redis_tls_ca = path(&pki.ca);
    })
    .await;
    assert!(e.contains("redis TLS handshake failed"), "{e}");

    let server = broker::start(|c| {
        c.redis_url = redis.url();
        c.redis_tls_ca = path(&pki.ca);
        c.redis_tls_cert = path(&pki.client_cert);
        c.redis_tls_key = path(&pki.client_key);
    })
    .await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("mtls");
    let mut live = sse_client::subscribe(&base, &thread, "", None).await;
    let events = run(&thread);
    sse_client::publish_ok(&base, &thread, &events).await;
    let got = live.take(events.len(), WAIT).await;
    assert_eq!(
        got.iter().map(|r| r.data.clone()).collect::<Vec<_>>(),
        events
    );
    server.stop().await;
}

#[tokio::test]
async fn tls_settings_that_cannot_work_are_refused_at_start() {
    let pki = Pki::generate();
    let missing = pki.dir().join("missing.pem");
    let e = start_error(|c| {
        c.redis_url = "rediss://127.0.0.1:1".into();
        c.redis_tls_ca = path(&missing);
    })
    .await;
    assert!(e.contains("redis_tls_ca: cannot read"), "{e}");

    // A key where the CA should be.
    let e = start_error(|c| {
        c.redis_url = "rediss://127.0.0.1:1".into();
        c.redis_tls_ca = path(&pki.client_key);
    })
    .await;
    assert!(e.contains("holds no PEM CERTIFICATE"), "{e}");

    // Checked with the rest of the configuration (`Config::validate`).
    let mut config = broker::test_config();
    config.redis_url = "redis://127.0.0.1:6379".into();
    config.redis_tls_ca = path(&pki.ca);
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("redis_tls_ca is set but redis_url"), "{e}");
    config.redis_url = "rediss://127.0.0.1:6379".into();
    config.redis_tls_cert = path(&pki.client_cert);
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("set together"), "{e}");
}
