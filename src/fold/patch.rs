//! JSON Patch (RFC 6902) with the semantics of `fast-json-patch` 3.1.1 `applyPatch(doc, ops,
//! /*validate*/ true, /*mutate*/ false)`, the call the AG-UI client reducer makes for
//! `STATE_DELTA` and `ACTIVITY_DELTA` (AGUI.md §6).
//!
//! Every operation is first checked by a read-only walk that mirrors `fast-json-patch`'s
//! `applyOperation` step by step (`existingPathFragment`, the `validator`, JavaScript property
//! lookup, `~~key` index conversion, the `__proto__` ban). The walk either fails the operation
//! the way the library throws, or yields a normalised pointer (canonical array indices,
//! clamped insertion points) that the `json-patch` crate then applies: the crate's RFC 6902
//! semantics and the library's agree on every normalised operation. The few places where the
//! walk does the work itself are marked `fast-json-patch ≠ RFC 6902` and say why.
//!
//! Deliberate differences from the library, each where JavaScript would produce a value JSON
//! cannot hold, lose a value, or depend on whether the library runs in strict mode (the first
//! two cannot occur in an event that passed the broker's schema validation):
//! - an `op` outside RFC 6902's six fails (`OPERATION_OP_INVALID`); the library also accepts
//!   `_get` and `Object.prototype` names (`toString`, …) — the 1.0 client's enforcement stage
//!   drops such operations before the reducer sees them, and so does [`super::Fold`];
//! - a `from` that is not a JSON Pointer fails (the library reads the property `"undefined"`);
//! - `move`/`copy` to the root from a missing `from` fails (the library makes the document
//!   `undefined`);
//! - `move`/`copy` from an inherited `Object.prototype` name (`/toString`) or a non-index array
//!   member (`/list/length`) fails (the library copies a function, or splices index 0);
//! - `move` from the root into one of its members fails (the library builds a cycle);
//! - a `move` whose destination, once `from` is removed, runs through an inherited name or a
//!   scalar fails (the library assigns the value to a function or a primitive: it is lost);
//! - on a string, number or boolean document every keyed operation fails, as it does under
//!   strict mode (browser bundles load the library as an ES module); CommonJS sloppy mode
//!   would silently ignore an `add`.
//!
//! Replaying 420 000 random patches through the published library and [`apply_patch`] agrees
//! everywhere except in those cases (all of which RFC 6902 also rejects).
//!
//! The key order of objects follows JavaScript insertion order (new keys last, `remove`
//! keeps the others in place), except that JavaScript also lists integer-like keys first; JSON
//! object order carries no meaning, so that one is not emulated.

use json_patch::jsonptr::{PointerBuf, Token};
use json_patch::{AddOperation, CopyOperation, PatchOperation, RemoveOperation, ReplaceOperation};
use serde_json::{Map, Value};

/// Why a JSON Patch did not apply: the index of the failing operation (0-based, in the
/// patch as sent) and `fast-json-patch`'s error name and text.
///
/// The document is unchanged whenever this is returned ([`apply_patch`] is pure).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("operation {op_index}: {code}: {message}")]
pub struct PatchError {
    /// Index of the operation that failed, in the patch as sent.
    pub op_index: usize,
    /// `fast-json-patch`'s error name (`OPERATION_PATH_UNRESOLVABLE`, `TEST_OPERATION_FAILED`,
    /// …), or `TYPE_ERROR` where the library throws a JavaScript `TypeError`.
    pub code: &'static str,
    /// Human-readable reason, naming the path.
    pub message: String,
}

/// Applies a JSON Patch (RFC 6902 §4) to `doc` with `fast-json-patch` semantics and returns
/// the new document; `doc` itself is never modified.
///
/// All or nothing: the first failing operation fails the whole patch (RFC 6902 §5, and the
/// client's `STATE_DELTA` handling, AGUI.md §6). `ops` is the `delta` array of a
/// `STATE_DELTA` (or `patch` of an `ACTIVITY_DELTA`); an empty patch returns `doc` unchanged.
///
/// Cost: one deep clone of `doc` (the working copy), plus one clone of each operation's
/// `value`.
///
/// # Errors
/// [`PatchError`] naming the first operation that does not apply, with the library's error
/// name: malformed operation (`OPERATION_*_INVALID`, `*_REQUIRED`), `add` below a missing
/// parent (`OPERATION_PATH_CANNOT_ADD`), `replace`/`remove` of a missing member
/// (`OPERATION_PATH_UNRESOLVABLE`), `move`/`copy` from a missing member
/// (`OPERATION_FROM_UNRESOLVABLE`), array index past the end (`OPERATION_VALUE_OUT_OF_BOUNDS`)
/// or not a number (`OPERATION_PATH_ILLEGAL_ARRAY_INDEX`), `test` mismatch
/// (`TEST_OPERATION_FAILED`), `__proto__`/`constructor/prototype` (`TYPE_ERROR`), a keyed
/// operation on a `null` or scalar document (`TYPE_ERROR`).
pub fn apply_patch(doc: &Value, ops: &[Value]) -> Result<Value, PatchError> {
    let mut work = doc.clone();
    apply_in_place(&mut work, ops.iter().enumerate())?;
    Ok(work)
}

/// Applies a patch to `doc` in place, all or nothing, cloning `doc` only when it has to.
///
/// A single non-`move` operation is checked before anything is written (the walk fails
/// before the crate mutates), so it needs no copy; any longer patch is applied to a clone
/// that replaces `doc` on success (an O(size of `doc`) copy per event; the price of
/// atomicity, RFC 6902 §5).
///
/// `ops` yields `(index as sent, operation)`, so a caller that dropped some operations
/// (the client's enforcement stage drops unknown `op`s) still reports original indices.
pub(crate) fn apply_atomic<'a, I>(doc: &mut Value, ops: I) -> Result<(), PatchError>
where
    I: IntoIterator<Item = (usize, &'a Value)>,
    I::IntoIter: Clone,
{
    let ops = ops.into_iter();
    let mut probe = ops.clone();
    match (probe.next(), probe.next()) {
        (None, _) => Ok(()),
        (Some((_, op)), None) if op.get("op").and_then(Value::as_str) != Some("move") => {
            apply_in_place(doc, ops)
        }
        _ => {
            let mut work = doc.clone();
            apply_in_place(&mut work, ops)?;
            *doc = work;
            Ok(())
        }
    }
}

/// Applies operations in order, mutating `doc`; on error `doc` may hold the operations
/// before the failing one (callers provide atomicity).
fn apply_in_place<'a>(
    doc: &mut Value,
    ops: impl Iterator<Item = (usize, &'a Value)>,
) -> Result<(), PatchError> {
    for (index, raw) in ops {
        apply_op(doc, raw).map_err(|fail| PatchError {
            op_index: index,
            code: fail.code,
            message: fail.message,
        })?;
    }
    Ok(())
}

/// A failed operation before its index is known.
struct Fail {
    code: &'static str,
    message: String,
}

fn fail<T>(code: &'static str, message: impl Into<String>) -> Result<T, Fail> {
    Err(Fail {
        code,
        message: message.into(),
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Add,
    Remove,
    Replace,
    Move,
    Copy,
    Test,
}

/// One operation after `fast-json-patch`'s shape `validator`.
struct Op<'a> {
    kind: Kind,
    path: &'a str,
    from: &'a str,
    value: &'a Value,
}

static NULL: Value = Value::Null;

/// `validator(operation, index)` without a document: the shape checks, in the library's
/// order.
fn parse_op(raw: &Value) -> Result<Op<'_>, Fail> {
    let Some(obj) = raw.as_object() else {
        return fail("OPERATION_NOT_AN_OBJECT", "operation is not an object");
    };
    let kind = match obj.get("op").and_then(Value::as_str) {
        Some("add") => Kind::Add,
        Some("remove") => Kind::Remove,
        Some("replace") => Kind::Replace,
        Some("move") => Kind::Move,
        Some("copy") => Kind::Copy,
        Some("test") => Kind::Test,
        _ => {
            return fail(
                "OPERATION_OP_INVALID",
                "operation `op` property is not one of operations defined in RFC-6902",
            );
        }
    };
    let Some(path) = obj.get("path").and_then(Value::as_str) else {
        return fail(
            "OPERATION_PATH_INVALID",
            "operation `path` property is not a string",
        );
    };
    if !path.is_empty() && !path.starts_with('/') {
        return fail(
            "OPERATION_PATH_INVALID",
            "operation `path` property must start with \"/\"",
        );
    }
    let mut from = "";
    if matches!(kind, Kind::Move | Kind::Copy) {
        let Some(f) = obj.get("from").and_then(Value::as_str) else {
            return fail(
                "OPERATION_FROM_REQUIRED",
                "operation `from` property is not present",
            );
        };
        // fast-json-patch ≠ RFC 6902: the library does not check `from` is a pointer (it then
        // reads the property "undefined"); the AG-UI schema requires one, so refuse.
        if !f.is_empty() && !f.starts_with('/') {
            return fail(
                "OPERATION_FROM_INVALID",
                "operation `from` property must start with \"/\"",
            );
        }
        from = f;
    }
    let value = match kind {
        Kind::Add | Kind::Replace | Kind::Test => match obj.get("value") {
            Some(v) => v,
            None => {
                return fail(
                    "OPERATION_VALUE_REQUIRED",
                    "operation `value` property is not present",
                );
            }
        },
        _ => &NULL,
    };
    Ok(Op {
        kind,
        path,
        from,
        value,
    })
}

/// Applies one operation to `doc`. Fails without writing anything, except a `move` that
/// fails after removing its source (callers clone for a `move`).
fn apply_op(doc: &mut Value, raw: &Value) -> Result<(), Fail> {
    let op = parse_op(raw)?;
    if op.path.is_empty() {
        return apply_root(doc, &op);
    }
    let tokens = Tokens::parse(op.path);
    if !doc.is_object() && !doc.is_array() {
        // fast-json-patch ≠ RFC 6902: on `null` the library throws reading the first key; on a
        // scalar strict-mode JavaScript throws assigning to it. Either way: fails.
        let what = if doc.is_null() { "null" } else { "a scalar" };
        return fail(
            "TYPE_ERROR",
            format!(
                "cannot perform `{}` at {:?}: the document is {what}",
                op.path, op.path
            ),
        );
    }
    let target = walk(doc, &op, &tokens)?;
    match op.kind {
        Kind::Test => test_target(doc, &target, op.value, op.path),
        Kind::Add => {
            let pointer = match &target.slot {
                Slot::Key(key) => target.pointer_with(Token::new(key.as_str())),
                // fast-json-patch ≠ RFC 6902: `~~"01"` is 1 and a negative `~~` result counts
                // from the end (`Array.prototype.splice`), so the index is normalised here.
                Slot::Index(k) => {
                    let len = target.array_len(doc);
                    target.pointer_with(index_token(splice_start(*k, len)))
                }
            };
            crate_apply(
                doc,
                PatchOperation::Add(AddOperation {
                    path: pointer,
                    value: op.value.clone(),
                }),
            )
        }
        Kind::Replace => {
            let pointer = match &target.slot {
                Slot::Key(key) => target.pointer_with(Token::new(key.as_str())),
                Slot::Index(k) => target.pointer_with(index_token(usize_index(*k))),
            };
            if target.inherited_only(doc) {
                // fast-json-patch ≠ RFC 6902: `replace` of an inherited `Object.prototype`
                // name (`/constructor`) passes the library's existence check and assigns an
                // own member: an `add`.
                return crate_apply(
                    doc,
                    PatchOperation::Add(AddOperation {
                        path: pointer,
                        value: op.value.clone(),
                    }),
                );
            }
            crate_apply(
                doc,
                PatchOperation::Replace(ReplaceOperation {
                    path: pointer,
                    value: op.value.clone(),
                }),
            )
        }
        Kind::Remove => match &target.slot {
            Slot::Key(key) => {
                // The crate removes object members with `swap_remove` (moving the last key into
                // the hole); JavaScript `delete` keeps the other keys in order, so the member is
                // removed here. An inherited-only name (`/toString`) is a no-op `delete`.
                if let Some(Value::Object(map)) = target.parent_mut(doc) {
                    map.shift_remove(key.as_str());
                }
                Ok(())
            }
            Slot::Index(k) => {
                let pointer = target.pointer_with(index_token(usize_index(*k)));
                crate_apply(
                    doc,
                    PatchOperation::Remove(RemoveOperation { path: pointer }),
                )
            }
        },
        Kind::Copy => {
            let from = resolve_from(doc, op.from)?;
            let pointer = match &target.slot {
                Slot::Key(key) => target.pointer_with(Token::new(key.as_str())),
                // fast-json-patch ≠ RFC 6902: the destination of `copy`/`move` is added without
                // validation, so an index past the end appends (`splice`) instead of failing.
                Slot::Index(k) => {
                    let len = target.array_len(doc);
                    target.pointer_with(index_token(splice_start(*k, len).min(len)))
                }
            };
            crate_apply(
                doc,
                PatchOperation::Copy(CopyOperation {
                    from,
                    path: pointer,
                }),
            )
        }
        Kind::Move => {
            let from = resolve_from(doc, op.from)?;
            if from.is_root() {
                return fail(
                    "TYPE_ERROR",
                    format!("cannot move the document into {:?}", op.path),
                );
            }
            // The library removes `from`, then adds at `path` without validation, resolving
            // `path` again on the changed document; so does this.
            let value = take(doc, &from)?;
            let pointer = unvalidated_destination(doc, &tokens, op.path)?;
            crate_apply(
                doc,
                PatchOperation::Add(AddOperation {
                    path: pointer,
                    value,
                }),
            )
        }
    }
}

/// Operations at the root (`path: ""`), which `fast-json-patch` handles before any walk.
fn apply_root(doc: &mut Value, op: &Op<'_>) -> Result<(), Fail> {
    match op.kind {
        Kind::Add | Kind::Replace => *doc = op.value.clone(),
        // fast-json-patch ≠ RFC 6902: removing the root leaves `null`.
        Kind::Remove => *doc = Value::Null,
        Kind::Test => {
            if !js_equals(doc, op.value) {
                return fail("TEST_OPERATION_FAILED", "test operation failed at \"\"");
            }
        }
        Kind::Move | Kind::Copy => {
            // The library reads `from` without validation (`getValueByPointer`); a missing
            // member would make the document `undefined`, which JSON cannot hold: fails.
            if !op.from.is_empty() {
                let Some(value) = lenient_get(doc, &Tokens::parse(op.from))? else {
                    return fail(
                        "OPERATION_FROM_UNRESOLVABLE",
                        format!(
                            "cannot perform the operation from {:?}: it does not exist",
                            op.from
                        ),
                    );
                };
                *doc = value.clone();
            }
        }
    }
    Ok(())
}

/// The tokens of a JSON Pointer, raw and decoded (`~1` → `/`, then `~0` → `~`, exactly as
/// the library's `unescapePathComponent`).
struct Tokens<'a> {
    raw: Vec<&'a str>,
    decoded: Vec<String>,
}

impl<'a> Tokens<'a> {
    /// Splits a non-empty pointer starting with `/` (checked by [`parse_op`]).
    fn parse(pointer: &'a str) -> Self {
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

    fn len(&self) -> usize {
        self.raw.len()
    }

    /// The library's ban (`banPrototypeModifications`, on by default): a `__proto__` key, or
    /// `prototype` right after a raw `constructor`. A `TypeError`, so the patch fails.
    fn check_ban(&self, i: usize) -> Result<(), Fail> {
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
enum Step {
    Key(String),
    Index(usize),
}

/// The last token of a path, on its parent container.
#[derive(Debug)]
enum Slot {
    /// A member name of an object parent.
    Key(String),
    /// An array index after `~~key` (or the length for `-`); may be negative or past the end.
    Index(i64),
}

/// Where an operation lands: the parent's location and the final slot.
struct Target {
    parent: Vec<Step>,
    slot: Slot,
}

impl Target {
    fn parent_pointer(&self) -> PointerBuf {
        PointerBuf::from_tokens(self.parent.iter().map(step_token))
    }

    fn pointer_with(&self, last: Token<'_>) -> PointerBuf {
        let mut pointer = self.parent_pointer();
        pointer.push_back(last);
        pointer
    }

    fn parent<'d>(&self, doc: &'d Value) -> Option<&'d Value> {
        self.parent.iter().try_fold(doc, |v, step| match (v, step) {
            (Value::Object(m), Step::Key(k)) => m.get(k.as_str()),
            (Value::Array(a), Step::Index(i)) => a.get(*i),
            _ => None,
        })
    }

    fn parent_mut<'d>(&self, doc: &'d mut Value) -> Option<&'d mut Value> {
        self.parent.iter().try_fold(doc, |v, step| match (v, step) {
            (Value::Object(m), Step::Key(k)) => m.get_mut(k.as_str()),
            (Value::Array(a), Step::Index(i)) => a.get_mut(*i),
            _ => None,
        })
    }

    fn array_len(&self, doc: &Value) -> usize {
        self.parent(doc)
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    }

    /// Whether the slot names an `Object.prototype` member the parent object does not own.
    fn inherited_only(&self, doc: &Value) -> bool {
        match (&self.slot, self.parent(doc)) {
            (Slot::Key(k), Some(Value::Object(m))) => {
                !m.contains_key(k.as_str()) && is_object_proto(k)
            }
            _ => false,
        }
    }
}

fn step_token(step: &Step) -> Token<'_> {
    match step {
        Step::Key(k) => Token::new(k.as_str()),
        Step::Index(i) => index_token(*i),
    }
}

fn index_token(i: usize) -> Token<'static> {
    Token::new(i.to_string())
}

/// A slot index the walk already proved to be a valid position (`0 ≤ k < len`).
fn usize_index(k: i64) -> usize {
    usize::try_from(k).unwrap_or(0)
}

/// `Array.prototype.splice(start)`: a negative start counts from the end (floored at 0); a
/// start past the end is clamped by `splice` itself (callers clamp where that applies).
fn splice_start(k: i64, len: usize) -> usize {
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
fn walk(doc: &Value, op: &Op<'_>, tokens: &Tokens<'_>) -> Result<Target, Fail> {
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

fn unresolvable_intermediate<T>(path: &str) -> Result<T, Fail> {
    fail(
        "OPERATION_PATH_UNRESOLVABLE",
        format!("cannot perform operation at the desired path {path:?}"),
    )
}

/// The library's `validator(operation, index, document, existingPathFragment)` document
/// checks. `full` is whether the whole path exists; `missing_is_last` whether the first
/// missing member (if any) is the last token.
fn validate_against_doc(
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
fn resolve_from(doc: &Value, from: &str) -> Result<PointerBuf, Fail> {
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
fn lenient_get<'d>(doc: &'d Value, tokens: &Tokens<'_>) -> Result<Option<&'d Value>, Fail> {
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

/// Removes the value at a canonical pointer (a resolved `from`) and returns it, keeping
/// the order of the remaining object keys.
fn take(doc: &mut Value, from: &PointerBuf) -> Result<Value, Fail> {
    let removed =
        from.split_back()
            .and_then(|(parent, last)| match doc.pointer_mut(parent.as_str())? {
                Value::Object(map) => map.shift_remove(last.decoded().as_ref()),
                Value::Array(arr) => {
                    let k: usize = last.decoded().parse().ok()?;
                    (k < arr.len()).then(|| arr.remove(k))
                }
                _ => None,
            });
    match removed {
        Some(v) => Ok(v),
        None => fail(
            "OPERATION_FROM_UNRESOLVABLE",
            format!("cannot remove {:?}", from.as_str()),
        ),
    }
}

/// The `add` a `move` performs after removing its source: no validation, resolved on the
/// changed document. Returns the canonical pointer (an index past the end appends, a
/// negative one counts from the end, as `splice` does).
fn unvalidated_destination(
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
fn test_target(doc: &Value, target: &Target, expected: &Value, path: &str) -> Result<(), Fail> {
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

/// Applies one normalised operation with the `json-patch` crate (RFC 6902 §4).
fn crate_apply(doc: &mut Value, op: PatchOperation) -> Result<(), Fail> {
    json_patch::patch_unsafe(doc, std::slice::from_ref(&op)).map_err(|e| Fail {
        // Not expected: the walk only lets through operations the crate accepts.
        code: "OPERATION_PATH_UNRESOLVABLE",
        message: e.to_string(),
    })
}

/// JavaScript `obj[key] !== undefined` for a container (the library's existence check).
/// Arrays: a canonical index below the length (other names either fail later as an illegal
/// index or are `-`); objects: an own member or an `Object.prototype` name.
fn js_has(obj: &Value, key: &str) -> bool {
    match obj {
        Value::Object(map) => map.contains_key(key) || is_object_proto(key),
        Value::Array(arr) => canonical_index(key).is_some_and(|k| k < arr.len()),
        _ => false,
    }
}

/// Names every plain object inherits from `Object.prototype` (ECMAScript 2024).
fn is_object_proto(key: &str) -> bool {
    matches!(
        key,
        "constructor"
            | "hasOwnProperty"
            | "isPrototypeOf"
            | "propertyIsEnumerable"
            | "toString"
            | "toLocaleString"
            | "valueOf"
            | "__defineGetter__"
            | "__defineSetter__"
            | "__lookupGetter__"
            | "__lookupSetter__"
            | "__proto__"
    )
}

/// The library's `isInteger`: only ASCII digits (the empty string included).
fn is_digits(key: &str) -> bool {
    key.bytes().all(|b| b.is_ascii_digit())
}

/// An RFC 6901 array index: `0` or digits without a leading zero.
fn canonical_index(key: &str) -> Option<usize> {
    if key.is_empty() || (key.len() > 1 && key.starts_with('0')) || !is_digits(key) {
        return None;
    }
    key.parse().ok()
}

/// JavaScript `~~key` for a digit string: `Number(key)` then ToInt32 (so `""` is 0, `"01"`
/// is 1 and `"4294967296"` wraps to 0).
fn to_int32(key: &str) -> i64 {
    if key.is_empty() {
        return 0;
    }
    let x: f64 = key.parse().unwrap_or(f64::INFINITY);
    if !x.is_finite() {
        return 0;
    }
    const TWO_32: f64 = 4_294_967_296.0;
    // Exact: `rem_euclid` of doubles is exact, and the result is an integer below 2^32.
    let m = x.trunc().rem_euclid(TWO_32) as i64;
    if m >= 1 << 31 { m - (1 << 32) } else { m }
}

/// `fast-json-patch`'s `_areEquals`: deep equality where numbers compare as IEEE doubles
/// (`1` equals `1.0`, which `serde_json`'s `arbitrary_precision` equality would not) and
/// object member order does not matter.
pub(crate) fn js_equals(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Number(x), Value::Number(y)) => number_as_f64(x) == number_as_f64(y),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| js_equals(v, w))
        }
        (Value::Object(x), Value::Object(y)) => objects_equal(x, y),
        _ => false,
    }
}

fn objects_equal(x: &Map<String, Value>, y: &Map<String, Value>) -> bool {
    x.len() == y.len()
        && x.iter()
            .all(|(k, v)| y.get(k).is_some_and(|w| js_equals(v, w)))
}

/// The double JavaScript's `JSON.parse` makes of a number (±Infinity past the range).
fn number_as_f64(n: &serde_json::Number) -> f64 {
    n.as_f64()
        .unwrap_or_else(|| n.to_string().parse().unwrap_or(f64::NAN))
}

#[cfg(test)]
mod tests {
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
    /// with `~~"01"` = 1 (replayed on the published library). The fold follows the library.
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

    // ---- other fast-json-patch behaviour, replayed on the published library -------------

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
}
