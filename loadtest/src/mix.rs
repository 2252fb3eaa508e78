//! The realistic event mixes, `tokens` and `agent`: each thread's events are a pure function
//! of (thread, sequence number), valid under the broker's order rules, looped in cycles with
//! fresh message, tool call and run ids, and every event carries a mark with its sequence
//! number and send time where the broker's coalescing keeps it (see [`write_mark`]).
//!
//! A thread is opened (unmeasured) with [`Script::open`]: a `RUN_STARTED` of run `<thread>-run-0`
//! (and, for `agent`, the recorded initial `STATE_SNAPSHOT`). Measured event `seq` is then
//! position `seq % len` of cycle `seq / len`; each cycle ends with the run's `RUN_FINISHED` and
//! the next run's `RUN_STARTED`, so a cycle can follow any other.

use std::io::Write;
use std::sync::LazyLock;

/// Opens a mark: `~@<seq>:<ts>@~` (plain ASCII that JSON never escapes).
pub const MARK_OPEN: &[u8] = b"~@";

/// Writes the mark of event `seq` sent at `ts_ns`.
///
/// Where it goes, by event type, so that a coalesced frame still holds every merged event's
/// mark: at the end of the `delta` text of `TEXT_MESSAGE_CONTENT`, `REASONING_MESSAGE_CONTENT`
/// and `TOOL_CALL_ARGS` (coalescing concatenates the deltas byte for byte); in the value of the
/// `add /items/-` operation of a `STATE_DELTA` (coalescing concatenates the operations); in a
/// top-level `lt` field of every other event (the broker keeps unknown fields as sent, and
/// never merges these events).
pub fn write_mark(out: &mut Vec<u8>, seq: u64, ts_ns: u64) {
    let _ = write!(out, "~@{seq}:{ts_ns}@~");
}

/// One piece of an event template.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    /// Bytes as they are.
    Lit(Vec<u8>),
    /// The thread id.
    Thread,
    /// The cycle number.
    Cycle,
    /// The next cycle's number (the next run's `RUN_STARTED`).
    NextCycle,
    /// The event's mark.
    Mark,
    /// One to eight words of the text corpus, each after a space, chosen by the sequence number.
    Words,
}

/// Placeholders in a template's JSON, and what they become. A number placeholder is a JSON
/// string whose quotes go too (it stands for a bare number).
const PLACEHOLDERS: [(&str, Piece); 6] = [
    ("\"@@CNUM@@\"", Piece::Cycle),
    ("@@T@@", Piece::Thread),
    ("@@C@@", Piece::Cycle),
    ("@@N@@", Piece::NextCycle),
    ("@@M@@", Piece::Mark),
    ("@@W@@", Piece::Words),
];

/// An event with holes for the per-thread, per-cycle and per-event parts.
#[derive(Clone, Debug)]
struct Template(Vec<Piece>);

impl Template {
    /// Splits serialised JSON at its placeholders.
    fn parse(json: &str) -> Template {
        let mut pieces = Vec::new();
        let mut rest = json;
        loop {
            let next = PLACEHOLDERS
                .iter()
                .filter_map(|(p, piece)| rest.find(p).map(|at| (at, p.len(), piece)))
                .min_by_key(|(at, len, _)| (*at, usize::MAX - len));
            let Some((at, len, piece)) = next else {
                if !rest.is_empty() {
                    pieces.push(Piece::Lit(rest.as_bytes().to_vec()));
                }
                return Template(pieces);
            };
            if at > 0 {
                pieces.push(Piece::Lit(rest.as_bytes()[..at].to_vec()));
            }
            pieces.push(piece.clone());
            rest = &rest[at + len..];
        }
    }

    /// A template from an event built as a JSON value.
    fn of(v: &serde_json::Value) -> Template {
        Template::parse(&v.to_string())
    }
}

/// A looped event sequence.
#[derive(Debug)]
pub struct Script {
    /// What opens a thread (unmeasured): a `RUN_STARTED`, maybe more.
    open: Vec<Template>,
    /// One cycle: inside the run, then `RUN_FINISHED` and the next `RUN_STARTED`.
    cycle: Vec<Template>,
    /// Words for [`Piece::Words`], JSON-escaped.
    words: Vec<String>,
}

/// SplitMix64: a cheap, well-mixed hash of the sequence number (deterministic, so a retried
/// batch is the same bytes).
fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Script {
    /// Events in one cycle.
    pub fn cycle_len(&self) -> u64 {
        self.cycle.len() as u64
    }

    /// Appends measured event `seq` of `thread`, stamped `ts_ns`.
    pub fn write(&self, out: &mut Vec<u8>, thread: &str, seq: u64, ts_ns: u64) {
        let len = self.cycle_len().max(1);
        let (cycle, pos) = (seq / len, (seq % len) as usize);
        self.emit(out, &self.cycle[pos], thread, cycle, seq, ts_ns);
    }

    /// The JSON body that opens `thread` (one event, or an array of them).
    pub fn open(&self, thread: &str) -> Vec<u8> {
        let mut out = Vec::new();
        if self.open.len() > 1 {
            out.push(b'[');
        }
        for (i, t) in self.open.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            self.emit(&mut out, t, thread, 0, 0, 0);
        }
        if self.open.len() > 1 {
            out.push(b']');
        }
        out
    }

    fn emit(&self, out: &mut Vec<u8>, t: &Template, thread: &str, cycle: u64, seq: u64, ts: u64) {
        for p in &t.0 {
            match p {
                Piece::Lit(b) => out.extend_from_slice(b),
                Piece::Thread => out.extend_from_slice(thread.as_bytes()),
                Piece::Cycle => {
                    let _ = write!(out, "{cycle}");
                }
                Piece::NextCycle => {
                    let _ = write!(out, "{}", cycle + 1);
                }
                Piece::Mark => write_mark(out, seq, ts),
                Piece::Words => {
                    let h = mix64(seq);
                    let n = 1 + (h % 8) as usize;
                    let start = ((h >> 8) % self.words.len().max(1) as u64) as usize;
                    for i in 0..n {
                        if let Some(w) = self.words.get((start + i) % self.words.len()) {
                            out.push(b' ');
                            out.extend_from_slice(w.as_bytes());
                        }
                    }
                }
            }
        }
    }
}

/// The recorded runs the mixes are built from (tests/fixtures/agui-recorded, see SOURCES.md).
mod recorded {
    /// .NET AG-UI server, backend tool call: tool call, result, streamed answer.
    pub const BACKEND_TOOLS: &str = include_str!(
        "../../tests/fixtures/agui-recorded/dotnet-getting-started-baselines/Step02_BackendTools/PostRun_WithBackendToolCall_InvokesToolAndStreamsResult#Turn_01.06.Response.Server.AGUI.verified.json"
    );
    /// .NET AG-UI server, a long streamed answer (693 token deltas): the `tokens` corpus.
    pub const LONG_ANSWER: &str = include_str!(
        "../../tests/fixtures/agui-recorded/dotnet-getting-started-baselines/Step06_RawEvents/PostRun_ForwardsLlmUsageAsRawEvents#Turn_01.06.Response.Server.AGUI.verified.json"
    );
    /// Dart SDK named sequences: state, reasoning and step events.
    pub const DART_EVENTS: &str =
        include_str!("../../tests/fixtures/agui-recorded/dart-sdk-fixtures/events.json");
}

/// Parses a recorded event list (the .NET files start with a UTF-8 BOM).
fn events(json: &str) -> Vec<serde_json::Value> {
    serde_json::from_str(json.trim_start_matches('\u{feff}')).unwrap_or_default()
}

/// A named sequence of the Dart SDK fixtures.
fn dart(name: &str) -> Vec<serde_json::Value> {
    let all: serde_json::Value = serde_json::from_str(recorded::DART_EVENTS).unwrap_or_default();
    all.get(name)
        .and_then(|v| v.as_array())
        .cloned()
        .unwrap_or_default()
}

/// The run-closing and run-opening events that end every cycle.
fn run_boundary(finished: serde_json::Value) -> Vec<Template> {
    let mut fin = finished;
    fin["threadId"] = "@@T@@".into();
    fin["runId"] = "@@T@@-run-@@C@@".into();
    fin["lt"] = "@@M@@".into();
    let start = serde_json::json!({
        "type": "RUN_STARTED", "threadId": "@@T@@", "runId": "@@T@@-run-@@N@@", "lt": "@@M@@"
    });
    vec![Template::of(&fin), Template::of(&start)]
}

/// The opening `RUN_STARTED`.
fn run_zero() -> Template {
    Template::of(&serde_json::json!({
        "type": "RUN_STARTED", "threadId": "@@T@@", "runId": "@@T@@-run-0"
    }))
}

/// Words of the recorded long answer, JSON-escaped (the `tokens` corpus).
fn corpus() -> Vec<String> {
    let text: String = events(recorded::LONG_ANSWER)
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .filter_map(|e| e["delta"].as_str().map(str::to_owned))
        .collect();
    text.split_whitespace()
        .map(|w| {
            let s = serde_json::to_string(w).unwrap_or_default();
            s[1..s.len().saturating_sub(1)].to_string()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Messages per run of the `tokens` mix.
const TOKEN_MESSAGES: usize = 4;
/// `TEXT_MESSAGE_CONTENT` deltas per message of the `tokens` mix.
const TOKEN_DELTAS: usize = 30;

/// `tokens`: runs of assistant messages streamed as deltas of 1-8 words.
pub static TOKENS: LazyLock<Script> = LazyLock::new(|| {
    let mut cycle = Vec::new();
    for m in 0..TOKEN_MESSAGES {
        let id = format!("m-@@C@@-{m}");
        cycle.push(Template::of(&serde_json::json!({
            "type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant", "lt": "@@M@@"
        })));
        for _ in 0..TOKEN_DELTAS {
            cycle.push(Template::of(&serde_json::json!({
                "type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": "@@W@@@@M@@"
            })));
        }
        cycle.push(Template::of(&serde_json::json!({
            "type": "TEXT_MESSAGE_END", "messageId": id, "lt": "@@M@@"
        })));
    }
    cycle.extend(run_boundary(serde_json::json!({"type": "RUN_FINISHED"})));
    Script {
        open: vec![run_zero()],
        cycle,
        words: corpus(),
    }
});

/// Splits a tool call's arguments into chunks the way models stream them (a few characters
/// each, cut after spaces and punctuation).
fn arg_chunks(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in args.chars() {
        cur.push(c);
        if cur.len() >= 6 && matches!(c, ' ' | ',' | ':' | '{' | '}' | '"' | '\n') {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Gives an event of the recorded runs its fresh per-cycle ids and its mark.
fn retarget(mut e: serde_json::Value) -> serde_json::Value {
    let Some(obj) = e.as_object_mut() else {
        return e;
    };
    // .NET's echo of the model's raw chunk, which no other SDK sends: it would double the size
    // of every event.
    obj.remove("rawEvent");
    for key in ["messageId", "toolCallId", "parentMessageId"] {
        if let Some(serde_json::Value::String(id)) = obj.get_mut(key) {
            let base = if id.is_empty() {
                "assistant"
            } else {
                id.as_str()
            };
            *id = format!("{base}-@@C@@");
        }
    }
    let t = obj.get("type").and_then(|t| t.as_str()).unwrap_or("");
    match t {
        "TEXT_MESSAGE_CONTENT" | "REASONING_MESSAGE_CONTENT" | "TOOL_CALL_ARGS" => {
            if let Some(serde_json::Value::String(d)) = obj.get_mut("delta") {
                d.push_str("@@M@@");
            }
        }
        "STATE_DELTA" => {}
        _ => {
            obj.insert("lt".into(), "@@M@@".into());
        }
    }
    e
}

/// The `STATE_DELTA` of the recorded state run, on a state that grows by one item per delta:
/// `replace /count` with the cycle number, `add /items/-` an item holding the mark.
fn state_delta(k: usize) -> serde_json::Value {
    let mut d = dart("state_management")
        .into_iter()
        .find(|e| e["type"] == "STATE_DELTA")
        .unwrap_or_else(|| serde_json::json!({"type": "STATE_DELTA", "delta": []}));
    if let Some(ops) = d["delta"].as_array_mut() {
        for op in ops {
            match op["op"].as_str() {
                Some("replace") => op["value"] = "@@CNUM@@".into(),
                Some("add") => op["value"] = format!("item-@@C@@-{k}@@M@@").into(),
                _ => {}
            }
        }
    }
    d
}

/// `agent`: one recorded agent turn per run: a step with reasoning, a step with a tool call
/// (arguments streamed), its result, `STATE_DELTA`s, and the streamed answer.
pub static AGENT: LazyLock<Script> = LazyLock::new(|| {
    let steps = dart("step_events");
    let step = |i: usize| steps.get(i).cloned().unwrap_or_default();
    let reasoning = dart("reasoning_events");
    let tool_run = events(recorded::BACKEND_TOOLS);
    let mut c: Vec<serde_json::Value> = Vec::new();
    // Step 1: reasoning (the recorded REASONING_MESSAGE_CONTENT and _CHUNK text, streamed as
    // content deltas word by word).
    c.push(step(1));
    let text: String = reasoning
        .iter()
        .filter(|e| {
            e["type"] == "REASONING_MESSAGE_CONTENT" || e["type"] == "REASONING_MESSAGE_CHUNK"
        })
        .filter_map(|e| e["delta"].as_str())
        .collect();
    for e in &reasoning {
        match e["type"].as_str() {
            Some("REASONING_START" | "REASONING_MESSAGE_START" | "REASONING_END") => {
                c.push(e.clone())
            }
            Some("REASONING_MESSAGE_END") => {
                let id = e["messageId"].clone();
                for w in text.split_inclusive(' ') {
                    c.push(serde_json::json!({
                        "type": "REASONING_MESSAGE_CONTENT", "messageId": id, "delta": w
                    }));
                }
                c.push(e.clone());
            }
            _ => {}
        }
    }
    c.push(step(2));
    // Step 2: the recorded tool call, its result, state, and the answer.
    c.push(step(3));
    let mut finished = serde_json::json!({"type": "RUN_FINISHED"});
    let mut deltas = 0;
    for e in &tool_run {
        match e["type"].as_str() {
            Some("RUN_STARTED") => {}
            Some("RUN_FINISHED") => finished = e.clone(),
            Some("TOOL_CALL_ARGS") => {
                for chunk in arg_chunks(e["delta"].as_str().unwrap_or("")) {
                    let mut a = e.clone();
                    a["delta"] = chunk.into();
                    c.push(a);
                }
            }
            Some("TOOL_CALL_RESULT") => {
                c.push(e.clone());
                c.push(state_delta(deltas));
                deltas += 1;
            }
            Some("TEXT_MESSAGE_END") => {
                c.push(e.clone());
                c.push(state_delta(deltas));
                deltas += 1;
            }
            _ => c.push(e.clone()),
        }
    }
    c.push(step(4));
    if let Some(o) = finished.as_object_mut() {
        o.remove("rawEvent");
    }
    let mut cycle: Vec<Template> = c.into_iter().map(|e| Template::of(&retarget(e))).collect();
    cycle.extend(run_boundary(finished));
    let snapshot = dart("state_management")
        .into_iter()
        .find(|e| e["type"] == "STATE_SNAPSHOT")
        .unwrap_or_else(|| serde_json::json!({"type": "STATE_SNAPSHOT", "snapshot": {}}));
    Script {
        open: vec![run_zero(), Template::of(&snapshot)],
        cycle,
        words: Vec::new(),
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_split_at_placeholders() {
        let t = Template::parse(r#"{"a":"@@T@@-x","n":"@@CNUM@@","d":"@@W@@@@M@@"}"#);
        assert_eq!(
            t.0,
            vec![
                Piece::Lit(br#"{"a":""#.to_vec()),
                Piece::Thread,
                Piece::Lit(br#"-x","n":"#.to_vec()),
                Piece::Cycle,
                Piece::Lit(br#","d":""#.to_vec()),
                Piece::Words,
                Piece::Mark,
                Piece::Lit(br#""}"#.to_vec()),
            ]
        );
    }

    #[test]
    fn scripts_are_built_from_the_recordings() {
        assert_eq!(
            TOKENS.cycle_len() as usize,
            TOKEN_MESSAGES * (TOKEN_DELTAS + 2) + 2
        );
        assert!(TOKENS.words.len() > 300, "{}", TOKENS.words.len());
        let types: Vec<String> = (0..AGENT.cycle_len())
            .map(|i| {
                let mut out = Vec::new();
                AGENT.write(&mut out, "t", i, 1);
                let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
                v["type"].as_str().unwrap().to_string()
            })
            .collect();
        for t in [
            "STEP_STARTED",
            "REASONING_MESSAGE_CONTENT",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_RESULT",
            "STATE_DELTA",
            "TEXT_MESSAGE_CONTENT",
            "STEP_FINISHED",
        ] {
            assert!(types.iter().any(|x| x == t), "{t} missing from {types:?}");
        }
        assert!(types.iter().filter(|t| *t == "TOOL_CALL_ARGS").count() > 5);
        assert_eq!(types[types.len() - 2], "RUN_FINISHED");
        assert_eq!(types[types.len() - 1], "RUN_STARTED");
    }

    /// Publishes `cycles` cycles of `mix` to two interleaved threads of a real in-process
    /// broker with order validation on (one event per POST, then batches of 7), and returns
    /// every refused publish and the snapshots of both threads.
    async fn publish_loop(
        mix: crate::payload::Mix,
        cycles: u64,
    ) -> (Vec<String>, Vec<serde_json::Value>) {
        use crate::net::{HttpConn, Target};
        use crate::payload::EventWriter;
        use bytes::Bytes;
        let config = agui_fanout::config::Config {
            listen: "127.0.0.1:0".parse().expect("a socket address"),
            strict_order: true,
            ..agui_fanout::config::Config::default()
        };
        let server = agui_fanout::app::start(config)
            .await
            .expect("broker starts");
        let target = Target::parse(&format!("http://{}", server.addr)).expect("a URL");
        let mut conn = HttpConn::open(&target, None).await.expect("connects");
        let w = EventWriter::new(mix, 200);
        let threads = ["lt-0", "lt-1"];
        let path = |t: &str| format!("/v1/threads/{t}/events");
        let mut refused = Vec::new();
        let mut post = async |conn: &mut HttpConn, t: &str, body: Vec<u8>| {
            let r = conn
                .post_json(&path(t), Bytes::from(body))
                .await
                .expect("posts");
            if !(200..300).contains(&r.status) {
                refused.push(format!(
                    "{t} {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                ));
            }
        };
        for t in threads {
            post(&mut conn, t, w.open(t)).await;
        }
        let len = match &mix {
            crate::payload::Mix::Tokens => TOKENS.cycle_len(),
            crate::payload::Mix::Agent => AGENT.cycle_len(),
            crate::payload::Mix::Custom => 10,
        };
        let half = cycles / 2 * len;
        for seq in 0..half {
            for t in threads {
                post(&mut conn, t, w.batch(t, seq, 1, 1_000 + seq)).await;
            }
        }
        let mut seq = half;
        while seq < cycles * len {
            let n = 7.min(cycles * len - seq);
            for t in threads {
                post(&mut conn, t, w.batch(t, seq, n, 1_000 + seq)).await;
            }
            seq += n;
        }
        let mut snapshots = Vec::new();
        for t in threads {
            let r = conn
                .get(&format!("/v1/threads/{t}/snapshot"))
                .await
                .expect("gets");
            snapshots.push(serde_json::from_slice(&r.body).expect("a JSON snapshot"));
        }
        server.stop().await;
        (refused, snapshots)
    }

    /// A long loop of each realistic mix is accepted by the broker's order validation (no 4xx),
    /// and the `agent` mix's `STATE_DELTA`s apply to the recorded state, which grows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_broker_accepts_long_loops_with_order_validation_on() {
        let (refused, snaps) = publish_loop(crate::payload::Mix::Tokens, 12).await;
        assert!(
            refused.is_empty(),
            "tokens: {} refused: {refused:?}",
            refused.len()
        );
        for s in &snaps {
            let msgs = s["messages"].as_array().expect("messages");
            assert_eq!(msgs.len(), 12 * TOKEN_MESSAGES, "{s}");
        }
        let cycles = 12;
        let (refused, snaps) = publish_loop(crate::payload::Mix::Agent, cycles).await;
        assert!(
            refused.is_empty(),
            "agent: {} refused: {refused:?}",
            refused.len()
        );
        for s in &snaps {
            let items = s["state"]["items"].as_array().expect("state.items");
            assert_eq!(items.len() as u64, 2 * cycles, "{s}");
            assert_eq!(s["state"]["count"], cycles - 1);
        }
    }
}
