//! Authentication and CORS (PROTOCOL §8) over real sockets, with tokens signed by the
//! `jsonwebtoken` crate (HS256 with a secret, RS256 with the throwaway key pair in
//! `tests/keys/`):
//!
//! - publish, snapshot and subscribe need a token whose `agui` claim allows the action on the
//!   thread (a thread id or a `prefix*` pattern): 401 `unauthorized` with `WWW-Authenticate`
//!   without one or with one that does not verify (signature, algorithm, `exp`, `nbf`, `aud`),
//!   403 `forbidden` when it does not allow the action; the token may come from
//!   `Authorization: Bearer`, `?access_token=` or the `agui_token` cookie, on the connection
//!   front's path and on hyper's;
//! - a stream opened with a token that expires ends at its expiry, with a comment, on both
//!   paths; reconnecting with the same token is refused;
//! - RS256 tokens verify against the configured public key, and an HS256 token is refused when
//!   only RS256 is configured;
//! - a non-loopback listen address needs a key or `insecure`;
//! - CORS: a preflight allows `Last-Event-ID` and `Authorization`; an allowed origin gets the
//!   same CORS headers on the front's streams as on hyper's; another origin gets no
//!   `Access-Control-Allow-Origin`.

mod common;

use agui_fanout::app;
use agui_fanout::config::Config;
use common::broker;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "test-secret-of-a-reasonable-length";
const RS_PRIVATE: &str = include_str!("keys/rs256-test-private.pem");
const RS_PUBLIC: &str = include_str!("keys/rs256-test-public.pem");

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn hs256(claims: &Value) -> String {
    sign(
        Algorithm::HS256,
        claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
}

fn sign(alg: Algorithm, claims: &Value, key: &EncodingKey) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).expect("sign a test token")
}

/// A token allowing `subscribe` and `publish` on the given patterns, valid for an hour.
fn token(subscribe: &[&str], publish: &[&str]) -> String {
    hs256(&json!({"exp": now() + 3600, "agui": {"subscribe": subscribe, "publish": publish}}))
}

async fn hs256_broker() -> app::Server {
    // Order checks off: the tests publish bare `CUSTOM` events.
    broker::start(|c| {
        c.auth.hs256_secret = SECRET.into();
        c.strict_order = false;
    })
    .await
}

/// A raw HTTP/1.1 exchange: sends `request`, reads until the connection closes or `until`
/// appears or 5 s pass; returns what was read (lossy UTF-8).
async fn exchange(addr: SocketAddr, request: &str, until: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send request");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
        if !until.is_empty() && String::from_utf8_lossy(&got).contains(until) {
            break;
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// The status code of a raw response.
fn status(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The lower-cased header block of a raw response.
fn head(resp: &str) -> String {
    resp.split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// A subscribe request head: on the front's path, or on hyper's (`hyper`: two empty
/// `Last-Event-ID` fields, which the front leaves to hyper), with extra header lines.
fn subscribe_request(thread: &str, query: &str, hyper: bool, extra: &str) -> String {
    let via = if hyper {
        "Last-Event-ID: \r\nLast-Event-ID: \r\n"
    } else {
        ""
    };
    // `Connection: close`: hyper ends the connection after an error's answer too.
    format!(
        "GET /v1/threads/{thread}/events{query} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         {via}{extra}\r\n"
    )
}

async fn publish(base: &str, thread: &str, bearer: Option<&str>, query: &str) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events{query}"))
        .json(&json!({"type": "CUSTOM", "name": "auth", "value": 1}));
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("publish");
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let mut body: Value = resp.json().await.expect("JSON reply");
    if let Some(c) = challenge {
        body["www-authenticate"] = json!(c);
    }
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_needs_a_token_allowing_the_thread() {
    let server = hs256_broker().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("auth-a");
    let other = broker::thread_id("auth-b");
    let good = token(&[], &["t-auth-a-*"]);

    let (s, body) = publish(&base, &thread, None, "").await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    assert_eq!(body["www-authenticate"], "Bearer", "{body}");

    let refused = [
        ("not a token", "not.a.token".to_string()),
        ("wrong secret", {
            let claims = json!({"agui": {"publish": ["*"]}});
            sign(
                Algorithm::HS256,
                &claims,
                &EncodingKey::from_secret(b"another secret"),
            )
        }),
        (
            "expired",
            hs256(&json!({"exp": now() - 10, "agui": {"publish": ["*"]}})),
        ),
        (
            "not yet valid",
            hs256(&json!({"nbf": now() + 600, "agui": {"publish": ["*"]}})),
        ),
        (
            "an audience",
            hs256(&json!({"aud": "elsewhere", "agui": {"publish": ["*"]}})),
        ),
        ("HS384", {
            let claims = json!({"agui": {"publish": ["*"]}});
            sign(
                Algorithm::HS384,
                &claims,
                &EncodingKey::from_secret(SECRET.as_bytes()),
            )
        }),
    ];
    for (what, t) in &refused {
        let (s, body) = publish(&base, &thread, Some(t), "").await;
        assert_eq!(s, 401, "{what}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized", "{what}");
        assert_eq!(
            body["www-authenticate"], "Bearer error=\"invalid_token\"",
            "{what}"
        );
    }

    let (s, body) = publish(&base, &thread, Some(&good), "").await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = publish(&base, &thread, None, &format!("?access_token={good}")).await;
    assert_eq!(s, 200, "access_token: {body}");
    // Without `exp` a token does not expire.
    let forever = hs256(&json!({"agui": {"publish": [thread]}}));
    assert_eq!(publish(&base, &thread, Some(&forever), "").await.0, 200);

    for (what, t) in [
        ("subscribe only", token(&["*"], &[])),
        ("another prefix", good.clone()),
    ] {
        let target = if what == "another prefix" {
            &other
        } else {
            &thread
        };
        let (s, body) = publish(&base, target, Some(&t), "").await;
        assert_eq!(s, 403, "{what}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{what}");
        assert_eq!(body["error"]["field"], "agui.publish", "{what}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_and_snapshot_need_a_subscribe_token_on_both_paths() {
    let server = hs256_broker().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("auth-sub");
    let (s, _) = publish(&base, &thread, Some(&token(&[], &[&thread])), "").await;
    assert_eq!(s, 200);
    let sub = token(&[&thread], &[]);
    let publish_only = token(&[], &[&thread]);

    for hyper in [false, true] {
        let path = if hyper { "hyper" } else { "front" };
        let open = |query: String, extra: String| {
            let req = subscribe_request(&thread, &query, hyper, &extra);
            async move { exchange(server.addr, &req, "\"CUSTOM\"").await }
        };
        let resp = open("?from=start".into(), String::new()).await;
        assert_eq!(status(&resp), 401, "{path}: {resp}");
        assert!(
            head(&resp).contains("www-authenticate: bearer"),
            "{path}: {resp}"
        );
        assert!(resp.contains("\"unauthorized\""), "{path}: {resp}");

        let resp = open(
            "?from=start".into(),
            format!("Authorization: Bearer {publish_only}\r\n"),
        )
        .await;
        assert_eq!(status(&resp), 403, "{path}: {resp}");

        for (how, query, extra) in [
            (
                "bearer",
                "?from=start".to_string(),
                format!("Authorization: Bearer {sub}\r\n"),
            ),
            (
                "query",
                format!("?from=start&access_token={sub}"),
                String::new(),
            ),
            (
                "cookie",
                "?from=start".to_string(),
                format!("Cookie: a=b; agui_token={sub}\r\n"),
            ),
        ] {
            let resp = open(query, extra).await;
            assert_eq!(status(&resp), 200, "{path} {how}: {resp}");
            assert!(head(&resp).contains("text/event-stream"), "{path} {how}");
            assert!(
                resp.contains("\"CUSTOM\""),
                "{path} {how}: the event: {resp}"
            );
        }
    }

    let get = |t: Option<String>| {
        let mut req = reqwest::Client::new().get(format!("{base}/v1/threads/{thread}/snapshot"));
        if let Some(t) = t {
            req = req.bearer_auth(t);
        }
        async move { req.send().await.expect("snapshot").status().as_u16() }
    };
    assert_eq!(get(None).await, 401);
    assert_eq!(get(Some(publish_only.clone())).await, 403);
    assert_eq!(get(Some(sub.clone())).await, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_when_its_token_expires() {
    let server = hs256_broker().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("auth-exp");
    let publisher = token(&[], &[&thread]);
    let (s, _) = publish(&base, &thread, Some(&publisher), "").await;
    assert_eq!(s, 200);
    // `exp` has a one-second resolution: 3 s ahead ends the streams 2–3 s from now.
    let short = hs256(&json!({"exp": now() + 3, "agui": {"subscribe": [thread]}}));
    let started = Instant::now();
    let streams: Vec<_> = [false, true]
        .into_iter()
        .map(|hyper| {
            let req = subscribe_request(
                &thread,
                "?from=start",
                hyper,
                &format!("Authorization: Bearer {short}\r\n"),
            );
            let addr = server.addr;
            tokio::spawn(async move { (hyper, exchange(addr, &req, "token expired").await) })
        })
        .collect();
    for s in streams {
        let (hyper, resp) = s.await.unwrap();
        assert_eq!(status(&resp), 200, "hyper {hyper}: {resp}");
        assert!(resp.contains("\"CUSTOM\""), "hyper {hyper}: {resp}");
        assert!(
            resp.contains(": agui-fanout: token expired"),
            "hyper {hyper}: the stream did not end with the token: {resp}"
        );
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1500), "ended after {took:?}");
    // The same token again: refused now.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let req = subscribe_request(
        &thread,
        "",
        false,
        &format!("Authorization: Bearer {short}\r\n"),
    );
    assert_eq!(status(&exchange(server.addr, &req, "}}").await), 401);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs256_tokens_verify_against_the_public_key() {
    let server = broker::start(|c| {
        c.auth.rs256_public_key = RS_PUBLIC.into();
        c.strict_order = false;
    })
    .await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("auth-rs");
    let key = EncodingKey::from_rsa_pem(RS_PRIVATE.as_bytes()).expect("test private key");
    let claims = json!({"exp": now() + 600, "agui": {"publish": ["*"]}});
    let (s, body) = publish(
        &base,
        &thread,
        Some(&sign(Algorithm::RS256, &claims, &key)),
        "",
    )
    .await;
    assert_eq!(s, 200, "{body}");
    // HS256 is not configured: refused whatever the secret.
    let (s, body) = publish(&base, &thread, Some(&hs256(&claims)), "").await;
    assert_eq!(s, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not accepted"),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_address_needs_a_key_or_insecure() {
    let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let config = |f: &dyn Fn(&mut Config)| {
        let mut c = broker::test_config();
        c.listen = any;
        f(&mut c);
        c
    };
    let refused = app::start(config(&|_| {})).await.err().expect("refused");
    assert!(
        refused.to_string().contains("without authentication"),
        "{refused}"
    );
    for allowed in [
        config(&|c| c.insecure = true),
        config(&|c| c.auth.hs256_secret = SECRET.into()),
    ] {
        app::start(allowed).await.expect("starts").stop().await;
    }
    let bad_key = config(&|c| c.auth.rs256_public_key = "not a key".into());
    let refused = app::start(bad_key).await.err().expect("refused");
    assert!(
        refused.to_string().contains("rs256_public_key"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_headers_are_the_same_on_both_paths() {
    const ORIGIN: &str = "https://app.example";
    let server = broker::start(|c| {
        c.cors.allow_origins = vec![ORIGIN.into()];
        c.cors.allow_credentials = true;
    })
    .await;
    let thread = broker::thread_id("cors");

    let preflight = exchange(
        server.addr,
        &format!(
            "OPTIONS /v1/threads/{thread}/events HTTP/1.1\r\nHost: x\r\nOrigin: {ORIGIN}\r\n\
             Access-Control-Request-Method: GET\r\n\
             Access-Control-Request-Headers: last-event-id, authorization\r\n\r\n"
        ),
        "\r\n\r\n",
    )
    .await;
    let h = head(&preflight);
    assert_eq!(status(&preflight), 200, "{preflight}");
    assert!(
        h.contains(&format!("access-control-allow-origin: {ORIGIN}")),
        "{h}"
    );
    assert!(h.contains("access-control-allow-credentials: true"), "{h}");
    let allowed = h
        .lines()
        .find(|l| l.starts_with("access-control-allow-headers:"))
        .unwrap_or_else(|| panic!("{h}"));
    assert!(
        allowed.contains("last-event-id") && allowed.contains("authorization"),
        "{h}"
    );

    let cors_of = |resp: &str| -> Vec<String> {
        let mut v: Vec<String> = head(resp)
            .lines()
            .filter(|l| l.starts_with("access-control-") || l.starts_with("vary:"))
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    for origin in [ORIGIN, "https://elsewhere.example"] {
        let extra = format!("Origin: {origin}\r\n");
        let front = exchange(
            server.addr,
            &subscribe_request(&thread, "", false, &extra),
            "\r\n\r\n",
        )
        .await;
        let hyper = exchange(
            server.addr,
            &subscribe_request(&thread, "", true, &extra),
            "\r\n\r\n",
        )
        .await;
        assert_eq!(
            (status(&front), status(&hyper)),
            (200, 200),
            "{front}\n{hyper}"
        );
        assert!(
            !head(&front).contains("transfer-encoding"),
            "front: {front}"
        );
        assert!(
            head(&hyper).contains("transfer-encoding: chunked"),
            "hyper: {hyper}"
        );
        assert_eq!(cors_of(&front), cors_of(&hyper), "{origin}");
        let allow = format!("access-control-allow-origin: {origin}");
        assert_eq!(
            head(&front).contains(&allow),
            origin == ORIGIN,
            "{origin}: {front}"
        );
        assert!(head(&front).contains("vary: origin"), "{front}");
    }
    server.stop().await;
}

/// Claims of the wrong shape are refused, not ignored (found by an adversarial pass): with an
/// audience and an issuer configured, `aud` and `iss` must be there and match (`aud` a string
/// or an array of strings); without an audience, any `aud` is refused. An `exp` beyond what
/// the clock represents is a 401, not a panic. A `crit` header is refused. A quoted cookie
/// value is the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_claims_are_refused() {
    let server = broker::start(|c| {
        c.auth.hs256_secret = SECRET.into();
        c.auth.audience = "aud1".into();
        c.auth.issuer = "iss1".into();
        c.strict_order = false;
    })
    .await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("auth-claims");
    let with = |extra: Value| {
        let mut claims = json!({"agui": {"publish": ["*"], "subscribe": ["*"]}});
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        hs256(&claims)
    };
    for (what, extra, want) in [
        ("matching", json!({"aud": "aud1", "iss": "iss1"}), 200),
        (
            "aud in an array",
            json!({"aud": ["x", "aud1"], "iss": "iss1"}),
            200,
        ),
        ("no aud, no iss", json!({}), 401),
        ("no aud", json!({"iss": "iss1"}), 401),
        ("no iss", json!({"aud": "aud1"}), 401),
        ("aud a number", json!({"aud": 1, "iss": "iss1"}), 401),
        ("aud null", json!({"aud": null, "iss": "iss1"}), 401),
        (
            "aud with a number",
            json!({"aud": ["aud1", 1], "iss": "iss1"}),
            401,
        ),
        ("iss an object", json!({"aud": "aud1", "iss": {}}), 401),
        (
            "iss in an array",
            json!({"aud": "aud1", "iss": ["iss1"]}),
            401,
        ),
        (
            "exp = 2^63",
            json!({"aud": "aud1", "iss": "iss1", "exp": 1u64 << 63}),
            401,
        ),
    ] {
        let (s, body) = publish(&base, &thread, Some(&with(extra)), "").await;
        assert_eq!(s, want, "{what}: {body}");
    }
    // A critical header parameter the broker cannot understand.
    let mut header = Header::new(Algorithm::HS256);
    header.crit = Some(vec!["exp".into()]);
    let claims = json!({"aud": "aud1", "iss": "iss1", "agui": {"publish": ["*"]}});
    let crit = jsonwebtoken::encode(
        &header,
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap();
    assert_eq!(publish(&base, &thread, Some(&crit), "").await.0, 401);
    // A quoted cookie value, after an empty cookie of the same name.
    let good = with(json!({"aud": "aud1", "iss": "iss1"}));
    let req = subscribe_request(
        &thread,
        "?from=start",
        false,
        &format!("Cookie: agui_token=; agui_token=\"{good}\"\r\n"),
    );
    let resp = exchange(server.addr, &req, "\"CUSTOM\"").await;
    assert_eq!(status(&resp), 200, "{resp}");
    // An `exp` centuries ahead: a stream that does not end (and no overflow).
    let far = with(json!({"aud": "aud1", "iss": "iss1", "exp": i64::MAX as u64}));
    for hyper in [false, true] {
        let extra = format!("Authorization: Bearer {far}\r\n");
        let req = subscribe_request(&thread, "?from=start", hyper, &extra);
        let resp = exchange(server.addr, &req, "\"CUSTOM\"").await;
        assert_eq!(status(&resp), 200, "hyper {hyper}: {resp}");
        assert!(resp.contains("\"CUSTOM\""), "hyper {hyper}: {resp}");
    }

    // Without an audience configured, a token with any `aud` is refused.
    let plain = hs256_broker().await;
    let base = broker::base(plain.addr);
    for aud in [json!("x"), json!(1), json!(null), json!([])] {
        let (s, body) = publish(&base, &thread, Some(&with(json!({"aud": aud}))), "").await;
        assert_eq!(s, 401, "aud {aud}: {body}");
    }
    assert_eq!(
        publish(&base, &thread, Some(&with(json!({}))), "").await.0,
        200
    );
    plain.stop().await;
    server.stop().await;
}
