//! The real `@ag-ui/client` 1.0.0 as the judge of what the broker sends (PROTOCOL §4.5), through
//! `tests/node/agui-fold.mjs`, and the building blocks of the conformance scenarios:
//!
//! - [`run_cases`]: plays raw SSE bodies through the client's whole pipeline (transport parse →
//!   compat → enforce → `transformChunks` → `verifyEvents` → `defaultApplyEvents`) and returns
//!   whether each case passed and what it folded to;
//! - [`client_case`]: turns the raw bodies of one client's successive connections into what the
//!   client has to accept, split into streams the way PROTOCOL §4.5 says;
//! - [`Publisher`], [`spawn_reader`], [`read_until`], [`read_log`]: publish a source one event per
//!   POST (refused events skipped and noted) and keep what subscribers receive byte for byte;
//! - [`Source`], [`recorded_sources`], [`conformance_sources`]: the recorded streams and the
//!   conformance fixtures whose `expect.outcome` is `completed`;
//! - [`Comparison`], [`judge`]: one client run against the fold of the full log (and a fixture's
//!   `expect` block), all cases of a test in one `node` process.

use super::fixtures;
use super::sse_client::{self, RawStream};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::sync::watch;

/// Longest wait for any one SSE frame.
pub const FRAME_WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The client

/// One client: a fresh `HttpAgent` (no messages, state `{}`) that plays `bodies` in order, one
/// `runAgent()` (one HTTP response, so one fresh verifier) per body.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Case {
    /// Unique within one [`run_cases`] call.
    pub name: String,
    /// The agent's `threadId` (only sent in the request; the client checks no event against it).
    pub thread_id: String,
    /// Raw SSE text of each HTTP response, in order.
    pub bodies: Vec<String>,
}

/// One body that failed.
#[derive(Clone, Debug, Deserialize)]
pub struct BodyError {
    /// Index into [`Case::bodies`].
    pub body: usize,
    /// The client's error message, e.g. `First event must be 'RUN_STARTED'`.
    pub error: String,
}

/// What the client made of a [`Case`].
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseResult {
    /// [`Case::name`].
    pub name: String,
    /// Every body passed (no `runAgent()` rejected).
    pub ok: bool,
    /// The first failure's message.
    pub error: Option<String>,
    /// The first failed body's index.
    pub failed_body: Option<usize>,
    /// Every failure (later bodies still run after a failed one, as a client would go on).
    #[serde(default)]
    pub errors: Vec<BodyError>,
    /// `agent.messages` after the last body.
    pub messages: Value,
    /// `agent.state` after the last body.
    pub state: Value,
    /// The `console.warn` lines the client emitted.
    pub warnings: Vec<String>,
    /// Every `CUSTOM` event an app's `onCustomEvent` subscriber got, as `{name, value}`, in
    /// order.
    #[serde(default)]
    pub custom: Vec<Value>,
}

/// `tests/node`.
pub fn node_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node")
}

/// Runs `cases` through `@ag-ui/client` 1.0.0 (one `node tests/node/agui-fold.mjs` process) and
/// returns one result per case, in order.
///
/// Panics when `tests/node/node_modules` lacks the client (run `npm ci --prefix tests/node`),
/// when `node` is missing, or when the script fails.
pub fn run_cases(cases: &[Case]) -> Vec<CaseResult> {
    if cases.is_empty() {
        return Vec::new();
    }
    let dir = node_dir();
    assert!(
        dir.join("node_modules/@ag-ui/client/package.json").exists(),
        "tests/node/node_modules has no @ag-ui/client: run `npm ci --prefix tests/node` first \
         (scripts/test.sh does it)"
    );
    let mut input = tempfile::NamedTempFile::new().expect("temp file for the cases");
    serde_json::to_writer(&mut input, &serde_json::json!({ "cases": cases }))
        .expect("write the cases");
    input.flush().expect("flush the cases");
    let output = Command::new("node")
        .arg(dir.join("agui-fold.mjs"))
        .arg(input.path())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `node` (Node.js 20+ is needed): {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "agui-fold.mjs failed ({}):\n--- stderr\n{}\n--- stdout\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        truncate(&stdout, 2000)
    );
    #[derive(Deserialize)]
    struct Output {
        results: Vec<CaseResult>,
    }
    let out: Output = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("agui-fold.mjs output is not the expected JSON ({e})"));
    assert_eq!(out.results.len(), cases.len(), "one result per case");
    for (c, r) in cases.iter().zip(&out.results) {
        assert_eq!(c.name, r.name, "results in case order");
    }
    out.results
}

// ---------------------------------------------------------------------------------------------
// Bodies as the client sees them

/// The events of a raw SSE body of whole frames, read with the strict parser
/// ([`super::sse::body_events`]). On what the broker writes (one `data:` line per frame) this is
/// what `@ag-ui/client` reads too (AGUI.md §4.2: `data:` lines, one optional space removed,
/// joined with `\n`; a frame without data skipped). Panics on a body the parser refuses or
/// data that is not JSON (the broker never sends such).
pub fn body_events(body: &str) -> Vec<Value> {
    super::sse::body_events(body.as_bytes())
}

/// True for the first event of a prelude or bridge: a `RUN_STARTED` whose metadata holds
/// `{"agui-fanout": {"prelude": true}}` (PROTOCOL §5).
pub fn is_prelude_start(event: &Value) -> bool {
    event["type"] == "RUN_STARTED" && event["metadata"]["agui-fanout"]["prelude"] == true
}

/// `body` cut after its last complete frame: what a client keeps of a connection that was cut
/// (an incomplete frame is discarded at the disconnect).
pub fn complete_frames(body: &str) -> &str {
    match body.rfind("\n\n") {
        Some(end) => &body[..end + 2],
        None => "",
    }
}

/// The streams one client's successive connections make for `verifyEvents` (PROTOCOL §4.5): a
/// connection that begins with a prelude starts a new stream (it has to pass on its own); any
/// other connection resumed exactly and continues the previous stream (their concatenation has
/// to pass as one stream). The first connection always starts a stream. Each body is cut after
/// its last complete frame first.
pub fn client_streams(connections: &[String]) -> Vec<String> {
    let mut streams: Vec<String> = Vec::new();
    for body in connections {
        let body = complete_frames(body);
        let prelude = body_events(body).first().is_some_and(is_prelude_start);
        match streams.last_mut() {
            Some(stream) if !prelude => stream.push_str(body),
            _ => streams.push(body.to_string()),
        }
    }
    streams
}

/// The [`Case`] a client that made `connections` (raw bodies, in order) has to pass.
pub fn client_case(name: &str, thread_id: &str, connections: &[String]) -> Case {
    Case {
        name: name.to_string(),
        thread_id: thread_id.to_string(),
        bodies: client_streams(connections),
    }
}

// ---------------------------------------------------------------------------------------------
// Publishing and reading

/// An event the broker refused at publish (4xx), skipped.
#[derive(Clone, Debug)]
pub struct Skipped {
    /// Index in the source.
    pub index: usize,
    /// The event's `type`.
    pub event_type: String,
    /// HTTP status.
    pub status: u16,
    /// The reply body.
    pub reply: String,
}

/// Publishes a source to one thread, one event per POST (as an agent streams), keeping what was
/// accepted and noting what was refused.
pub struct Publisher {
    base: String,
    thread: String,
    /// The accepted events, in order.
    pub accepted: Vec<Value>,
    /// Their ids.
    pub ids: Vec<String>,
    /// The refused ones.
    pub skipped: Vec<Skipped>,
}

impl Publisher {
    /// A publisher to `thread` on the broker at `base`.
    pub fn new(base: &str, thread: &str) -> Publisher {
        Publisher {
            base: base.to_string(),
            thread: thread.to_string(),
            accepted: Vec::new(),
            ids: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// Publishes `event` (number `index` of its source); returns its id, or `None` when the
    /// broker refused it with a 4xx (noted in [`Publisher::skipped`]). Panics on any other
    /// status.
    pub async fn publish(&mut self, index: usize, event: &Value) -> Option<String> {
        let resp = sse_client::publish_one(&self.base, &self.thread, event).await;
        let status = resp.status();
        let reply = resp.text().await.expect("publish reply");
        if status.is_client_error() {
            self.skipped.push(Skipped {
                index,
                event_type: event["type"].as_str().unwrap_or("?").to_string(),
                status: status.as_u16(),
                reply,
            });
            return None;
        }
        assert_eq!(status, 200, "publish of event #{index}: {reply}");
        let reply: Value = serde_json::from_str(&reply).expect("publish reply is JSON");
        let id = reply["lastId"].as_str().expect("lastId").to_string();
        self.accepted.push(event.clone());
        self.ids.push(id.clone());
        Some(id)
    }

    /// Publishes every event of `events` in order.
    pub async fn publish_all(&mut self, events: &[Value]) {
        for (i, e) in events.iter().enumerate() {
            self.publish(i, e).await;
        }
    }

    /// The id of the last accepted event.
    pub fn last_id(&self) -> Option<&str> {
        self.ids.last().map(String::as_str)
    }

    /// One line per refused event, e.g. `#3 STATE_DELTA: 422 {"error":…}`.
    pub fn skipped_notes(&self) -> Vec<String> {
        self.skipped
            .iter()
            .map(|s| {
                format!(
                    "#{} {}: {} {}",
                    s.index,
                    s.event_type,
                    s.status,
                    truncate(&s.reply, 200)
                )
            })
            .collect()
    }
}

/// Reads `raw` until a frame with `id: last_id` arrived and returns everything read, byte for
/// byte (complete frames only; `retry:`, comments and heartbeats included). The stream stays
/// open: drop `raw` to close it. Panics if the stream ends first or stalls for [`FRAME_WAIT`].
pub async fn read_until(raw: &mut RawStream, last_id: &str) -> String {
    let mut body = String::new();
    loop {
        let Some(frame) = raw.next_frame(FRAME_WAIT).await else {
            panic!(
                "stream ended before id {last_id}; got:\n{}",
                truncate(&body, 2000)
            );
        };
        body.push_str(&frame.text);
        body.push_str("\n\n");
        if frame.id.as_deref() == Some(last_id) {
            return body;
        }
    }
}

/// Reads `raw` in a task from now on (so its queue never fills while the test publishes) until a
/// frame carries the id that `until` eventually names, and returns the body read, byte for byte.
/// Panics (in the task) if the stream ends first or stalls for [`FRAME_WAIT`].
pub fn spawn_reader(
    mut raw: RawStream,
    mut until: watch::Receiver<Option<String>>,
) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut body = String::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut target_open = true;
        loop {
            let done = until.borrow().as_ref().is_some_and(|t| seen.contains(t));
            if done {
                return body;
            }
            tokio::select! {
                frame = raw.next_frame(FRAME_WAIT) => {
                    let Some(frame) = frame else {
                        panic!(
                            "stream ended before id {:?}; got:\n{}",
                            until.borrow().clone(),
                            truncate(&body, 2000)
                        );
                    };
                    body.push_str(&frame.text);
                    body.push_str("\n\n");
                    if let Some(id) = frame.id {
                        seen.insert(id);
                    }
                }
                changed = until.changed(), if target_open => {
                    target_open = changed.is_ok();
                }
            }
        }
    })
}

/// Opens a subscription (asserting 200) and reads it in a task, see [`spawn_reader`].
pub async fn subscribe_reader(
    base: &str,
    thread: &str,
    last_event_id: Option<&str>,
    until: watch::Receiver<Option<String>>,
) -> tokio::task::JoinHandle<String> {
    let raw = sse_client::open_raw(base, thread, "", last_event_id).await;
    assert_eq!(raw.status, 200, "subscribe status");
    spawn_reader(raw, until)
}

/// The full log of `thread` (`?from=start`) up to `last_id`, byte for byte.
pub async fn read_log(base: &str, thread: &str, last_id: &str) -> String {
    let mut raw = sse_client::open_raw(base, thread, "?from=start", None).await;
    assert_eq!(raw.status, 200, "from=start status");
    read_until(&mut raw, last_id).await
}

// ---------------------------------------------------------------------------------------------
// Sources

/// An AG-UI event stream to publish.
#[derive(Clone, Debug)]
pub struct Source {
    /// Short name, unique among sources.
    pub name: String,
    /// The events as recorded (their own `threadId`s).
    pub events: Vec<Value>,
    /// A conformance fixture's `expect` block.
    pub expect: Option<Value>,
}

impl Source {
    /// The events with every `threadId` set to `thread`.
    pub fn retargeted(&self, thread: &str) -> Vec<Value> {
        let mut events = self.events.clone();
        fixtures::retarget(&mut events, thread);
        events
    }
}

/// The recorded .NET server responses, named `StepNN/<test>#Turn_NN`.
pub fn recorded_sources() -> Vec<Source> {
    fixtures::recorded_responses()
        .into_iter()
        .map(|path| {
            let step = path
                .parent()
                .and_then(Path::file_name)
                .map(|s| {
                    s.to_string_lossy()
                        .split('_')
                        .next()
                        .unwrap_or("")
                        .to_string()
                })
                .unwrap_or_default();
            let file = path.file_name().unwrap().to_string_lossy();
            let test = file.split('.').next().unwrap_or(&file).to_string();
            Source {
                name: format!("{step}/{test}"),
                events: fixtures::read_events(&path),
                expect: None,
            }
        })
        .collect()
}

/// The conformance fixtures of `conformance-streams/<spec>/` whose `expect.outcome` is
/// `completed`, sorted by name.
pub fn conformance_sources(spec: &str) -> Vec<Source> {
    let dir = fixtures::root()
        .join("agui-recorded/conformance-streams")
        .join(spec);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let fixture: Value = serde_json::from_str(text.trim_start_matches('\u{feff}'))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (fixture["expect"]["outcome"] == "completed").then(|| Source {
                name: format!("{spec}/{}", fixture["name"].as_str().expect("name")),
                events: fixture["stream"].as_array().expect("stream").clone(),
                expect: Some(fixture["expect"].clone()),
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Judging

/// One client run to judge against the fold of the full log.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// What the failure report calls it, e.g. `memory/live/Step01/...`.
    pub label: String,
    /// The client's case (see [`client_case`]); must pass.
    pub subject: Case,
    /// The full log as one body (`?from=start`); must pass, and the subject's messages and state
    /// must equal its. Comparisons may share a reference (same [`Case::name`]).
    pub reference: Case,
    /// A conformance fixture's `expect` block, checked against the reference's fold (only give
    /// it when the whole source was published: a refused event changes what it describes).
    pub expect: Option<Value>,
}

/// Runs every subject and reference of `comparisons` through the client (one `node` process)
/// and returns one line per failed check: a subject or reference that did not pass, a subject
/// whose messages or state differ from its reference's, a reference that contradicts `expect`.
pub fn judge(comparisons: &[Comparison]) -> Vec<String> {
    let mut cases: Vec<Case> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for c in comparisons {
        for case in [&c.reference, &c.subject] {
            if !index.contains_key(&case.name) {
                index.insert(case.name.clone(), cases.len());
                cases.push(case.clone());
            }
        }
    }
    let results = run_cases(&cases);
    let mut failures = Vec::new();
    let mut reported_refs = HashSet::new();
    for c in comparisons {
        let subject = &results[index[&c.subject.name]];
        let reference = &results[index[&c.reference.name]];
        if !reference.ok {
            if reported_refs.insert(c.reference.name.clone()) {
                failures.push(format!(
                    "{}: the full log fails in the client: body {:?}: {}",
                    c.label,
                    reference.failed_body,
                    reference.error.as_deref().unwrap_or("")
                ));
            }
            continue;
        }
        if let Some(expect) = &c.expect
            && reported_refs.insert(format!("{} expect", c.reference.name))
        {
            for diff in expect_diff(reference, expect) {
                failures.push(format!("{}: full log vs fixture expect: {diff}", c.label));
            }
        }
        if !subject.ok {
            failures.push(format!(
                "{}: the client fails body {:?} of {}: {}",
                c.label,
                subject.failed_body,
                c.subject.bodies.len(),
                subject.error.as_deref().unwrap_or("")
            ));
        }
        if let Some(diff) = fold_diff(subject, reference) {
            failures.push(format!(
                "{}: fold differs from the full log's: {diff}",
                c.label
            ));
        }
    }
    failures
}

/// `None` when `got` and `want` folded to the same messages and state, else what differs.
pub fn fold_diff(got: &CaseResult, want: &CaseResult) -> Option<String> {
    let mut diffs = Vec::new();
    if got.messages != want.messages {
        diffs.push(messages_diff(&got.messages, &want.messages));
    }
    if got.state != want.state {
        diffs.push(format!(
            "state {} vs {}",
            truncate(&got.state.to_string(), 200),
            truncate(&want.state.to_string(), 200)
        ));
    }
    (!diffs.is_empty()).then(|| diffs.join("; "))
}

fn messages_diff(got: &Value, want: &Value) -> String {
    let empty = Vec::new();
    let g = got.as_array().unwrap_or(&empty);
    let w = want.as_array().unwrap_or(&empty);
    let first = g.iter().zip(w).position(|(a, b)| a != b);
    match first {
        Some(i) => format!(
            "{} vs {} messages, first difference at #{i}: {} vs {}",
            g.len(),
            w.len(),
            truncate(&g[i].to_string(), 300),
            truncate(&w[i].to_string(), 300)
        ),
        None => format!(
            "{} vs {} messages (one is a prefix of the other)",
            g.len(),
            w.len()
        ),
    }
}

/// What of a conformance fixture's `expect` block `got` contradicts: `messageCount`,
/// `messages` (each expected message's keys must equal the folded one's; ids may be left
/// out), `state`, `noWarnings` (the 1.0 client's warning about a newer declared
/// `protocolVersion` aside), `warnings` (each a substring of some warning).
pub fn expect_diff(got: &CaseResult, expect: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let msgs = got.messages.as_array().cloned().unwrap_or_default();
    if let Some(n) = expect["messageCount"].as_u64()
        && msgs.len() as u64 != n
    {
        out.push(format!("{} messages, expected {n}", msgs.len()));
    }
    if let Some(want) = expect["messages"].as_array() {
        if want.len() != msgs.len() {
            out.push(format!("{} messages, expected {}", msgs.len(), want.len()));
        }
        for (i, (w, g)) in want.iter().zip(&msgs).enumerate() {
            let fits = w
                .as_object()
                .is_some_and(|w| w.iter().all(|(k, v)| g.get(k) == Some(v)));
            if !fits {
                out.push(format!("message #{i} is {g}, expected {w}"));
            }
        }
    }
    if let Some(state) = expect.get("state")
        && &got.state != state
    {
        out.push(format!("state is {}, expected {state}", got.state));
    }
    // The spec-1.1 fixtures declare `protocolVersion: "1.1"`, which a 1.0 client answers with
    // one warning about the declaration itself; `noWarnings` is about the events.
    let warnings: Vec<&String> = got
        .warnings
        .iter()
        .filter(|w| !w.starts_with("[ag-ui] The producer speaks protocol"))
        .collect();
    if expect["noWarnings"] == true && !warnings.is_empty() {
        out.push(format!("expected no warnings, got {warnings:?}"));
    }
    for w in expect["warnings"].as_array().into_iter().flatten() {
        let w = w.as_str().unwrap_or("");
        if !got.warnings.iter().any(|g| g.contains(w)) {
            out.push(format!("no warning containing {w:?} in {:?}", got.warnings));
        }
    }
    out
}

/// `s` cut to at most `max` bytes (on a char boundary), with `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Runs `plan` through `tests/node/gateway-run.mjs` (the real `HttpAgent` running turns
/// through the gateway) and returns what it prints.
pub async fn run_gateway_plan(plan: Value) -> Value {
    tokio::task::spawn_blocking(move || {
        let mut file = tempfile::NamedTempFile::new().expect("a temp file");
        serde_json::to_writer(&mut file, &plan).expect("write the plan");
        std::io::Write::flush(&mut file).expect("flush the plan");
        let out = std::process::Command::new("node")
            .arg(node_dir().join("gateway-run.mjs"))
            .arg(file.path())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("node runs (Node.js 20+; `npm ci --prefix tests/node`)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "gateway-run.mjs failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(stdout.trim()).expect("gateway-run.mjs prints JSON")
    })
    .await
    .expect("the node run")
}
