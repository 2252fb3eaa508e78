//! Test-only access to the repository's recorded AG-UI fixtures (`tests/fixtures/`, sources
//! and licences in its `SOURCES.md`): the files under a directory, and the event objects in a
//! document.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// `tests/fixtures/` joined with `sub` (empty: the whole of it).
pub(crate) fn dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(sub)
}

/// Every file under `dir`, at any depth, sorted.
pub(crate) fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The objects with a string `type` and another member in `value`, at any depth: the events
/// a fixture document holds.
pub(crate) fn events<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
    match value {
        Value::Object(members) => {
            if members.get("type").is_some_and(Value::is_string) && members.len() > 1 {
                out.push(value);
            }
            members.values().for_each(|v| events(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| events(v, out)),
        _ => {}
    }
}
