//! The repository's shape, checked: every `src/` file opens with a `//!` line and stays under
//! 800 lines, and no module imports one above it on the data path (docs/ARCHITECTURE.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines a file under `src/` may have, tests included.
const MAX_LINES: usize = 800;

/// The crate's top-level modules by layer, lowest first. A module may import only modules of
/// a lower layer: the data path `http → ingest → log` on publish and `log → hub → queue → sse`
/// then `stream` on subscribe runs one way, and leaves (`event`, `sse`, ...) import nothing of
/// the crate above them.
/// `fixtures` (test-only access to the recorded fixtures) imports nothing of the crate, so it
/// sits below the leaves and any layer's tests may read it.
const LAYERS: &[&[&str]] = &[
    &["fixtures"],
    &["config", "metrics", "event", "sse"],
    &["log"],
    &["fold"],
    &["queue"],
    &["hub", "ingest"],
    &["stream", "gateway"],
    &["http"],
    &["app", "cli"],
    &["main", "lib"],
];

fn src_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The top-level module a file under `src/` belongs to (`src/hub/fanout.rs` → `hub`).
fn module_of(path: &Path) -> String {
    let rel = path
        .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
        .expect("under src/");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// Whether a file is test code (a `tests.rs` file or a file under a `tests/` folder).
fn is_test_file(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
        || path.components().any(|c| c.as_os_str() == "tests")
}

/// Every top-level module a source text names through `crate::` (also inside
/// `use crate::{a::X, b::{Y, Z}}` groups), ignoring comments.
fn crate_imports(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::") {
        let start = from + i + "crate::".len();
        from = start;
        if start > "crate::".len() {
            let before = bytes[start - "crate::".len() - 1];
            if before.is_ascii_alphanumeric() || before == b'_' || before == b'$' {
                continue; // e.g. `$crate::` or `my_crate::`
            }
        }
        if bytes.get(start) == Some(&b'{') {
            // A group: the first identifier at each top level of the braces.
            let mut depth = 0;
            let mut at_item_start = true;
            let mut j = start;
            while j < bytes.len() {
                let c = bytes[j];
                match c {
                    b'{' => {
                        depth += 1;
                        at_item_start = depth == 1;
                    }
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    b',' if depth == 1 => at_item_start = true,
                    c if at_item_start && depth == 1 && (c.is_ascii_alphabetic() || c == b'_') => {
                        let end = code[j..]
                            .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                            .map_or(code.len(), |k| j + k);
                        found.insert(code[j..end].to_string());
                        at_item_start = false;
                        j = end;
                        continue;
                    }
                    _ => {}
                }
                j += 1;
            }
        } else {
            let end = code[start..]
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                .map_or(code.len(), |k| start + k);
            found.insert(code[start..end].to_string());
        }
    }
    found
}

/// A path relative to the crate, for messages.
fn rel(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .display()
        .to_string()
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

#[test]
fn every_source_file_says_what_it_owns_and_stays_small() {
    let mut problems = Vec::new();
    for path in src_files() {
        let text = std::fs::read_to_string(&path).expect("readable source");
        let lines = text.lines().count();
        if lines > MAX_LINES {
            problems.push(format!("{}: {lines} lines (max {MAX_LINES})", rel(&path)));
        }
        if !text.starts_with("//!") {
            problems.push(format!("{}: does not open with a `//!` line", rel(&path)));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_module_imports_one_above_it() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for path in src_files() {
        if is_test_file(&path) {
            continue;
        }
        let module = module_of(&path);
        let Some(own) = layer_of(&module) else {
            problems.push(format!("{}: module `{module}` has no layer", rel(&path)));
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("readable source");
        for import in crate_imports(&text) {
            if import == module || import == "self" || import == "super" {
                continue;
            }
            let Some(theirs) = layer_of(&import) else {
                // A crate-root item (e.g. `crate::fixtures_dir`): the root is the top layer.
                problems.push(format!(
                    "{}: imports crate-root item `{import}`",
                    rel(&path)
                ));
                continue;
            };
            if theirs >= own {
                problems.push(format!(
                    "{}: `{module}` imports `{import}`, which is not below it",
                    rel(&path)
                ));
            }
            edges.entry(module.clone()).or_default().insert(import);
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The table is only worth something if the data path's stages actually depend on each
    // other as drawn: the subscriber path runs http → stream → queue → sse.
    for (from, to) in [
        ("http", "stream"),
        ("stream", "queue"),
        ("queue", "sse"),
        ("hub", "queue"),
    ] {
        assert!(
            edges.get(from).is_some_and(|e| e.contains(to)),
            "`{from}` no longer imports `{to}`: update LAYERS and docs/ARCHITECTURE.md"
        );
    }
}

#[test]
fn the_import_parser_sees_groups_and_skips_comments() {
    let text = "use crate::{event::{A, B}, log::C};\n// crate::hub::X\nlet x = crate::queue::f();\nmacro $crate::sse";
    let found = crate_imports(text);
    let expected: BTreeSet<String> = ["event", "log", "queue"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, expected);
}
