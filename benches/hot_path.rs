//! The publish → hub → queue → SSE path on the token-delta workload (issue 16): each event is
//! POSTed through the router (`tower::ServiceExt::oneshot`, memory log, default config:
//! strict order, checkpoints every `retention.max_events`), folded and encoded by the hub and
//! read back from the response bodies of `SUBSCRIBERS` subscribers opened through the router.
//!
//! Two mixes: `tokens` (`TEXT_MESSAGE_CONTENT` deltas of 1–8 words inside open messages, as an
//! LLM streams them) and `agent` (text, tool calls with streamed `TOOL_CALL_ARGS`, and
//! `STATE_DELTA`s on a growing state). Every event is about 200 bytes (a `seq` and `ts` ride as
//! unknown fields, as the load generator's do).
//!
//! `cargo bench --bench hot_path` (criterion, wall clock), or instruction counts, noise-free on
//! a shared machine: build with `cargo bench --bench hot_path --no-run`, then
//!
//! ```text
//! HOT_PATH=tokens:20000:10 valgrind --tool=callgrind --toggle-collect='*hot_path*measured*' \
//!     target/release/deps/hot_path-<hash>
//! ```
//!
//! (`mix:events:subscribers`; only the measured publishes are counted, not the set-up nor the
//! making of the events, so the total divided by the events is the instructions per published
//! event).

use agui_fanout::config::Config;
use agui_fanout::http;
use axum::Router;
use axum::body::{Body, BodyDataStream};
use axum::http::{Method, Request, StatusCode, header};
use criterion::{Criterion, Throughput};
use futures::StreamExt;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Words the deltas are made of.
const WORDS: &[&str] = &[
    "the",
    "model",
    "streams",
    "tokens",
    "quickly",
    "while",
    "browsers",
    "follow",
    "each",
    "thread",
    "over",
    "server-sent",
    "events",
    "and",
    "resume",
    "exactly",
];

/// The event mixes.
#[derive(Clone, Copy, Debug)]
enum Mix {
    /// Text messages of 60 deltas each.
    Tokens,
    /// Text, tool calls with streamed arguments, state deltas.
    Agent,
}

impl Mix {
    fn parse(s: &str) -> Mix {
        match s {
            "tokens" => Mix::Tokens,
            "agent" => Mix::Agent,
            other => panic!("unknown mix {other:?} (tokens | agent)"),
        }
    }
}

/// Generates a valid endless run of one mix; the `n`-th event is always the same.
struct Script {
    mix: Mix,
    n: u64,
    /// Events of the current construct emitted so far.
    step: u64,
    /// Which construct comes next (`agent`: text, tool call, state delta in turn).
    construct: u64,
}

/// Deltas per text message, argument chunks per tool call.
const PER_MESSAGE: u64 = 60;
const PER_TOOL_CALL: u64 = 20;

impl Script {
    fn new(mix: Mix) -> Script {
        Script {
            mix,
            n: 0,
            step: 0,
            construct: 0,
        }
    }

    /// Unknown fields the broker keeps, about as the load generator adds them.
    fn stamp(&self) -> String {
        format!(
            r#","seq":{},"ts":1764500000{:09},"pad":"{}""#,
            self.n,
            self.n,
            "x".repeat(40)
        )
    }

    fn words(&self) -> String {
        let count = 1 + (self.n * 7 % 8) as usize;
        (0..count)
            .map(|i| WORDS[(self.n as usize * 5 + i * 3) % WORDS.len()])
            .fold(String::new(), |acc, w| acc + " " + w)
    }

    fn next_event(&mut self) -> String {
        let stamp = self.stamp();
        let kind = match self.mix {
            Mix::Tokens => 0,
            Mix::Agent => self.construct % 3,
        };
        let c = self.construct;
        let event = match kind {
            0 => {
                let id = format!("msg-{c}");
                match self.step {
                    0 => format!(
                        r#"{{"type":"TEXT_MESSAGE_START","messageId":"{id}","role":"assistant"{stamp}}}"#
                    ),
                    s if s <= PER_MESSAGE => format!(
                        r#"{{"type":"TEXT_MESSAGE_CONTENT","messageId":"{id}","delta":"{}"{stamp}}}"#,
                        self.words()
                    ),
                    _ => format!(r#"{{"type":"TEXT_MESSAGE_END","messageId":"{id}"{stamp}}}"#),
                }
            }
            1 => {
                let id = format!("call-{c}");
                match self.step {
                    0 => format!(
                        r#"{{"type":"TOOL_CALL_START","toolCallId":"{id}","toolCallName":"search"{stamp}}}"#
                    ),
                    s if s <= PER_TOOL_CALL => format!(
                        r#"{{"type":"TOOL_CALL_ARGS","toolCallId":"{id}","delta":"{}"{stamp}}}"#,
                        self.words().replace(' ', "_")
                    ),
                    _ => format!(r#"{{"type":"TOOL_CALL_END","toolCallId":"{id}"{stamp}}}"#),
                }
            }
            _ => format!(
                r#"{{"type":"STATE_DELTA","delta":[{{"op":"add","path":"/notes/-","value":"{}"}},{{"op":"replace","path":"/count","value":{}}}]{stamp}}}"#,
                self.words(),
                self.n
            ),
        };
        let len = match kind {
            0 => PER_MESSAGE + 1,
            1 => PER_TOOL_CALL + 1,
            _ => 0,
        };
        self.n += 1;
        if self.step >= len {
            self.step = 0;
            self.construct += 1;
        } else {
            self.step += 1;
        }
        event
    }
}

/// A broker over a memory log and the subscribers of one thread.
struct Setup {
    router: Router,
    subscribers: Vec<Subscriber>,
    script: Script,
    thread: String,
}

struct Subscriber {
    body: BodyDataStream,
    /// `data:` lines not yet read (a frame may straddle body chunks only at its end).
    frames: u64,
}

async fn app() -> Router {
    let config = Config::default();
    let log = agui_fanout::app::build_log(&config)
        .await
        .expect("a memory log");
    let state = agui_fanout::app::state(
        config,
        log,
        CancellationToken::new(),
        agui_fanout::metrics::install_recorder(),
    )
    .expect("the default configuration is valid");
    http::router(state)
}

impl Setup {
    /// The broker, the run open (`RUN_STARTED`), `subscribers` streams open and read up to it.
    async fn new(mix: Mix, subscribers: usize) -> Setup {
        let router = app().await;
        let thread = "bench-thread".to_string();
        let mut s = Setup {
            router,
            subscribers: Vec::new(),
            script: Script::new(mix),
            thread,
        };
        let started = format!(
            r#"{{"type":"RUN_STARTED","threadId":"{}","runId":"run-1"}}"#,
            s.thread
        );
        s.publish(started).await;
        if let Mix::Agent = mix {
            s.publish(r#"{"type":"STATE_SNAPSHOT","snapshot":{"notes":[],"count":0}}"#.into())
                .await;
        }
        for _ in 0..subscribers {
            let req = Request::builder()
                .method(Method::GET)
                .uri(format!("/v1/threads/{}/events", s.thread))
                .body(Body::empty())
                .expect("a request");
            let resp = s.router.clone().oneshot(req).await.expect("infallible");
            assert_eq!(resp.status(), StatusCode::OK);
            let mut sub = Subscriber {
                body: resp.into_body().into_data_stream(),
                frames: 0,
            };
            // The prelude: `retry:`, then the snapshot frames.
            sub.read_some().await;
            sub.frames = 0;
            s.subscribers.push(sub);
        }
        s
    }

    async fn publish(&self, event: String) {
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("/v1/threads/{}/events", self.thread))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(event))
            .expect("a request");
        let resp = self.router.clone().oneshot(req).await.expect("infallible");
        assert_eq!(resp.status(), StatusCode::OK, "publish refused");
    }

    /// The mix's next `n` events.
    fn next_events(&mut self, n: u64) -> Vec<String> {
        (0..n).map(|_| self.script.next_event()).collect()
    }

    /// Publishes the mix's next `events` and reads each from every subscriber.
    async fn run(&mut self, events: u64) {
        let events = self.next_events(events);
        self.run_events(events).await;
    }

    /// Publishes `events` and reads each from every subscriber.
    async fn run_events(&mut self, events: Vec<String>) {
        for event in events {
            self.publish(event).await;
            for sub in &mut self.subscribers {
                while sub.frames == 0 {
                    sub.read_some().await;
                }
                sub.frames -= 1;
            }
        }
    }
}

impl Subscriber {
    async fn read_some(&mut self) {
        let chunk = self
            .body
            .next()
            .await
            .expect("the stream stays open")
            .expect("a body chunk");
        // One searcher for the whole run: building one per chunk cost as much as a tenth of
        // what the broker does per event, in the counts of the measured publishes.
        static DATA_LINE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\ndata:"));
        self.frames +=
            DATA_LINE.find_iter(&chunk).count() as u64 + u64::from(chunk.starts_with(b"data:"));
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The publishes callgrind counts (`--toggle-collect='*hot_path*measured*'`); the events are
/// made before, so that the count is the broker's and the subscribers' reads.
#[inline(never)]
fn measured(rt: &Runtime, setup: &mut Setup, events: Vec<String>) {
    rt.block_on(setup.run_events(events));
}

fn profile(spec: &str) {
    let mut parts = spec.split(':');
    let mix = Mix::parse(parts.next().unwrap_or("tokens"));
    let events: u64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let subs: usize = parts.next().and_then(|n| n.parse().ok()).unwrap_or(10);
    let rt = runtime();
    let mut setup = rt.block_on(Setup::new(mix, subs));
    // Warm: the first message, caches and allocator pools.
    rt.block_on(setup.run(200));
    let made = setup.next_events(events);
    measured(&rt, &mut setup, made);
    println!("{mix:?}: {events} events published, {subs} subscribers each read them all");
}

fn bench(c: &mut Criterion) {
    for (mix, subs) in [(Mix::Tokens, 10), (Mix::Agent, 10), (Mix::Tokens, 100)] {
        let rt = runtime();
        let mut setup = rt.block_on(Setup::new(mix, subs));
        let mut group = c.benchmark_group(format!("hot_path_{mix:?}_{subs}_subscribers"));
        group.throughput(Throughput::Elements(1));
        group.bench_function("publish_and_deliver", |b| {
            b.iter(|| rt.block_on(setup.run(1)))
        });
        group.finish();
    }
}

fn main() {
    if let Ok(spec) = std::env::var("HOT_PATH") {
        profile(&spec);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
