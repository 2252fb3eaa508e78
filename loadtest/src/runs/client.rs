//! The `runs` scenario's side of the wire: keep-alive HTTP/1.1 connections (hyper), a run
//! request and its SSE answer read event by event, the plain publishes of the `publish`
//! phase, and the viewers following `GET …/events?from=start`, each event timed on arrival.

use super::Baseline;
use crate::net::{self, Sources, Target};
use crate::scenario::Ctx;
use crate::wire::SseParser;
use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a run or a publish may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// One event as a client read it.
#[derive(Clone, Debug)]
pub(super) struct Seen {
    pub(super) id: Option<String>,
    pub(super) data: Bytes,
    pub(super) at: Instant,
}

/// What one run's caller (or one publishing worker) did.
#[derive(Debug)]
pub(super) struct RunRead {
    pub(super) worker: usize,
    pub(super) run_id: String,
    pub(super) start: Instant,
    pub(super) events: Vec<Seen>,
    pub(super) error: Option<String>,
}

/// A viewer's stream so far.
#[derive(Default)]
pub(super) struct ViewerLog {
    pub(super) seen: Vec<Seen>,
    pub(super) error: Option<String>,
}

/// A viewer of one thread.
pub(super) struct Viewer {
    pub(super) worker: usize,
    pub(super) log: Arc<Mutex<ViewerLog>>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

/// Opens a keep-alive HTTP/1.1 connection to `target`.
pub(super) async fn connect(
    target: &Target,
    sources: &Sources,
) -> Result<SendRequest<Full<Bytes>>> {
    let stream = net::connect(target.addr, sources.pick())
        .await
        .with_context(|| format!("connecting to {}", target.addr))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

pub(super) fn request(
    target: &Target,
    method: hyper::Method,
    path: &str,
) -> hyper::http::request::Builder {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, &target.host)
        .header(hyper::header::ACCEPT, "text/event-stream");
    if let Some(t) = &target.bearer {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    req
}

/// Reads an SSE response body into `out` as it arrives (every frame with `data`).
pub(super) async fn read_sse(
    mut body: hyper::body::Incoming,
    mut out: impl FnMut(Seen),
) -> Result<()> {
    let mut parser = SseParser::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        let at = Instant::now();
        parser.feed(&chunk, |f| {
            if let Some(data) = f.data {
                out(Seen {
                    id: f.id.map(|i| String::from_utf8_lossy(i).into_owned()),
                    data: Bytes::copy_from_slice(data),
                    at,
                });
            }
        });
    }
    Ok(())
}

/// A `RunAgentInput` for a fresh run: one new user message.
pub(super) fn run_input(thread: &str, run_id: &str) -> Bytes {
    Bytes::from(
        json!({
            "threadId": thread,
            "runId": run_id,
            "messages": [{"id": format!("{run_id}-q"), "role": "user",
                          "content": "I would like to open an account."}],
            "state": {},
            "tools": [],
            "context": [],
            "forwardedProps": {},
        })
        .to_string(),
    )
}

/// One run: the request, then its SSE answer to the end.
pub(super) async fn one_run(
    sender: &mut SendRequest<Full<Bytes>>,
    target: &Target,
    path: &str,
    thread: &str,
    run_id: &str,
    worker: usize,
) -> RunRead {
    let body = run_input(thread, run_id);
    let start = Instant::now();
    let mut events = Vec::new();
    let result: Result<()> = async {
        sender.ready().await?;
        let req = request(target, hyper::Method::POST, path)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let resp = sender.send_request(req).await?;
        if resp.status() != 200 {
            let status = resp.status();
            let text = resp.into_body().collect().await?.to_bytes();
            bail!("status {status}: {}", String::from_utf8_lossy(&text));
        }
        read_sse(resp.into_body(), |s| events.push(s)).await
    }
    .await;
    let error = result.err().map(|e| format!("{e:#}"));
    RunRead {
        worker,
        run_id: run_id.to_string(),
        start,
        events,
        error,
    }
}

/// `runs` runs over `conc` workers (worker `w` runs on thread `<run_id>-<tag>-w`).
pub(super) async fn run_phase(
    ctx: &Ctx,
    target: &Target,
    path: &str,
    tag: &str,
    conc: usize,
    runs: usize,
) -> Vec<RunRead> {
    let mut tasks = Vec::new();
    for w in 0..conc {
        let target = target.clone();
        let sources = ctx.sources.clone();
        let path = path.to_string();
        let thread = format!("{}-{tag}-{w}", ctx.run_id);
        let prefix = format!("{}{tag}w{w}n", ctx.run_id);
        let count = (runs + conc - 1 - w) / conc;
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut sender = None;
            for k in 0..count {
                let run_id = format!("{prefix}{k}");
                if sender.is_none() {
                    match connect(&target, &sources).await {
                        Ok(s) => sender = Some(s),
                        Err(e) => {
                            out.push(failed(w, &run_id, format!("{e:#}")));
                            continue;
                        }
                    }
                }
                let Some(s) = sender.as_mut() else { continue };
                let read = match tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    one_run(s, &target, &path, &thread, &run_id, w),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => failed(w, &run_id, "timed out".into()),
                };
                if read.error.is_some() {
                    sender = None;
                }
                out.push(read);
            }
            out
        }));
    }
    let mut reads = Vec::new();
    for t in tasks {
        if let Ok(r) = t.await {
            reads.extend(r);
        }
    }
    reads
}

pub(super) fn failed(worker: usize, run_id: &str, error: String) -> RunRead {
    RunRead {
        worker,
        run_id: run_id.to_string(),
        start: Instant::now(),
        events: Vec::new(),
        error: Some(error),
    }
}

/// A run's events as the `publish` phase sends them.
pub(super) struct PublishRun {
    pub(super) run_id: String,
    /// The events (JSON), the gateway thread id replaced.
    pub(super) events: Vec<Bytes>,
}

/// The gateway's runs of each worker, moved to the worker's publish thread.
pub(super) fn publish_bodies(
    reads: &[RunRead],
    from: &[String],
    to: &[String],
) -> Result<Vec<Vec<PublishRun>>> {
    let mut out: Vec<Vec<PublishRun>> = (0..from.len()).map(|_| Vec::new()).collect();
    for r in reads {
        let old = format!("\"{}\"", from[r.worker]);
        let new = format!("\"{}\"", to[r.worker]);
        let events = r
            .events
            .iter()
            .map(|e| {
                let s = std::str::from_utf8(&e.data).map_err(|_| anyhow!("event not UTF-8"))?;
                Ok(Bytes::from(s.replace(&old, &new)))
            })
            .collect::<Result<Vec<_>>>()?;
        out[r.worker].push(PublishRun {
            run_id: r.run_id.clone(),
            events,
        });
    }
    Ok(out)
}

/// Publishes each worker's runs on its thread, one run after another; a [`RunRead`] per
/// run whose `events` hold the send time of each event.
pub(super) async fn publish_phase(
    ctx: &Ctx,
    threads: &[String],
    bodies: Vec<Vec<PublishRun>>,
    mode: Baseline,
) -> Vec<RunRead> {
    let mut tasks = Vec::new();
    for (w, runs) in bodies.into_iter().enumerate() {
        let target = ctx.target.clone();
        let sources = ctx.sources.clone();
        let path = ctx.target.path(&ctx.common.publish_path, &threads[w]);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut sender = match connect(&target, &sources).await {
                Ok(s) => s,
                Err(e) => {
                    return runs
                        .iter()
                        .map(|r| failed(w, &r.run_id, format!("{e:#}")))
                        .collect();
                }
            };
            for run in runs {
                let start = Instant::now();
                let mut read = RunRead {
                    worker: w,
                    run_id: run.run_id.clone(),
                    start,
                    events: Vec::new(),
                    error: None,
                };
                let posts: Vec<(Bytes, usize, &str)> = match mode {
                    Baseline::Event => run
                        .events
                        .iter()
                        .map(|e| (e.clone(), 1, "application/json"))
                        .collect(),
                    Baseline::Sse => {
                        let mut body = Vec::new();
                        for e in &run.events {
                            body.extend_from_slice(b"data: ");
                            body.extend_from_slice(e);
                            body.extend_from_slice(b"\n\n");
                        }
                        vec![(Bytes::from(body), run.events.len(), "text/event-stream")]
                    }
                };
                for (body, n, content_type) in posts {
                    let at = Instant::now();
                    let res = tokio::time::timeout(
                        REQUEST_TIMEOUT,
                        post(&mut sender, &target, &path, content_type, body),
                    )
                    .await
                    .unwrap_or_else(|_| Err(anyhow!("timed out")));
                    if let Err(e) = res {
                        read.error = Some(format!("{e:#}"));
                        break;
                    }
                    for _ in 0..n {
                        read.events.push(Seen {
                            id: None,
                            data: Bytes::new(),
                            at,
                        });
                    }
                }
                let broken = read.error.is_some();
                out.push(read);
                if broken {
                    break;
                }
            }
            out
        }));
    }
    let mut reads = Vec::new();
    for t in tasks {
        if let Ok(r) = t.await {
            reads.extend(r);
        }
    }
    reads
}

pub(super) async fn post(
    sender: &mut SendRequest<Full<Bytes>>,
    target: &Target,
    path: &str,
    content_type: &str,
    body: Bytes,
) -> Result<()> {
    sender.ready().await?;
    let req = request(target, hyper::Method::POST, path)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(body))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let text = resp.into_body().collect().await?.to_bytes();
    if status != 200 {
        bail!("status {status}: {}", String::from_utf8_lossy(&text));
    }
    Ok(())
}

/// Opens `per_thread` viewers (`GET …/events?from=start`) on each thread and waits until
/// every one has its response head.
///
/// # Errors
/// A viewer that cannot connect or gets another status than 200 within 10 s.
pub(super) async fn open_viewers(
    ctx: &Ctx,
    threads: &[String],
    per_thread: usize,
) -> Result<Vec<Viewer>> {
    let ready = Arc::new(AtomicUsize::new(0));
    let mut viewers = Vec::new();
    for (w, thread) in threads.iter().enumerate() {
        for _ in 0..per_thread {
            let target = ctx.target.clone();
            let sources = ctx.sources.clone();
            let path = format!(
                "{}?from=start",
                ctx.target.path(&ctx.common.subscribe_path, thread)
            );
            let log = Arc::new(Mutex::new(ViewerLog::default()));
            let (log2, ready2) = (log.clone(), ready.clone());
            let task = tokio::spawn(async move {
                let result: Result<()> = async {
                    let mut sender = connect(&target, &sources).await?;
                    let req = request(&target, hyper::Method::GET, &path).body(Full::default())?;
                    let resp = sender.send_request(req).await?;
                    if resp.status() != 200 {
                        bail!("subscribe status {}", resp.status());
                    }
                    ready2.fetch_add(1, Ordering::Relaxed);
                    read_sse(resp.into_body(), |s| {
                        // The lock is this viewer's and the drain's only, held for a push.
                        if let Ok(mut l) = log2.lock() {
                            l.seen.push(s);
                        }
                    })
                    .await?;
                    bail!("the stream ended")
                }
                .await;
                if let (Err(e), Ok(mut l)) = (result, log2.lock()) {
                    l.error = Some(format!("{e:#}"));
                }
            });
            viewers.push(Viewer {
                worker: w,
                log,
                task,
            });
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready.load(Ordering::Relaxed) < viewers.len() {
        if let Some(e) = viewers
            .iter()
            .find_map(|v| v.log.lock().ok().and_then(|l| l.error.clone()))
        {
            close(viewers);
            bail!("a viewer failed: {e}");
        }
        if Instant::now() > deadline {
            close(viewers);
            bail!("viewers not connected within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(viewers)
}

/// Waits until every viewer holds as many events as its thread's callers got (or
/// `timeout` seconds), then takes their logs.
pub(super) async fn drain(
    viewers: &[Viewer],
    expected: &[Vec<(Option<String>, Bytes)>],
    timeout: f64,
) -> Vec<(usize, ViewerLog)> {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
    loop {
        let behind = viewers.iter().any(|v| {
            v.log
                .lock()
                .is_ok_and(|l| l.seen.len() < expected[v.worker].len() && l.error.is_none())
        });
        if !behind || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    viewers
        .iter()
        .map(|v| {
            let log = v
                .log
                .lock()
                .map(|mut l| std::mem::take(&mut *l))
                .unwrap_or_default();
            (v.worker, log)
        })
        .collect()
}

pub(super) fn close(viewers: Vec<Viewer>) {
    for v in viewers {
        v.task.abort();
    }
}
