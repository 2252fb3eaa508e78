//! # agui-fanout
//!
//! A broker that carries AG-UI agent events to browsers: producers append events to a
//! per-thread, totally ordered log (in memory, or Redis Streams); subscribers follow a thread
//! over Server-Sent Events and resume exactly with `Last-Event-ID`. The wire contract is
//! `docs/PROTOCOL.md`; the internals are described in `docs/ARCHITECTURE.md`.
//!
//! # Layout
//! One module per stage of the data path, listed top down; each imports only modules below it
//! (checked by `tests/layout.rs`; the files an event crosses are listed in order in
//! `docs/ARCHITECTURE.md`):
//!
//! - [`http`]: the router: publish, subscribe, snapshot, health, metrics; JSON errors; auth.
//! - [`stream`]: the subscriber's writers (hyper body, direct socket) that drain the queue.
//! - [`gateway`]: the AG-UI run gateway: runs an upstream agent, appends its events through
//!   [`ingest`], answers the caller with them.
//! - [`ingest`]: the publish pipeline: order checks, compare-and-append, checkpoints.
//! - [`hub`]: one reader per thread per node; fan-out of frames encoded once into queues.
//! - [`queue`]: the per-connection bounded queue (frames, coalescing, reset).
//! - [`fold`]: the AG-UI client reducer (state by JSON Patch, messages, run), preludes.
//! - [`log`]: the per-thread log (`memory` | `redis`), event ids and epochs, the node's tail.
//! - [`event`]: the AG-UI 1.0 event model, schema validation and the client's order rules.
//! - [`sse`]: the SSE wire encoding (a leaf).
//!
//! Around it: [`config`] (file + env + CLI), [`app`] (wiring, serving, graceful drain),
//! [`metrics`] (every metric name), [`cli`] (the `replay`, `token` and `demo-agent`
//! subcommands).

pub mod app;
pub mod cli;
pub mod config;
pub mod event;
#[cfg(test)]
mod fixtures;
pub mod fold;
pub mod gateway;
pub mod http;
pub mod hub;
pub mod ingest;
pub mod log;
pub mod metrics;
pub mod queue;
pub mod sse;
pub mod stream;

/// Where the test data is: `tests/fixtures/` of this repository (recorded AG-UI runs,
/// AG-UI conformance streams, JSON Patch conformance data; origins and licences in
/// `tests/fixtures/SOURCES.md`). Nothing outside the repository is read. For tests and
/// benches; not part of the API.
#[doc(hidden)]
pub fn fixtures_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"))
}

/// Every recorded .NET producer response stream of the test data ([`fixtures_dir`])
/// (`agui-recorded/dotnet-getting-started-baselines/**/…Response.Server.AGUI.verified.json`),
/// sorted by path. Empty when the fixtures are missing. For tests and benches.
#[doc(hidden)]
pub fn recorded_responses() -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![fixtures_dir().join("agui-recorded/dotnet-getting-started-baselines")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            if path.is_dir() {
                dirs.push(path);
            } else if path
                .to_string_lossy()
                .ends_with(".Response.Server.AGUI.verified.json")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}
