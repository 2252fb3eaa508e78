//! The JavaScript semantics `fast-json-patch` inherits: property existence, `Object.prototype`
//! names, `~~key` index conversion, and deep equality for `test`.

use serde_json::{Map, Value};

/// JavaScript `obj[key] !== undefined` for a container (the library's existence check).
/// Arrays: a canonical index below the length (other names either fail later as an illegal
/// index or are `-`); objects: an own member or an `Object.prototype` name.
pub(super) fn js_has(obj: &Value, key: &str) -> bool {
    match obj {
        Value::Object(map) => map.contains_key(key) || is_object_proto(key),
        Value::Array(arr) => canonical_index(key).is_some_and(|k| k < arr.len()),
        _ => false,
    }
}

/// Names every plain object inherits from `Object.prototype` (ECMAScript 2024).
pub(super) fn is_object_proto(key: &str) -> bool {
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
pub(super) fn is_digits(key: &str) -> bool {
    key.bytes().all(|b| b.is_ascii_digit())
}

/// An RFC 6901 array index: `0` or digits without a leading zero.
pub(super) fn canonical_index(key: &str) -> Option<usize> {
    if key.is_empty() || (key.len() > 1 && key.starts_with('0')) || !is_digits(key) {
        return None;
    }
    key.parse().ok()
}

/// JavaScript `~~key` for a digit string: `Number(key)` then ToInt32 (so `""` is 0, `"01"`
/// is 1 and `"4294967296"` wraps to 0).
pub(super) fn to_int32(key: &str) -> i64 {
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

pub(super) fn objects_equal(x: &Map<String, Value>, y: &Map<String, Value>) -> bool {
    x.len() == y.len()
        && x.iter()
            .all(|(k, v)| y.get(k).is_some_and(|w| js_equals(v, w)))
}

/// The double JavaScript's `JSON.parse` makes of a number (±Infinity past the range).
pub(super) fn number_as_f64(n: &serde_json::Number) -> f64 {
    n.as_f64()
        .unwrap_or_else(|| n.to_string().parse().unwrap_or(f64::NAN))
}
