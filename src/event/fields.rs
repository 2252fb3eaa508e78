//! Reading an event's fields by name without hashing the name: [`Fields::field`] and
//! [`Fields::at`], used on the per-event path (validation, order rules, folds) instead of
//! `serde_json`'s `get` and `[]`.
//!
//! Why: with `preserve_order` (the producer's field order is kept, PROTOCOL §2) a `serde_json`
//! object is an `IndexMap` with the standard SipHash hasher, so every lookup hashes the name.
//! A token delta went through ~36 lookups on the publish and fan-out paths, ~8 % of its
//! instructions (release callgrind, loadtest/REPORT.md session 10). AG-UI events and the
//! objects inside them have a handful of fields: comparing the names in order is cheaper than
//! hashing one, so objects of up to [`SCAN_LIMIT`] fields are scanned, larger ones hashed.

use serde_json::{Map, Value};

/// Objects with at most this many fields are scanned rather than hashed.
pub(super) const SCAN_LIMIT: usize = 12;

/// The `null` that [`Fields::at`] returns for a missing field (as `serde_json`'s `[]` does).
static NULL: Value = Value::Null;

/// Field access by name on a JSON object (or a value that may be one).
pub trait Fields {
    /// The field `name`, as `get` would return it (`None` when missing or not an object).
    fn field(&self, name: &str) -> Option<&Value>;

    /// The field `name`, or `null` when missing (as `value[name]`).
    fn at(&self, name: &str) -> &Value {
        self.field(name).unwrap_or(&NULL)
    }
}

impl Fields for Map<String, Value> {
    #[inline]
    fn field(&self, name: &str) -> Option<&Value> {
        if self.len() <= SCAN_LIMIT {
            // Keys are unique, so the first match is the one `get` finds.
            self.iter()
                .find(|(key, _)| key.as_str() == name)
                .map(|(_, value)| value)
        } else {
            self.get(name)
        }
    }
}

impl Fields for Value {
    #[inline]
    fn field(&self, name: &str) -> Option<&Value> {
        match self {
            Value::Object(map) => map.field(name),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_are_found_as_get_finds_them() {
        let small = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "hi"});
        let mut big = serde_json::Map::new();
        for i in 0..(SCAN_LIMIT + 5) {
            big.insert(format!("f{i}"), json!(i));
        }
        let big = Value::Object(big);
        for v in [&small, &big, &json!([1, 2]), &json!("s"), &Value::Null] {
            for name in ["type", "delta", "f0", "f3", "f16", "missing", ""] {
                assert_eq!(v.field(name), v.get(name), "{v} {name}");
                assert_eq!(v.at(name), &v[name], "{v} {name}");
            }
        }
        let map = small.as_object().unwrap();
        assert_eq!(map.field("messageId"), map.get("messageId"));
        assert_eq!(map.field("nope"), None);
    }
}
