//! Whether received JSON bytes already are what `serde_json` writes for their parsed value, so
//! validation keeps them as the event's JSON instead of serialising the value again.
//!
//! `serde_json` (built with `preserve_order` and `arbitrary_precision`) writes compact JSON:
//! no whitespace, members in their received order, numbers with their received digits,
//! strings with only `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t` and `\u00XX` (other control
//! characters) escaped. Received bytes spelled that way, without duplicate member names (the
//! parsed object keeps one of them) and without the crate's private number key (parsed into a
//! number), are byte for byte its output. The check is conservative: it accepts no `\u`
//! escape and no exponent (written differently by some producers), so a `false` only costs
//! the serialisation it replaces. Publishers that send compact JSON, as the AG-UI SDKs'
//! encoders do, skip it: callgrind on `benches/hot_path.rs` puts the serialisation at 3.8 %
//! of the publish and fan-out instructions of the `agent` mix (2,700 instructions per event).

use serde_json::Value;

/// Whether `raw`, one JSON text that `serde_json` parsed into `value`, equals
/// `serde_json::to_vec(value)` byte for byte (leading and trailing ASCII whitespace aside:
/// the caller trims it). `false` when unsure.
pub(super) fn is_serialised_form(raw: &[u8], value: &Value) -> bool {
    written_members(raw) == Some(count_members(value))
}

/// When `raw`, one JSON text, is spelled as `serde_json` writes it (above), the number of
/// object members it writes, nested ones included: equal to the parsed value's member count
/// when no object repeats a name (the parsed object keeps one). `None` when the spelling is
/// another or unsure.
pub(super) fn written_members(raw: &[u8]) -> Option<usize> {
    let mut members = 0_usize;
    let mut previous = 0_u8;
    let mut i = 0;
    while i < raw.len() {
        let byte = raw[i];
        match byte {
            b'"' => {
                i = string_end(raw, i, Escapes::Serialised)?;
                previous = b'"';
                continue;
            }
            b':' => members += 1,
            b' ' | b'\t' | b'\n' | b'\r' | b'E' | b'+' => return None,
            // `e` outside strings is in `true`, `false` or an exponent.
            b'e' if previous.is_ascii_digit() || previous == b'.' => return None,
            _ => {}
        }
        previous = byte;
        i += 1;
    }
    Some(members)
}

/// The elements of `raw`, a JSON array that `serde_json` parsed, as the byte slices they were
/// received as (trimmed), in order; `None` when `raw` is not an array. So each element of a
/// batch can keep its bytes ([`is_serialised_form`]).
pub fn array_elements(raw: &[u8]) -> Option<Vec<&[u8]>> {
    let inner = raw.trim_ascii().strip_prefix(b"[")?.strip_suffix(b"]")?;
    let mut elements = Vec::new();
    let (mut depth, mut start, mut i) = (0_usize, 0, 0);
    while i < inner.len() {
        match inner[i] {
            b'"' => {
                i = string_end(inner, i, Escapes::Any)?;
                continue;
            }
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth = depth.checked_sub(1)?,
            b',' if depth == 0 => {
                elements.push(inner[start..i].trim_ascii());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    let last = inner[start..].trim_ascii();
    if !last.is_empty() {
        elements.push(last);
    }
    Some(elements)
}

/// Which escapes [`string_end`] lets through.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Escapes {
    /// Only those serde_json writes the same way: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`,
    /// `\t` (`\/` and `\uXXXX` it writes differently or, for control characters, maybe
    /// not: unsure).
    Serialised,
    /// Any (the JSON was parsed, so they are valid).
    Any,
}

/// The position after the string that opens at `raw[start]` (a `"`); `None` when it does not
/// end or holds an escape `escapes` refuses. Jumps from escape to escape with `memchr`: most
/// of an event's bytes are in strings, and a byte-at-a-time scan cost as much as the
/// serialisation it replaces.
pub(super) fn string_end(raw: &[u8], start: usize, escapes: Escapes) -> Option<usize> {
    let mut j = start + 1;
    loop {
        let k = j + memchr::memchr2(b'"', b'\\', raw.get(j..)?)?;
        if raw[k] == b'"' {
            return Some(k + 1);
        }
        match raw.get(k + 1)? {
            b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => {}
            _ if escapes == Escapes::Any => {}
            _ => return None,
        }
        j = k + 2;
    }
}

/// Object members in `value`, nested ones included.
pub(super) fn count_members(value: &Value) -> usize {
    match value {
        Value::Object(members) => {
            members.len() + members.values().map(count_members).sum::<usize>()
        }
        Value::Array(items) => items.iter().map(count_members).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::{array_elements, is_serialised_form};
    use serde_json::Value;

    /// Whether the check accepts `raw`, after asserting it never accepts a spelling that
    /// serialises differently.
    fn accepted(raw: &str) -> bool {
        let value: Value = serde_json::from_str(raw).expect("test input parses");
        let ok = is_serialised_form(raw.as_bytes(), &value);
        if ok {
            assert_eq!(
                serde_json::to_string(&value).unwrap(),
                raw,
                "accepted {raw:?}"
            );
        }
        ok
    }

    #[test]
    fn compact_events_are_kept() {
        for raw in [
            r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":" the \"quoted\" one"}"#,
            r#"{"type":"STATE_DELTA","delta":[{"op":"add","path":"/items/-","value":{"n":-1.50,"ok":true,"no":false,"z":null}}]}"#,
            r#"{"type":"CUSTOM","name":"n","value":[1,2.0,-0,123456789012345678901234567890,{"a":{}},[]]}"#,
            r#"{"type":"CUSTOM","name":"tab\tnew\nline\\back\rcr\bbs\fff","value":"é ü 日本 🦀"}"#,
            // DEL and LINE SEPARATOR, unescaped by serde_json
            "{\"type\":\"CUSTOM\",\"name\":\"\u{7f}\",\"value\":\"\u{2028}\"}",
            r#"{"type":"RAW","event":"e","source":"colon: inside, {braces} [and] \"escapes\""}"#,
        ] {
            assert!(accepted(raw), "{raw}");
        }
    }

    #[test]
    fn other_spellings_are_serialised() {
        for raw in [
            r#"{"type": "CUSTOM","name":"n","value":1}"#,
            "{\"type\":\"CUSTOM\",\n\"name\":\"n\",\"value\":1}",
            r#"{"type":"CUSTOM","name":"n","value":1,"value":2}"#,
            r#"{"type":"CUSTOM","name":"a\/b","value":1}"#,
            r#"{"type":"CUSTOM","name":"\u00e9","value":1}"#,
            r#"{"type":"CUSTOM","name":"\u0001","value":1}"#,
            r#"{"type":"CUSTOM","name":"n","value":1E2}"#,
            r#"{"type":"CUSTOM","name":"n","value":1e2}"#,
            r#"{"type":"CUSTOM","name":"n","value":1.5e-3}"#,
            r#"{"type":"CUSTOM","name":"n","value":1e+2}"#,
            r#"{"type":"CUSTOM","name":"n","value":{"$serde_json::private::Number":"12"}}"#,
            r#"{"type":"CUSTOM","name":"n","value":{"a":1,"a":{"b":2}}}"#,
        ] {
            assert!(!accepted(raw), "{raw}");
        }
    }

    /// Every event object in the repository's recorded runs and conformance fixtures, written
    /// compactly by serde_json (as a producer's encoder writes it) and pretty-printed: the
    /// compact spelling is kept unless it holds a `\u` escape or an exponent, the pretty one
    /// never is, and nothing accepted serialises differently (asserted in `accepted`).
    #[test]
    fn recorded_events_agree_with_the_serialiser() {
        let documents: Vec<Value> = crate::fixtures::files(&crate::fixtures::dir(""))
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .filter_map(|text| serde_json::from_str(&text).ok())
            .collect();
        let mut events = Vec::new();
        for document in &documents {
            crate::fixtures::events(document, &mut events);
        }
        assert!(events.len() > 300, "fixtures hold {} events", events.len());
        for event in &events {
            let compact = serde_json::to_string(event).unwrap();
            let unsure = compact.contains("\\u")
                || compact
                    .bytes()
                    .zip(compact.bytes().skip(1))
                    .any(|(a, b)| (a.is_ascii_digit() || a == b'.') && (b == b'e' || b == b'E'));
            assert_eq!(accepted(&compact), !unsure, "{compact}");
            let pretty = serde_json::to_string_pretty(event).unwrap();
            assert!(!accepted(&pretty), "{pretty}");
        }
    }

    #[test]
    fn array_elements_are_the_received_slices() {
        let raw = br#" [ {"a":"x,]}\"\\","b":[1,{"c":2}]} ,{"d":"\u005d"},[],3 ]
"#;
        let elements = array_elements(raw).unwrap();
        let texts: Vec<&str> = elements
            .iter()
            .map(|e| std::str::from_utf8(e).unwrap())
            .collect();
        assert_eq!(
            texts,
            [
                r#"{"a":"x,]}\"\\","b":[1,{"c":2}]}"#,
                r#"{"d":"\u005d"}"#,
                "[]",
                "3"
            ]
        );
        assert_eq!(array_elements(b"[]").unwrap(), Vec::<&[u8]>::new());
        assert_eq!(array_elements(br#"{"a":1}"#), None);
    }
}
