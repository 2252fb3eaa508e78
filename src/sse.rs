//! Server-Sent Events wire encoding (WHATWG HTML, "Server-sent events", §9.2): event, `retry:`,
//! comment and heartbeat frames as bytes. A leaf: it knows nothing of the crate's events,
//! queues or sockets; the hub encodes each event once per node through it (see
//! `queue::Frame`) and every subscriber shares the same `Bytes` (PROTOCOL §3).
//!
//! Wire rules (PROTOCOL §3): LF only, never CR; one AG-UI event per frame as `id: <event id>\n` +
//! one `data: <compact JSON>\n` + a blank line; no `event:` field; `retry: <ms>` as the
//! stream's first frame; a comment line as heartbeat when the stream was idle.

use bytes::{BufMut, Bytes, BytesMut};

/// The heartbeat: an empty comment line and a blank line.
pub const HEARTBEAT: &[u8] = b":\n\n";

/// `id: ` before an event's id.
const ID_FIELD: &[u8] = b"id: ";
/// `data: ` before an event's JSON.
const DATA_FIELD: &[u8] = b"data: ";

/// Length of the event frame [`put_event`] writes for an id of `id_len` bytes (or none) and
/// JSON of `json_len` bytes.
pub fn event_len(id_len: Option<usize>, json_len: usize) -> usize {
    let id = id_len.map_or(0, |n| ID_FIELD.len() + n + 1);
    id + DATA_FIELD.len() + json_len + 2
}

/// Appends one event frame to `buf`: `id: <id>\n` (when `id` is given), `data: <json>\n`, and
/// the blank line that dispatches the event. Returns the offset of the JSON in `buf`.
///
/// `json` must be compact one-line JSON (validation guarantees it: serde_json escapes line
/// breaks inside strings), so one `data:` line carries the whole event; `id` must not contain
/// a line break (event ids are the broker's own).
pub fn put_event(buf: &mut BytesMut, id: Option<&str>, json: &[u8]) -> usize {
    debug_assert!(!json.contains(&b'\n') && !json.contains(&b'\r'));
    if let Some(id) = id {
        put_id(buf, id);
    }
    buf.put_slice(DATA_FIELD);
    let data_start = buf.len();
    buf.put_slice(json);
    buf.put_slice(b"\n\n");
    data_start
}

/// Appends the `id: <id>\n` line of an event whose `data:` line follows (a synthesised event
/// encoded once without an id and given one per connection). Same rules for `id` as
/// [`put_event`].
pub fn put_id(buf: &mut BytesMut, id: &str) {
    debug_assert!(!id.contains(['\n', '\r']));
    buf.put_slice(ID_FIELD);
    buf.put_slice(id.as_bytes());
    buf.put_u8(b'\n');
}

/// Encodes one event frame: `id: <id>\ndata: <json>\n\n` (see [`put_event`]), in one
/// allocation of the exact size.
pub fn encode_event(id: &str, json: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(event_len(Some(id.len()), json.len()));
    put_event(&mut buf, Some(id), json);
    buf.freeze()
}

/// Encodes a `retry: <ms>` frame (the client's reconnection delay, WHATWG §9.2.6).
pub fn encode_retry(ms: u64) -> Bytes {
    Bytes::from(format!("retry: {ms}\n\n"))
}

/// Encodes a comment frame `: <text>` (ignored by every SSE client). `text` must not contain
/// line breaks; they are replaced by spaces if it does.
pub fn encode_comment(text: &str) -> Bytes {
    let clean: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    Bytes::from(format!(": {clean}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_frame_is_byte_exact() {
        let f = encode_event("deadbeef-5-1", br#"{"type":"RAW","event":{}}"#);
        assert_eq!(
            &f[..],
            b"id: deadbeef-5-1\ndata: {\"type\":\"RAW\",\"event\":{}}\n\n"
        );
        assert!(!f.contains(&b'\r'));
        assert_eq!(f.len(), event_len(Some(12), 25));
    }

    #[test]
    fn events_append_with_or_without_id() {
        let mut buf = BytesMut::new();
        let first = put_event(&mut buf, None, br#"{"a":1}"#);
        let second = put_event(&mut buf, Some("00000001-0-9"), br#"{"b":2}"#);
        assert_eq!(
            &buf[..],
            b"data: {\"a\":1}\n\nid: 00000001-0-9\ndata: {\"b\":2}\n\n"
        );
        assert_eq!(&buf[first..first + 7], br#"{"a":1}"#);
        assert_eq!(&buf[second..second + 7], br#"{"b":2}"#);
        assert_eq!(event_len(None, 7), 15);
        assert_eq!(event_len(Some(12), 7) + 15, buf.len());
    }

    #[test]
    fn retry_comment_and_heartbeat_are_byte_exact() {
        assert_eq!(&encode_retry(2000)[..], b"retry: 2000\n\n");
        assert_eq!(&encode_retry(0)[..], b"retry: 0\n\n");
        assert_eq!(&encode_comment("a\r\nb")[..], b": a  b\n\n");
        assert_eq!(
            &encode_comment("agui-fanout: log discontinuity, reconnect")[..],
            b": agui-fanout: log discontinuity, reconnect\n\n"
        );
        assert_eq!(HEARTBEAT, b":\n\n");
    }
}
