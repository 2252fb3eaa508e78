//! Unit tests of the validation engine's private parts: JSON Pointer syntax, the nesting
//! bound and how field paths render. The table rows live in `tests/validate_rows/`.

use super::*;
use serde_json::json;

#[test]
fn json_pointers() {
    let good = [
        "", "/", "//", "/a", "/a/b", "/a~0b~1c", "/~0", "/~1", "/-", "/0", "/ä/€", "/a b", "/%25",
    ];
    let bad = [
        "a", "a/b", "~2", "/~2", "/a~", "/~", "#/a", " /a", "/a~b", "/~01~",
    ];
    for pointer in good {
        assert!(
            is_json_pointer(pointer),
            "{pointer:?} is an RFC 6901 pointer"
        );
        let event = json!({"type": "STATE_DELTA", "delta": [{"op": "remove", "path": pointer}]});
        assert!(validate_value(event, None).is_ok(), "{pointer:?}");
    }
    for pointer in bad {
        assert!(
            !is_json_pointer(pointer),
            "{pointer:?} is not an RFC 6901 pointer"
        );
        let event = json!({"type": "STATE_DELTA", "delta": [{"op": "remove", "path": pointer}]});
        let e = validate_value(event, None).expect_err(pointer);
        assert_eq!(e.field.as_deref(), Some("delta[0].path"));
    }
}

#[test]
fn nesting_depth_counts_levels() {
    assert!(nested_deeper_than(&json!([[]]), 1));
    assert!(!nested_deeper_than(&json!([[]]), 2));
}

#[test]
fn paths_render_like_the_spec_examples() {
    let root = Path::Root;
    let input = root.key("input");
    let messages = input.key("messages");
    let first = messages.index(0);
    assert_eq!(first.key("role").to_string(), "input.messages[0].role");
    let delta = root.key("delta");
    assert_eq!(delta.index(2).key("path").to_string(), "delta[2].path");
    assert_eq!(root.to_string(), "");
}
