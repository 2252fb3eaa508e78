//! JSON Patch (RFC 6902) with the semantics of `fast-json-patch` 3.1.1 `applyPatch(doc, ops,
//! /*validate*/ true, /*mutate*/ false)`, the call the AG-UI client reducer makes for
//! `STATE_DELTA` and `ACTIVITY_DELTA` (AGUI.md §6).
//!
//! Every operation is first checked by a read-only walk that mirrors `fast-json-patch`'s
//! `applyOperation` step by step (`existingPathFragment`, the `validator`, JavaScript property
//! lookup, `~~key` index conversion, the `__proto__` ban). The walk either fails the operation
//! the way the library throws, or yields a normalised pointer (canonical array indices,
//! clamped insertion points) where `journal.rs` then writes: at a normalised pointer every
//! operation is one insert, overwrite or removal on one container, on which RFC 6902 and the
//! library agree. Each write is recorded with what it overwrote, so a patch is all or nothing
//! without a copy of the document. The few places where the walk does the work itself are
//! marked `fast-json-patch ≠ RFC 6902` and say why.
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
//! Running 420 000 random patches through the published library and [`apply_patch`] agrees
//! everywhere except in those cases (all of which RFC 6902 also rejects).
//!
//! A publish applies patches with [`apply_atomic_portable`], which also refuses pointers that
//! JSON Patch clients disagree on (`portable.rs`: `__proto__`, `constructor/prototype`,
//! non-canonical array indices, inherited `Object.prototype` names); everything else (the log's
//! fold, coalescing) applies them as the JavaScript client does.
//!
//! The key order of objects follows JavaScript insertion order (new keys last, `remove`
//! keeps the others in place), except that JavaScript also lists integer-like keys first; JSON
//! object order carries no meaning, so that one is not emulated.

use crate::event::Fields;
use json_patch::jsonptr::Token;
use serde_json::Value;

mod journal;
mod js;
mod portable;
mod walk;

use journal::Journal;

pub(crate) use js::js_equals;

use walk::{
    Slot, Tokens, index_token, lenient_get, resolve_from, splice_start, test_target,
    unvalidated_destination, usize_index, walk,
};

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

/// Applies a patch to `doc` in place, all or nothing (RFC 6902 §5), without a copy of `doc`:
/// the writes are recorded as they are made and taken back if a later operation fails, so the
/// cost is O(the operations' values), whatever the size of `doc`.
///
/// `ops` yields `(index as sent, operation)`, so a caller that dropped some operations
/// (the client's enforcement stage drops unknown `op`s) still reports original indices.
pub(crate) fn apply_atomic<'a>(
    doc: &mut Value,
    ops: impl IntoIterator<Item = (usize, &'a Value)>,
) -> Result<(), PatchError> {
    atomic(doc, ops, apply_indexed)
}

/// Why a publish refuses a patch ([`apply_atomic_portable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaRefusal {
    /// An operation does not apply (as for [`apply_patch`]).
    #[error(transparent)]
    NotApplicable(#[from] PatchError),
    /// An operation's pointer is one JSON Patch clients disagree on.
    #[error(transparent)]
    Ambiguous(#[from] AmbiguousPath),
}

/// An operation whose `path` or `from` JSON Patch clients disagree on (PROTOCOL §2 "Portable
/// patch paths"): `__proto__`, `constructor/prototype`, a non-canonical array index, an
/// inherited `Object.prototype` name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("operation {op_index}: `{member}` {pointer:?} {reason}")]
pub struct AmbiguousPath {
    /// Index of the operation, in the patch as sent.
    pub op_index: usize,
    /// The operation's member holding the pointer: `path` or `from`.
    pub member: &'static str,
    /// The pointer as sent.
    pub pointer: String,
    /// What clients disagree on.
    pub reason: String,
}

/// [`apply_atomic`] for a publish: before it is applied, each operation's `path` and `from`
/// are checked against the document as the operations before it left it, and one that clients
/// disagree on refuses the patch (nothing applied).
///
/// # Errors
/// The first [`DeltaRefusal`].
pub(crate) fn apply_atomic_portable<'a>(
    doc: &mut Value,
    ops: impl IntoIterator<Item = (usize, &'a Value)>,
) -> Result<(), DeltaRefusal> {
    atomic(doc, ops, apply_portable)
}

/// Patches applied to a document only to see whether they apply (a publish's check of its
/// batch's `STATE_DELTA`s against the thread's own state), every write recorded so that
/// [`Trial::undo`] leaves the document exactly as it was (key order included), in
/// O(the operations' values) rather than a copy of the document.
#[derive(Debug)]
pub(crate) struct Trial(Journal);

impl Trial {
    /// A trial with nothing applied yet.
    pub(crate) fn new() -> Self {
        Trial(Journal::recording())
    }

    /// [`apply_atomic_portable`] as part of the trial. On error `doc` may hold the
    /// operations before the failing one, until [`Trial::undo`].
    ///
    /// # Errors
    /// The first [`DeltaRefusal`].
    pub(crate) fn apply_portable<'a>(
        &mut self,
        doc: &mut Value,
        ops: impl IntoIterator<Item = (usize, &'a Value)>,
    ) -> Result<(), DeltaRefusal> {
        for (index, raw) in ops {
            apply_portable(doc, index, raw, &mut self.0)?;
        }
        Ok(())
    }

    /// Takes back every write of the trial: `doc` (the document it applied to) is again what
    /// it was before the trial.
    pub(crate) fn undo(self, doc: &mut Value) {
        self.0.undo(doc);
    }
}

/// One operation of [`apply_atomic_portable`]: the portable-path check, then the operation.
fn apply_portable(
    doc: &mut Value,
    index: usize,
    raw: &Value,
    journal: &mut Journal,
) -> Result<(), DeltaRefusal> {
    portable::check(doc, raw).map_err(|u| AmbiguousPath {
        op_index: index,
        member: u.member,
        pointer: u.pointer,
        reason: u.reason,
    })?;
    Ok(apply_indexed(doc, index, raw, journal)?)
}

/// Runs `step` on each operation, all or nothing: the writes are recorded in a [`Journal`] and
/// taken back when an operation fails (O(operations applied), no copy of `doc`). `step` must
/// fail without writing anything, so a patch's last operation is not recorded.
fn atomic<'a, E>(
    doc: &mut Value,
    ops: impl IntoIterator<Item = (usize, &'a Value)>,
    mut step: impl FnMut(&mut Value, usize, &'a Value, &mut Journal) -> Result<(), E>,
) -> Result<(), E> {
    let mut ops = ops.into_iter().peekable();
    let mut journal = Journal::recording();
    while let Some((index, op)) = ops.next() {
        journal.set_recording(ops.peek().is_some());
        if let Err(failed) = step(doc, index, op, &mut journal) {
            journal.undo(doc);
            return Err(failed);
        }
    }
    Ok(())
}

/// Applies operations in order, mutating `doc`; on error `doc` may hold the operations
/// before the failing one (callers provide atomicity).
fn apply_in_place<'a>(
    doc: &mut Value,
    ops: impl Iterator<Item = (usize, &'a Value)>,
) -> Result<(), PatchError> {
    let mut journal = Journal::off();
    for (index, raw) in ops {
        apply_indexed(doc, index, raw, &mut journal)?;
    }
    Ok(())
}

/// [`apply_op`], its failure named by the operation's `index` as sent.
fn apply_indexed(
    doc: &mut Value,
    index: usize,
    raw: &Value,
    journal: &mut Journal,
) -> Result<(), PatchError> {
    apply_op(doc, raw, journal).map_err(|fail| PatchError {
        op_index: index,
        code: fail.code,
        message: fail.message,
    })
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
    let kind = match obj.field("op").and_then(Value::as_str) {
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
    let Some(path) = obj.field("path").and_then(Value::as_str) else {
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
        let Some(f) = obj.field("from").and_then(Value::as_str) else {
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
        Kind::Add | Kind::Replace | Kind::Test => match obj.field("value") {
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

/// Applies one operation to `doc`, recording its writes in `journal`. Fails without writing
/// anything (a `move` whose destination fails puts its source back).
fn apply_op(doc: &mut Value, raw: &Value, journal: &mut Journal) -> Result<(), Fail> {
    let op = parse_op(raw)?;
    if op.path.is_empty() {
        return apply_root(doc, &op, journal);
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
            journal.add(doc, &pointer, op.value.clone())
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
                return journal.add(doc, &pointer, op.value.clone());
            }
            journal.replace(doc, &pointer, op.value.clone())
        }
        Kind::Remove => {
            // JavaScript `delete` keeps the other keys in order (not the crate's
            // `swap_remove`); an inherited-only name (`/toString`) is a no-op `delete`.
            let pointer = match &target.slot {
                Slot::Key(key) => target.pointer_with(Token::new(key.as_str())),
                Slot::Index(k) => target.pointer_with(index_token(usize_index(*k))),
            };
            journal.remove(doc, &pointer)
        }
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
            let Some(value) = doc.pointer(from.as_str()).cloned() else {
                return fail(
                    "OPERATION_FROM_UNRESOLVABLE",
                    format!("cannot copy from {:?}", op.from),
                );
            };
            journal.add(doc, &pointer, value)
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
            let (value, removal) = journal.take(doc, &from)?;
            match unvalidated_destination(doc, &tokens, op.path) {
                Ok(pointer) => {
                    journal.moved(removal);
                    journal.add(doc, &pointer, value)
                }
                Err(failed) => {
                    removal.put_back(doc, value);
                    Err(failed)
                }
            }
        }
    }
}

/// Operations at the root (`path: ""`), which `fast-json-patch` handles before any walk.
fn apply_root(doc: &mut Value, op: &Op<'_>, journal: &mut Journal) -> Result<(), Fail> {
    match op.kind {
        Kind::Add | Kind::Replace => journal.set_document(doc, op.value.clone()),
        // fast-json-patch ≠ RFC 6902: removing the root leaves `null`.
        Kind::Remove => journal.set_document(doc, Value::Null),
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
                let value = value.clone();
                journal.set_document(doc, value);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
