//! The shortcut against the full validation: whatever it accepts, the full way accepts with the
//! same result; what it declines goes the full way unchanged.

use super::{validate_content, validate_content_batch, validate_content_in};
use crate::event::validate::{parse_received, validate_elements, validate_parsed};
use crate::event::{AsEvent, ContentRef, EventType, Fields, ValidEvent};
use crate::fixtures;
use bytes::Bytes;
use serde_json::Value;

/// The full validation alone (`validate_event` tries the shortcut first).
fn full(raw: &[u8]) -> Option<ValidEvent> {
    let value = parse_received(raw).ok()?;
    validate_parsed(value, raw, None).ok()
}

/// The shortcut's answer for `raw`, after asserting that an acceptance is the full
/// validation's result and that the fields it read are the value's.
fn shortcut(raw: &[u8]) -> Option<ValidEvent> {
    let fast = validate_content(raw)?;
    let text = String::from_utf8_lossy(raw);
    let slow = full(raw).unwrap_or_else(|| panic!("accepted what the full way refuses: {text}"));
    assert_eq!(fast.event_type, slow.event_type, "{text}");
    assert_eq!(fast.json, slow.json, "{text}");
    let content = fast.content().expect("fields read");
    let value = slow.parsed();
    let id = ContentRef::id_member(content.event_type);
    assert_eq!(
        Some(content.id),
        value.field(id).and_then(Value::as_str),
        "{text}"
    );
    assert_eq!(
        Some(content.delta),
        value.field("delta").and_then(Value::as_str)
    );
    assert_eq!(
        content.tag,
        value.field("subagentRunId").and_then(Value::as_str)
    );
    assert_eq!(fast.as_value(), &**value, "{text}");
    // The shared-bytes form agrees.
    let shared = validate_content_in(&Bytes::copy_from_slice(raw)).expect("same answer");
    assert_eq!(shared, fast);
    assert_eq!(shared.content(), fast.content());
    Some(fast)
}

#[test]
fn content_deltas_are_read_from_their_fields() {
    for raw in [
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":" the"}"#,
        r#"{"messageId":"m1","delta":"x","type":"REASONING_MESSAGE_CONTENT"}"#,
        r#"{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{\"q\":\"a\\nb\"}"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m\"1","delta":"é 日本 🦀\t","subagentRunId":"s1"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"","timestamp":-9007199254740991}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","timestamp":9007199254740991,"seq":12,"ts":1.5,"pad":"xx"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","rawEvent":{"type":"on_chat_model_stream","data":{"chunk":[1,{"a":null}]}}}"#,
        r#"{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"a","messageId":{"not":"the id here"},"x":[[],{}]}"#,
        " \n{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"a\"}\r\n",
    ] {
        let event = shortcut(raw.as_bytes()).unwrap_or_else(|| panic!("declined {raw}"));
        assert!(ContentRef::is_content_type(event.event_type));
    }
    let escaped =
        shortcut(br#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a\"b\\c\n"}"#)
            .unwrap();
    assert_eq!(escaped.content().unwrap().delta, "a\"b\\c\n");
}

#[test]
fn what_it_cannot_decide_goes_the_full_way() {
    let deep = format!(
        r#"{{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"a","x":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    for raw in [
        // Not a content delta, or not an object.
        r#"{"type":"TEXT_MESSAGE_START","messageId":"m1"}"#,
        r#"{"type":"CUSTOM","name":"n","value":{"type":"TEXT_MESSAGE_CONTENT"}}"#,
        r#"[{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a"}]"#,
        r#""TEXT_MESSAGE_CONTENT""#,
        // Refused by the full way.
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":7}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":null,"delta":"a"}"#,
        r#"{"type":"TOOL_CALL_ARGS","messageId":"m1","delta":"a"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","timestamp":1.0}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","timestamp":9007199254740992}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","timestamp":"1"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","rawEvent":null}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","subagentRunId":1}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","metadata":[]}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","x":{"$serde_json::private::Number":"1"}}"#,
        r#"{"$serde_json::private::RawValue":"1","type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"x"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","rawEvent":{"$serde_json::private::RawValue":"{\"a\":1}"}}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a"}x"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a""#,
        &deep,
        // Valid, but decided the full way: read by the fold, checked against the thread,
        // repeated or escaped names, spellings serde_json writes otherwise.
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","metadata":{"k":1}}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","threadId":"t"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","delta":"b"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","x":{"k":1,"k":2}}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","\u0064elta":"a"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"\u00e9"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a\/b"}"#,
        r#"{"type": "TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a"}"#,
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a","n":1e3}"#,
        r#"{"type":"TEXT_MESSAGE_\u0043ONTENT","messageId":"m1","delta":"a"}"#,
    ] {
        assert!(shortcut(raw.as_bytes()).is_none(), "{raw}");
    }
    assert!(
        validate_content(
            b"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"\xff\",\"delta\":\"a\"}"
        )
        .is_none()
    );
    // Whitespace JSON does not allow around a text (the parser refuses a form feed).
    let delta = r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a"}"#;
    for raw in [
        format!("{delta}\x0c"),
        format!("\x0c{delta}"),
        format!("{delta}\x0b"),
    ] {
        assert!(shortcut(raw.as_bytes()).is_none(), "{raw:?}");
        assert!(full(raw.as_bytes()).is_none(), "{raw:?}");
    }
}

/// Every content delta of the repository's recorded runs and conformance streams, written
/// compactly: the shortcut reads those it can decide (no metadata, no escape it cannot tell),
/// with the full way's result (asserted in `shortcut`).
#[test]
fn recorded_content_deltas_take_the_shortcut() {
    let mut texts = Vec::new();
    for path in fixtures::files(&fixtures::dir("")) {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(document) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let mut events = Vec::new();
        fixtures::events(&document, &mut events);
        texts.extend(events.iter().map(|e| serde_json::to_string(e).unwrap()));
    }
    let (mut taken, mut content) = (0, 0);
    for text in &texts {
        let value: Value = serde_json::from_str(text).unwrap();
        let is_content = value
            .field("type")
            .and_then(Value::as_str)
            .and_then(EventType::parse)
            .is_some_and(ContentRef::is_content_type);
        content += usize::from(is_content);
        if shortcut(text.as_bytes()).is_some() {
            assert!(is_content, "{text}");
            taken += 1;
        }
    }
    assert!(content > 40, "{content} content deltas in the fixtures");
    assert!(taken * 10 >= content * 8, "{taken} of {content} taken");
}

/// Byte-level mutants of a text from a fixed-seed generator (a linear congruential one): 1 to
/// `most` mutations, each a piece put in place of a byte, a byte dropped, or a run of up to
/// `longest_run` bytes doubled.
struct Mutator {
    seed: u64,
    pieces: &'static [&'static [u8]],
    most: usize,
    longest_run: usize,
}

impl Mutator {
    fn next(&mut self, bound: usize) -> usize {
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.seed >> 33) as usize % bound
    }

    fn mutant(&mut self, base: &[u8]) -> Vec<u8> {
        let mut raw = base.to_vec();
        for _ in 0..1 + self.next(self.most) {
            let at = self.next(raw.len());
            match self.next(3) {
                0 => {
                    let piece = self.pieces[self.next(self.pieces.len())];
                    raw.splice(at..(at + 1).min(raw.len()), piece.iter().copied());
                }
                1 => {
                    raw.remove(at);
                }
                _ => {
                    let end = (at + 1 + self.next(self.longest_run)).min(raw.len());
                    let copy = raw[at..end].to_vec();
                    raw.splice(at..at, copy);
                }
            }
        }
        raw
    }
}

/// Mutated content deltas (bytes replaced, dropped, doubled; a fixed-seed generator): the
/// shortcut never accepts what the full way refuses, nor gives another result.
#[test]
fn mutated_deltas_never_pass_the_shortcut_alone() {
    const PIECES: &[&[u8]] = &[
        b"\"$serde_json::private::RawValue\":\"1\",",
        b"\"$serde_json::private::Number\":\"1\",",
        b"\x0c",
        b"\"",
        b"\\",
        b"{",
        b"}",
        b"[",
        b"]",
        b":",
        b",",
        b" ",
        b"0",
        b"-",
        b"1e5",
        b"null",
        b"\\u0041",
        b"\xc3",
        b"\"type\":",
        b"\"delta\":\"x\"",
        b"\"metadata\":{}",
        b"\"a\":1",
    ];
    let bases: &[&[u8]] = &[
        br#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":" hello there","seq":1}"#,
        br#"{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{\"q\":1}","rawEvent":{"k":[1,2]}}"#,
        br#"{"type":"REASONING_MESSAGE_CONTENT","messageId":"r","delta":"hm","subagentRunId":"s","timestamp":17}"#,
    ];
    let mut mutator = Mutator {
        seed: 0x9e37_79b9_7f4a_7c15,
        pieces: PIECES,
        most: 3,
        longest_run: 12,
    };
    let mut accepted = 0;
    for round in 0..20_000 {
        let raw = mutator.mutant(bases[round % bases.len()]);
        accepted += usize::from(shortcut(&raw).is_some());
    }
    assert!(accepted > 1_000, "{accepted} mutants accepted");
}

/// The full validation of a batch body (as `POST` handles `[...]`): the array parsed, each
/// element validated with its received bytes.
fn full_batch(raw: &[u8]) -> Option<Vec<ValidEvent>> {
    let Value::Array(items) = parse_received(raw).ok()? else {
        return None;
    };
    validate_elements(items, raw, None)
        .map(Result::ok)
        .collect()
}

/// The batch shortcut's answer, after asserting that an acceptance is the full way's.
fn shortcut_batch(raw: &[u8]) -> Option<Vec<ValidEvent>> {
    let fast = validate_content_batch(raw)?;
    let text = String::from_utf8_lossy(raw);
    let slow =
        full_batch(raw).unwrap_or_else(|| panic!("accepted what the full way refuses: {text}"));
    assert_eq!(fast.len(), slow.len(), "{text}");
    for (f, s) in fast.iter().zip(&slow) {
        assert_eq!(f.event_type, s.event_type, "{text}");
        assert_eq!(f.json, s.json, "{text}");
        assert_eq!(f.as_value(), &**s.parsed(), "{text}");
    }
    Some(fast)
}

const DELTAS: &[&str] = &[
    r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":" hello [there] {x}"}"#,
    r#"{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{\"q\":[1,2]}"}"#,
    r#"{"type":"REASONING_MESSAGE_CONTENT","messageId":"r","delta":"\"hm\\","timestamp":17}"#,
];

#[test]
fn batches_of_content_deltas_take_the_shortcut() {
    for separator in [",", ", ", ",\n", " ,\t", "\r\n,\r\n"] {
        for n in 1..=DELTAS.len() {
            let body = format!("[{}]", DELTAS[..n].join(separator));
            let events = shortcut_batch(body.as_bytes()).unwrap_or_else(|| panic!("{body}"));
            assert_eq!(events.len(), n);
            for (event, text) in events.iter().zip(DELTAS) {
                assert_eq!(&event.json[..], text.as_bytes());
            }
            let spaced = format!(" \n[ {} ]\r\n", DELTAS[..n].join(separator));
            assert!(shortcut_batch(spaced.as_bytes()).is_some(), "{spaced}");
        }
    }
}

#[test]
fn batches_it_cannot_decide_go_the_full_way() {
    let [a, b, _] = DELTAS else { unreachable!() };
    let start = r#"{"type":"TEXT_MESSAGE_START","messageId":"m2","role":"assistant"}"#;
    let bodies = [
        "[]".to_owned(),
        "[ ]".to_owned(),
        format!("[{a},]"),
        format!("[,{a}]"),
        format!("[{a},,{b}]"),
        format!("[{a}{b}]"),
        format!("[{a} {b}]"),
        format!("[{a},\x0c{b}]"),
        format!("[{a},1]"),
        format!("[{a},{start}]"),
        format!("[{a}]]"),
        format!("[[{a}]]"),
        format!("[{a}"),
        format!("{a}]"),
        format!("[{a}] x"),
        format!("[{a},{b}"),
        format!("[{}]", &a[..a.len() - 1]),
        format!("[{a}}}]"),
        format!("[{a},null]"),
    ];
    for body in &bodies {
        assert!(
            validate_content_batch(body.as_bytes()).is_none(),
            "shortcut took {body}"
        );
    }
    // A mixed batch is valid, the full way.
    assert!(full_batch(format!("[{a},{start}]").as_bytes()).is_some());
}

/// Mutated batch bodies (a fixed-seed generator): the shortcut never accepts what the full
/// way refuses, nor gives another result.
#[test]
fn mutated_batches_never_pass_the_shortcut_alone() {
    const PIECES: &[&[u8]] = &[
        b",", b"[", b"]", b"{", b"}", b" ", b"\x0c", b"\"", b"\\", b"1",
    ];
    let base = format!("[{}]", DELTAS.join(","));
    let mut mutator = Mutator {
        seed: 0x2545_f491_4f6c_dd1d,
        pieces: PIECES,
        most: 2,
        longest_run: 40,
    };
    let mut accepted = 0;
    for _ in 0..20_000 {
        let raw = mutator.mutant(base.as_bytes());
        accepted += usize::from(shortcut_batch(&raw).is_some());
    }
    assert!(accepted > 500, "{accepted} mutants accepted");
}
