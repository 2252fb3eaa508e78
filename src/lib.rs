//! # agui-fanout
//!
//! A broker that carries AG-UI agent events to browsers: producers append events to a
//! per-thread, totally ordered log (in memory, or Redis Streams); subscribers follow a thread
//! over Server-Sent Events and resume exactly with `Last-Event-ID`. The contract is
//! `SPEC.md` (shipped with the project's shared documents).
//!
//! # Layout
//! The data path runs one way, one module per stage:
//!
//! - [`http`]: the router: publish, subscribe, health, metrics; JSON errors.
//! - [`event`]: the AG-UI 1.0 event model and schema validation.
//! - [`fold`]: the AG-UI client reducer (state by JSON Patch, messages, run status).
//! - [`log`]: the per-thread log (`memory` | `redis`), event ids and epochs, the node's tail.
//! - [`hub`]: one reader per thread per node, fan-out of encoded frames into queues.
//! - [`queue`]: the per-connection bounded queue.
//! - [`sse`]: the SSE wire encoding and the subscriber's response body.
//!
//! Around it: [`config`] (file + env + CLI), [`app`] (wiring, serving, graceful drain),
//! [`metrics`] (every metric name), [`replay`] (the `replay` subcommand: a client).

pub mod app;
pub mod config;
pub mod event;
pub mod fold;
pub mod http;
pub mod hub;
pub mod ingest;
pub mod log;
pub mod metrics;
pub mod queue;
pub mod replay;
pub mod sse;

/// Where the shared AG-UI fixtures are (test and bench support; not part of the API).
///
/// The fixtures live outside the repository, in the project's shared folder
/// (`shared/fixtures`). Looked up in order: `$AGUI_FIXTURES_DIR`; `../shared/fixtures` beside
/// the crate; a `shared/fixtures` folder beside any ancestor of the current directory;
/// `/work/shared/fixtures` (where the shared folder sits on the project's machines, whatever
/// folder a clone was made in).
#[doc(hidden)]
pub fn fixtures_dir() -> std::path::PathBuf {
    use std::path::{Path, PathBuf};
    if let Some(dir) = std::env::var_os("AGUI_FIXTURES_DIR") {
        return PathBuf::from(dir);
    }
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures");
    if beside.is_dir() {
        return beside;
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let candidate = dir.join("shared/fixtures");
            if candidate.is_dir() {
                return candidate;
            }
        }
    }
    PathBuf::from("/work/shared/fixtures")
}

/// Every recorded .NET producer response stream of the shared fixtures
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
