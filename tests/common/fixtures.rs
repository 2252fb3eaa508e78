//! Reading the test data in `tests/fixtures/` (recorded AG-UI runs and conformance streams;
//! origins and licences in `tests/fixtures/SOURCES.md`).

use serde_json::Value;
use std::path::{Path, PathBuf};

/// The fixtures folder, `tests/fixtures/` of this repository (`agui_fanout::fixtures_dir()`).
pub fn root() -> PathBuf {
    agui_fanout::fixtures_dir()
}

/// Every recorded .NET server response stream (`…Response.Server.AGUI.verified.json`), sorted.
pub fn recorded_responses() -> Vec<PathBuf> {
    let out = agui_fanout::recorded_responses();
    assert!(!out.is_empty(), "fixtures present");
    out
}

/// Reads a JSON array of events (UTF-8 BOM tolerated).
pub fn read_events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.trim_start_matches('\u{feff}');
    match serde_json::from_str(text).unwrap() {
        Value::Array(v) => v,
        other => panic!("{} is not an array: {other}", path.display()),
    }
}

/// Rewrites every `threadId` (top level and `input.threadId`) to `thread`.
pub fn retarget(events: &mut [Value], thread: &str) {
    for e in events {
        if let Some(obj) = e.as_object_mut() {
            if obj.contains_key("threadId") {
                obj.insert("threadId".into(), Value::String(thread.into()));
            }
            if let Some(Value::Object(input)) = obj.get_mut("input")
                && input.contains_key("threadId")
            {
                input.insert("threadId".into(), Value::String(thread.into()));
            }
        }
    }
}
