//! `fast-json-patch` semantics case by case, and the all-or-nothing application.

use super::js::to_int32;
use super::*;
use serde_json::json;

fn apply(doc: Value, ops: Value) -> Result<Value, PatchError> {
    let ops = ops.as_array().cloned().unwrap_or_default();
    apply_patch(&doc, &ops)
}

fn code(doc: Value, ops: Value) -> &'static str {
    match apply(doc, ops) {
        Ok(v) => panic!("expected an error, got {v}"),
        Err(e) => e.code,
    }
}

// ---- AGUI.md §6, one test per row of the table ----------------------------------------

#[test]
fn row_add_creates_or_replaces_key_parent_must_exist() {
    assert_eq!(
        apply(
            json!({"a": 1}),
            json!([{"op": "add", "path": "/b", "value": 2}])
        )
        .unwrap(),
        json!({"a": 1, "b": 2})
    );
    assert_eq!(
        apply(
            json!({"a": 1}),
            json!([{"op": "add", "path": "/a", "value": 2}])
        )
        .unwrap(),
        json!({"a": 2})
    );
    assert_eq!(
        code(
            json!({}),
            json!([{"op": "add", "path": "/x/y", "value": 1}])
        ),
        "OPERATION_PATH_CANNOT_ADD"
    );
    // Replacing a key keeps its position.
    let out = apply(
        json!({"a": 1, "b": 2}),
        json!([{"op": "add", "path": "/a", "value": 3}]),
    )
    .unwrap();
    assert_eq!(serde_json::to_string(&out).unwrap(), r#"{"a":3,"b":2}"#);
}

#[test]
fn row_replace_and_remove_need_an_existing_path() {
    assert_eq!(
        code(
            json!({}),
            json!([{"op": "replace", "path": "/a", "value": 1}])
        ),
        "OPERATION_PATH_UNRESOLVABLE"
    );
    assert_eq!(
        code(json!({}), json!([{"op": "remove", "path": "/a"}])),
        "OPERATION_PATH_UNRESOLVABLE"
    );
    assert_eq!(
        code(
            json!({"a": {}}),
            json!([{"op": "remove", "path": "/a/b/c"}])
        ),
        "OPERATION_PATH_UNRESOLVABLE"
    );
    assert_eq!(
        apply(
            json!({"a": 1}),
            json!([{"op": "replace", "path": "/a", "value": null}])
        )
        .unwrap(),
        json!({"a": null})
    );
    // `remove` keeps the order of the other keys (JavaScript `delete`).
    let out = apply(
        json!({"a": 1, "b": 2, "c": 3}),
        json!([{"op": "remove", "path": "/a"}]),
    )
    .unwrap();
    assert_eq!(serde_json::to_string(&out).unwrap(), r#"{"b":2,"c":3}"#);
}

#[test]
fn row_array_add_index_at_most_length_dash_appends() {
    let doc = json!({"l": [1, 2]});
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "add", "path": "/l/2", "value": 3}])
        )
        .unwrap(),
        json!({"l": [1, 2, 3]})
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "add", "path": "/l/0", "value": 0}])
        )
        .unwrap(),
        json!({"l": [0, 1, 2]})
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "add", "path": "/l/-", "value": 3}])
        )
        .unwrap(),
        json!({"l": [1, 2, 3]})
    );
    assert_eq!(
        code(
            doc.clone(),
            json!([{"op": "add", "path": "/l/3", "value": 3}])
        ),
        "OPERATION_VALUE_OUT_OF_BOUNDS"
    );
    assert_eq!(
        code(doc, json!([{"op": "add", "path": "/l/x", "value": 3}])),
        "OPERATION_PATH_ILLEGAL_ARRAY_INDEX"
    );
}

/// AGUI.md's row says a leading-zero index fails. That holds for `replace`, `remove` and
/// a `move`/`copy` `from` (the existence check reads the property `"01"`, which no array
/// has), but fast-json-patch 3.1.1 lets `add` and `test` through: both convert the token
/// with `~~"01"` = 1 (checked on the published library). The fold follows the library.
#[test]
fn row_leading_zero_index() {
    let doc = json!({"l": [1, 2]});
    assert_eq!(
        code(
            doc.clone(),
            json!([{"op": "replace", "path": "/l/01", "value": 9}])
        ),
        "OPERATION_PATH_UNRESOLVABLE"
    );
    assert_eq!(
        code(doc.clone(), json!([{"op": "remove", "path": "/l/01"}])),
        "OPERATION_PATH_UNRESOLVABLE"
    );
    assert_eq!(
        code(
            doc.clone(),
            json!([{"op": "copy", "from": "/l/01", "path": "/x"}])
        ),
        "OPERATION_FROM_UNRESOLVABLE"
    );
    assert_eq!(
        code(
            doc.clone(),
            json!([{"op": "move", "from": "/l/00", "path": "/x"}])
        ),
        "OPERATION_FROM_UNRESOLVABLE"
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "add", "path": "/l/01", "value": 9}])
        )
        .unwrap(),
        json!({"l": [1, 9, 2]})
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "test", "path": "/l/01", "value": 2}])
        )
        .unwrap(),
        doc
    );
}

#[test]
fn row_empty_path_replaces_the_root_with_any_value() {
    for value in [
        json!(null),
        json!([]),
        json!(0),
        json!("s"),
        json!({"x": 1}),
    ] {
        assert_eq!(
            apply(
                json!({"a": 1}),
                json!([{"op": "replace", "path": "", "value": value}])
            )
            .unwrap(),
            value
        );
        assert_eq!(
            apply(
                json!(null),
                json!([{"op": "add", "path": "", "value": value}])
            )
            .unwrap(),
            value
        );
    }
    assert_eq!(
        apply(json!({"a": 1}), json!([{"op": "remove", "path": ""}])).unwrap(),
        json!(null)
    );
}

#[test]
fn row_test_mismatch_fails_the_whole_patch() {
    let ops = json!([
        {"op": "replace", "path": "/a", "value": 2},
        {"op": "test", "path": "/a", "value": 1}
    ]);
    let err = apply(json!({"a": 1}), ops).unwrap_err();
    assert_eq!((err.op_index, err.code), (1, "TEST_OPERATION_FAILED"));
    // Numbers compare as doubles; member order is irrelevant.
    assert!(
        apply(
            json!({"a": 1, "o": {"x": 1, "y": [2]}}),
            json!([
                {"op": "test", "path": "/a", "value": 1.0},
                {"op": "test", "path": "/o", "value": {"y": [2.0], "x": 1}}
            ])
        )
        .is_ok()
    );
}

#[test]
fn row_move_copy_with_missing_from_fail() {
    assert_eq!(
        code(
            json!({"a": 1}),
            json!([{"op": "move", "from": "/x", "path": "/b"}])
        ),
        "OPERATION_FROM_UNRESOLVABLE"
    );
    assert_eq!(
        code(
            json!({"a": 1}),
            json!([{"op": "copy", "from": "/x", "path": "/b"}])
        ),
        "OPERATION_FROM_UNRESOLVABLE"
    );
    assert_eq!(
        code(
            json!({"a": 1}),
            json!([{"op": "move", "from": "/x", "path": ""}])
        ),
        "OPERATION_FROM_UNRESOLVABLE"
    );
    assert_eq!(
        apply(
            json!({"a": 1}),
            json!([{"op": "move", "from": "/a", "path": "/b"}])
        )
        .unwrap(),
        json!({"b": 1})
    );
    assert_eq!(
        apply(
            json!({"a": [1]}),
            json!([{"op": "copy", "from": "/a", "path": "/b"}])
        )
        .unwrap(),
        json!({"a": [1], "b": [1]})
    );
}

#[test]
fn row_proto_paths_rejected() {
    for path in [
        "/__proto__",
        "/a/__proto__/x",
        "/constructor/prototype",
        "/a/constructor/prototype",
    ] {
        let doc = json!({"a": {"constructor": {}}});
        assert!(
            apply(doc, json!([{"op": "add", "path": path, "value": 1}])).is_err(),
            "{path}"
        );
    }
    assert_eq!(
        code(
            json!({"a": {"constructor": {}}}),
            json!([{"op": "add", "path": "/a/constructor/prototype", "value": 1}])
        ),
        "TYPE_ERROR"
    );
    assert_eq!(
        code(
            json!({"a": {}}),
            json!([{"op": "copy", "from": "/__proto__", "path": "/b"}])
        ),
        "TYPE_ERROR"
    );
    // `constructor` alone is an ordinary key.
    assert_eq!(
        apply(
            json!({}),
            json!([{"op": "add", "path": "/constructor", "value": 1}])
        )
        .unwrap(),
        json!({"constructor": 1})
    );
}

#[test]
fn row_null_state_fails_every_keyed_op() {
    for op in [
        json!({"op": "add", "path": "/a", "value": 1}),
        json!({"op": "replace", "path": "/a", "value": 1}),
        json!({"op": "remove", "path": "/a"}),
        json!({"op": "test", "path": "/a", "value": 1}),
        json!({"op": "copy", "from": "", "path": "/a"}),
    ] {
        assert_eq!(code(json!(null), json!([op])), "TYPE_ERROR");
    }
    assert_eq!(
        apply(json!(null), json!([{"op": "add", "path": "", "value": {}}])).unwrap(),
        json!({})
    );
}

#[test]
fn row_empty_patch_is_a_no_op() {
    for doc in [json!(null), json!({"a": 1}), json!([1]), json!(0)] {
        assert_eq!(apply(doc.clone(), json!([])).unwrap(), doc);
    }
}

// ---- other fast-json-patch behaviour, checked on the published library -------------

#[test]
fn atomic_per_patch_and_reports_the_original_index() {
    let doc = json!({"plan": {"status": "open"}});
    let err = apply(
        doc.clone(),
        json!([
            {"op": "replace", "path": "/plan/status", "value": "closed"},
            {"op": "replace", "path": "/absent/deeper", "value": 1}
        ]),
    )
    .unwrap_err();
    assert_eq!((err.op_index, err.code), (1, "OPERATION_PATH_UNRESOLVABLE"));
    let mut state = doc.clone();
    let ops = [
        json!({"op": "add", "path": "/x", "value": 1}),
        json!({"op": "test", "path": "/x", "value": 2}),
    ];
    let err = apply_atomic(&mut state, [(3, &ops[0]), (7, &ops[1])]).unwrap_err();
    assert_eq!(err.op_index, 7);
    assert_eq!(state, doc, "a failed patch leaves the document unchanged");
    let single = [json!({"op": "replace", "path": "/nope", "value": 1})];
    assert!(apply_atomic(&mut state, single.iter().enumerate()).is_err());
    assert_eq!(state, doc);
}

#[test]
fn move_and_copy_destinations_are_not_bounds_checked() {
    let doc = json!({"l": [1, 2]});
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "copy", "from": "/l/0", "path": "/l/9"}])
        )
        .unwrap(),
        json!({"l": [1, 2, 1]})
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "move", "from": "/l/0", "path": "/l/9"}])
        )
        .unwrap(),
        json!({"l": [2, 1]})
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "move", "from": "/l/0", "path": "/l/-"}])
        )
        .unwrap(),
        json!({"l": [2, 1]})
    );
    assert_eq!(
        code(
            doc.clone(),
            json!([{"op": "copy", "from": "/l/0", "path": "/l/x"}])
        ),
        "OPERATION_PATH_ILLEGAL_ARRAY_INDEX"
    );
    assert_eq!(
        code(
            doc.clone(),
            json!([{"op": "copy", "from": "/l/0", "path": "/m/x"}])
        ),
        "OPERATION_PATH_UNRESOLVABLE"
    );
    assert!(apply(doc, json!([{"op": "move", "from": "/l", "path": "/l/0"}])).is_err());
    assert!(
        apply(
            json!({"a": {"b": 1}}),
            json!([{"op": "move", "from": "/a", "path": "/a/c"}])
        )
        .is_err()
    );
    assert!(
        apply(
            json!({"a": 1}),
            json!([{"op": "move", "from": "", "path": "/b"}])
        )
        .is_err()
    );
    assert_eq!(
        apply(
            json!({"a": {}}),
            json!([{"op": "copy", "from": "/a", "path": "/a/b"}])
        )
        .unwrap(),
        json!({"a": {"b": {}}})
    );
    assert_eq!(
        apply(
            json!({"a": 1}),
            json!([{"op": "copy", "from": "/a", "path": ""}])
        )
        .unwrap(),
        json!(1)
    );
    // A move re-resolves its destination after removing the source (RFC 6902 §4.4).
    let doc = json!({"l": [{"n": 0}, {"n": 1}, {"n": 2}]});
    assert_eq!(
        apply(
            doc,
            json!([{"op": "move", "from": "/l/0", "path": "/l/1/x"}])
        )
        .unwrap(),
        json!({"l": [{"n": 1}, {"n": 2, "x": {"n": 0}}]})
    );
}

#[test]
fn javascript_index_conversion() {
    let doc = json!({"l": [1, 2]});
    // `~~""` is 0; `~~"4294967296"` wraps to 0; `~~"4294967295"` is -1 (splice from the end).
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "add", "path": "/l/", "value": 9}])
        )
        .unwrap(),
        json!({"l": [9, 1, 2]})
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "add", "path": "/l/4294967296", "value": 9}])
        )
        .unwrap(),
        json!({"l": [9, 1, 2]})
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "add", "path": "/l/4294967295", "value": 9}])
        )
        .unwrap(),
        json!({"l": [1, 9, 2]})
    );
    assert_eq!(
        code(
            doc.clone(),
            json!([{"op": "test", "path": "/l/-", "value": 1}])
        ),
        "TEST_OPERATION_FAILED"
    );
    assert_eq!(
        code(doc, json!([{"op": "add", "path": "/l/ 1", "value": 0}])),
        "OPERATION_PATH_ILLEGAL_ARRAY_INDEX"
    );
    assert_eq!(to_int32("2147483648"), -2_147_483_648);
    assert_eq!(to_int32(&"9".repeat(400)), 0);
}

#[test]
fn inherited_object_names() {
    // `replace` of an inherited name passes the existence check and assigns; `remove`
    // deletes nothing; `test` compares a function: fails.
    assert_eq!(
        apply(
            json!({"a": 1}),
            json!([{"op": "replace", "path": "/constructor", "value": 1}])
        )
        .unwrap(),
        json!({"a": 1, "constructor": 1})
    );
    assert_eq!(
        apply(
            json!({"a": 1}),
            json!([{"op": "remove", "path": "/toString"}])
        )
        .unwrap(),
        json!({"a": 1})
    );
    assert_eq!(
        code(
            json!({"a": 1}),
            json!([{"op": "test", "path": "/constructor", "value": 1}])
        ),
        "TEST_OPERATION_FAILED"
    );
    assert_eq!(
        code(
            json!({"a": 1}),
            json!([{"op": "add", "path": "/toString/x", "value": 1}])
        ),
        "OPERATION_PATH_UNRESOLVABLE"
    );
}

#[test]
fn malformed_operations() {
    assert_eq!(code(json!({}), json!([5])), "OPERATION_NOT_AN_OBJECT");
    assert_eq!(
        code(json!({}), json!([{"op": "increment", "path": "/a"}])),
        "OPERATION_OP_INVALID"
    );
    assert_eq!(
        code(json!({}), json!([{"op": "_get", "path": "/a"}])),
        "OPERATION_OP_INVALID"
    );
    assert_eq!(
        code(json!({}), json!([{"op": "add", "path": "a", "value": 1}])),
        "OPERATION_PATH_INVALID"
    );
    assert_eq!(
        code(json!({}), json!([{"op": "add", "value": 1}])),
        "OPERATION_PATH_INVALID"
    );
    assert_eq!(
        code(json!({}), json!([{"op": "copy", "path": "/a"}])),
        "OPERATION_FROM_REQUIRED"
    );
    assert_eq!(
        code(
            json!({}),
            json!([{"op": "copy", "from": "a", "path": "/a"}])
        ),
        "OPERATION_FROM_INVALID"
    );
    assert_eq!(
        code(json!({}), json!([{"op": "add", "path": "/a"}])),
        "OPERATION_VALUE_REQUIRED"
    );
    // Extra members (a `remove` carrying `value`) are ignored.
    assert_eq!(
        apply(
            json!({"a": 1}),
            json!([{"op": "remove", "path": "/a", "value": "x"}])
        )
        .unwrap(),
        json!({})
    );
}

#[test]
fn scalar_documents_fail_keyed_operations() {
    for doc in [json!(5), json!("s"), json!(true), json!(0)] {
        assert_eq!(
            code(doc, json!([{"op": "add", "path": "/a", "value": 1}])),
            "TYPE_ERROR"
        );
    }
}

#[test]
fn escaped_tokens() {
    let doc = json!({"a/b": {"~c": 1}, "": 2});
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "replace", "path": "/a~1b/~0c", "value": 3}])
        )
        .unwrap(),
        json!({"a/b": {"~c": 3}, "": 2})
    );
    assert_eq!(
        apply(doc, json!([{"op": "replace", "path": "/", "value": 3}])).unwrap(),
        json!({"a/b": {"~c": 1}, "": 3})
    );
}
