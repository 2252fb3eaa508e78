//! The journal against a copy: random documents and patches applied in place all or nothing
//! end exactly where the patch applied to a copy ends, and a failed patch or a taken-back
//! trial leaves the document as it was, byte for byte (key order included).

use super::super::{Trial, apply_atomic, apply_atomic_portable, apply_patch};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Member names that collide often, array indices among them, and an inherited
/// `Object.prototype` name.
const KEYS: &[&str] = &["a", "b", "c", "0", "1", "2", "-", "toString"];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (0i64..4).prop_map(Value::from),
        "[xy]{0,2}".prop_map(Value::from),
    ]
}

fn document() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 40, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..4).prop_map(|members| {
                Value::Object(
                    members
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                )
            }),
        ]
    })
}

fn pointer() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(KEYS), 0..4)
        .prop_map(|tokens| tokens.iter().map(|t| format!("/{t}")).collect())
}

fn operation() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(&["add", "remove", "replace", "move", "copy", "test"][..]),
        pointer(),
        pointer(),
        document(),
    )
        .prop_map(
            |(op, path, from, value)| json!({"op": op, "path": path, "from": from, "value": value}),
        )
}

fn patch() -> impl Strategy<Value = Vec<Value>> {
    prop::collection::vec(operation(), 1..6)
}

fn bytes(v: &Value) -> String {
    serde_json::to_string(v).expect("a JSON value serialises")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// In place with the journal, the patch ends where it ends on a copy; when it fails the
    /// document is untouched.
    #[test]
    fn in_place_agrees_with_a_copy(doc in document(), ops in patch()) {
        let reference = apply_patch(&doc, &ops);
        let mut in_place = doc.clone();
        let result = apply_atomic(&mut in_place, ops.iter().enumerate());
        match (&reference, &result) {
            (Ok(expected), Ok(())) => prop_assert_eq!(bytes(&in_place), bytes(expected)),
            (Err(expected), Err(error)) => {
                prop_assert_eq!(error, expected);
                prop_assert_eq!(bytes(&in_place), bytes(&doc));
            }
            _ => prop_assert!(false, "copy {:?} but in place {:?}", reference, result),
        }
        let mut portable = doc.clone();
        if apply_atomic_portable(&mut portable, ops.iter().enumerate()).is_err() {
            prop_assert_eq!(bytes(&portable), bytes(&doc));
        } else {
            prop_assert_eq!(bytes(&portable), bytes(&in_place));
        }
    }

    /// Several patches tried one after the other, some failing part-way, then taken back:
    /// the document is what it was.
    #[test]
    fn a_trial_is_taken_back(doc in document(), patches in prop::collection::vec(patch(), 1..4)) {
        let mut tried = doc.clone();
        let mut trial = Trial::new();
        for ops in &patches {
            let _ = trial.apply_portable(&mut tried, ops.iter().enumerate());
        }
        trial.undo(&mut tried);
        prop_assert_eq!(bytes(&tried), bytes(&doc));
    }
}

/// A `move` whose removal is taken back after later writes, key order kept, and a failure
/// after it.
#[test]
fn a_move_and_removals_come_back_in_place() {
    let doc = json!({"a": 1, "b": {"x": [1, 2, 3]}, "c": 3, "d": [4, 5]});
    let ops = [
        json!({"op": "move", "from": "/b", "path": "/d/0"}),
        json!({"op": "remove", "path": "/a"}),
        json!({"op": "replace", "path": "/c", "value": {"big": true}}),
        json!({"op": "add", "path": "/e", "value": 5}),
        json!({"op": "remove", "path": "/d/1"}),
        json!({"op": "test", "path": "/c", "value": 4}),
    ];
    let mut in_place = doc.clone();
    let error = apply_atomic(&mut in_place, ops.iter().enumerate()).unwrap_err();
    assert_eq!(error.op_index, 5);
    assert_eq!(bytes(&in_place), bytes(&doc));
    let mut applied = doc.clone();
    apply_atomic(&mut applied, ops[..5].iter().enumerate()).unwrap();
    assert_eq!(
        bytes(&applied),
        r#"{"c":{"big":true},"d":[{"x":[1,2,3]},5],"e":5}"#
    );
}
