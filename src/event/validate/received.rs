//! Received JSON text into a value: the one parse of a producer's or a caller's bytes (a
//! publish's body or NDJSON line, an SSE ingest's or upstream agent's `data`, a log entry read
//! back, a run request), refusing the member names the parser reserves.

use super::compact::{Escapes, string_end};
use serde_json::Value;
use std::fmt;

/// The member name `serde_json` (built with `arbitrary_precision`) keeps for numbers: an object
/// holding it parses as a number (`{"$serde_json::private::Number":"12"}` becomes `12`, even
/// where the schema wants an integer) or fails with a misleading message, so received JSON may
/// not use it.
pub const RESERVED_MEMBER: &str = "$serde_json::private::Number";

/// The member names `serde_json` keeps for itself, so received JSON may not use them:
/// [`RESERVED_MEMBER`], and the one its `raw_value` feature (which axum turns on) keeps for raw
/// values: an object whose first member has that name parses as the JSON text the member's
/// string holds (`{"$serde_json::private::RawValue":"{\"a\":1}"}` becomes `{"a":1}`), or
/// fails when the object has other members.
pub const RESERVED_MEMBERS: [&str; 2] = [RESERVED_MEMBER, "$serde_json::private::RawValue"];

/// The name in [`RESERVED_MEMBERS`] that `raw`, JSON text, uses as a member anywhere, however
/// escaped. Only text holding `$serde_json` or a `\u` escape is scanned; for other text this
/// is one `memchr2` pass (two `memmem::find` calls cost 1,100 instructions per event in
/// `benches/hot_path.rs`, mostly setting up their searchers).
pub(super) fn names_reserved_member(raw: &[u8]) -> Option<&'static str> {
    let suspect = memchr::memchr2_iter(b'$', b'\\', raw).any(|at| match raw[at] {
        b'$' => raw[at..].starts_with(b"$serde_json"),
        _ => raw.get(at + 1) == Some(&b'u'),
    });
    if !suspect {
        return None;
    }
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'"' {
            i += 1;
            continue;
        }
        // Malformed text: the parser says what is wrong with it.
        let end = string_end(raw, i, Escapes::Any)?;
        let is_key = raw[end..]
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| *b == b':');
        if is_key {
            let name = &raw[i + 1..end - 1];
            let reserved = if name.contains(&b'\\') {
                let name = serde_json::from_slice::<String>(&raw[i..end]).ok();
                RESERVED_MEMBERS
                    .into_iter()
                    .find(|r| name.as_deref() == Some(*r))
            } else {
                RESERVED_MEMBERS.into_iter().find(|r| name == r.as_bytes())
            };
            if reserved.is_some() {
                return reserved;
            }
        }
        i = end;
    }
    None
}

/// Why received JSON text did not become a value.
#[derive(Debug)]
pub enum ParseError {
    /// Not JSON (the parser's error; not UTF-8 included).
    Malformed(serde_json::Error),
    /// JSON naming one of [`RESERVED_MEMBERS`] (this one).
    Reserved(&'static str),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Malformed(e) => {
                write!(f, "malformed JSON: {e}")?;
                // serde_json's words for an unpaired UTF-16 surrogate escape, which
                // JavaScript's `JSON.stringify` writes for a string cut inside a character.
                let text = e.to_string();
                if text.contains("surrogate") || text.contains("end of hex escape") {
                    f.write_str(
                        " (an unpaired UTF-16 surrogate escape, \\uD800 to \\uDFFF not in a \
                         high-low pair, is not Unicode text and is refused: send whole \
                         characters)",
                    )?;
                }
                Ok(())
            }
            ParseError::Reserved(name) => write!(
                f,
                "the member name {name:?} is reserved (the broker's JSON parser reads an \
                 object holding it as {}) and is not accepted",
                if *name == RESERVED_MEMBER {
                    "a number"
                } else {
                    "JSON text"
                }
            ),
        }
    }
}

/// Parses received JSON text: refused when it names [`RESERVED_MEMBER`] anywhere (which the
/// parser would turn into a number), else `serde_json`'s value or error.
///
/// # Errors
/// [`ParseError::Reserved`], or [`ParseError::Malformed`] with the parser's error.
pub fn parse_received(raw: &[u8]) -> Result<Value, ParseError> {
    refuse_reserved(raw, || serde_json::from_slice(raw))
}

/// [`parse_received`] for text known to be UTF-8 (the parser then does not check it again).
pub(super) fn parse_received_text(text: &str) -> Result<Value, ParseError> {
    refuse_reserved(text.as_bytes(), || serde_json::from_str(text))
}

/// `parse` of `raw`, unless `raw` names [`RESERVED_MEMBER`].
fn refuse_reserved(
    raw: &[u8],
    parse: impl FnOnce() -> serde_json::Result<Value>,
) -> Result<Value, ParseError> {
    if let Some(name) = names_reserved_member(raw) {
        return Err(ParseError::Reserved(name));
    }
    parse().map_err(ParseError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::{RESERVED_MEMBER, RESERVED_MEMBERS, names_reserved_member};

    #[test]
    fn an_unpaired_surrogate_is_named() {
        for raw in [
            r#"{"d":"a\ud800 b"}"#,
            r#"{"d":"a\udc00"}"#,
            r#"{"d":"\ud83d\u0041"}"#,
        ] {
            let e = super::parse_received(raw.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.contains("unpaired UTF-16 surrogate"), "{raw}: {e}");
        }
        let e = super::parse_received(br#"{"d":1"#).unwrap_err().to_string();
        assert!(!e.contains("surrogate"), "{e}");
        assert!(super::parse_received(br#"{"d":"\ud83d\ude00"}"#).is_ok());
    }

    #[test]
    fn the_reserved_member_is_found_however_spelled() {
        for raw in [
            r#"{"type":"CUSTOM","name":"n","value":{"$serde_json::private::Number":"12"}}"#,
            r#"{"$serde_json::private::Number" : "1","type":"CUSTOM"}"#,
            r#"[{"a":[{"b":{"\u0024serde_json::private::Number":12}}]}]"#,
            r#"{"x":{"$serde_json::private::\u004eumber":"abc","b":1}}"#,
        ] {
            assert_eq!(
                names_reserved_member(raw.as_bytes()),
                Some(RESERVED_MEMBER),
                "{raw}"
            );
        }
        for raw in [
            r#"{"$serde_json::private::RawValue":"1","type":"TEXT_MESSAGE_CONTENT"}"#,
            r#"{"type":"STATE_SNAPSHOT","snapshot":{"$serde_json::private::RawValue":"{\"a\":1}"}}"#,
            r#"{"x":[{"\u0024serde_json::private::RawValue" :"2"}]}"#,
        ] {
            assert_eq!(
                names_reserved_member(raw.as_bytes()),
                Some(RESERVED_MEMBERS[1]),
                "{raw}"
            );
        }
        for raw in [
            r#"{"type":"CUSTOM","name":"n","value":"$serde_json::private::Number"}"#,
            r#"{"type":"CUSTOM","name":"\u00e9","value":["$serde_json::private::Number",1]}"#,
            r#"{"type":"CUSTOM","name":"n","value":{"$serde_json::private::Numbers":1}}"#,
            r#"{"type":"CUSTOM","name":"n","value":1}"#,
            r#"{"type":"CUSTOM","name":"n","value":{"$serde_json::private::RawValues":1}}"#,
        ] {
            assert_eq!(names_reserved_member(raw.as_bytes()), None, "{raw}");
        }
    }
}
