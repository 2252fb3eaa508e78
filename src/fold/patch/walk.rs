//! The read-only walk that mirrors `fast-json-patch`'s `applyOperation` for one operation:
//! it fails the operation the way the library throws, or yields the normalised pointer that
//! `journal.rs` then writes at.

use super::js::{canonical_index, is_digits, is_object_proto, js_equals, js_has, to_int32};
use super::{Fail, Kind, Op, fail};
use json_patch::jsonptr::{PointerBuf, Token};
use serde_json::Value;

/// The tokens of a JSON Pointer, raw and decoded (`~1` → `/`, then `~0` → `~`, exactly as
/// the library's `unescapePathComponent`).
pub(super) struct Tokens<'a> {
    pub(super) raw: Vec<&'a str>,
    pub(super) decoded: Vec<String>,
}

impl<'a> Tokens<'a> {
    /// Splits a non-empty pointer starting with `/` (checked by [`parse_op`]).
    pub(super) fn parse(pointer: &'a str) -> Self {
        let raw: Vec<&str> = pointer.get(1..).unwrap_or_default().split('/').collect();
        let decoded = raw
            .iter()
            .map(|t| {
                if t.contains('~') {
                    t.replace("~1", "/").replace("~0", "~")
                } else {
                    (*t).to_owned()
                }
            })
            .collect();
        Tokens { raw, decoded }
    }

    pub(super) fn len(&self) -> usize {
        self.raw.len()
    }

    /// The library's ban (`banPrototypeModifications`, on by default): a `__proto__` key, or
    /// `prototype` right after a raw `constructor`. A `TypeError`, so the patch fails.
    pub(super) fn check_ban(&self, i: usize) -> Result<(), Fail> {
        let key = self.decoded[i].as_str();
        let prev = if i == 0 { "" } else { self.raw[i - 1] };
        if key == "__proto__" || (key == "prototype" && prev == "constructor") {
            return fail(
                "TYPE_ERROR",
                "modifying `__proto__` or `constructor/prototype` prop is banned for security reasons",
            );
        }
        Ok(())
    }
}

/// One step from a container to a member, as the crate's pointer will spell it.
#[derive(Clone, Debug)]
pub(super) enum Step {
    Key(String),
    Index(usize),
}

/// The last token of a path, on its parent container.
#[derive(Debug)]
pub(super) enum Slot {
    /// A member name of an object parent.
    Key(String),
    /// An array index after `~~key` (or the length for `-`); may be negative or past the end.
    Index(i64),
}

/// Where an operation lands: the parent's location and the final slot.
pub(super) struct Target {
    pub(super) parent: Vec<Step>,
    pub(super) slot: Slot,
}

impl Target {
    pub(super) fn parent_pointer(&self) -> PointerBuf {
        PointerBuf::from_tokens(self.parent.iter().map(step_token))
    }

    pub(super) fn pointer_with(&self, last: Token<'_>) -> PointerBuf {
        let mut pointer = self.parent_pointer();
        pointer.push_back(last);
        pointer
    }

    pub(super) fn parent<'d>(&self, doc: &'d Value) -> Option<&'d Value> {
        self.parent.iter().try_fold(doc, |v, step| match (v, step) {
            (Value::Object(m), Step::Key(k)) => m.get(k.as_str()),
            (Value::Array(a), Step::Index(i)) => a.get(*i),
            _ => None,
        })
    }

    pub(super) fn array_len(&self, doc: &Value) -> usize {
        self.parent(doc)
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    }

    /// Whether the slot names an `Object.prototype` member the parent object does not own.
    pub(super) fn inherited_only(&self, doc: &Value) -> bool {
        match (&self.slot, self.parent(doc)) {
            (Slot::Key(k), Some(Value::Object(m))) => {
                !m.contains_key(k.as_str()) && is_object_proto(k)
            }
            _ => false,
        }
    }
}

pub(super) fn step_token(step: &Step) -> Token<'_> {
    match step {
        Step::Key(k) => Token::new(k.as_str()),
        Step::Index(i) => index_token(*i),
    }
}

pub(super) fn index_token(i: usize) -> Token<'static> {
    Token::new(i.to_string())
}

/// A slot index the walk already proved to be a valid position (`0 ≤ k < len`).
pub(super) fn usize_index(k: i64) -> usize {
    usize::try_from(k).unwrap_or(0)
}

/// `Array.prototype.splice(start)`: a negative start counts from the end (floored at 0); a
/// start past the end is clamped by `splice` itself (callers clamp where that applies).
pub(super) fn splice_start(k: i64, len: usize) -> usize {
    if k < 0 {
        let len = i64::try_from(len).unwrap_or(i64::MAX);
        usize::try_from((len + k).max(0)).unwrap_or(0)
    } else {
        usize::try_from(k).unwrap_or(usize::MAX)
    }
}

/// The library's walk for a non-root `path` with validation on (`applyOperation`, `while
/// (true)` loop): the `existingPathFragment` check and the document `validator` at the first
/// missing member (or at the last token), then `~~key` indices on arrays and the
/// `OPERATION_PATH_UNRESOLVABLE` check for every intermediate value that is not an object.
pub(super) fn walk(doc: &Value, op: &Op<'_>, tokens: &Tokens<'_>) -> Result<Target, Fail> {
    let n = tokens.len();
    let mut obj = doc;
    let mut parent = Vec::new();
    let mut validated = false;
    for i in 0..n {
        tokens.check_ban(i)?;
        let key = tokens.decoded[i].as_str();
        let last = i + 1 == n;
        if !validated {
            let exists = js_has(obj, key);
            if !exists || last {
                validated = true;
                validate_against_doc(doc, op, exists && last, last)?;
            }
        }
        match obj {
            Value::Array(arr) => {
                let k = if key == "-" {
                    i64::try_from(arr.len()).unwrap_or(i64::MAX)
                } else if !is_digits(key) {
                    return fail(
                        "OPERATION_PATH_ILLEGAL_ARRAY_INDEX",
                        format!(
                            "expected an unsigned base-10 integer array index in {:?}",
                            op.path
                        ),
                    );
                } else {
                    to_int32(key)
                };
                if last {
                    if op.kind == Kind::Add && k > i64::try_from(arr.len()).unwrap_or(i64::MAX) {
                        return fail(
                            "OPERATION_VALUE_OUT_OF_BOUNDS",
                            format!(
                                "the index in {:?} is greater than the number of elements",
                                op.path
                            ),
                        );
                    }
                    return Ok(Target {
                        parent,
                        slot: Slot::Index(k),
                    });
                }
                match usize::try_from(k)
                    .ok()
                    .and_then(|k| arr.get(k).map(|v| (k, v)))
                {
                    Some((k, v)) => {
                        parent.push(Step::Index(k));
                        obj = v;
                    }
                    None => return unresolvable_intermediate(op.path),
                }
            }
            Value::Object(map) => {
                if last {
                    return Ok(Target {
                        parent,
                        slot: Slot::Key(key.to_owned()),
                    });
                }
                // An inherited `Object.prototype` member is a function: not an object either.
                match map.get(key) {
                    Some(v) => {
                        parent.push(Step::Key(key.to_owned()));
                        obj = v;
                    }
                    None => return unresolvable_intermediate(op.path),
                }
            }
            // Unreachable: the root is checked by the caller and every intermediate below.
            _ => return unresolvable_intermediate(op.path),
        }
        if !obj.is_object() && !obj.is_array() {
            return unresolvable_intermediate(op.path);
        }
    }
    // `n ≥ 1` for a non-root path, so the loop always returns.
    unresolvable_intermediate(op.path)
}

pub(super) fn unresolvable_intermediate<T>(path: &str) -> Result<T, Fail> {
    fail(
        "OPERATION_PATH_UNRESOLVABLE",
        format!("cannot perform operation at the desired path {path:?}"),
    )
}

/// The library's `validator(operation, index, document, existingPathFragment)` document
/// checks. `full` is whether the whole path exists; `missing_is_last` whether the first
/// missing member (if any) is the last token.
pub(super) fn validate_against_doc(
    doc: &Value,
    op: &Op<'_>,
    full: bool,
    missing_is_last: bool,
) -> Result<(), Fail> {
    match op.kind {
        Kind::Add if !full && !missing_is_last => fail(
            "OPERATION_PATH_CANNOT_ADD",
            format!(
                "cannot perform an `add` operation at {:?}: its parent does not exist",
                op.path
            ),
        ),
        Kind::Replace | Kind::Remove if !full => fail(
            "OPERATION_PATH_UNRESOLVABLE",
            format!(
                "cannot perform the operation at {:?}: it does not exist",
                op.path
            ),
        ),
        Kind::Move | Kind::Copy => resolve_from(doc, op.from).map(drop),
        _ => Ok(()),
    }
}

/// Resolves a `move`/`copy` `from` the way the library validates it (a `_get` that must
/// resolve, `OPERATION_FROM_UNRESOLVABLE` otherwise) and returns its canonical pointer.
pub(super) fn resolve_from(doc: &Value, from: &str) -> Result<PointerBuf, Fail> {
    if from.is_empty() {
        return Ok(PointerBuf::root());
    }
    let tokens = Tokens::parse(from);
    let mut obj = doc;
    let mut steps = Vec::with_capacity(tokens.len());
    for i in 0..tokens.len() {
        tokens.check_ban(i)?;
        let key = tokens.decoded[i].as_str();
        let next = match obj {
            Value::Object(map) => map.get(key).map(|v| (Step::Key(key.to_owned()), v)),
            Value::Array(arr) => {
                canonical_index(key).and_then(|k| arr.get(k).map(|v| (Step::Index(k), v)))
            }
            Value::Null => {
                return fail(
                    "TYPE_ERROR",
                    format!("cannot read {from:?}: a member of it is null"),
                );
            }
            _ => None,
        };
        // fast-json-patch ≠ RFC 6902 only for inherited names and non-index array members,
        // which the library "finds" (a function, `length`); they fail here (module docs).
        let Some((step, v)) = next else {
            return fail(
                "OPERATION_FROM_UNRESOLVABLE",
                format!("cannot perform the operation from {from:?}: it does not exist"),
            );
        };
        steps.push(step);
        obj = v;
    }
    Ok(PointerBuf::from_tokens(steps.iter().map(step_token)))
}

/// `getValueByPointer` without validation (used by a root `move`/`copy`): arrays take
/// `~~key`, objects their own members. `Ok(None)` when nothing is there.
pub(super) fn lenient_get<'d>(
    doc: &'d Value,
    tokens: &Tokens<'_>,
) -> Result<Option<&'d Value>, Fail> {
    let mut obj = doc;
    for i in 0..tokens.len() {
        tokens.check_ban(i)?;
        let key = tokens.decoded[i].as_str();
        let next = match obj {
            Value::Object(map) => map.get(key),
            Value::Array(arr) if is_digits(key) => {
                usize::try_from(to_int32(key)).ok().and_then(|k| arr.get(k))
            }
            Value::Null => return fail("TYPE_ERROR", "cannot read a member of null"),
            _ => None,
        };
        match next {
            Some(v) => obj = v,
            None => return Ok(None),
        }
    }
    Ok(Some(obj))
}

/// The `add` a `move` performs after removing its source: no validation, resolved on the
/// changed document. Returns the canonical pointer (an index past the end appends, a
/// negative one counts from the end, as `splice` does).
pub(super) fn unvalidated_destination(
    doc: &Value,
    tokens: &Tokens<'_>,
    path: &str,
) -> Result<PointerBuf, Fail> {
    let mut obj = doc;
    let mut pointer = PointerBuf::root();
    let n = tokens.len();
    for i in 0..n {
        let key = tokens.decoded[i].as_str();
        let last = i + 1 == n;
        match obj {
            Value::Object(map) => {
                if last {
                    pointer.push_back(Token::new(key));
                    return Ok(pointer);
                }
                match map.get(key) {
                    Some(v) if v.is_object() || v.is_array() => {
                        pointer.push_back(Token::new(key));
                        obj = v;
                    }
                    _ => break,
                }
            }
            Value::Array(arr) => {
                let k = if key == "-" {
                    i64::try_from(arr.len()).unwrap_or(i64::MAX)
                } else if is_digits(key) {
                    to_int32(key)
                } else {
                    // JavaScript would set a non-index array property, which JSON drops.
                    break;
                };
                if last {
                    pointer.push_back(index_token(splice_start(k, arr.len()).min(arr.len())));
                    return Ok(pointer);
                }
                match usize::try_from(k)
                    .ok()
                    .and_then(|k| arr.get(k).map(|v| (k, v)))
                {
                    Some((k, v)) if v.is_object() || v.is_array() => {
                        pointer.push_back(index_token(k));
                        obj = v;
                    }
                    _ => break,
                }
            }
            _ => break,
        }
    }
    fail(
        "TYPE_ERROR",
        format!("cannot add at {path:?} after removing `from`: its parent is gone"),
    )
}

/// `test`: the library compares with `_areEquals` (deep equality, numbers as IEEE doubles).
pub(super) fn test_target(
    doc: &Value,
    target: &Target,
    expected: &Value,
    path: &str,
) -> Result<(), Fail> {
    let actual = match (target.parent(doc), &target.slot) {
        (Some(Value::Object(map)), Slot::Key(k)) => map.get(k.as_str()),
        // fast-json-patch ≠ RFC 6902: `test` does not validate the index, so `/01` tests
        // element 1 (`~~"01"`).
        (Some(Value::Array(arr)), Slot::Index(k)) => {
            usize::try_from(*k).ok().and_then(|k| arr.get(k))
        }
        _ => None,
    };
    // An inherited name is a function and a missing one `undefined`: neither equals JSON.
    match actual {
        Some(v) if js_equals(v, expected) => Ok(()),
        _ => fail(
            "TEST_OPERATION_FAILED",
            format!("test operation failed at {path:?}"),
        ),
    }
}
