//! The run gateway's upstream over HTTPS (PROTOCOL §11, `url` and `ca_file`): the built-in
//! demo agent served behind a rustls acceptor with a certificate from a private CA this test
//! generates (rcgen, `common::redis_tls::Pki`). With `ca_file` naming that CA a gateway run
//! goes through end to end (over HTTP/2, which the agent's TLS offers); without it (the
//! platform's trust store) or with another CA the run ends with `RUN_ERROR`
//! `upstream_unavailable`; a `ca_file` that is missing, holds no certificate or is set for an
//! `http://` agent stops the broker at start.

mod common;

use agui_fanout::app;
use agui_fanout::cli::demo_agent::{self, Pacing};
use agui_fanout::config::agents::AgentConfig;
use common::broker::{self, snapshot};
use common::redis_tls::Pki;
use common::sse_client::{RawFrame, RawStream};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

/// The demo agent behind TLS on 127.0.0.1; stops on drop.
struct TlsAgent {
    addr: SocketAddr,
    /// The ALPN protocol of each TLS connection accepted (`None`: none negotiated).
    alpn: Arc<Mutex<Vec<Option<Vec<u8>>>>>,
    stop: CancellationToken,
}

impl TlsAgent {
    /// Serves `demo_agent::router` (events unpaced) with `pki`'s server certificate, offering
    /// HTTP/2 and HTTP/1.1 by ALPN.
    async fn start(pki: &Pki) -> TlsAgent {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.server_cert)
            .expect("server certificate file")
            .collect::<Result<_, _>>()
            .expect("server certificate PEM");
        let key = PrivateKeyDer::from_pem_file(&pki.server_key).expect("server key PEM");
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server certificate and key");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let stop = CancellationToken::new();
        let app = demo_agent::router(Pacing::UNLIMITED, stop.clone());
        let alpn: Arc<Mutex<Vec<Option<Vec<u8>>>>> = Arc::default();
        let (stop2, alpn2) = (stop.clone(), alpn.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = stop2.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(_) => continue,
                    },
                };
                let (acceptor, app, alpn) = (acceptor.clone(), app.clone(), alpn2.clone());
                tokio::spawn(async move {
                    // A client that does not trust the certificate aborts the handshake.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    alpn.lock()
                        .unwrap()
                        .push(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                        .await;
                });
            }
        });
        TlsAgent { addr, alpn, stop }
    }

    /// `https://localhost:<port>/`: the certificate names `localhost` and `127.0.0.1`.
    fn url(&self) -> String {
        format!("https://localhost:{}/", self.addr.port())
    }
}

impl Drop for TlsAgent {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn agent(url: &str, ca_file: Option<PathBuf>) -> AgentConfig {
    let mut a = AgentConfig::new(url);
    a.connect_timeout = Duration::from_secs(5);
    a.ca_file = ca_file;
    a
}

fn input(thread: &str, run: &str) -> Value {
    json!({
        "threadId": thread, "runId": run, "state": {}, "tools": [], "context": [],
        "forwardedProps": {},
        "messages": [{"id": format!("u-{run}"), "role": "user", "content": "Open an account"}]
    })
}

/// Runs agent `name` on a fresh thread; the thread and the event frames of the answer.
async fn run(base: &str, name: &str) -> (String, Vec<RawFrame>) {
    let thread = broker::thread_id(&format!("tls-{name}"));
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/agents/{name}"))
        .json(&input(&thread, "r1"))
        .send()
        .await
        .expect("run request");
    assert_eq!(resp.status(), 200, "{name}");
    let (frames, _) = RawStream::from_response(resp).read_to_end(WAIT).await;
    (
        thread,
        frames.into_iter().filter(|f| f.data.is_some()).collect(),
    )
}

fn events(frames: &[RawFrame]) -> Vec<Value> {
    frames
        .iter()
        .map(|f| serde_json::from_str(f.data.as_deref().unwrap()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_run_goes_through_an_https_agent_behind_a_private_ca() {
    let pki = Pki::generate();
    let tls_agent = TlsAgent::start(&pki).await;
    let server = broker::start(|c| {
        c.agents.insert(
            "secure".into(),
            agent(&tls_agent.url(), Some(pki.ca.clone())),
        );
        c.agents
            .insert("platform".into(), agent(&tls_agent.url(), None));
        c.agents.insert(
            "wrongca".into(),
            agent(&tls_agent.url(), Some(pki.other_ca.clone())),
        );
    })
    .await;
    let base = broker::base(server.addr);

    // Trusted through `ca_file`: the whole run, as appended, and the thread holds it.
    let (thread, frames) = run(&base, "secure").await;
    let evs = events(&frames);
    assert_eq!(evs.first().unwrap()["type"], "RUN_STARTED", "{evs:?}");
    assert_eq!(evs.last().unwrap()["type"], "RUN_FINISHED", "{evs:?}");
    let want = demo_agent::script::run_events(&input(&thread, "r1")).len();
    assert_eq!(evs.len(), want, "every event of the demo agent's run");
    assert!(
        evs.iter().any(|e| e["type"] == "TOOL_CALL_ARGS")
            && evs.iter().any(|e| e["type"] == "STATE_DELTA"),
        "the scripted run's content came through"
    );
    assert!(
        frames.iter().all(|f| f.id.is_some()),
        "each event has its log id"
    );
    let snap = snapshot(&base, &thread).await;
    assert_eq!(
        snap["lastEventId"].as_str(),
        frames.last().unwrap().id.as_deref()
    );
    assert_eq!(snap["run"]["status"], "finished", "{snap}");
    assert_eq!(snap["messages"][0]["content"], "Open an account");
    assert_eq!(
        tls_agent
            .alpn
            .lock()
            .unwrap()
            .first()
            .cloned()
            .flatten()
            .as_deref(),
        Some(&b"h2"[..]),
        "the agent's TLS offered HTTP/2 and the gateway took it"
    );

    // Not trusted: the platform's trust store, or a CA that signed nothing here.
    for name in ["platform", "wrongca"] {
        let (thread, frames) = run(&base, name).await;
        let evs = events(&frames);
        let last = evs.last().unwrap();
        assert_eq!(last["type"], "RUN_ERROR", "{name}: {evs:?}");
        assert_eq!(last["code"], "upstream_unavailable", "{name}: {last}");
        let message = last["message"].as_str().unwrap_or_default();
        assert!(message.contains("certificate"), "{name}: {message}");
        assert_eq!(
            evs.len(),
            2,
            "{name}: the broker's RUN_STARTED and RUN_ERROR"
        );
        let snap = snapshot(&base, &thread).await;
        assert_eq!(snap["run"]["status"], "errored", "{name}");
    }
}

#[tokio::test]
async fn a_bad_ca_file_stops_the_broker_at_start() {
    let pki = Pki::generate();
    let start = |a: AgentConfig| {
        let mut c = broker::test_config();
        c.agents.insert("secure".into(), a);
        app::start(c)
    };
    let missing = pki.dir().join("missing.pem");
    let cases = [
        (
            agent("https://localhost:9/", Some(missing.clone())),
            format!("agents.secure.ca_file ({})", missing.display()),
        ),
        (
            // A PEM file, but a key: no certificate.
            agent("https://localhost:9/", Some(pki.server_key.clone())),
            "the file holds no usable PEM certificate".to_string(),
        ),
        (
            agent("http://localhost:9/", Some(pki.ca.clone())),
            "agents.secure.ca_file is set but agents.secure.url does not start with https://"
                .to_string(),
        ),
    ];
    for (a, want) in cases {
        let e = match start(a).await {
            Ok(_) => panic!("the broker started with a bad ca_file ({want})"),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.contains(&want), "{e}");
    }
}
