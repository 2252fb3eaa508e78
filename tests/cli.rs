//! The `agui-fanout` binary as a user meets it: `replay --token` against a broker with
//! authentication on, `token --audience/--issuer`, and what a user error prints (one line,
//! no backtrace, a non-zero exit code; a busy address names itself and `--listen`; a
//! configuration error once, with an example of the expected form).

mod common;

use common::broker;
use serde_json::{Value, json};
use std::io::Write;
use std::process::Output;

const SECRET: &str = "cli-test-secret-0123456789abcdefghij";

/// Runs the binary with `args` and `env` (and `RUST_BACKTRACE=1`, so that a backtrace would
/// show), from the package root (where `config/default.toml` is).
async fn agui_fanout(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agui-fanout"));
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_BACKTRACE", "1")
        .env("AGUI_LOG", "error")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::time::timeout(std::time::Duration::from_secs(30), cmd.output())
        .await
        .expect("the command ends within 30 s")
        .expect("the binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Asserts that `out` failed with one line on stderr (no `Error:` dump, no cause list, no
/// backtrace) and returns that line.
fn one_error_line(out: &Output) -> String {
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    for dump in ["Error: ", "Caused by", "backtrace", "Backtrace"] {
        assert!(!err.contains(dump), "{dump:?} in {err}");
    }
    err
}

/// The payload of a JWT, decoded.
fn claims(token: &str) -> Value {
    use jsonwebtoken::{Algorithm, DecodingKey, Validation};
    let mut v = Validation::new(Algorithm::HS256);
    v.validate_aud = false;
    v.required_spec_claims.clear();
    jsonwebtoken::decode::<Value>(token, &DecodingKey::from_secret(SECRET.as_bytes()), &v)
        .expect("a token signed with the secret")
        .claims
}

/// `replay --token` publishes to a broker with authentication on; without it, the refusal
/// says how to pass one. The token comes from `agui-fanout token`.
#[tokio::test]
async fn replay_publishes_with_a_token_when_auth_is_on() {
    let server = broker::start(|c| c.auth.hs256_secret = SECRET.into()).await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("cli-replay");
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let events = json!([
        {"type": "RUN_STARTED", "threadId": t, "runId": "r1"},
        {"type": "RUN_FINISHED", "threadId": t, "runId": "r1"},
    ]);
    file.write_all(events.to_string().as_bytes()).unwrap();
    let path = file.path().to_str().unwrap();
    let out = agui_fanout(
        &["token", "--publish", &t, "--subscribe", &t],
        &[("AGUI_AUTH__HS256_SECRET", SECRET)],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let token = stdout(&out);
    let refused = agui_fanout(&["replay", "--url", &base, "--rate", "0", path], &[]).await;
    let line = one_error_line(&refused);
    assert!(line.contains("401") && line.contains("--token"), "{line}");
    let out = agui_fanout(
        &[
            "replay", "--url", &base, "--rate", "0", "--token", &token, path,
        ],
        &[],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).starts_with("published 2 events"), "{out:?}");
    let snapshot: Value = reqwest::Client::new()
        .get(format!("{base}/v1/threads/{t}/snapshot"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(snapshot["run"]["status"], "finished", "{snapshot}");
    server.stop().await;
}

/// `token --audience --issuer` puts `aud` and `iss` in the token, and a broker that requires
/// them accepts it.
#[tokio::test]
async fn token_takes_audience_and_issuer() {
    let server = broker::start(|c| {
        c.auth.hs256_secret = SECRET.into();
        c.auth.audience = "agui-fanout".into();
        c.auth.issuer = "https://issuer.example".into();
    })
    .await;
    let t = broker::thread_id("cli-aud");
    let out = agui_fanout(
        &[
            "token",
            "--secret",
            SECRET,
            "--publish",
            &t,
            "--audience",
            "agui-fanout",
            "--issuer",
            "https://issuer.example",
        ],
        &[],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let token = stdout(&out);
    let c = claims(&token);
    assert_eq!(
        (c["aud"].clone(), c["iss"].clone()),
        (json!("agui-fanout"), json!("https://issuer.example")),
        "{c}"
    );
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/v1/threads/{t}/events",
            broker::base(server.addr)
        ))
        .bearer_auth(&token)
        .json(&json!({"type": "RUN_STARTED", "threadId": t, "runId": "r1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    server.stop().await;
}

/// `token` refuses a secret the broker would refuse (under 32 bytes), and without one says
/// where it may come from.
#[tokio::test]
async fn token_refuses_a_secret_the_broker_refuses() {
    let out = agui_fanout(&["token", "--secret", "short", "--admin"], &[]).await;
    let line = one_error_line(&out);
    assert!(line.contains("at least 32 bytes"), "{line}");
    assert!(!line.contains("short"), "the secret is not echoed: {line}");
    let out = agui_fanout(&["token", "--admin"], &[("AGUI_AUTH__HS256_SECRET", "")]).await;
    let line = one_error_line(&out);
    assert!(line.contains("AGUI_AUTH__HS256_SECRET"), "{line}");
}

/// A user error prints one line without a Rust backtrace or `Error:` dump, exit code 1.
#[tokio::test]
async fn user_errors_print_one_line_without_a_backtrace() {
    let out = agui_fanout(
        &[
            "replay",
            "--url",
            "http://127.0.0.1:9",
            "/nonexistent/run.json",
        ],
        &[],
    )
    .await;
    let line = one_error_line(&out);
    assert!(line.contains("/nonexistent/run.json"), "{line}");
    // The cause is said once.
    assert_eq!(line.matches("No such file").count(), 1, "{line}");
}

/// A busy listen address names itself and the `--listen` flag (`serve`, `demo-agent`).
#[tokio::test]
async fn a_busy_listen_address_names_itself_and_the_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for command in ["serve", "demo-agent"] {
        let out = agui_fanout(&[command, "--listen", &addr], &[]).await;
        let line = one_error_line(&out);
        assert!(line.contains(&addr), "{command}: {line}");
        assert!(line.contains("--listen"), "{command}: {line}");
    }
}

/// A configuration error is printed once, naming the key and where it was set, with an
/// example of the expected form.
#[tokio::test]
async fn config_errors_print_once_with_an_example() {
    let out = agui_fanout(
        &["serve", "--listen", "127.0.0.1:0"],
        &[("AGUI_SSE__HEARTBEAT", "soon")],
    )
    .await;
    let line = one_error_line(&out);
    assert!(line.contains("AGUI_SSE__HEARTBEAT"), "{line}");
    assert!(
        line.contains(r#"expected a duration like "30s" or "500ms""#),
        "{line}"
    );
    assert_eq!(line.matches("soon").count(), 1, "{line}");
    // A number is asked for in words, not by its Rust type (`expected usize`).
    for (key, value, expected) in [
        (
            "AGUI_LIMITS__MAX_EVENT_BYTES",
            "-1",
            "a non-negative integer",
        ),
        (
            "AGUI_RETENTION__MAX_EVENTS",
            "many",
            "a non-negative integer",
        ),
        ("AGUI_SSE__RETRY_MS", "1.5", "a non-negative integer"),
    ] {
        let out = agui_fanout(&["serve", "--listen", "127.0.0.1:0"], &[(key, value)]).await;
        let line = one_error_line(&out);
        assert!(line.contains(key), "{line}");
        assert!(line.contains(&format!("expected {expected}")), "{line}");
        assert!(!line.contains("usize") && !line.contains("u64"), "{line}");
    }
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(b"listen = \"localhost\"\n").unwrap();
    let path = file.path().to_str().unwrap();
    let out = agui_fanout(&["serve", "--config", path], &[]).await;
    let line = one_error_line(&out);
    assert!(line.contains(path), "{line}");
    assert!(
        line.contains(r#"expected an address like "127.0.0.1:8080""#),
        "{line}"
    );
    file.as_file().set_len(0).unwrap();
    let mut typo = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    typo.write_all(b"[queue]\nmax_evnts = 5\n").unwrap();
    let out = agui_fanout(&["serve", "--config", path], &[]).await;
    let line = one_error_line(&out);
    assert_eq!(line.matches("max_evnts").count(), 1, "{line}");
    assert!(line.contains("max_events"), "the keys it could be: {line}");
}
