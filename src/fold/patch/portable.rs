//! JSON Patch pointers that clients disagree on (PROTOCOL §2 "Portable patch paths"): refused at
//! publish so that every subscriber's state stays the log's, whatever its JSON Patch library.
//!
//! The fold applies patches as `fast-json-patch` does (the JavaScript client), while clients in
//! other languages follow RFC 6902 and RFC 6901 to the letter. They part ways on a pointer that
//! (checked against the document the operation applies to):
//! - names `__proto__`, or `prototype` right after `constructor`: `fast-json-patch` throws
//!   (`banPrototypeModifications`, on by default), other libraries apply it as a member name;
//! - applies to an array a digit token that is not a canonical index: a leading zero (`01`,
//!   invalid in RFC 6901 §4), the empty token, or an index above 2^31 − 1. The others refuse
//!   it; `fast-json-patch` converts it with `~~key` (`01` → 1, `""` → 0, `4294967296` → 0)
//!   wherever it does not first check the member exists (an `add`'s last token, a `test`, a
//!   `move`/`copy` destination: `add /arr/01` inserts at 1). Refused wherever it appears:
//!   RFC 6901 gives it no meaning, so no client can be relied on to read it alike;
//! - makes a `remove` or `replace` target, or a `move`/`copy` source, of an `Object.prototype`
//!   name (`constructor`, `toString`, …) the object does not hold: JavaScript finds it on
//!   every object (a `remove` then does nothing, a `replace` adds), the others find nothing.
//!
//! Other uses of those names are ordinary members everywhere (`add /constructor`, `replace` of
//! an own `constructor`, `prototype` anywhere else) and pass.

use super::js::{canonical_index, is_digits, is_object_proto, to_int32};
use super::walk::Tokens;
use crate::event::Fields;
use serde_json::Value;

/// Why a pointer of an operation is refused.
pub(super) struct Unportable {
    /// The operation's member holding it: `path` or `from`.
    pub member: &'static str,
    /// The pointer as sent.
    pub pointer: String,
    /// What clients disagree on.
    pub reason: String,
}

/// Checks the `path` (and a `move`/`copy`'s `from`) of one operation against `doc`, the document
/// as the operations before it left it. A malformed operation passes: applying it reports that.
///
/// # Errors
/// [`Unportable`] for the first pointer clients disagree on (module docs).
pub(super) fn check(doc: &Value, raw: &Value) -> Result<(), Unportable> {
    let Some(op) = raw.as_object() else {
        return Ok(());
    };
    let kind = op.field("op").and_then(Value::as_str).unwrap_or_default();
    if let Some(path) = op.field("path").and_then(Value::as_str) {
        check_pointer(doc, path, "path", matches!(kind, "remove" | "replace"))?;
    }
    if matches!(kind, "move" | "copy")
        && let Some(from) = op.field("from").and_then(Value::as_str)
    {
        check_pointer(doc, from, "from", true)?;
    }
    Ok(())
}

/// One pointer; `must_exist`: its last token must name a member the operation finds.
fn check_pointer(
    doc: &Value,
    pointer: &str,
    member: &'static str,
    must_exist: bool,
) -> Result<(), Unportable> {
    if !pointer.starts_with('/') {
        return Ok(());
    }
    let refuse = |reason: String| {
        Err(Unportable {
            member,
            pointer: pointer.to_owned(),
            reason,
        })
    };
    let tokens = Tokens::parse(pointer);
    let n = tokens.len();
    // The value the tokens so far lead to, while there is one.
    let mut at = Some(doc);
    for i in 0..n {
        let key = tokens.decoded[i].as_str();
        if key == "__proto__" {
            return refuse(
                "names `__proto__`: JavaScript clients refuse it (fast-json-patch bans it), \
                 others apply it as a member name"
                    .into(),
            );
        }
        if key == "prototype" && i > 0 && tokens.raw[i - 1] == "constructor" {
            return refuse(
                "names `constructor/prototype`: JavaScript clients refuse it (fast-json-patch \
                 bans it), others apply it as member names"
                    .into(),
            );
        }
        at = match at {
            Some(Value::Array(items)) => {
                if is_digits(key) && !portable_index(key) {
                    return refuse(format!(
                        "has the array index {key:?}: RFC 6901 §4 allows only 0 or digits \
                         without a leading zero (and JavaScript wraps past 2^31 - 1), so other \
                         clients refuse it, while fast-json-patch reads it as {} in some \
                         operations",
                        to_int32(key)
                    ));
                }
                canonical_index(key).and_then(|k| items.get(k))
            }
            Some(Value::Object(members)) => {
                let own = members.get(key);
                if i + 1 == n && must_exist && own.is_none() && is_object_proto(key) {
                    return refuse(format!(
                        "names `{key}`, which this object does not hold: JavaScript clients \
                         find it on every object (Object.prototype), others find nothing"
                    ));
                }
                own
            }
            _ => None,
        };
    }
    Ok(())
}

/// A digit token every client reads as the same array index: canonical (RFC 6901 §4) and within
/// JavaScript's `~~` (32-bit signed) range.
fn portable_index(key: &str) -> bool {
    canonical_index(key).is_some_and(|k| k <= i32::MAX as usize)
}
