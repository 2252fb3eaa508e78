//! A test SSE client: reqwest for HTTP, the tests' one strict wire parser ([`super::sse`]) for
//! frames, so every frame read also checks the wire rules of PROTOCOL §3 (LF only, the broker's
//! fields only).

use super::sse::{parse_frame, split_frame};
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::pin::Pin;
use std::time::Duration;

/// One received event.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    /// The `id:` field.
    pub id: String,
    /// The `data:` parsed as JSON.
    pub data: Value,
}

/// An open subscription.
pub struct Subscription {
    raw: RawStream,
    /// The parser's last-event-id buffer (WHATWG HTML §9.2): the last `id:` seen.
    last_id: String,
    /// Response headers.
    pub headers: reqwest::header::HeaderMap,
}

/// Opens `GET {base}/v1/threads/{thread}/events{query}` with an optional `Last-Event-ID`.
pub async fn subscribe(
    base: &str,
    thread: &str,
    query: &str,
    last_event_id: Option<&str>,
) -> Subscription {
    let raw = open_raw(base, thread, query, last_event_id).await;
    assert_eq!(raw.status, 200, "subscribe status");
    Subscription {
        headers: raw.headers.clone(),
        raw,
        last_id: String::new(),
    }
}

impl Subscription {
    /// The next event with data, or `None` when the stream ended or `timeout` passed.
    pub async fn next(&mut self, timeout: Duration) -> Option<Received> {
        self.next_text(timeout).await.map(|r| Received {
            id: r.id,
            data: r.data,
        })
    }

    /// Collects exactly `n` events (panics with what it got if they do not come in `timeout`
    /// each).
    pub async fn take(&mut self, n: usize, timeout: Duration) -> Vec<Received> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.next(timeout).await {
                Some(r) => out.push(r),
                None => panic!("stream ended or stalled after {} of {n} events", out.len()),
            }
        }
        out
    }
}

/// Publishes `events` (a JSON array body) and returns the reply.
pub async fn publish(base: &str, thread: &str, events: &[Value]) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(events).unwrap())
        .send()
        .await
        .expect("publish request")
}

/// `POST {base}/v1/threads/{thread}/events` with an SSE body (an SSE ingest).
pub async fn publish_sse(base: &str, thread: &str, body: String) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events"))
        .header("content-type", "text/event-stream")
        .body(body)
        .send()
        .await
        .expect("SSE ingest request")
}

/// Event ids compare in log order: `<epoch>-<ms>-<seq>` within one epoch. The mark on the
/// first event of a reset bridge, `<epoch>-<ms>-<seq>-bridge`, sorts right after the id it
/// names (the last component is `true` for it).
pub fn id_key(id: &str) -> (String, u64, u64, bool) {
    let (id, bridge) = match id.strip_suffix("-bridge") {
        Some(id) => (id, true),
        None => (id, false),
    };
    let mut parts = id.splitn(3, '-');
    let epoch = parts.next().unwrap().to_string();
    let ms = parts.next().unwrap().parse().unwrap();
    let seq = parts.next().unwrap().parse().unwrap();
    (epoch, ms, seq, bridge)
}

/// Asserts that ids strictly increase.
pub fn assert_strictly_increasing(received: &[Received]) {
    for w in received.windows(2) {
        assert!(
            id_key(&w[0].id) < id_key(&w[1].id),
            "ids not increasing: {} then {}",
            w[0].id,
            w[1].id
        );
    }
}

/// One received event with its `data` text exactly as it came over the wire.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedText {
    /// The `id:` field (the parser's last-event-id buffer).
    pub id: String,
    /// The `data:` text.
    pub text: String,
    /// The `data:` parsed as JSON.
    pub data: Value,
}

impl Subscription {
    /// Like [`Subscription::next`], keeping the data text.
    pub async fn next_text(&mut self, timeout: Duration) -> Option<ReceivedText> {
        loop {
            let frame = self.raw.next_frame_within(timeout).await?;
            if let Some(id) = frame.id {
                self.last_id = id;
            }
            let Some(text) = frame.data.filter(|d| !d.is_empty()) else {
                continue;
            };
            let data = serde_json::from_str(&text).expect("data is JSON");
            return Some(ReceivedText {
                id: self.last_id.clone(),
                text,
                data,
            });
        }
    }

    /// Like [`Subscription::take`], keeping the data text.
    pub async fn take_text(&mut self, n: usize, timeout: Duration) -> Vec<ReceivedText> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.next_text(timeout).await {
                Some(r) => out.push(r),
                None => panic!("stream ended or stalled after {} of {n} events", out.len()),
            }
        }
        out
    }
}

/// Asserts that the ids of `received` strictly increase.
pub fn assert_text_ids_increasing(received: &[ReceivedText]) {
    for w in received.windows(2) {
        assert!(
            id_key(&w[0].id) < id_key(&w[1].id),
            "ids not increasing: {} then {}",
            w[0].id,
            w[1].id
        );
    }
}

/// Publishes one event as a single JSON object body (as an agent streams, one POST per event).
pub async fn publish_one(base: &str, thread: &str, event: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(event).unwrap())
        .send()
        .await
        .expect("publish request")
}

/// Publishes `events` as a JSON array, asserts 200 and `count`, and returns the reply's
/// `(firstId, lastId)`.
pub async fn publish_ok(base: &str, thread: &str, events: &[Value]) -> (String, String) {
    let resp = publish(base, thread, events).await;
    let status = resp.status();
    let body: Value = resp.json().await.expect("publish reply is JSON");
    assert_eq!(status, 200, "publish of {} events: {body}", events.len());
    assert_eq!(body["count"], events.len(), "publish reply {body}");
    (
        body["firstId"].as_str().expect("firstId").to_string(),
        body["lastId"].as_str().expect("lastId").to_string(),
    )
}

/// One frame of a raw SSE stream (the text between blank lines), parsed by the strict parser.
pub use super::sse::Frame as RawFrame;

/// A subscription read as raw frames (comments and `retry:` included), for wire-level checks.
pub struct RawStream {
    /// Response status.
    pub status: reqwest::StatusCode,
    /// Response headers.
    pub headers: reqwest::header::HeaderMap,
    body: Pin<Box<dyn Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Send>>,
    buf: Vec<u8>,
    ended: bool,
}

/// Opens `GET {base}/v1/threads/{thread}/events{query}` without asserting the status.
pub async fn open_raw(
    base: &str,
    thread: &str,
    query: &str,
    last_event_id: Option<&str>,
) -> RawStream {
    let mut req = reqwest::Client::new().get(format!("{base}/v1/threads/{thread}/events{query}"));
    if let Some(id) = last_event_id {
        req = req.header("Last-Event-ID", id);
    }
    let resp = req.send().await.expect("subscribe request");
    RawStream {
        status: resp.status(),
        headers: resp.headers().clone(),
        body: Box::pin(resp.bytes_stream()),
        buf: Vec::new(),
        ended: false,
    }
}

impl RawStream {
    /// Reads `resp`'s body as SSE (any response: a gateway run's answer, say).
    pub fn from_response(resp: reqwest::Response) -> RawStream {
        RawStream {
            status: resp.status(),
            headers: resp.headers().clone(),
            body: Box::pin(resp.bytes_stream()),
            buf: Vec::new(),
            ended: false,
        }
    }

    /// The next complete frame; `None` when the stream ended (EOF or a transport error).
    /// Panics if nothing completes a frame within `timeout`.
    pub async fn next_frame(&mut self, timeout: Duration) -> Option<RawFrame> {
        loop {
            if let Some(frame) = self.take_frame() {
                return Some(frame);
            }
            if self.ended {
                return None;
            }
            match tokio::time::timeout(timeout, self.body.next()).await {
                Err(_) => panic!(
                    "no complete SSE frame within {timeout:?} (pending: {:?})",
                    String::from_utf8_lossy(&self.buf)
                ),
                Ok(Some(Ok(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(Some(Err(_))) | Ok(None) => self.ended = true,
            }
        }
    }

    /// The next complete frame; `None` when the stream ended or no frame completed within
    /// `timeout`.
    async fn next_frame_within(&mut self, timeout: Duration) -> Option<RawFrame> {
        let next = async {
            loop {
                if let Some(frame) = self.take_frame() {
                    return Some(frame);
                }
                if self.ended {
                    return None;
                }
                match self.body.next().await {
                    Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                    Some(Err(_)) | None => self.ended = true,
                }
            }
        };
        tokio::time::timeout(timeout, next).await.ok().flatten()
    }

    /// The complete frame at the start of the buffer, if any, taken out of it and parsed.
    /// Panics on a frame the strict parser refuses.
    fn take_frame(&mut self) -> Option<RawFrame> {
        let (frame, rest) = split_frame(&self.buf)?;
        let text = std::str::from_utf8(frame).expect("SSE is UTF-8");
        let parsed = parse_frame(text).unwrap_or_else(|e| panic!("{e}"));
        self.buf = rest.to_vec();
        Some(parsed)
    }

    /// The next frame that carries `data:` (skipping comments, `retry:` and heartbeats).
    pub async fn next_event(&mut self, timeout: Duration) -> Option<RawFrame> {
        loop {
            let f = self.next_frame(timeout).await?;
            if f.data.is_some() {
                return Some(f);
            }
        }
    }

    /// Every remaining frame until the stream ends (panics if it stalls for `timeout`), and
    /// the bytes left after the last complete frame.
    pub async fn read_to_end(&mut self, timeout: Duration) -> (Vec<RawFrame>, Vec<u8>) {
        let mut frames = Vec::new();
        while let Some(f) = self.next_frame(timeout).await {
            frames.push(f);
        }
        (frames, std::mem::take(&mut self.buf))
    }
}

/// The value of a Prometheus sample `name{labels}` at `{base}/metrics` (0 when absent).
/// `labels` must all be present on the sample; other labels are allowed.
pub async fn metric(base: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("metrics request")
        .text()
        .await
        .expect("metrics body");
    let mut total = 0.0;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric_name, label_text) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric_name != name {
            continue;
        }
        let all = labels
            .iter()
            .all(|(k, v)| label_text.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        if all {
            total += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    total
}
